import Foundation
import Testing

/// The admin API's actions on upstreams, against the real proxy and real
/// upstreams: a drained endpoint gets no tries until undrained; a breaker
/// forced open refuses, forced closed lets through whatever the answers,
/// and released it is automatic again (docs/operations.md, "Admin actions").
@Suite("admin actions") struct AdminActionsTests {
    /// The upstream's entry in `/admin/state`.
    func upstream(_ admin: Int, _ name: String) throws -> [String: Any] {
        let state = try HTTP.request(port: admin, "/admin/state").json
        return (state["upstreams"] as? [[String: Any]])?.first { $0["name"] as? String == name } ?? [:]
    }

    func post(_ admin: Int, _ path: String, headers: [(String, String)] = []) throws -> TestResponse {
        try HTTP.request(port: admin, "POST", path, headers: headers)
    }

    /// The events the status page lists (the last 50, as the admin listener keeps them).
    func events(_ admin: Int) throws -> String { try HTTP.request(port: admin, "/status").text }

    @Test func aDrainedEndpointGetsNoTriesUntilUndrained() throws {
        let a = ScriptedUpstream(responses: [http(200, "a")]).started()
        let b = ScriptedUpstream(responses: [http(200, "b")]).started()
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              pool:
                endpoints: [http://127.0.0.1:\(a.port), http://127.0.0.1:\(b.port)]
            routes:
              - match: { path_prefix: / }
                upstream: pool
            """, workers: 1)
        h.scripted += [a, b]
        let admin = h.adminPort
        // Both take tries before.
        #expect(
            waitUntil("both endpoints answered") {
                _ = try HTTP.request(port: h.port, "/x")
                return a.appRequests.count > 0 && b.appRequests.count > 0
            })

        let drained = try post(admin, "/admin/upstreams/pool/endpoints/1/drain")
        #expect(drained.status == 200, "\(drained.text)")
        #expect(drained.json["drained"] as? Bool == true && drained.json["url"] as? String == "http://127.0.0.1:\(b.port)")
        let endpoints = try upstream(admin, "pool")["endpoints"] as? [[String: Any]] ?? []
        #expect(endpoints.map { $0["drained"] as? Bool } == [false, true])
        let before = b.appRequests.count
        for i in 0..<12 {
            let r = try HTTP.request(port: h.port, "/after-drain-\(i)")
            #expect(r.status == 200 && r.text == "a", "\(i): \(r.status) \(r.text)")
        }
        #expect(b.appRequests.count == before, "the drained endpoint got a try")

        // The last endpoint in rotation cannot go too.
        let last = try post(admin, "/admin/upstreams/pool/endpoints/0/drain")
        #expect(last.status == 409 && last.text.contains("last endpoint"), "\(last.status) \(last.text)")

        let undrained = try post(admin, "/admin/upstreams/pool/endpoints/1/undrain")
        #expect(undrained.status == 200 && undrained.json["drained"] as? Bool == false)
        #expect(
            waitUntil("the undrained endpoint takes tries again") {
                _ = try HTTP.request(port: h.port, "/after-undrain")
                return b.appRequests.count > before
            })

        // Logged with who and when: the events the page lists.
        let page = try events(admin)
        #expect(page.contains("<b>endpoint_drained</b> upstream=pool endpoint=1 url=http://127.0.0.1:\(b.port) by=127.0.0.1"))
        #expect(page.contains("<b>endpoint_undrained</b> upstream=pool endpoint=1"))
    }

    @Test func theActionsKeepTheAdminListenersRules() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              demo:
                endpoints: [{{DEMO}}, {{DEMO}}]
            routes:
              - match: { path_prefix: / }
                upstream: demo
            """)
        let admin = h.adminPort
        let browser = AdminBrowserTests()
        // A cross-site page cannot drain or force anything.
        for path in ["/admin/upstreams/demo/endpoints/0/drain", "/admin/upstreams/demo/breaker/open"] {
            let forged = try browser.send(
                admin, "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(admin)\r\nOrigin: https://evil.example\r\n")
            #expect(forged.status == 403, "\(path)")
            let rebound = try browser.send(admin, "POST \(path) HTTP/1.1\r\nHost: evil.example:\(admin)\r\n")
            #expect(rebound.status == 403, "\(path)")
        }
        let u = try upstream(admin, "demo")
        #expect((u["circuit_breaker"] as? [String: Any])?["forced"] == nil)
        #expect((u["endpoints"] as? [[String: Any]])?.allSatisfy { $0["drained"] as? Bool == false } == true)
        // POST only, and only what exists.
        #expect(try HTTP.request(port: admin, "/admin/upstreams/demo/breaker/open").status == 400)
        #expect(try post(admin, "/admin/upstreams/nope/breaker/open").status == 404)
        #expect(try post(admin, "/admin/upstreams/demo/breaker/ajar").status == 404)
        #expect(try post(admin, "/admin/upstreams/demo/endpoints/2/drain").status == 404)
        #expect(try post(admin, "/admin/upstreams/demo/endpoints/-1/drain").status == 404)
        #expect(try post(admin, "/admin/upstreams/demo").status == 404)
    }

    @Test func aForcedBreakerRefusesOrLetsThroughThenIsAutomaticAgain() throws {
        // /fail answers 500, anything else 200.
        let up = ScriptedUpstream(answering: { head in
            head.hasPrefix("GET /fail") ? http(500, "no") : http(200, "yes")
        }).started()
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              svc:
                endpoints: [http://127.0.0.1:\(up.port)]
                retry: { on: [500], attempts: 1 }
                circuit_breaker: { consecutive_failures: 1, open_for: 60s, while_open: fail }
            routes:
              - match: { path_prefix: / }
                upstream: svc
            """)
        h.scripted.append(up)
        let admin = h.adminPort
        func breaker() throws -> [String: Any] { try upstream(admin, "svc")["circuit_breaker"] as? [String: Any] ?? [:] }
        func ok() throws -> TestResponse { try HTTP.request(port: h.port, "/ok") }

        #expect(try ok().status == 200)
        // Forced open: refused without a try.
        let open = try post(admin, "/admin/upstreams/svc/breaker/open")
        #expect(open.status == 200 && open.json["state"] as? String == "open" && open.json["forced"] as? String == "open")
        let sent = up.appRequests.count
        let refused = try ok()
        #expect(refused.status == 503 && refused.text.contains("CIRCUIT_OPEN"), "\(refused.status) \(refused.text)")
        #expect(up.appRequests.count == sent, "a try went through a breaker forced open")
        #expect(try breaker()["forced"] as? String == "open")

        // Forced closed: failures do not open it.
        let closed = try post(admin, "/admin/upstreams/svc/breaker/closed")
        #expect(closed.status == 200 && closed.json["state"] as? String == "closed")
        for _ in 0..<3 { #expect(try HTTP.request(port: h.port, "/fail").status >= 500) }
        #expect(try ok().status == 200, "forced closed lets through after failures")
        #expect(try breaker()["state"] as? String == "closed" && breaker()["forced"] as? String == "closed")

        // Back to automatic: one failure opens it again, as configured.
        let auto = try post(admin, "/admin/upstreams/svc/breaker/auto")
        #expect(auto.status == 200 && auto.json["forced"] is NSNull && auto.json["state"] as? String == "closed")
        #expect(try ok().status == 200)
        _ = try HTTP.request(port: h.port, "/fail")
        #expect(
            waitUntil("the breaker opened by itself") { try breaker()["state"] as? String == "open" })
        #expect(try breaker()["forced"] == nil)
        #expect(try ok().text.contains("CIRCUIT_OPEN"))

        let page = try events(admin)
        for event in ["breaker_forced_open", "breaker_forced_closed", "breaker_released"] {
            #expect(page.contains("<b>\(event)</b> upstream=svc by=127.0.0.1"), "\(event)")
        }
    }
}
