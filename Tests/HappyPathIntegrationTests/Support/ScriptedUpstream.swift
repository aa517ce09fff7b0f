import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A raw TCP upstream that reads one request head per connection and writes
/// back exactly the bytes it was given: for answers no well-behaved HTTP
/// server would send (garbage, hop-by-hop headers, truncated bodies).
final class ScriptedUpstream: @unchecked Sendable {
    let port: Int
    private let listenFD: Int32
    private let response: [UInt8]
    let requests = Mutex<[String]>([])

    init(response: String) {
        self.response = Array(response.utf8)
        let listenFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listenFD = listenFD
        var one: Int32 = 1
        setsockopt(listenFD, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                _ = bind(listenFD, $0, len)
                _ = getsockname(listenFD, $0, &len)
            }
        }
        listen(listenFD, 64)
        port = Int(UInt16(bigEndian: addr.sin_port))
    }

    /// Starts accepting (separate from init so `self` is complete).
    @discardableResult
    func started() -> ScriptedUpstream {
        Thread { [self] in acceptLoop() }.start()
        return self
    }

    func stop() {
        shutdown(listenFD, Int32(SHUT_RDWR))
        Glibc.close(listenFD)
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 { return }
            var head: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while !head.ends(with: [13, 10, 13, 10]) {
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break }
                head += chunk[0..<n]
                if let range = head.firstRange(of: [13, 10, 13, 10]) { head = Array(head[..<range.upperBound]); break }
            }
            requests.withLock { $0.append(String(decoding: head, as: UTF8.self)) }
            _ = response.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            shutdown(fd, Int32(SHUT_WR))
            Glibc.close(fd)
        }
    }
}

extension Array where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix }
}
