import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// One request the strict edge must refuse, as raw bytes.
struct EdgeRefusal: Sendable, CustomTestStringConvertible {
    let name: String
    let bytes: [UInt8]
    let status: Int
    let code: String
    /// The `reason` label of `happypath_requests_refused_total`.
    let reason: String
    /// A request hidden in the body that a lenient reader would forward.
    let smuggled: String?

    init(_ name: String, _ text: String, _ status: Int, _ code: String, _ reason: String, smuggled: String? = nil) {
        self.init(name, Array(text.utf8), status, code, reason, smuggled: smuggled)
    }

    init(_ name: String, _ bytes: [UInt8], _ status: Int, _ code: String, _ reason: String, smuggled: String? = nil) {
        self.name = name
        self.bytes = bytes
        self.status = status
        self.code = code
        self.reason = reason
        self.smuggled = smuggled
    }

    var testDescription: String { name }

    static let hidden = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

    static let all: [EdgeRefusal] = [
        // Framing: anything two readers could frame differently.
        EdgeRefusal(
            "TE with a space before the colon, and CL",
            "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: \(5 + hidden.utf8.count)\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"
                + hidden, 400, "BAD_REQUEST", "whitespace_before_colon", smuggled: "/smuggled"),
        EdgeRefusal(
            "CL then TE",
            "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden,
            400, "BAD_REQUEST", "content_length_with_transfer_encoding", smuggled: "/smuggled"),
        EdgeRefusal(
            "TE then CL",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: \(5 + hidden.utf8.count)\r\n\r\n0\r\n\r\n"
                + hidden, 400, "BAD_REQUEST", "content_length_with_transfer_encoding", smuggled: "/smuggled"),
        EdgeRefusal(
            "two different Content-Lengths",
            "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: \(hidden.utf8.count)\r\n\r\n" + hidden, 400,
            "BAD_REQUEST", "conflicting_content_length", smuggled: "/smuggled"),
        EdgeRefusal(
            "differing Content-Length list",
            "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0, \(hidden.utf8.count)\r\n\r\n" + hidden,
            400, "BAD_REQUEST", "conflicting_content_length", smuggled: "/smuggled"),
        EdgeRefusal(
            "Content-Length: +5", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello", 400, "BAD_REQUEST",
            "bad_content_length"),
        EdgeRefusal(
            "Content-Length: 0x5", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\nhello", 400, "BAD_REQUEST",
            "bad_content_length"),
        EdgeRefusal(
            "Transfer-Encoding: xchunked", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + hidden,
            400, "BAD_REQUEST", "chunked_not_final", smuggled: "/smuggled"),
        EdgeRefusal(
            "Transfer-Encoding: gzip", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n" + hidden, 400,
            "BAD_REQUEST", "chunked_not_final", smuggled: "/smuggled"),
        EdgeRefusal(
            "Transfer-Encoding: chunked, chunked",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400, "BAD_REQUEST",
            "chunked_not_final"),
        EdgeRefusal(
            "Transfer-Encoding: gzip, chunked",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501, "NOT_IMPLEMENTED",
            "unsupported_transfer_coding"),
        EdgeRefusal(
            "Transfer-Encoding on HTTP/1.0", "POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden, 400,
            "BAD_REQUEST", "transfer_encoding_on_http10", smuggled: "/smuggled"),
        // Request line.
        EdgeRefusal(
            "CR inside the request line", "GET /a\rX-Injected: 1 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "BAD_REQUEST", "bare_cr"),
        EdgeRefusal("target with a space", "GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400, "BAD_REQUEST", "bad_request_line"),
        EdgeRefusal("target with a tab", "GET /a\tb HTTP/1.1\r\nHost: x\r\n\r\n", 400, "BAD_REQUEST", "bad_target"),
        EdgeRefusal(
            "target with NUL", Array("GET /a".utf8) + [0] + Array("b HTTP/1.1\r\nHost: x\r\n\r\n".utf8), 400, "BAD_REQUEST",
            "bad_target"),
        EdgeRefusal(
            "CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 400, "BAD_REQUEST", "connect_method"),
        EdgeRefusal(
            "authority-form", "GET example.com:80 HTTP/1.1\r\nHost: example.com\r\n\r\n", 400, "BAD_REQUEST", "authority_form"),
        EdgeRefusal("asterisk-form with GET", "GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "BAD_REQUEST", "asterisk_form"),
        EdgeRefusal(
            "HTTP/2.0 request line", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "VERSION_NOT_SUPPORTED", "unsupported_version"),
        EdgeRefusal(
            "request line over the limit", "GET /" + String(repeating: "a", count: 9000) + " HTTP/1.1\r\nHost: x\r\n\r\n", 414,
            "URI_TOO_LONG", "request_line_too_long"),
        // Host.
        EdgeRefusal("missing Host on HTTP/1.1", "GET /a HTTP/1.1\r\nX-A: 1\r\n\r\n", 400, "BAD_REQUEST", "missing_host"),
        EdgeRefusal("two Host headers", "GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "BAD_REQUEST", "repeated_host"),
        EdgeRefusal("Host: bad/host", "GET /a HTTP/1.1\r\nHost: bad/host\r\n\r\n", 400, "BAD_REQUEST", "invalid_host"),
        // Field lines.
        EdgeRefusal("obs-fold", "GET /a HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", 400, "BAD_REQUEST", "obs_fold"),
        EdgeRefusal(
            "NUL in a value", Array("GET /a HTTP/1.1\r\nHost: x\r\nX-A: 1".utf8) + [0] + Array("2\r\n\r\n".utf8), 400,
            "BAD_REQUEST",
            "bad_field_value"),
        EdgeRefusal("bare LF line endings", "GET /a HTTP/1.1\nHost: x\n\n", 400, "BAD_REQUEST", "bare_lf"),
        EdgeRefusal(
            "whitespace before the first field", "GET /a HTTP/1.1\r\n Host: x\r\n\r\n", 400, "BAD_REQUEST",
            "whitespace_before_first_field"),
        // Chunked body.
        EdgeRefusal(
            "chunk size overflow",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n" + hidden, 400, "BAD_REQUEST",
            "bad_chunk_size", smuggled: "/smuggled"),
        EdgeRefusal(
            "chunk extension without a name",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;\r\nhello\r\n0\r\n\r\n",
            400, "BAD_REQUEST", "bad_chunk_extension"),
        EdgeRefusal(
            "chunk extension with an open quote",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\"b\r\nhello\r\n0\r\n\r\n", 400, "BAD_REQUEST",
            "bad_chunk_extension"),
        EdgeRefusal(
            "no CRLF after chunk data",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n0\r\n\r\n" + hidden, 400,
            "BAD_REQUEST",
            "missing_chunk_crlf", smuggled: "/smuggled"),
    ]
}

/// The strict RFC 9112 edge, end to end: refused requests never reach the
/// upstream; accepted ones reach it normalized.
@Suite("edge parser") struct EdgeParserTests {
    static let ok = http(200, "ok")

    @Test(arguments: EdgeRefusal.all)
    func refusedAndNeverForwarded(_ refusal: EdgeRefusal) throws {
        let (h, up) = try Edge.scripted([Self.ok])
        let c = try TestConnection(port: h.port)
        try c.send(refusal.bytes)
        let r = try c.readResponse()
        #expect(r.status == refusal.status)
        #expect(r.header("Content-Type") == "application/problem+json")
        #expect(r.json["code"] as? String == refusal.code)
        #expect(r.json["status"] as? Int == refusal.status)
        #expect(r.header("Connection") == "close")
        #expect(c.closedByPeer())
        #expect(up.appRequests.isEmpty)

        // A request on a fresh connection goes through: once it has, the
        // upstream has seen exactly that one, nothing of the refused bytes.
        let sentinel = try HTTP.request(port: h.port, "/sentinel")
        #expect(sentinel.status == 200)
        let seen = up.appRequests.map { Edge.requestLine($0.head) }
        #expect(seen == ["GET /sentinel HTTP/1.1"])
        if let smuggled = refusal.smuggled {
            #expect(!seen.contains { $0.contains(smuggled) })
        }
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: refusal.reason, status: refusal.status) == 1)
    }

    @Test func refusalCounterMovesPerReason() throws {
        let (h, up) = try Edge.scripted([Self.ok])
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "obs_fold", status: 400) == 0)
        for expected in 1...2 {
            let c = try TestConnection(port: h.port)
            try c.send("GET /a HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\t2\r\n\r\n")
            #expect(try c.readResponse().status == 400)
            #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "obs_fold", status: 400) == Double(expected))
        }
        let c = try TestConnection(port: h.port)
        try c.send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
        #expect(try c.readResponse().status == 501)
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "unsupported_transfer_coding", status: 501) == 1)
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "obs_fold", status: 400) == 2)
        #expect(up.appRequests.isEmpty)
    }

    // MARK: - Accepted, normalized

    @Test func chunkedBodyGoesUpstreamWithContentLength() throws {
        let (h, up) = try Edge.scripted([Self.ok])
        let c = try TestConnection(port: h.port)
        try c.send(
            "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\n"
                + "5;name=val\r\nhello\r\n6;q=\"x y\";flag\r\n world\r\n0;last\r\nX-Trailer: t\r\nX-Other-Trailer: u\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.text == "ok")
        let seen = up.appRequests
        try #require(seen.count == 1)
        #expect(Edge.requestLine(seen[0].head) == "POST /up HTTP/1.1")
        #expect(String(decoding: seen[0].body, as: UTF8.self) == "hello world")
        #expect(Edge.values(seen[0].head, "Content-Length") == ["11"])
        let names = Edge.fields(seen[0].head).map(\.name)
        #expect(!names.contains("transfer-encoding"))
        #expect(!names.contains("trailer"))
        #expect(!names.contains("x-trailer"))
        #expect(!names.contains("x-other-trailer"))
    }

    @Test(arguments: [
        "Content-Length: 5\r\nContent-Length: 5\r\n", "Content-Length: 5, 5\r\n", "Content-Length: 5,5\r\nContent-Length: 5\r\n",
    ])
    func identicalContentLengthsBecomeOne(_ lines: String) throws {
        let (h, up) = try Edge.scripted([Self.ok])
        let c = try TestConnection(port: h.port)
        try c.send("POST /p HTTP/1.1\r\nHost: x\r\n" + lines + "\r\nhello")
        #expect(try c.readResponse().status == 200)
        let seen = up.appRequests
        try #require(seen.count == 1)
        #expect(Edge.values(seen[0].head, "Content-Length") == ["5"])
        #expect(String(decoding: seen[0].body, as: UTF8.self) == "hello")
    }

    static let prefixYAML = """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          u:
            endpoints: [{{UP}}]
        routes:
          - match: { path_prefix: /api/ }
            upstream: u
            strip_prefix: /api
          - match: { path_prefix: / }
            upstream: u
        """

    @Test(arguments: [
        ("http://example.com/p?q=1", "/p?q=1"),
        ("http://example.com/api/p?q=1", "/p?q=1"),
        ("HTTP://Example.COM:8080/api/x/y", "/x/y"),
        ("https://example.com/s", "/s"),
        ("http://example.com", "/"),
        ("http://example.com?q=1", "/?q=1"),
    ])
    func absoluteFormGoesUpstreamInOriginForm(_ target: String, _ expected: String) throws {
        let (h, up) = try Edge.harness(Self.prefixYAML, responses: [Self.ok])
        let c = try TestConnection(port: h.port)
        try c.send("GET \(target) HTTP/1.1\r\nHost: example.com\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        let seen = up.appRequests
        try #require(seen.count == 1)
        #expect(Edge.requestLine(seen[0].head) == "GET \(expected) HTTP/1.1")
    }

    @Test func connectionNominatedFieldsAreDropped() throws {
        let (h, up) = try Edge.scripted([Self.ok])
        let c = try TestConnection(port: h.port)
        try c.send("GET /p HTTP/1.1\r\nHost: x\r\nConnection: X-Secret,x-OTHER\r\nX-Secret: s\r\nX-Kept: k\r\nX-Other: o\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.header("Connection") == nil)  // no close token: kept alive
        // With close among the tokens, the nominated field is dropped all the same.
        try c.send("GET /q HTTP/1.1\r\nHost: x\r\nConnection: close, X-Secret\r\nX-Secret: s2\r\n\r\n")
        let second = try c.readResponse()
        #expect(second.status == 200)
        #expect(second.header("Connection") == "close")
        let seen = up.appRequests
        try #require(seen.count == 2)
        let names = Edge.fields(seen[0].head).map(\.name)
        #expect(!names.contains("x-other"))
        #expect(Edge.values(seen[0].head, "X-Kept") == ["k"])
        #expect(!seen[0].head.lowercased().contains("secret"))
        #expect(!seen[1].head.lowercased().contains("secret"))
    }

    /// RFC 9112 section 9.6: a server that sends `Connection: close` must
    /// close the connection after that response and must not process any
    /// further request on it.
    @Test(
        arguments: [
            "GET /p HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "GET /p HTTP/1.0\r\n\r\n",
            "GET /p HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
        ])
    func announcedCloseClosesTheConnection(_ request: String) throws {
        let (h, up) = try Edge.scripted([Self.ok])
        let c = try TestConnection(port: h.port, timeout: 3)
        // A second request pipelined behind the one that asks for close.
        try c.send(request + "GET /after-close HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.header("Connection") == "close")
        #expect(Edge.readToEnd(c) == [])  // closed, and nothing for the second request
        #expect(up.appRequests.map { Edge.requestLine($0.head) } == ["GET /p HTTP/1.1"])
    }

    @Test func optionsAsteriskIsAnsweredByTheProxy() throws {
        let (h, up) = try Edge.scripted([Self.ok])
        let c = try TestConnection(port: h.port)
        try c.send("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        let allow = try #require(r.header("Allow"))
        #expect(allow.contains("GET"))
        #expect(allow.contains("OPTIONS"))
        // The connection stays usable; the upstream saw only the next request.
        try c.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().text == "ok")
        #expect(up.appRequests.map { Edge.requestLine($0.head) } == ["GET /after HTTP/1.1"])
    }

    @Test func http10WithoutHostIsServed() throws {
        let (h, up) = try Edge.scripted([http(200, "one"), http(200, "two"), http(200, "three")])
        // Without keep-alive the answer says close (and the connection
        // closes: announcedCloseClosesTheConnection).
        let c = try TestConnection(port: h.port)
        try c.send("GET /p HTTP/1.0\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.text == "one")
        #expect(r.header("Connection") == "close")
        // With keep-alive it stays open for the next request.
        let k = try TestConnection(port: h.port)
        try k.send("GET /k1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        let first = try k.readResponse()
        #expect(first.text == "two")
        #expect(first.header("Connection")?.lowercased() == "keep-alive")
        try k.send("GET /k2 HTTP/1.0\r\n\r\n")
        let last = try k.readResponse()
        #expect(last.text == "three")
        #expect(last.header("Connection") == "close")
        #expect(up.appRequests.map { Edge.requestLine($0.head) } == ["GET /p HTTP/1.1", "GET /k1 HTTP/1.1", "GET /k2 HTTP/1.1"])
    }
}
