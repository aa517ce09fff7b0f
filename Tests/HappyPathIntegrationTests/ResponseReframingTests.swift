import Foundation
import Testing

/// An upstream response as raw text, named for the test report.
struct UpstreamAnswer: Sendable, CustomTestStringConvertible {
    let name: String
    let raw: String
    /// For accepted answers: the body the client must get, and the length
    /// the proxy must announce (nil: chunked, by the proxy).
    var body = ""
    var length: Int?
    var testDescription: String { name }
}

/// The proxy writes the client's framing itself: an upstream head that could
/// be framed two ways fails the try (502), and accepted bodies arrive intact
/// with exactly one framing header, the proxy's.
@Suite("response re-framing") struct ResponseReframingTests {
    static let oneTry = "{ reachability: { park_for: 0s }, retry: { attempts: 1 } }"
    static let second = http(200, "second")

    static let invalid: [UpstreamAnswer] = [
        UpstreamAnswer(
            name: "Content-Length and Transfer-Encoding",
            raw:
                "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ),
        UpstreamAnswer(
            name: "Transfer-Encoding then Content-Length",
            raw:
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ),
        UpstreamAnswer(
            name: "a 404 with Content-Length and Transfer-Encoding",
            raw:
                "HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        ),
        UpstreamAnswer(
            name: "two different Content-Lengths",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello!"),
        UpstreamAnswer(
            name: "a Content-Length list that differs",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\nConnection: close\r\n\r\nhello!"),
        UpstreamAnswer(
            name: "a Content-Length that is not a number",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 5x\r\nConnection: close\r\n\r\nhello"),
        UpstreamAnswer(name: "status 2000", raw: "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"),
        UpstreamAnswer(name: "status 99", raw: "HTTP/1.1 99 X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"),
        UpstreamAnswer(
            name: "a bare CR in a value",
            raw: "HTTP/1.1 200 OK\r\nX-A: 1\rX-Injected: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"),
        UpstreamAnswer(
            name: "a header name that is not a token",
            raw: "HTTP/1.1 200 OK\r\nX A: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"),
        UpstreamAnswer(
            name: "a control byte in a value",
            raw: "HTTP/1.1 200 OK\r\nX-A: 1\u{01}2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"),
    ]

    @Test(arguments: invalid)
    func ambiguousOrInvalidHeadIsBadGateway(_ answer: UpstreamAnswer) throws {
        let (h, up) = try Edge.scripted([answer.raw, Self.second], defaults: Self.oneTry)
        let c = try TestConnection(port: h.port)
        try c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 502)
        #expect(r.json["code"] as? String == "BAD_GATEWAY")
        #expect(r.header("Content-Type") == "application/problem+json")
        #expect(r.header("X-Injected") == nil)
        #expect(r.header("X-A") == nil)
        #expect(Edge.count(r, "Content-Length") == 1)
        #expect(Edge.count(r, "Transfer-Encoding") == 0)
        // The client connection was not desynchronized: the next request on it works.
        try c.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        let next = try c.readResponse()
        #expect(next.status == 200)
        #expect(next.text == "second")
        #expect(up.appRequests.count == 2)  // one try each: retry.attempts is 1
    }

    static let bigChunks = (0..<100).map { i in String(repeating: Character(UnicodeScalar(UInt8(97 + i % 26))), count: 1000) }

    static let accepted: [UpstreamAnswer] = [
        UpstreamAnswer(
            name: "chunked",
            raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
            body: "hello world", length: nil),
        UpstreamAnswer(
            name: "chunked with trailers",
            raw:
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\nX-Up: 1\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n",
            body: "abc", length: nil),
        UpstreamAnswer(
            name: "chunked, 100 KB in 100 chunks",
            raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n"
                + bigChunks.map { "3e8\r\n" + $0 + "\r\n" }.joined() + "0\r\n\r\n",
            body: bigChunks.joined(), length: nil),
        UpstreamAnswer(
            name: "close-delimited",
            raw: "HTTP/1.1 200 OK\r\nConnection: close\r\nX-Up: 1\r\n\r\n" + String(repeating: "z", count: 3000),
            body: String(repeating: "z", count: 3000), length: nil),
        UpstreamAnswer(
            name: "Content-Length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Up: 1\r\nConnection: close\r\n\r\nabc",
            body: "abc",
            length: 3),
        UpstreamAnswer(
            name: "identical Content-Lengths",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3, 3\r\nX-Up: 1\r\nConnection: close\r\n\r\nabc",
            body: "abc",
            length: 3),
        UpstreamAnswer(
            name: "Connection names a field",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nX-Up: 1\r\n\r\nabc",
            body: "abc",
            length: 3),
    ]

    @Test(arguments: accepted)
    func bodyArrivesInTheProxysFraming(_ answer: UpstreamAnswer) throws {
        let (h, up) = try Edge.scripted([answer.raw, Self.second], defaults: Self.oneTry)
        let c = try TestConnection(port: h.port)
        try c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.text == answer.body)
        #expect(Edge.count(r, "X-Up") == 1)
        #expect(Edge.count(r, "X-Trailer") == 0)
        #expect(Edge.count(r, "X-Hop") == 0)
        #expect(Edge.count(r, "Connection") == 0)  // the upstream's hop-by-hop fields stay there
        if let length = answer.length {
            #expect(r.headers.filter { $0.name.lowercased() == "content-length" }.map(\.value) == [String(length)])
            #expect(Edge.count(r, "Transfer-Encoding") == 0)
        } else {
            #expect(r.headers.filter { $0.name.lowercased() == "transfer-encoding" }.map(\.value) == ["chunked"])
            #expect(Edge.count(r, "Content-Length") == 0)
        }
        // Keep-alive survives the re-framed response.
        try c.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        let next = try c.readResponse()
        #expect(next.status == 200)
        #expect(next.text == "second")
        #expect(up.appRequests.count == 2)
    }
}
