import Foundation

#if canImport(Glibc)
    import Glibc
#endif

struct TestError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// A parsed HTTP/1.1 response as a client saw it on the wire.
struct TestResponse {
    var status: Int
    var headers: [(name: String, value: String)]
    var body: [UInt8]
    /// The fields of a chunked body's trailer section, as they came.
    var trailers: [(name: String, value: String)] = []

    func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    var text: String { String(decoding: body, as: UTF8.self) }

    var json: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
    }
}

/// A blocking client socket on loopback with a receive timeout: the test's
/// view of the proxy, byte for byte, including malformed and partial input.
final class TestConnection {
    let fd: Int32
    private var buffer: [UInt8] = []

    /// - Parameter receiveBuffer: pins the socket's receive buffer (set
    ///   before connecting, so the window is sized for it), for tests that
    ///   count what the kernel holds for a client that does not read.
    /// - Parameter source: the local address to connect from (another
    ///   loopback address, 127.0.0.2, is another client to the proxy).
    init(
        port: Int, timeout: Double = 10, host: String = "127.0.0.1", receiveBuffer: Int32? = nil, source: String? = nil
    ) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestError("socket: \(errno)") }
        if let source, Self.withAddress(source, port: 0, { bind(fd, $0, $1) }) != 0 {
            Glibc.close(fd)
            throw TestError("bind to \(source): errno \(errno)")
        }
        var tv = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        guard Self.withAddress(host, port: port, { connect(fd, $0, $1) }) == 0 else {
            Glibc.close(fd)
            throw TestError("connect to \(port): errno \(errno)")
        }
    }

    /// Calls `body` (bind, connect) with `host:port` as an IPv4 socket address.
    private static func withAddress(
        _ host: String, port: Int, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32
    ) -> Int32 {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr(host)
        return withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
    }

    deinit { Glibc.close(fd) }

    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw TestError("send: errno \(errno)") }
            offset += n
        }
    }

    func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// Reads more bytes; false at end of stream.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n > 0 {
            buffer.append(contentsOf: chunk[0..<n])
            return true
        }
        if n == 0 { return false }
        if errno == EAGAIN || errno == EWOULDBLOCK { throw TestError("timed out waiting for the server") }
        return false  // ECONNRESET and friends: the peer is gone
    }

    private func readLine() throws -> String {
        while true {
            if let i = buffer.firstIndex(of: 0x0A) {
                let line = buffer[..<i]
                buffer.removeFirst(i + 1)
                return String(decoding: line.last == 0x0D ? line.dropLast() : line, as: UTF8.self)
            }
            guard try fill() else { throw TestError("connection closed mid-head") }
        }
    }

    private func readExactly(_ n: Int) throws -> [UInt8] {
        while buffer.count < n {
            guard try fill() else { throw TestError("connection closed after \(buffer.count) of \(n) body bytes") }
        }
        let out = Array(buffer[0..<n])
        buffer.removeFirst(n)
        return out
    }

    func readResponse(forHead: Bool = false) throws -> TestResponse {
        var statusLine = try readLine()
        var status = 0
        var headers: [(String, String)] = []
        while true {
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, let code = Int(parts[1]) else { throw TestError("bad status line '\(statusLine)'") }
            status = code
            headers = []
            while true {
                let line = try readLine()
                if line.isEmpty { break }
                guard let colon = line.firstIndex(of: ":") else { continue }
                headers.append(
                    (String(line[..<colon]), String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces)))
            }
            if status >= 200 { break }
            statusLine = try readLine()
        }
        var response = TestResponse(status: status, headers: headers, body: [])
        if forHead || status == 204 || status == 304 { return response }
        if let te = response.header("Transfer-Encoding"), te.lowercased().contains("chunked") {
            while true {
                let sizeLine = try readLine()
                guard let size = Int(sizeLine.split(separator: ";")[0], radix: 16) else { throw TestError("bad chunk size") }
                if size == 0 {
                    while case let line = try readLine(), !line.isEmpty {
                        guard let colon = line.firstIndex(of: ":") else { continue }
                        response.trailers.append(
                            (String(line[..<colon]), String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces)))
                    }
                    break
                }
                response.body += try readExactly(size)
                _ = try readLine()
            }
        } else if let length = response.header("Content-Length").flatMap({ Int($0) }) {
            response.body = try readExactly(length)
        } else {
            while try fill() {}
            response.body = buffer
            buffer = []
        }
        return response
    }

    /// True if the server closes (or resets) the connection before `seconds`.
    func closedByPeer() -> Bool { bytesUntilClosed() != nil }

    /// Reads until the peer closes, keeping nothing; the bytes that came
    /// (with those already buffered), or nil if it did not close in time.
    func bytesUntilClosed() -> Int? {
        var count = buffer.count
        buffer.removeAll()
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                count += n
                continue
            }
            if n < 0, errno == EAGAIN || errno == EWOULDBLOCK { return nil }
            return count  // closed, or reset: the peer is gone
        }
    }
}

enum HTTP {
    static func request(
        port: Int, _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil, timeout: Double = 10,
        host: String = "127.0.0.1"
    ) throws -> TestResponse {
        try request(port: port, "GET", target, headers: headers, body: body, timeout: timeout, host: host)
    }

    /// One request on a fresh connection.
    static func request(
        port: Int, _ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil,
        timeout: Double = 10, host: String = "127.0.0.1", source: String? = nil
    ) throws -> TestResponse {
        let connection = try TestConnection(port: port, timeout: timeout, host: host, source: source)
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try connection.send(Array(head.utf8) + (body ?? []))
        return try connection.readResponse(forHead: method == "HEAD")
    }
}

/// FNV-1a 64, as the demo upstream's /echo reports it.
func fnv1a(_ bytes: [UInt8]) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in bytes {
        hash ^= UInt64(byte)
        hash &*= 0x100_0000_01b3
    }
    return String(hash, radix: 16)
}

func randomBytes(_ n: Int) -> [UInt8] {
    var g = SystemRandomNumberGenerator()
    return (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
}

/// Binds `fd` to an ephemeral loopback port and returns the port (0 if the bind failed).
func bindLoopback(_ fd: Int32) -> Int {
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
    }
    return bound ? Int(UInt16(bigEndian: addr.sin_port)) : 0
}

/// The local port of a connected or bound socket.
func localPort(_ fd: Int32) -> Int {
    var addr = sockaddr_in()
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return Int(UInt16(bigEndian: addr.sin_port))
}

/// The remote port of a connected socket.
func peerPort(_ fd: Int32) -> Int {
    var addr = sockaddr_in()
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &len) } }
    return Int(UInt16(bigEndian: addr.sin_port))
}

/// A loopback port that refuses connections for as long as this object
/// lives: a TCP socket bound to it that never listens (on Linux, connect()
/// to a port bound but not listening gets ECONNREFUSED). SO_REUSEADDR
/// stays off, so no other socket can bind the port meanwhile, not even one
/// with SO_REUSEADDR, and ephemeral binds (port 0) skip it. A port that is
/// bound, closed and remembered instead may be taken by another test
/// before this one uses it. Keep the object until the test ends (for
/// instance in `ProxyHarness(holding:)`): its deinit frees the port.
final class RefusingPort: @unchecked Sendable {
    let port: Int
    private var fd: Int32

    init() {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        precondition(fd >= 0, "socket: errno \(errno)")
        port = bindLoopback(fd)
        precondition(port > 0, "bind: errno \(errno)")
    }

    var url: String { "http://127.0.0.1:\(port)" }

    /// Hands the bound socket to a server that will listen on it: the port
    /// stays reserved throughout, and this object no longer closes it.
    func takeSocket() -> Int32 {
        precondition(fd >= 0, "the socket was handed over already")
        defer { fd = -1 }
        return fd
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }
}

/// The `happypath` binary that `swift build --build-tests` put beside the test runner.
let happypathBinary = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    .appendingPathComponent("happypath").path

/// Polls `condition` until it holds or `seconds` pass: tests wait for what
/// they need, never for a fixed time. True if it held.
func eventually(_ seconds: Double = 5, _ condition: () throws -> Bool) rethrows -> Bool {
    let until = Date().addingTimeInterval(seconds)
    while Date() < until {
        if try condition() { return true }
        Thread.sleep(forTimeInterval: 0.01)
    }
    return try condition()
}

/// An IPv4 address of this machine that is not loopback (nil if it has
/// none): a client connecting to it is "remote" to a server on this machine.
func nonLoopbackIPv4() -> String? {
    var list: UnsafeMutablePointer<ifaddrs>?
    guard getifaddrs(&list) == 0 else { return nil }
    defer { freeifaddrs(list) }
    var next = list
    while let entry = next {
        defer { next = entry.pointee.ifa_next }
        guard let sa = entry.pointee.ifa_addr, sa.pointee.sa_family == sa_family_t(AF_INET) else { continue }
        let address = sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { String(cString: inet_ntoa($0.pointee.sin_addr)) }
        if !address.hasPrefix("127.") { return address }
    }
    return nil
}
