import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 18's rules between the edge and routing, through the real proxy
/// on loopback with raw bytes: paths normalized before routing, an
/// HTTP/0.9 line refused at once, TRACE not forwarded.
@Suite("edge hardening") struct EdgeHardeningTests {
    /// The issue's own example: `path_prefix: /public/`, `strip_prefix:
    /// /public` and an endpoint with a base path.
    static func config(upstream: Int, extra: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        \(extra)
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          u:
            endpoints: [http://127.0.0.1:\(upstream)/base]
        routes:
          - match: { path_prefix: /public/ }
            upstream: u
            strip_prefix: /public
          - match: { path_prefix: /pub }
            upstream: u
            strip_prefix: /pub
          - match: { path_prefix: /traced/ }
            upstream: u
            allow_trace: true
          - match: { path_prefix: /, methods: [GET, POST, TRACE] }
            upstream: u
        """
    }

    /// The request line each request reached the upstream with.
    static func upstreamLines(_ upstream: ScriptedUpstream) -> [String] {
        upstream.appRequests.map { $0.head.components(separatedBy: "\r\n")[0] }
    }

    static func raw(_ port: Int, _ head: String) throws -> TestResponse {
        let c = try TestConnection(port: port)
        try c.send(head)
        return try c.readResponse()
    }

    @Test(arguments: [
        ("/public/a/./b/../c?q=/../x", "/base/a/c?q=/../x"),
        ("/public/%2e%2e/secret", "/base/secret"),
        ("/public/.%2E/x/%2e/y", "/base/x/y"),
        ("/public/%41b%63", "/base/Abc"),
        ("/public/a%2Fb", "/base/a%2Fb"),
        ("/public//x", "/base//x"),
        ("http://elsewhere/public/x/../y", "/base/y"),
    ])
    func upstreamReceivesTheNormalizedPath(target: String, expected: String) throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "GET \(target) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(r.status == 200)
        #expect(Self.upstreamLines(upstream) == ["GET \(expected) HTTP/1.1"])
    }

    @Test(arguments: [
        ("/public/../../secret", "path_above_root"),
        ("/public/%2e%2e/%2e%2e/secret", "path_above_root"),
        ("/../x", "path_above_root"),
        ("/public/a%zz", "bad_percent_encoding"),
        // strip_prefix /pub ends inside the segment "pub..": the upstream would get /../x.
        ("/pub../x", nil),
        ("/pub./x", nil),
    ])
    func pathsThatWouldClimbAreRefusedAndNeverForwarded(target: String, reason: String?) throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "GET \(target) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(r.status == 400)
        #expect(r.json["code"] as? String == "BAD_REQUEST")
        #expect(r.header("Content-Type") == "application/problem+json")
        #expect(Self.upstreamLines(upstream).isEmpty)
        if let reason {
            let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
            #expect(metrics.contains("happypath_requests_refused_total{reason=\"\(reason)\",status=\"400\"} 1"))
        }
    }

    @Test func mergeSlashesAndRejectedEncodedSlashesAreTheOperatorsChoice() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(
            Self.config(
                upstream: upstream.port,
                extra: "normalize: { merge_slashes: true }\nlimits: { encoded_slashes: reject }"))
        defer { h.stop(); upstream.stop() }
        #expect(try Self.raw(h.port, "GET /public//a///b HTTP/1.1\r\nHost: x\r\n\r\n").status == 200)
        for target in ["/public/a%2Fb", "/public/a%5cb", "/public/a\\b"] {
            let r = try Self.raw(h.port, "GET \(target) HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(r.status == 400, "\(target)")
            #expect((r.json["detail"] as? String)?.contains("limits.encoded_slashes") == true, "\(target)")
        }
        #expect(Self.upstreamLines(upstream) == ["GET /base/a/b HTTP/1.1"])
    }

    /// `GET /p` with no version is HTTP/0.9: 400 as soon as the line ends,
    /// not a 408 after client_timeout (30 s here; the socket gives up at 10 s).
    @Test func anHTTP09RequestLineIsRefusedAtOnce() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let c = try TestConnection(port: h.port)
        try c.send("GET /p\r\n")
        let r = try c.readResponse()
        #expect(r.status == 400)
        #expect(r.json["code"] as? String == "BAD_REQUEST")
        #expect(c.closedByPeer())
        #expect(upstream.appRequests.isEmpty)
    }

    @Test func traceIsNotForwardedUnlessTheRouteAllowsIt() throws {
        let upstream = ScriptedUpstream(response: http(200, "echo")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let refused = try Self.raw(
            h.port, "TRACE /x HTTP/1.1\r\nHost: x\r\nCookie: session=s3cret\r\nAuthorization: Bearer t0ken\r\n\r\n")
        #expect(refused.status == 405)
        #expect(refused.json["code"] as? String == "METHOD_NOT_ALLOWED")
        #expect(refused.header("Allow") == "GET, POST")
        #expect(!refused.text.contains("s3cret") && !refused.text.contains("t0ken"))
        #expect(upstream.appRequests.isEmpty)

        let allowed = try Self.raw(h.port, "TRACE /traced/x HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(allowed.status == 200)
        #expect(Self.upstreamLines(upstream) == ["TRACE /base/traced/x HTTP/1.1"])
    }

    // MARK: - A response that breaks before its first body byte

    static let headThenClose = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-From: first\r\n\r\n"
    static let badFirstChunk = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nhello\r\n0\r\n\r\n"

    /// The head arrived, then the upstream closed: nothing reached the
    /// client, so it is a failed try; GET is retried and the second try's
    /// answer is the client's, with none of the first one's headers.
    @Test(arguments: [headThenClose, badFirstChunk])
    func aResponseThatBreaksBeforeItsBodyIsRetried(broken: String) throws {
        let upstream = ScriptedUpstream(responses: [broken, http(200, "fine")]).started()
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(r.status == 200)
        #expect(r.text == "fine")
        #expect(r.header("X-From") == nil)
        #expect(r.header("X-Happypath-Attempts") == "2")
        #expect(upstream.appRequests.count == 2)
    }

    /// Every try breaks the same way: the client gets the usual problem
    /// (502 BAD_GATEWAY), not zero bytes and a close, and the connection stays usable.
    @Test func aResponseThatAlwaysBreaksBeforeItsBodyIsABadGateway() throws {
        let upstream = ScriptedUpstream(response: Self.headThenClose).started()
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        defer { h.stop(); upstream.stop() }
        let c = try TestConnection(port: h.port)
        try c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 502)
        #expect(r.json["code"] as? String == "BAD_GATEWAY")
        #expect(r.json["attempts"] as? Int == 3)
        #expect((r.json["detail"] as? String)?.contains("broke off after its head") == true, "\(r.text)")
        #expect(r.header("X-From") == nil)
        try c.send("GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
        // The same connection answers again (by now the breaker may be open: 503 CIRCUIT_OPEN).
        let again = try c.readResponse()
        #expect(again.header("Content-Type") == "application/problem+json", "\(again.status) \(again.text)")
    }

    /// A POST without an Idempotency-Key is not sent twice: one try, then the problem.
    @Test func aBrokenResponseToAPostIsNotRetried() throws {
        let upstream = ScriptedUpstream(responses: [Self.headThenClose, http(200, "fine")]).started()
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        #expect(r.status == 502)
        #expect(r.json["code"] as? String == "BAD_GATEWAY")
        #expect(upstream.appRequests.count == 1)
    }

    // MARK: - From the outside review

    /// A field line that starts with "HTTP/" is a bad field, never a second
    /// status line that would swap the held 401 for a 200.
    @Test func aStatusLineInsideAHeadIsRefusedNotBelieved() throws {
        let upstream = ScriptedUpstream(
            response: "HTTP/1.1 401 No\r\nWWW-Authenticate: Basic\r\nHTTP/1.1 200 OK: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nfinal"
        ).started()
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(r.status == 502)
        #expect(r.json["code"] as? String == "BAD_GATEWAY")
        #expect(!r.text.contains("final"))
    }

    /// A coding other than chunked would reach the client undeclared.
    @Test func aTransferCodingOtherThanChunkedIsABadGateway() throws {
        let upstream = ScriptedUpstream(
            response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n2\r\nzz\r\n0\r\n\r\n"
        ).started()
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(r.status == 502)
    }

    /// An error answer whose body breaks off after its head is a bad gateway too.
    @Test func aHeldErrorThatBreaksOffIsABadGateway() throws {
        let upstream = ScriptedUpstream(response: "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\n").started()
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        #expect(r.status == 502)
        #expect((r.json["detail"] as? String)?.contains("broke off after its head") == true, "\(r.text)")
    }

    @Test(arguments: ["trace", "Trace", "TRACK"])
    func traceInAnyCaseAndTrackAreNotForwarded(method: String) throws {
        let upstream = ScriptedUpstream(response: http(200, "echo")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "\(method) /public/x HTTP/1.1\r\nHost: x\r\nCookie: s=1\r\n\r\n")
        #expect(r.status == 405)
        #expect(upstream.appRequests.isEmpty)
    }

    /// `..;` is `..` to a servlet container: refused, never forwarded.
    @Test(arguments: ["/public/..;/x", "/pub..;/x", "/public/%2e%2e;jsessionid=1/x"])
    func aDotSegmentWithParametersIsRefused(target: String) throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try Self.raw(h.port, "GET \(target) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(r.status == 400)
        #expect(upstream.appRequests.isEmpty)
    }
}
