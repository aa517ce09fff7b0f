import Foundation
import Testing

/// Every failure the foundation can produce, as problem+json.
@Suite("errors") struct ProxyErrorTests {
    func expectProblem(
        _ r: TestResponse, status: Int, code: String, retryable: Bool, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(r.status == status, sourceLocation: sourceLocation)
        #expect(r.header("Content-Type") == "application/problem+json", sourceLocation: sourceLocation)
        let j = r.json
        #expect(j["code"] as? String == code, sourceLocation: sourceLocation)
        #expect(j["status"] as? Int == status, sourceLocation: sourceLocation)
        #expect(
            j["type"] as? String == "urn:happypath:error:" + code.lowercased().replacingOccurrences(of: "_", with: "-"),
            sourceLocation: sourceLocation)
        #expect((j["title"] as? String)?.isEmpty == false, sourceLocation: sourceLocation)
        #expect(j["retryable"] as? Bool == retryable, sourceLocation: sourceLocation)
        #expect((j["request_id"] as? String)?.isEmpty == false, sourceLocation: sourceLocation)
        #expect(r.header("X-Request-Id") == j["request_id"] as? String, sourceLocation: sourceLocation)
    }

    @Test func noRoute() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams: { demo: { endpoints: [{{DEMO}}] } }
            routes:
              - { match: { path_prefix: /api/, methods: [GET] }, upstream: demo }
            """)
        expectProblem(try HTTP.request(port: h.port, "/other"), status: 404, code: "NO_ROUTE", retryable: false)
        expectProblem(try HTTP.request(port: h.port, "DELETE", "/api/x"), status: 404, code: "NO_ROUTE", retryable: false)
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)
    }

    @Test func oversizedBody() throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, "POST", "/echo", body: [UInt8](repeating: 7, count: 4 * 1024 * 1024 + 1))
        expectProblem(r, status: 413, code: "PAYLOAD_TOO_LARGE", retryable: false)
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)
    }

    @Test func oversizedHeaders() throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, "/ok", headers: [("X-Huge", String(repeating: "a", count: 9000))])
        expectProblem(r, status: 431, code: "HEADERS_TOO_LARGE", retryable: false)
        let many = (0..<40).map { ("X-Many-\($0)", String(repeating: "b", count: 300)) }
        expectProblem(
            try HTTP.request(port: h.port, "/ok", headers: many), status: 431, code: "HEADERS_TOO_LARGE", retryable: false)
    }

    /// Nothing parks (park_for 0s): a refused connection is retried, since
    /// the request never left (`connect-failure` in `retry.on`, the default).
    @Test func upstreamRefused() throws {
        let down = RefusingPort()
        let h = try ProxyHarness(ProxyHarness.single(upstream: down.url), holding: [down])
        let r = try HTTP.request(port: h.port, "/x")
        expectProblem(r, status: 503, code: "UPSTREAM_UNREACHABLE", retryable: true)
        #expect(r.json["upstream"] as? String == "u")
        #expect(r.json["attempts"] as? Int == 3)
    }

    /// Without `connect-failure` in `retry.on`, the first refusal is the answer.
    @Test func upstreamRefusedWithoutConnectFailureRetries() throws {
        let down = RefusingPort()
        let h = try ProxyHarness(
            ProxyHarness.single(upstream: down.url, defaults: "{ reachability: { park_for: 0s }, retry: { on: [503] } }"),
            holding: [down])
        let r = try HTTP.request(port: h.port, "/x")
        expectProblem(r, status: 503, code: "UPSTREAM_UNREACHABLE", retryable: true)
        #expect(r.json["attempts"] as? Int == 1)
    }

    @Test func upstreamTimeout() throws {
        let h = try ProxyHarness()
        let started = ContinuousClock.now
        let r = try HTTP.request(port: h.port, "/slow?ms=3000")
        expectProblem(r, status: 504, code: "UPSTREAM_TIMEOUT", retryable: true)
        // A bound on time, so not exact: cut, the answer comes about 0.3 s
        // in; uncut, not before 3 s. 2.5 leaves a loaded machine room.
        #expect(seconds(since: started) < 2.5, "the 300ms route deadline must cut the 3s call")
    }

    @Test func garbageUpstreamResponse() throws {
        let h = try ProxyHarness()
        expectProblem(try HTTP.request(port: h.port, "/garbage"), status: 502, code: "BAD_GATEWAY", retryable: true)
        let scripted = ScriptedUpstream(response: "HTTP/1.1 abc nonsense\r\n\r\n").started()
        defer { scripted.stop() }
        let h2 = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(scripted.port)"))
        expectProblem(try HTTP.request(port: h2.port, "/x"), status: 502, code: "BAD_GATEWAY", retryable: true)
    }

    @Test func upstreamDropsConnectionOnEveryTry() throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, "/drop")
        expectProblem(r, status: 503, code: "UPSTREAM_UNAVAILABLE", retryable: true)
        #expect(r.json["attempts"] as? Int == 3)
        #expect((r.json["detail"] as? String)?.hasPrefix("3 attempts failed: connection reset") == true)
        #expect(r.header("X-Happypath-Attempts") == "3")
    }

    @Test func truncatedUpstreamBodyBreaksTheClientConnection() throws {
        let scripted = ScriptedUpstream(response: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-twenty-bytes...").started()
        defer { scripted.stop() }
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(scripted.port)"))
        let c = try TestConnection(port: h.port)
        try c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(throws: (any Error).self) { _ = try c.readResponse() }
    }

    @Test func acceptJSONGetsTheSameBodyAsApplicationJSON() throws {
        let down = RefusingPort()
        let h = try ProxyHarness(ProxyHarness.single(upstream: down.url), holding: [down])
        let r = try HTTP.request(port: h.port, "/x", headers: [("Accept", "application/json")])
        #expect(r.header("Content-Type") == "application/json")
        #expect(r.json["code"] as? String == "UPSTREAM_UNREACHABLE")
    }

    @Test func malformedRequestGetsBadRequest() throws {
        let h = try ProxyHarness()
        let c = try TestConnection(port: h.port)
        try c.send("THIS IS NOT HTTP\r\n\r\n")
        let r = try c.readResponse()
        expectProblem(r, status: 400, code: "BAD_REQUEST", retryable: false)
    }
}
