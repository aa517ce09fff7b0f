import Foundation
import HappyPathCore
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// An upstream head with ambiguous framing must not only fail the try: the
/// connection it came on must never carry another request, because the
/// upstream and the proxy may disagree on where that response ends.
@Suite struct UpstreamConnectionDropTests {
    @Test func aRefusedHeadClosesItsUpstreamConnection() throws {
        // First answer: CL and TE together (a complete chunked body, so a
        // lenient client could keep the connection); then a good one.
        let ambiguous = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        let good = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngood"
        let upstream = KeepAliveUpstream(responses: [ambiguous, good])
        defer { upstream.stop() }
        let h = try ProxyHarness(
            ProxyHarness.single(
                upstream: "http://127.0.0.1:\(upstream.port)",
                defaults: "{ reachability: { park_for: 0s }, retry: { attempts: 2, backoff: { base: 1ms, max: 1ms } } }"))
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status == 200)
        #expect(r.text == "good")
        #expect(r.header("X-Happypath-Attempts") == "2")
        // The retry could not reuse the first connection: it was closed.
        #expect(upstream.appConnections == 2)
    }
}

/// A raw upstream that keeps each connection open and answers every request
/// on it with the next canned response; it counts the connections that
/// carried application requests (health checks aside).
private final class KeepAliveUpstream: @unchecked Sendable {
    let port: Int
    private let listenFD: Int32
    private let responses: [String]
    private let state = Locked<(served: Int, connections: Int)>((0, 0))

    init(responses: [String]) {
        self.responses = responses
        listenFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        port = bindLoopback(listenFD)
        listen(listenFD, 64)
        let fd = listenFD
        let stopped = self.stopped
        Thread { [self] in
            // Closed here, once out of accept (see ScriptedUpstream.stop).
            defer { Glibc.close(fd) }
            while true {
                let c = accept(fd, nil, nil)
                if c < 0 { return }
                if stopped.withLock({ $0 }) {
                    Glibc.close(c)
                    return
                }
                Thread { [self] in serve(c) }.start()
            }
        }.start()
    }

    private let stopped = Locked(false)

    var appConnections: Int { state.withLock { $0.connections } }

    func stop() {
        guard !stopped.withLock({ s in defer { s = true }; return s }) else { return }
        shutdown(listenFD, Int32(SHUT_RDWR))
    }

    private func serve(_ fd: Int32) {
        defer { Glibc.close(fd) }
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        var counted = false
        while true {
            // One request head (the proxy's GETs carry no body).
            while data.firstRange(of: [13, 10, 13, 10]) == nil {
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return }
                data += chunk[0..<n]
            }
            let end = data.firstRange(of: [13, 10, 13, 10])!.upperBound
            let head = String(decoding: data[..<end], as: UTF8.self)
            data.removeFirst(end)
            let response: String
            if head.contains("happypath-health-check") {
                response = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
            } else {
                response = state.withLock { s in
                    if !counted { s.connections += 1 }
                    s.served += 1
                    return responses[min(s.served - 1, responses.count - 1)]
                }
                counted = true
            }
            let sent = Array(response.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent <= 0 { return }
        }
    }
}
