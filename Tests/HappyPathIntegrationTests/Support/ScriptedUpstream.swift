import Foundation
import HappyPathCore
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
    /// Served in order, one per request; the last one repeats. A response
    /// may start with "DELAY:<ms>\n" (wait first), be "DROP" (close without
    /// answering) or "HOLD" (never answer; count the proxy's close in `held`).
    private let responses: [String]
    /// When set, computes each answer from the request head instead.
    private let answer: (@Sendable (String) -> String)?
    /// "HOLD" requests whose connection the proxy closed.
    let held = Locked(0)
    /// Every request received: head and body.
    let requests = Locked<[(head: String, body: [UInt8])]>([])
    /// Those of `requests` that are not health checks (changed only under its lock).
    private var appRequestCount = 0

    convenience init(response: String) { self.init(responses: [response]) }

    init(responses: [String]) {
        self.responses = responses
        answer = nil
        (listenFD, port) = Self.listening()
    }

    /// An upstream that answers each request (health checks aside) with `answer(head)`.
    init(answering answer: @escaping @Sendable (String) -> String) {
        responses = []
        self.answer = answer
        (listenFD, port) = Self.listening()
    }

    /// A socket listening on a fresh loopback port.
    private static func listening() -> (Int32, Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let port = bindLoopback(fd)
        listen(fd, 256)
        return (fd, port)
    }

    /// An upstream whose answer names its own port (a redirect to itself),
    /// known only once it is bound: `answer(port)` for every request.
    init(comingUpOnFreshPort answer: @escaping @Sendable (Int) -> String) {
        responses = []
        let (listenFD, port) = Self.listening()
        self.listenFD = listenFD
        self.port = port
        self.answer = { _ in answer(port) }
    }

    /// An upstream that comes up on `reserved`, a port that refused
    /// connections until now (the very socket starts listening, so the port
    /// is never free in between), and answers each request (health checks
    /// aside) with `answer(head)`.
    init(comingUpOn reserved: RefusingPort, answer: @escaping @Sendable (String) -> String) {
        responses = []
        self.answer = answer
        port = reserved.port
        listenFD = reserved.takeSocket()
        listen(listenFD, 256)
    }

    /// Starts accepting (separate from init so `self` is complete).
    @discardableResult
    func started() -> ScriptedUpstream {
        acceptStarted.withLock { $0 = true }
        Thread { [self] in acceptLoop() }.start()
        return self
    }

    /// Stops accepting. The listening socket is closed by the accept
    /// thread itself, once it is out of `accept`: closed here, its number
    /// could be given to another test's new listening socket while this
    /// thread is about to call `accept` again, and it would answer that
    /// test's requests with this one's script (a flake seen under load).
    func stop() {
        guard !stopped.withLock({ s in defer { s = true }; return s }) else { return }
        shutdown(listenFD, Int32(SHUT_RDWR))
        if !acceptStarted.withLock({ $0 }) { Glibc.close(listenFD) }
    }

    private let stopped = Locked(false)
    private let acceptStarted = Locked(false)

    var count: Int { requests.withLock { $0.count } }

    /// Requests other than health checks.
    var appRequests: [(head: String, body: [UInt8])] {
        requests.withLock { $0.filter { !$0.head.contains("happypath-health-check") } }
    }

    private func acceptLoop() {
        defer { Glibc.close(listenFD) }
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                if errno == EINTR, !stopped.withLock({ $0 }) { continue }
                return
            }
            if stopped.withLock({ $0 }) {
                Glibc.close(fd)
                return
            }
            Thread { [self] in serve(fd) }.start()
        }
    }

    /// One request per connection, then close (keeps the script simple).
    private func serve(_ fd: Int32) {
        defer { Glibc.close(fd) }
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var headEnd: Int?
        while headEnd == nil {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return }
            data += chunk[0..<n]
            headEnd = data.firstRange(of: [13, 10, 13, 10])?.upperBound
        }
        let head = String(decoding: data[..<headEnd!], as: UTF8.self)
        var length = 0
        for line in head.split(separator: "\r\n") where line.lowercased().hasPrefix("content-length:") {
            length = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) ?? 0
        }
        while data.count - headEnd! < length {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            data += chunk[0..<n]
        }
        let body = Array(data[headEnd!...])
        let index = requests.withLock { list -> Int in
            list.append((head, body))
            guard !head.contains("happypath-health-check") else { return -1 }
            // Counted as they come, not by scanning every head kept so far
            // (hundreds of 60 KiB heads made that quadratic).
            defer { appRequestCount += 1 }
            return appRequestCount
        }
        var response =
            index < 0
            ? "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            : answer?(head) ?? responses[min(index, responses.count - 1)]
        if response.hasPrefix("DELAY:"), let nl = response.firstIndex(of: "\n") {
            let ms = Int(response[response.index(response.startIndex, offsetBy: 6)..<nl]) ?? 0
            // Not an ordering sleep: a slow upstream is what the test is
            // about (per-try timeouts, route deadlines).
            Thread.sleep(forTimeInterval: Double(ms) / 1000)
            response = String(response[response.index(after: nl)...])
        }
        if response == "DROP" { return }
        if response == "HOLD" {
            // Never answers: waits for the proxy to give up on the try and
            // close the connection, and records that it did.
            var byte: UInt8 = 0
            while recv(fd, &byte, 1, 0) > 0 {}
            held.withLock { $0 += 1 }
            return
        }
        _ = Array(response.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        shutdown(fd, Int32(SHUT_WR))
    }
}

extension Array where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix }
}

/// A canned HTTP/1.1 response.
func http(_ status: Int, _ body: String = "", headers: [String] = []) -> String {
    "HTTP/1.1 \(status) X\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n"
        + headers.map { $0 + "\r\n" }.joined() + "\r\n" + body
}
