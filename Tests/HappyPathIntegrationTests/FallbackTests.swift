import Foundation
import HappyPathCore
import Testing

/// Issue 20, part 2: a route's fallback through the real proxy. A scripted
/// upstream is switched between a good answer and each way of failing; the
/// client gets the kept answer (with `Age` and the marker), the fixed one,
/// or the problem, as the rules say.
@Suite("fallback") struct FallbackTests {
    /// An upstream whose answer the test switches as it goes.
    final class Switchable: @unchecked Sendable {
        let mode = Locked("ok")
        let okAnswer: String
        var upstream: ScriptedUpstream!

        init(ok: String = http(200, "{\"items\":[1,2]}", headers: ["Content-Type: application/json", "X-Custom: kept"])) {
            okAnswer = ok
            let mode = self.mode
            upstream = ScriptedUpstream(comingUpOnFreshPort: { _ in
                switch mode.withLock({ $0 }) {
                case "503": return http(503, "{\"down\":true}")
                case "slow": return "DELAY:1500\n" + ok
                default: return ok
                }
            }).started()
        }

        func set(_ m: String) { mode.withLock { $0 = m } }
    }

    static func config(
        _ upstream: Int, fallback: String = "{ serve_stale: 10m }", breaker: String = "consecutive_failures: 100"
    ) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults:
          reachability: { park_for: 0s }
          retry: { attempts: 1 }
        upstreams:
          u:
            endpoints: [http://127.0.0.1:\(upstream)]
            circuit_breaker: { \(breaker), while_open: fail, open_for: 30s }
        routes:
          - match: { path_prefix: /catalog/ }
            upstream: u
            timeout: 500ms
            fallback: \(fallback)
          - match: { path_prefix: / }
            upstream: u
            timeout: 500ms
        """
    }

    /// Waits until no exchange is in flight: an answer is kept when its
    /// transfer ends, which may be just after the client has read it.
    static func settled(_ h: ProxyHarness, sourceLocation: SourceLocation = #_sourceLocation) {
        let admin = AdminProbe(port: h.adminPort)
        #expect(eventually(5) { (try? admin.inFlight()) == 0 }, sourceLocation: sourceLocation)
    }

    static func expectStale(
        _ r: TestResponse, reason: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(r.status == 200, "\(r.text)", sourceLocation: sourceLocation)
        #expect(r.text == "{\"items\":[1,2]}", sourceLocation: sourceLocation)
        #expect(r.header("X-Custom") == "kept", sourceLocation: sourceLocation)
        #expect(r.header("X-Happypath-Fallback") == "stale; reason=\(reason)", sourceLocation: sourceLocation)
        #expect(r.header("Age").flatMap { Int($0) }.map { $0 >= 0 && $0 < 60 } == true, sourceLocation: sourceLocation)
        #expect(r.header("X-Request-Id") != nil, sourceLocation: sourceLocation)
    }

    /// Warm a GET, then fail each way: 503, timeout, open breaker, refused
    /// connection. The kept answer comes back each time, marked.
    @Test func theLastGoodAnswerComesBackForEachWayOfFailing() throws {
        let up = Switchable()
        let h = try ProxyHarness(Self.config(up.upstream.port, breaker: "consecutive_failures: 3"))
        defer { h.stop(); up.upstream.stop() }
        let fresh = try HTTP.request(port: h.port, "/catalog/items?page=1")
        #expect(fresh.status == 200)
        #expect(fresh.header("X-Happypath-Fallback") == nil)
        Self.settled(h)

        up.set("503")
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/items?page=1"), reason: "5xx")
        up.set("slow")
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/items?page=1"), reason: "timeout")
        up.set("503")
        // The third failure in a row opens the breaker (while_open: fail).
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/items?page=1"), reason: "5xx")
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/items?page=1"), reason: "circuit-open")
        // Another query is another answer: none kept, so the problem.
        let other = try HTTP.request(port: h.port, "/catalog/items?page=2")
        #expect(other.status == 503)
        #expect(other.json["code"] as? String == "CIRCUIT_OPEN")
        let admin = AdminProbe(port: h.adminPort)
        #expect(eventually(5) {
            (try? admin.metric("happypath_fallback_total{route=\"/catalog/\",kind=\"stale\",reason=\"5xx\"}")) == 2
        })
        #expect(eventually(5) { (try? admin.metric("happypath_requests_total{route=\"/catalog/\",code=\"STALE\"}")) == 4 })
        // HEAD is answered from the GET's kept answer, without its body.
        let head = try HTTP.request(port: h.port, "HEAD", "/catalog/items?page=1")
        #expect(head.status == 200)
        #expect(head.header("X-Happypath-Fallback") == "stale; reason=circuit-open")
        #expect(head.body.isEmpty)
    }

    @Test func aRefusedConnectionIsUnreachable() throws {
        let up = Switchable()
        let h = try ProxyHarness(Self.config(up.upstream.port))
        defer { h.stop() }
        #expect(try HTTP.request(port: h.port, "/catalog/a").status == 200)
        Self.settled(h)
        up.upstream.stop()
        #expect(eventually(5) { (try? HTTP.request(port: h.port, "/catalog/a"))?.header("X-Happypath-Fallback") != nil })
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/a"), reason: "unreachable")
    }

    /// Answers the rules forbid keeping are never served: `no-store`,
    /// `private`, `Set-Cookie`, `no-cache`, `Vary: *`, with or without
    /// credentials on the request. (An answer to one user's credentials
    /// that may be kept goes to those credentials only: FallbackKeyTests.)
    @Test(arguments: [
        (["Cache-Control: no-store"], [(String, String)]()),
        (["Cache-Control: private, max-age=60"], []),
        (["Set-Cookie: session=abc"], []),
        (["Cache-Control: no-cache"], []),
        (["Vary: *"], []),
        (["Cache-Control: private, max-age=60"], [("Authorization", "Bearer alice")]),
        (["Set-Cookie: session=abc"], [("Cookie", "session=alice")]),
    ])
    func answersThatMustNotBeKeptAreNeverServed(headers: [String], credentials: [(String, String)]) throws {
        let up = Switchable(ok: http(200, "{\"items\":[1,2]}", headers: headers))
        let h = try ProxyHarness(Self.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/catalog/x", headers: credentials).status == 200)
        Self.settled(h)
        up.set("503")
        for asker in [credentials, [("Authorization", "Bearer bob")], []] {
            let r = try HTTP.request(port: h.port, "/catalog/x", headers: asker)
            #expect(r.status == 503, "\(headers) \(credentials): \(r.text)")
            #expect(r.header("X-Happypath-Fallback") == nil)
            #expect(!r.text.contains("items"))
        }
        #expect(try AdminProbe(port: h.adminPort).state()["fallback"].flatMap { ($0 as? [String: Any])?["entries"] as? Int } == 0)
    }

    /// Two credentials: alice's answer is never bob's, unless the upstream
    /// said `public` (then it is the same for everyone, by its own word).
    @Test func aPublicAnswerIsSharedAndAPrivateOneIsNot() throws {
        let up = Switchable(ok: http(200, "{\"items\":[1,2]}", headers: ["Cache-Control: public, max-age=5", "X-Custom: kept"]))
        let h = try ProxyHarness(Self.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/catalog/p", headers: [("Authorization", "Bearer alice")]).status == 200)
        Self.settled(h)
        up.set("503")
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/p", headers: [("Authorization", "Bearer bob")]), reason: "5xx")
    }

    /// `Vary`: the kept answer only for a request that matches the one it
    /// answered, field by field.
    @Test func varyTellsVariantsApart() throws {
        let up = Switchable(ok: http(200, "{\"items\":[1,2]}", headers: ["Vary: Accept-Language", "X-Custom: kept"]))
        let h = try ProxyHarness(Self.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/catalog/v", headers: [("Accept-Language", "de")]).status == 200)
        Self.settled(h)
        up.set("503")
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/v", headers: [("Accept-Language", "de")]), reason: "5xx")
        #expect(try HTTP.request(port: h.port, "/catalog/v", headers: [("Accept-Language", "fr")]).status == 503)
        #expect(try HTTP.request(port: h.port, "/catalog/v").status == 503)
    }

    /// Nothing kept: the fixed answer, marked; without one, the problem.
    /// `on` leaves out a failure: the problem for it.
    @Test func theFixedAnswerThenTheProblem() throws {
        let up = Switchable()
        up.set("503")
        let fixed = "{ response: { status: 200, content_type: application/json, body: '{\"items\":[],\"degraded\":true}' }, on: [5xx] }"
        let h = try ProxyHarness(Self.config(up.upstream.port, fallback: fixed))
        defer { h.stop(); up.upstream.stop() }
        let r = try HTTP.request(port: h.port, "/catalog/never-seen")
        #expect(r.status == 200)
        #expect(r.text == "{\"items\":[],\"degraded\":true}")
        #expect(r.header("Content-Type") == "application/json")
        #expect(r.header("X-Happypath-Fallback") == "fixed; reason=5xx")
        // A timeout is not in `on`: the problem.
        up.set("slow")
        let timeout = try HTTP.request(port: h.port, "/catalog/never-seen")
        #expect(timeout.status == 504)
        #expect(timeout.header("X-Happypath-Fallback") == nil)
        // The route without a fallback: the problem.
        up.set("503")
        let plain = try HTTP.request(port: h.port, "/elsewhere")
        #expect(plain.status == 503)
        #expect(plain.json["code"] as? String == "UPSTREAM_UNAVAILABLE")
        let admin = AdminProbe(port: h.adminPort)
        #expect(eventually(5) {
            (try? admin.metric("happypath_fallback_total{route=\"/catalog/\",kind=\"fixed\",reason=\"5xx\"}")) == 1
        })
    }

    /// With `upstream_errors: pass` a 404 reaches the client as it came,
    /// so it is kept like any answer (with `normalize` it becomes a problem
    /// body and is not).
    @Test func aPassedThrough404IsKept() throws {
        let up = Switchable(ok: http(404, "{\"missing\":true}", headers: ["Content-Type: application/json"]))
        let yaml = Self.config(up.upstream.port).replacingOccurrences(
            of: "fallback: { serve_stale: 10m }", with: "fallback: { serve_stale: 10m }\n    upstream_errors: pass")
        let h = try ProxyHarness(yaml)
        defer { h.stop(); up.upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/catalog/gone").status == 404)
        Self.settled(h)
        up.set("503")
        let r = try HTTP.request(port: h.port, "/catalog/gone")
        #expect(r.status == 404)
        #expect(r.text == "{\"missing\":true}")
        #expect(r.header("X-Happypath-Fallback") == "stale; reason=5xx")
    }

    /// The admin purge drops kept answers by path prefix.
    @Test func purgeByPrefix() throws {
        let up = Switchable()
        let h = try ProxyHarness(Self.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/catalog/a/1").status == 200)
        #expect(try HTTP.request(port: h.port, "/catalog/b/1").status == 200)
        Self.settled(h)
        let purge = try HTTP.request(port: h.adminPort, "POST", "/admin/fallback/purge?prefix=/catalog/a/", body: [])
        #expect(purge.status == 200, "\(purge.text)")
        #expect(purge.json["purged"] as? Int == 1)
        up.set("503")
        #expect(try HTTP.request(port: h.port, "/catalog/a/1").status == 503)
        Self.expectStale(try HTTP.request(port: h.port, "/catalog/b/1"), reason: "5xx")
    }

    /// 10,000 distinct answers pass through a store of 64 KiB: what is kept
    /// never exceeds it, and the most recent answers are the ones kept.
    @Test func memoryStaysUnderTheLimit() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { stale_max_bytes: 64KiB, stale_max_entry: 4KiB }
            upstreams:
              demo: { endpoints: ["{{DEMO}}"] }
            routes:
              - match: { path_prefix: / }
                upstream: demo
                fallback: { serve_stale: 10m }
            """)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let connection = try TestConnection(port: h.port, timeout: 10)
        var maxSeen = 0
        for i in 0..<10_000 {
            try connection.send("GET /bytes?n=200&i=\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            let r = try connection.readResponse()
            if r.status != 200 { Issue.record("request \(i): \(r.status)"); break }
            if i % 1000 == 999 {
                let fallback = try admin.state()["fallback"] as? [String: Any]
                let bytes = fallback?["bytes"] as? Int ?? -1
                maxSeen = max(maxSeen, bytes)
                #expect(bytes > 0 && bytes <= 64 * 1024, "after \(i + 1): \(bytes)")
            }
        }
        #expect(maxSeen > 32 * 1024)  // it did keep answers, up to near the limit
    }

    /// `stale_max_bytes` holds on everything kept: 10 times the cap in
    /// distinct 60 KiB `User-Agent` values under `Vary: User-Agent`. The
    /// counted bytes stay under the cap, the entries kept with their values
    /// fit in it, and the process's resident memory grows by little more.
    @Test func theCapHoldsOnVaryValuesAtTenTimesIt() throws {
        #expect(
            FileManager.default.isExecutableFile(atPath: happypathBinary),
            "\(happypathBinary) is built by `swift build --build-tests`")
        let up = ScriptedUpstream(answering: { _ in http(200, "ok", headers: ["Vary: User-Agent"]) }).started()
        defer { up.stop() }
        let cap = 2 << 20
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                limits: { stale_max_bytes: 2MiB, stale_max_entry: 1MiB, max_header_bytes: 128KiB }
                upstreams: { u: { endpoints: [http://127.0.0.1:\(up.port)] } }
                routes: [ { match: { path_prefix: / }, upstream: u, fallback: { serve_stale: 10m } } ]
                """, logLevel: "info")
        let port = try #require(serve.listeningPort())
        let admin = AdminProbe(port: try #require(serve.adminPort()))
        let huge = 60 * 1024
        let connection = try TestConnection(port: port, timeout: 10)
        func send(_ i: Int) throws {
            let agent = "agent-\(i)-" + String(repeating: "a", count: huge)
            try connection.send("GET /item/\(i) HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: \(agent)\r\n\r\n")
            let r = try connection.readResponse()
            if r.status != 200 { throw TestError("request \(i): \(r.status) \(r.text)") }
        }
        // Warm up: buffers, pools and the store's first entries.
        for i in 0..<40 { try send(i) }
        #expect(eventually(5) { (try? admin.inFlight()) == 0 })
        let before = serve.residentBytes
        let total = 10 * cap / huge
        for i in 40..<total {
            try send(i)
            if i % 50 == 49 || i == total - 1 {
                #expect(eventually(5) { (try? admin.inFlight()) == 0 })
                let fallback = try admin.state()["fallback"] as? [String: Any]
                let bytes = fallback?["bytes"] as? Int ?? -1
                let entries = fallback?["entries"] as? Int ?? -1
                #expect(bytes > 0 && bytes <= cap, "after \(i + 1): \(bytes) bytes counted")
                #expect(entries > 0 && entries * huge <= cap, "after \(i + 1): \(entries) entries of 60 KiB each kept")
            }
        }
        let grown = serve.residentBytes - before
        #expect(before > 0)
        if residentMemoryIsMeaningful {
            #expect(grown < 4 * cap, "resident memory grew by \(grown / 1024) KiB with a cap of \(cap / 1024) KiB")
        }
    }
}
