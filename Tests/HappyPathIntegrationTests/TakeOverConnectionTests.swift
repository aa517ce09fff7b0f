import Foundation
import HappyPathCore
import HappyPathIO
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `HTTPRequest.takeOverConnection`: after it, the socket speaks whatever
/// its new owner speaks, and the HTTP server neither reads nor writes it.
@Suite struct TakeOverConnectionTests {
    /// Takes over `/switch`, answers HTTP to everything else. The
    /// taken socket goes to the test thread.
    final class Switcher: HTTPServerDelegate, @unchecked Sendable {
        let loop = EventLoop()
        var server: HTTPServer!
        let taken = Locked<Int32?>(nil)

        init() throws {
            server = try HTTPServer(
                loop: loop, host: "127.0.0.1", port: 0, reusePort: false,
                limits: HTTPServerLimits(maxHeaderBytes: 8192, maxBodyBytes: 1024, timeout: .seconds(30)), delegate: self)
            loop.start(name: "switcher")
        }

        func serve(_ request: HTTPRequest) {
            guard request.target == "/switch", let socket = request.takeOverConnection() else {
                return request.reply(status: 200, body: "http\n")
            }
            request.reply(status: 500, body: "must go nowhere")  // no longer HTTP: a no-op
            taken.withLock { $0 = socket }
        }

        func reject(_ request: HTTPRequest, reason: HTTP1Refusal) { request.reply(status: reason.status) }

        func stop() {
            loop.execute { [self] in
                server.close()
                loop.stop()
            }
            loop.join()
            loop.close()
        }
    }

    @Test func theTakenSocketCarriesAnotherProtocol() throws {
        let s = try Switcher()
        defer { s.stop() }
        let client = try TestConnection(port: s.server.port, timeout: 5)
        try client.send("GET /switch HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(eventually { s.taken.withLock { $0 } != nil })
        guard let socket = s.taken.withLock({ $0 }) else { return }
        defer { close(socket) }
        // Not HTTP from here on, both ways: the server parses none of it.
        try client.send("PING\n")
        var buffer = [UInt8](repeating: 0, count: 16)
        var got: [UInt8] = []
        #expect(
            eventually {
                let n = recv(socket, &buffer, buffer.count, 0)
                if n > 0 { got += buffer[0..<n] }
                return got == Array("PING\n".utf8)
            })
        _ = "PONG\n".withCString { write(socket, $0, 5) }
        #expect(try Edge.readRaw(client, 5) == Array("PONG\n".utf8))
        // The owner ends it, not the server.
        shutdown(socket, Int32(SHUT_WR))
        #expect(Edge.readToEnd(client) == [])
        // Other connections are still served as HTTP.
        #expect(try HTTP.request(port: s.server.port, "/other").text == "http\n")
    }
}
