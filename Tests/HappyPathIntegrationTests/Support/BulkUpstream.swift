import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A raw upstream that answers each request (health checks aside) with a
/// `length`-byte body, byte i being `i % 251`, written with non-blocking
/// sends from a small, pinned send buffer: it knows exactly how many body
/// bytes the kernel took from it (`written`) and whether it is waiting for
/// room (`blocked`), i.e. how far ahead of a slow client the proxy let it get.
final class BulkUpstream: @unchecked Sendable {
    let port: Int
    let length: Int
    private let listenFD: Int32
    private let stopped = Atomic<Bool>(false)
    /// Body bytes the kernel has taken from this upstream.
    let written = Atomic<Int>(0)
    /// True while a send found the socket buffer full and waits for room.
    let blocked = Atomic<Bool>(false)
    /// The proxy's port on the connection that carries the body (0 until it comes).
    let proxyPort = Atomic<Int>(0)

    /// SO_SNDBUF of the body's connection (the kernel doubles it).
    static let sendBuffer: Int32 = 64 * 1024
    /// Byte i of every body is `i % 251`; this holds enough of the pattern
    /// that any 64 KiB of a body is one slice of it.
    static let pattern = (0..<(251 * 300)).map { UInt8($0 % 251) }

    init(length: Int) {
        self.length = length
        listenFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(listenFD, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        port = bindLoopback(listenFD)
        listen(listenFD, 64)
    }

    var url: String { "http://127.0.0.1:\(port)" }

    @discardableResult
    func started() -> BulkUpstream {
        acceptStarted.store(true, ordering: .relaxed)
        Thread { [self] in
            // Closed here, once out of accept (see ScriptedUpstream.stop).
            defer { Glibc.close(listenFD) }
            while true {
                let fd = accept(listenFD, nil, nil)
                if fd < 0 { return }
                if stopped.load(ordering: .relaxed) {
                    Glibc.close(fd)
                    return
                }
                Thread { [self] in serve(fd) }.start()
            }
        }.start()
        return self
    }

    private let acceptStarted = Atomic<Bool>(false)

    func stop() {
        guard !stopped.exchange(true, ordering: .relaxed) else { return }
        shutdown(listenFD, Int32(SHUT_RDWR))
        if !acceptStarted.load(ordering: .relaxed) { Glibc.close(listenFD) }
    }

    /// True if `bytes` are the body's bytes from `offset` on.
    static func matches(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> Bool {
        var done = 0
        while done < bytes.count {
            let start = (offset + done) % 251
            let n = min(bytes.count - done, pattern.count - start)
            let same = pattern.withUnsafeBytes { memcmp(bytes.baseAddress! + done, $0.baseAddress! + start, n) == 0 }
            if !same { return false }
            done += n
        }
        return true
    }

    private func serve(_ fd: Int32) {
        defer { Glibc.close(fd) }
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while data.firstRange(of: [13, 10, 13, 10]) == nil {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return }
            data += chunk[0..<n]
        }
        let head = String(decoding: data, as: UTF8.self)
        if head.contains("happypath-health-check") {
            _ = Array("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8).withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            return
        }
        proxyPort.store(peerPort(fd), ordering: .relaxed)
        var size = Self.sendBuffer
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        let responseHead = Array("HTTP/1.1 200 OK\r\nContent-Length: \(length)\r\nConnection: close\r\n\r\n".utf8)
        _ = responseHead.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var sent = 0
        while sent < length, !stopped.load(ordering: .relaxed) {
            let start = sent % 251
            let n = Self.pattern.withUnsafeBytes { p in
                Glibc.send(
                    fd, p.baseAddress! + start, min(length - sent, 64 * 1024), Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
            }
            if n > 0 {
                sent += n
                written.store(sent, ordering: .releasing)
                continue
            }
            guard n < 0, errno == EAGAIN || errno == EWOULDBLOCK else { return }
            // The socket buffer is full: the proxy stopped reading.
            blocked.store(true, ordering: .releasing)
            var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            while poll(&p, 1, 100) == 0, !stopped.load(ordering: .relaxed) {}
            blocked.store(false, ordering: .releasing)
        }
        shutdown(fd, Int32(SHUT_WR))
    }
}

/// What the kernel holds for loopback TCP connections, from /proc/net/tcp:
/// per socket, `tx_queue` (written by its process, not yet acknowledged by
/// the peer) and `rx_queue` (arrived, not yet read by its process).
enum KernelTCPQueues {
    struct Key: Hashable {
        let local: Int
        let remote: Int
    }

    /// Every IPv4 socket's queues, by (local port, remote port).
    static func snapshot() -> [Key: (tx: Int, rx: Int)] {
        var out: [Key: (tx: Int, rx: Int)] = [:]
        for line in (readSmallFile("/proc/net/tcp") ?? "").split(separator: "\n").dropFirst() {
            // sl local_address rem_address st tx_queue:rx_queue ...
            let fields = line.split(separator: " ")
            guard fields.count > 4, fields[3] == "01" else { continue }  // ESTABLISHED only
            let queues = fields[4].split(separator: ":")
            guard let local = fields[1].split(separator: ":").last.flatMap({ Int($0, radix: 16) }),
                let remote = fields[2].split(separator: ":").last.flatMap({ Int($0, radix: 16) }),
                queues.count == 2, let tx = Int(queues[0], radix: 16), let rx = Int(queues[1], radix: 16)
            else { continue }
            out[Key(local: local, remote: remote)] = (tx, rx)
        }
        return out
    }

    /// The bytes queued (both directions' queues) on the sockets of the
    /// given connections, each named by one end's (local, remote) ports: its
    /// peer socket is counted too. nil if a socket is not in the table.
    static func queued(_ connections: [(local: Int, remote: Int)]) -> Int? {
        let table = snapshot()
        var total = 0
        for c in connections {
            for key in [Key(local: c.local, remote: c.remote), Key(local: c.remote, remote: c.local)] {
                guard let q = table[key] else { return nil }
                total += q.tx + q.rx
            }
        }
        return total
    }
}
