import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 25: where a standard HTTP client relies on the proxy changing
/// nothing. Real proxy, scripted upstreams, raw bytes on both sides.
@Suite("transparency") struct TransparencyTests {
    static func config(upstream: Int, routeExtra: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          u:
            endpoints: [http://127.0.0.1:\(upstream)/base]
        routes:
          - match: { path_prefix: /public/ }
            upstream: u
            strip_prefix: /public
            \(routeExtra)
        """
    }

    /// Everything the proxy writes on a connection until it closes it.
    static func exchange(_ port: Int, _ request: String) throws -> String {
        let c = try TestConnection(port: port)
        try c.send(request)
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            out += chunk[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }

    // MARK: - 3. Empty fields

    @Test func emptyFieldsReachTheUpstreamAndComeBack() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok", headers: ["X-Empty-Back:", "X-Full: 1"])).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(
            port: h.port, "/public/x", headers: [("X-Empty", ""), ("X-Dup", "a"), ("X-Empty", ""), ("X-Dup", "b")])
        #expect(r.status == 200)
        let lines = try #require(upstream.appRequests.first).head.components(separatedBy: "\r\n")
        let sent = lines.filter { $0.hasPrefix("X-Empty") || $0.hasPrefix("X-Dup") }
        #expect(sent == ["X-Empty:", "X-Dup: a", "X-Empty:", "X-Dup: b"], "\(lines)")
        #expect(r.headers.contains { $0.name == "X-Empty-Back" && $0.value.isEmpty })
        #expect(r.header("X-Full") == "1")
    }

    // MARK: - 4. 1xx answers

    static let earlyHints =
        "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: x-drop\r\n\r\n"
        + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

    @Test func earlyHintsReachAnHTTP11Client() throws {
        let upstream = ScriptedUpstream(response: Self.earlyHints).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"), "\(wire)")
        #expect(!wire.contains("x-drop"))
        #expect(wire.hasSuffix("\r\n\r\nok"))
    }

    /// A 1xx has no body: its Content-Length is not forwarded.
    @Test func aForwarded1xxCarriesNoLength() throws {
        let upstream = ScriptedUpstream(
            response: "HTTP/1.1 103 Early\r\nContent-Length: 5\r\nLink: </c>\r\n\r\n" + http(200, "ok")
        ).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 103 Early Hints\r\nLink: </c>\r\n\r\nHTTP/1.1 200"), "\(wire)")
    }

    /// The proxy's own X-Request-Id and X-Happypath-Attempts are the only ones.
    @Test func theUpstreamsCopiesOfTheProxysFieldsAreDropped() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok", headers: ["X-Request-Id: upstream-id", "X-Happypath-Attempts: 99"]))
            .started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(port: h.port, "/public/x", headers: [("X-Request-Id", "client-id")])
        #expect(r.headers.filter { $0.name.lowercased() == "x-request-id" }.map(\.value) == ["client-id"])
        #expect(r.headers.filter { $0.name.lowercased() == "x-happypath-attempts" }.map(\.value) == ["1"])
    }

    @Test func noInformationalAnswerForAnHTTP10Client() throws {
        let upstream = ScriptedUpstream(response: Self.earlyHints).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.0\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(wire)")
        #expect(!wire.contains("103"))
    }

    /// A flood of 1xx answers: at most 8 reach the client, and the final answer still does.
    @Test func aFloodOfInformationalAnswersIsBounded() throws {
        let flood = String(repeating: "HTTP/1.1 102 Processing\r\n\r\n", count: 50)
        let upstream = ScriptedUpstream(response: flood + http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.components(separatedBy: "HTTP/1.1 102 Processing").count - 1 == 8)
        #expect(wire.hasSuffix("\r\n\r\nok"))
    }

    // MARK: - 5. Redirects

    @Test func aRedirectToTheEndpointPointsAtTheProxy() throws {
        // The Location names the upstream's own port, known only once it listens.
        let target = ScriptedUpstream(comingUpOnFreshPort: { port in
            http(302, "", headers: ["Location: http://127.0.0.1:\(port)/base/next?x=1", "Content-Location: http://127.0.0.1:\(port)/elsewhere"])
        }).started()
        let h = try ProxyHarness(Self.config(upstream: target.port))
        defer { h.stop(); target.stop() }
        let r = try HTTP.request(port: h.port, "/public/start", headers: [])
        #expect(r.status == 302)
        // A path on the proxy: no host or scheme taken from the request.
        #expect(r.header("Location") == "/public/next?x=1")
        // Outside the endpoint's base path: left alone.
        #expect(r.header("Content-Location") == "http://127.0.0.1:\(target.port)/elsewhere")
    }

    @Test func redirectsKeepLeavesThemAlone() throws {
        let target = ScriptedUpstream(comingUpOnFreshPort: { port in
            http(302, "", headers: ["Location: http://127.0.0.1:\(port)/base/next"])
        }).started()
        let h = try ProxyHarness(Self.config(upstream: target.port, routeExtra: "redirects: keep"))
        defer { h.stop(); target.stop() }
        let r = try HTTP.request(port: h.port, "/public/start")
        #expect(r.header("Location") == "http://127.0.0.1:\(target.port)/base/next")
    }

    // MARK: - 6. Reason phrases

    @Test func theUpstreamsReasonPhraseIsKept() throws {
        let upstream = ScriptedUpstream(response: "HTTP/1.1 200 Fine By Me\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 200 Fine By Me\r\n"), "\(wire)")
    }

    // MARK: - 1. A normalized error keeps the fields clients act on

    @Test func aNormalized401KeepsWWWAuthenticateAndCookies() throws {
        let upstream = ScriptedUpstream(
            response: http(
                401, "<html>no</html>",
                headers: [
                    "WWW-Authenticate: Basic realm=\"api\"", "Set-Cookie: a=1", "Set-Cookie: b=2", "Content-Type: text/html",
                    "ETag: \"v1\"", "Cache-Control: max-age=60", "X-Request-Id: upstream-id", "Vary: Authorization",
                ])
        ).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(port: h.port, "/public/x", headers: [("X-Request-Id", "client-id")])
        #expect(r.status == 401)
        #expect(r.json["code"] as? String == "CLIENT_ERROR")
        #expect(r.header("WWW-Authenticate") == "Basic realm=\"api\"")
        #expect(r.headers.filter { $0.name.lowercased() == "set-cookie" }.map(\.value) == ["a=1", "b=2"])
        #expect(r.header("Vary") == "Authorization")
        // What described the replaced body is gone; the proxy's own fields win.
        #expect(r.header("Content-Type") == "application/problem+json")
        #expect(r.header("ETag") == nil)
        #expect(r.headers.filter { $0.name.lowercased() == "cache-control" }.map(\.value) == ["no-store"])
        #expect(r.headers.filter { $0.name.lowercased() == "x-request-id" }.map(\.value) == ["client-id"])
    }

    /// A kept field is scrubbed like the body: an upstream that echoes the
    /// proxy's credential in a field of its error does not leak it.
    @Test func aKeptFieldThatEchoesTheCredentialIsScrubbed() throws {
        let upstream = ScriptedUpstream(
            response: http(400, "{}", headers: ["X-Echo: error=\"invalid\", got=\"k3y/echoed+in-a-field\""])
        ).started()
        let yaml = Self.config(upstream: upstream.port).replacingOccurrences(
            of: "    endpoints: [",
            with: "    auth: { kind: static, header: X-Api-Key, value: \"k3y/echoed+in-a-field\" }\n    endpoints: [")
        let h = try ProxyHarness(yaml)
        defer { h.stop(); upstream.stop() }
        let c = try TestConnection(port: h.port)
        try c.send("GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 400)
        #expect(r.header("X-Echo") == "error=\"invalid\", got=\"***\"")
        #expect(!r.headers.contains { $0.value.contains("k3y/echoed") })
        #expect(upstream.appRequests.first?.head.contains("X-Api-Key: k3y/echoed+in-a-field") == true)
    }

    @Test(arguments: [
        (405, "Allow: GET, HEAD", "Allow", "GET, HEAD"),
        (416, "Content-Range: bytes */1234", "Content-Range", "bytes */1234"),
        (404, "Content-Range: bytes */1234", "Content-Range", nil),
    ])
    func statusSpecificFieldsSurviveNormalizing(status: Int, line: String, name: String, expected: String?) throws {
        let upstream = ScriptedUpstream(response: http(status, "{}", headers: [line])).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(port: h.port, "/public/x")
        #expect(r.status == status)
        #expect(r.header(name) == expected)
        #expect(r.header("Content-Type") == "application/problem+json")
    }

    @Test func theProxysRetryAfterWinsOverTheUpstreams() throws {
        let upstream = ScriptedUpstream(response: http(503, "busy", headers: ["Retry-After: 7", "X-Shard: 3"])).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port, routeExtra: "retry: { attempts: 1 }"))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(port: h.port, "/public/x")
        #expect(r.status == 503)
        #expect(r.headers.filter { $0.name.lowercased() == "retry-after" }.map(\.value) == ["7"])
        #expect(r.header("X-Shard") == "3")
    }

    // MARK: - 2. upstream_errors: pass

    @Test func passModeSendsTheUpstreamsErrorUnchanged() throws {
        let upstream = ScriptedUpstream(
            response: "HTTP/1.1 402 Payment Required\r\nContent-Type: text/plain\r\nX-Custom: 1\r\nContent-Length: 6\r\nConnection: close\r\n\r\npay up"
        ).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port, routeExtra: "upstream_errors: pass"))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 402 Payment Required\r\n"), "\(wire)")
        #expect(wire.contains("\r\nContent-Type: text/plain\r\n"))
        #expect(wire.contains("\r\nX-Custom: 1\r\n"))
        #expect(wire.hasSuffix("\r\n\r\npay up"))
        #expect(upstream.appRequests.count == 1)
        // Counted just after the answer is written: wait for it.
        #expect(eventually { (try? HTTP.request(port: h.adminPort, "/metrics").text.contains("code=\"CLIENT_ERROR\"")) == true })
    }

    /// A status the retry rules act on is held, retried, and the last
    /// answer goes out whole (status, fields, body) when they give up.
    @Test func passModeStillRetriesThenSendsTheLastAnswerWhole() throws {
        let upstream = ScriptedUpstream(responses: [
            http(503, "first", headers: ["X-Try: 1"]), http(503, "second", headers: ["X-Try: 2"]),
            http(503, "{\"last\":true}", headers: ["X-Try: 3", "Content-Type: application/json", "Retry-After: 9"]),
        ]).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port, routeExtra: "upstream_errors: pass"))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(port: h.port, "/public/x")
        #expect(r.status == 503)
        #expect(r.text == "{\"last\":true}")
        #expect(r.header("X-Try") == "3")
        #expect(r.header("Content-Type") == "application/json")
        #expect(r.header("Retry-After") == "9")
        #expect(r.header("X-Happypath-Attempts") == "3")
        #expect(upstream.appRequests.count == 3)
    }

    /// Errors the proxy makes itself stay problem bodies in pass mode.
    @Test func passModeStillNormalizesTheProxysOwnErrors() throws {
        let down = RefusingPort()
        let h = try ProxyHarness(
            Self.config(upstream: down.port, routeExtra: "upstream_errors: pass"), holding: [down])
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "/public/x")
        #expect(r.status == 503)
        #expect(r.json["code"] as? String == "UPSTREAM_UNREACHABLE")
    }

    @Test func passModeIsInheritedFromTheUpstream() throws {
        let upstream = ScriptedUpstream(response: http(404, "plain not found", headers: ["Content-Type: text/plain"]))
            .started()
        let yaml = Self.config(upstream: upstream.port).replacingOccurrences(
            of: "    endpoints: [", with: "    upstream_errors: pass\n    endpoints: [")
        let h = try ProxyHarness(yaml)
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(port: h.port, "/public/x")
        #expect(r.status == 404)
        #expect(r.text == "plain not found")
    }
}
