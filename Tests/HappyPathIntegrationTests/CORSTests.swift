import Foundation
import HappyPathConfig
import Testing

/// Issue 49, first part: `cors:` on a route, through the real proxy. A
/// preflight is answered by the proxy and never reaches the upstream; every
/// answer to an allowed origin (the upstream's, and the proxy's own
/// problems) carries the CORS fields; HTTP/1.1 and HTTP/2 alike.
@Suite("CORS") struct CORSTests {
    static func yaml(upstream: Int) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: { reachability: { park_for: 0s }, retry: { attempts: 1 } }
        upstreams:
          u: { endpoints: [http://127.0.0.1:\(upstream)] }
        routes:
          - match: { path_prefix: /api/, methods: [GET, POST] }
            upstream: u
            cors: { allow_origins: [https://app.example.com], allow_headers: [X-Api-Key], max_age: 10m }
          - match: { path_prefix: /limited/ }
            upstream: u
            cors: { allow_origins: [https://app.example.com] }
            rate_limit: { rate: 1/m, burst: 1, over_limit: reject }
          - match: { path_prefix: / }
            upstream: u
        """
    }

    /// A request with a body refused at its head (a rate limit judges it
    /// before the body is read) carries the fields too: the browser can
    /// read its 429.
    @Test func aRefusalAtTheHeadCarriesTheFields() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.yaml(upstream: upstream.port))
        defer {
            h.stop()
            upstream.stop()
        }
        let first = try HTTP.request(port: h.port, "POST", "/limited/a", headers: [Self.origin], body: Array("x".utf8))
        #expect(first.status == 200)
        // A preflight, over HTTP/2 too (where a head with a body to come is judged before it is read), is never counted.
        let pre = try runProcess(
            "/usr/bin/curl",
            ["-sS", "--max-time", "10", "--http2-prior-knowledge", "-X", "OPTIONS", "-D", "-", "-o", "/dev/null",
             "-H", "Origin: https://app.example.com", "-H", "Access-Control-Request-Method: POST",
             "http://127.0.0.1:\(h.port)/limited/a"], timeout: 20)
        #expect(pre.out.hasPrefix("HTTP/2 204"), "\(pre.out)")
        let refused = try HTTP.request(port: h.port, "POST", "/limited/a", headers: [Self.origin], body: Array("x".utf8))
        #expect(refused.status == 429)
        #expect(refused.header("Access-Control-Allow-Origin") == "https://app.example.com", "\(refused.headers)")
    }

    static let origin = ("Origin", "https://app.example.com")

    @Test func aPreflightIsAnsweredHereAndNeverSentOn() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.yaml(upstream: upstream.port))
        defer {
            h.stop()
            upstream.stop()
        }
        let allowed = try HTTP.request(
            port: h.port, "OPTIONS", "/api/orders",
            headers: [Self.origin, ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", "x-api-key, content-type")])
        #expect(allowed.status == 204)
        #expect(allowed.header("Access-Control-Allow-Origin") == "https://app.example.com")
        #expect(allowed.header("Access-Control-Allow-Methods") == "GET, POST")
        #expect(allowed.header("Access-Control-Allow-Headers") == "x-api-key")
        #expect(allowed.header("Access-Control-Max-Age") == "600")
        // Another origin, a header not allowed: no CORS fields (the browser refuses).
        for headers in [
            [("Origin", "https://evil.example"), ("Access-Control-Request-Method", "POST")],
            [Self.origin, ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", "x-secret")],
        ] {
            let refused = try HTTP.request(port: h.port, "OPTIONS", "/api/orders", headers: headers)
            #expect(refused.status == 204, "\(headers)")
            #expect(refused.header("Access-Control-Allow-Origin") == nil, "\(headers)")
        }
        #expect(upstream.appRequests.isEmpty, "no preflight reached the upstream")
        // A method /api/ does not take is the catch-all route's: the preflight goes where the call would, without CORS fields.
        let other = try HTTP.request(
            port: h.port, "OPTIONS", "/api/orders", headers: [Self.origin, ("Access-Control-Request-Method", "DELETE")])
        #expect(other.status == 200)
        #expect(other.header("Access-Control-Allow-Origin") == nil)
        #expect(upstream.appRequests.count == 1)
        // A route without `cors`: an OPTIONS request goes to the upstream as before.
        let plain = try HTTP.request(
            port: h.port, "OPTIONS", "/other", headers: [Self.origin, ("Access-Control-Request-Method", "GET")])
        #expect(plain.status == 200)
        #expect(plain.header("Access-Control-Allow-Origin") == nil)
        #expect(upstream.appRequests.count == 2)
    }

    @Test func everyAnswerToAnAllowedOriginCarriesTheFields() throws {
        let upstream = ScriptedUpstream { head in
            head.contains("/api/fail") ? http(503, "down") : http(200, "ok")
        }.started()
        let h = try ProxyHarness(Self.yaml(upstream: upstream.port))
        defer {
            h.stop()
            upstream.stop()
        }
        let ok = try HTTP.request(port: h.port, "/api/x", headers: [Self.origin])
        #expect(ok.status == 200)
        #expect(ok.header("Access-Control-Allow-Origin") == "https://app.example.com")
        #expect(ok.header("Vary") == "Origin")
        // The proxy's own problem answer too, so the page can read the error.
        let failed = try HTTP.request(port: h.port, "/api/fail", headers: [Self.origin])
        #expect(failed.status == 503)
        #expect(failed.json["code"] as? String == "UPSTREAM_UNAVAILABLE")
        #expect(failed.header("Access-Control-Allow-Origin") == "https://app.example.com")
        // Another origin, or none: nothing.
        #expect(try HTTP.request(port: h.port, "/api/x", headers: [("Origin", "https://evil.example")]).header("Access-Control-Allow-Origin") == nil)
        #expect(try HTTP.request(port: h.port, "/api/x").header("Access-Control-Allow-Origin") == nil)
        // Over HTTP/2 (h2c), the same.
        let h2 = try runProcess(
            "/usr/bin/curl",
            ["-sS", "--max-time", "10", "--http2-prior-knowledge", "-D", "-", "-o", "/dev/null", "-H", "Origin: https://app.example.com",
             "http://127.0.0.1:\(h.port)/api/x"], timeout: 20)
        #expect(h2.out.hasPrefix("HTTP/2 200"), "\(h2.out)")
        #expect(h2.out.lowercased().contains("access-control-allow-origin: https://app.example.com"), "\(h2.out)")
        let pre = try runProcess(
            "/usr/bin/curl",
            ["-sS", "--max-time", "10", "--http2-prior-knowledge", "-X", "OPTIONS", "-D", "-", "-o", "/dev/null",
             "-H", "Origin: https://app.example.com", "-H", "Access-Control-Request-Method: POST",
             "http://127.0.0.1:\(h.port)/api/x"], timeout: 20)
        #expect(pre.out.hasPrefix("HTTP/2 204"), "\(pre.out)")
        #expect(pre.out.lowercased().contains("access-control-allow-methods: get, post"), "\(pre.out)")
    }
}
