import Foundation
import Testing

@Suite("auth") struct AuthTests {
    static let secret = "s3cr3t-value-never-logged"

    func harness(_ auth: AuthTestServer, log: CapturedLog = CapturedLog(), workers: Int = 2) throws -> ProxyHarness {
        try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { timeout: 5s, reachability: { park_for: 4s } }
            upstreams:
              api:
                endpoints: [http://127.0.0.1:\(auth.port)]
                auth:
                  kind: oauth2_client_credentials
                  token_url: http://127.0.0.1:\(auth.port)/token
                  client_id: proxy
                  client_secret: ${TEST_CLIENT_SECRET}
            routes: [ { match: { path_prefix: / }, upstream: api } ]
            """, workers: workers, logger: log.logger, environment: ["TEST_CLIENT_SECRET": Self.secret])
    }

    @Test func tokenIsFetchedOnFirstUseAndInjected() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        let h = try harness(auth)
        let r = try HTTP.request(port: h.port, "/data")
        #expect(r.status == 200)
        #expect(auth.tokenCalls == 1)
        let form = auth.state.withLock { $0.tokenBodies.first } ?? ""
        #expect(form.contains("grant_type=client_credentials"))
        #expect(form.contains("client_secret=\(Self.secret)"))
        #expect(try HTTP.request(port: h.port, "/data").status == 200)
        #expect(auth.tokenCalls == 1)  // reused, not fetched per request
    }

    @Test func sixtyConcurrentRequestsAfterInvalidationShareOneRefresh() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        let h = try harness(auth)
        #expect(try HTTP.request(port: h.port, "/data").status == 200)
        auth.invalidate()
        let clients = try (0..<60).map { i -> TestConnection in
            let c = try TestConnection(port: h.port)
            try c.send("GET /data?i=\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            return c
        }
        var ok = 0
        for c in clients where try c.readResponse().status == 200 { ok += 1 }
        #expect(ok == 60)
        #expect(auth.tokenCalls == 2)  // the first fetch, and exactly one refresh
    }

    @Test func postBodyIsReplayedUnchangedAfterARefresh() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        let h = try harness(auth)
        #expect(try HTTP.request(port: h.port, "/data").status == 200)
        auth.invalidate()
        let body = Array("{\"order\":\"\(UUID().uuidString)\"}".utf8)
        let r = try HTTP.request(port: h.port, "POST", "/data", body: body)
        #expect(r.status == 200)
        #expect(r.body == body)
    }

    @Test func failingTokenEndpointGivesEveryWaitingClientAuthFailed() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        // The token call is held until every client waits for it: then all
        // ten share the one refresh, whatever the timing.
        auth.state.withLock {
            $0.tokenStatus = 400
            $0.holdTokens = true
        }
        let log = CapturedLog()
        let h = try harness(auth, log: log)
        let clients = try (0..<10).map { _ -> TestConnection in
            let c = try TestConnection(port: h.port)
            try c.send("GET /data HTTP/1.1\r\nHost: x\r\n\r\n")
            return c
        }
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("ten requests waiting for the token") {
            let parked = try admin.upstream("api")["parked"] as? [String: Any]
            return parked?["auth"] as? Int == 10 && auth.tokenCalls > 0
        }
        auth.releaseTokenCalls()
        for c in clients {
            let r = try c.readResponse()
            #expect(r.status == 401)
            #expect(r.json["code"] as? String == "AUTH_FAILED")
            #expect(!r.text.contains(Self.secret))
        }
        #expect(auth.tokenCalls == 1)  // one refresh for all ten; a 4xx is not retried
        #expect(log.text.contains("token refresh failed"))
        #expect(!log.text.contains(Self.secret))
    }

    @Test func loginKindTakesTheTokenFromAJSONPointer() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              api:
                endpoints: [http://127.0.0.1:\(auth.port)]
                auth:
                  kind: login
                  login_url: http://127.0.0.1:\(auth.port)/token
                  login_body: '{"user":"proxy","password":"${PW}"}'
                  token_pointer: /access_token
                  expires_in_pointer: /expires_in
            routes: [ { match: { path_prefix: / }, upstream: api } ]
            """, environment: ["PW": Self.secret])
        #expect(try HTTP.request(port: h.port, "/data").status == 200)
        #expect(auth.state.withLock { $0.tokenBodies.first } == #"{"user":"proxy","password":"\#(Self.secret)"}"#)
    }

    @Test func staticKindInjectsTheConfiguredValue() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        auth.state.withLock { $0.valid = "fixed-key" }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              api:
                endpoints: [http://127.0.0.1:\(auth.port)]
                auth: { kind: static, value: "${KEY}", scheme: Bearer }
            routes: [ { match: { path_prefix: / }, upstream: api } ]
            """, environment: ["KEY": "fixed-key"])
        #expect(try HTTP.request(port: h.port, "/data", headers: [("Authorization", "Bearer client-own")]).status == 200)
        #expect(auth.tokenCalls == 0)
    }

    @Test func tokenEndpointDownIsRetriedWithBackoff() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        auth.state.withLock { $0.failNext = 2 }
        let h = try harness(auth)
        let r = try HTTP.request(port: h.port, "/data")
        #expect(r.status == 200)
        #expect(auth.tokenCalls == 3)
    }

    @Test func aRefusedFreshTokenIsNotRefreshedAgain() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        let h = try harness(auth)
        auth.state.withLock { $0.refuseEverything = true }
        let r = try HTTP.request(port: h.port, "/data")
        #expect(r.status == 401)
        #expect(r.json["code"] as? String == "AUTH_FAILED")
        #expect(auth.tokenCalls == 2)  // first fetch, one refresh, then no loop
    }
}

@Suite("auth: static credentials") struct StaticCredentialTests {
    /// A static credential cannot be refreshed: a refusal is answered
    /// AUTH_FAILED at once, and the credential stays in use for the next
    /// request (the upstream may accept it again).
    @Test func aRefusedStaticCredentialFailsThatRequestOnly() throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        auth.state.withLock {
            $0.valid = "fixed-key"
            $0.refuseEverything = true
        }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { timeout: 5s, reachability: { park_for: 3s } }
            upstreams:
              api:
                endpoints: [http://127.0.0.1:\(auth.port)]
                auth: { kind: static, value: "${KEY}", scheme: Bearer }
            routes: [ { match: { path_prefix: / }, upstream: api } ]
            """, environment: ["KEY": "fixed-key"])
        let started = Date()
        let refused = try HTTP.request(port: h.port, "/data")
        #expect(refused.status == 401)
        #expect(refused.json["code"] as? String == "AUTH_FAILED")
        #expect(Date().timeIntervalSince(started) < 2, "waited for a refresh that cannot happen")
        auth.state.withLock { $0.refuseEverything = false }
        #expect(try HTTP.request(port: h.port, "/data").status == 200)
        #expect(auth.tokenCalls == 0)
    }
}
