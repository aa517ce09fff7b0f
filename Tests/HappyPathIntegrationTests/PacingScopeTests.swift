import Foundation
import HappyPathConfig
import HappyPathCore
import Testing

/// Issue 31, part 1: a 429 is about one client (RFC 6585: "the user has
/// sent too many requests"). Mallory's own 429 with `Retry-After: 999999`
/// holds Mallory only; a 503 still pauses everyone; `scope_429: upstream`
/// is the old behaviour. Real proxy, real clients, a scripted upstream that
/// knows Mallory by the address her requests carry in `X-Forwarded-For`
/// (the proxy trusts the loopback hop) or by her `X-Api-Key`.
@Suite("pacing scope") struct PacingScopeTests {
    static let mallory = "192.0.2.66"
    static let alice = "192.0.2.1"

    static func config(
        upstream: Int, whilePaused: String, scope: String? = nil, timeout: String = "20s", rateLimit: String? = nil
    ) -> String {
        let scopeKey = scope.map { ", scope_429: \($0)" } ?? ""
        let limit = rateLimit.map { "\n    rate_limit: \($0)" } ?? ""
        return """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            trusted_proxies: [127.0.0.1/32]
            defaults:
              reachability: { park_for: 0s }
              retry: { on: [429, 503, connect-failure, reset], attempts: 3, backoff: { base: 10ms, max: 20ms } }
            upstreams:
              u:
                endpoints: [http://127.0.0.1:\(upstream)]
                pacing: { on: [429, 503], max_pause: 30s, while_paused: \(whilePaused)\(scopeKey) }
            routes:
              - match: { path_prefix: / }
                upstream: u
                timeout: \(timeout)\(limit)
            """
    }

    /// Answers `toMallory` to requests whose head names `marker` (her
    /// address, or her key), 200 to everyone else; counts both.
    final class Upstream: @unchecked Sendable {
        let fromMallory = Locked(0)
        let fromOthers = Locked(0)
        var upstream: ScriptedUpstream!

        init(marker: String = PacingScopeTests.mallory, toMallory: String) {
            let (m, o) = (fromMallory, fromOthers)
            upstream = ScriptedUpstream(answering: { head in
                if head.contains(marker) {
                    m.withLock { $0 += 1 }
                    return toMallory
                }
                o.withLock { $0 += 1 }
                return http(200, "ok")
            }).started()
        }
    }

    static let tooMany = http(429, "{\"error\":\"you, slow down\"}", headers: ["Retry-After: 999999"])

    static func from(_ address: String) -> [(String, String)] { [("X-Forwarded-For", address)] }

    static func state(_ h: ProxyHarness) -> String { (try? HTTP.request(port: h.adminPort, "/admin/state").text) ?? "" }

    static func metrics(_ h: ProxyHarness) -> String { (try? HTTP.request(port: h.adminPort, "/metrics").text) ?? "" }

    /// The scenario, `while_paused: wait`: Mallory's request waits
    /// for her pause (up to its 3 s deadline, then 429 RATE_LIMITED with a
    /// Retry-After within max_pause); meanwhile Alice, and a client with no
    /// forwarded address at all, get 200 at once, and the upstream sees them.
    @Test func mallorysOwn429HoldsOnlyMallory() throws {
        let u = Upstream(toMallory: Self.tooMany)
        let h = try ProxyHarness(Self.config(upstream: u.upstream.port, whilePaused: "wait", timeout: "3s"))
        defer { h.stop(); u.upstream.stop() }
        let malloryAnswer = Locked<TestResponse?>(nil)
        let port = h.port
        Thread {
            let r = try? HTTP.request(port: port, "/m", headers: Self.from(Self.mallory), timeout: 30)
            malloryAnswer.withLock { $0 = r }
        }.start()
        // Her retry is parked for her pause.
        #expect(eventually(10) { Self.state(h).contains("\"paused\":1") })
        #expect(Self.state(h).contains("\"paused_clients\":1"))
        #expect(Self.state(h).contains("\"paused_until\":null"))
        for i in 0..<5 {
            let started = Date()
            // A client timeout of 2 s: under the old behaviour this waits for
            // the 30 s pause and is cut off by its route's 3 s deadline.
            let r = try HTTP.request(port: h.port, "/a\(i)", headers: Self.from(Self.alice), timeout: 2)
            #expect(r.status == 200, "\(r.text)")
            #expect(Date().timeIntervalSince(started) < 1.5)
        }
        let direct = try HTTP.request(port: h.port, "/direct", timeout: 2)
        #expect(direct.status == 200, "\(direct.text)")
        #expect(u.fromOthers.withLock { $0 } == 6)
        #expect(malloryAnswer.withLock { $0 } == nil)  // still waiting for her pause

        #expect(eventually(10) { malloryAnswer.withLock { $0 } != nil })
        let r = try #require(malloryAnswer.withLock { $0 })
        #expect(r.status == 429)
        #expect(r.json["code"] as? String == "RATE_LIMITED")
        let retryAfter = Int(r.header("Retry-After") ?? "") ?? 0
        #expect((1...30).contains(retryAfter), "Retry-After \(retryAfter)")
        #expect(u.fromMallory.withLock { $0 } == 1)  // her retry never went

        let metrics = Self.metrics(h)
        #expect(metrics.contains("happypath_upstream_paused_seconds{upstream=\"u\",scope=\"upstream\"} 0"), "\(metrics)")
        #expect(!metrics.contains("happypath_upstream_paused_seconds{upstream=\"u\",scope=\"client\"} 0"), "\(metrics)")
        #expect(metrics.contains("happypath_upstream_paused_clients{upstream=\"u\"} 1"), "\(metrics)")
    }

    /// `while_paused: fail` with a route keyed by `header:X-Api-Key`: the
    /// key, not the address, is the client. Every request of Mallory's key
    /// is answered 429 at once without reaching the upstream; Alice's key,
    /// from the same address, gets 200.
    @Test func theRateLimitKeyIsTheClientAndFailAnswersItAtOnce() throws {
        let u = Upstream(marker: "X-Api-Key: mallory", toMallory: Self.tooMany)
        let h = try ProxyHarness(
            Self.config(
                upstream: u.upstream.port, whilePaused: "fail",
                rateLimit: "{ rate: 1000/s, burst: 1000, key: \"header:X-Api-Key\" }"))
        defer { h.stop(); u.upstream.stop() }
        let first = try HTTP.request(port: h.port, "/m", headers: [("X-Api-Key", "mallory")])
        #expect(first.status == 429)  // her retry met her pause
        for i in 0..<3 {
            let m = try HTTP.request(port: h.port, "/m\(i)", headers: [("X-Api-Key", "mallory")])
            #expect(m.status == 429)
            #expect(m.json["code"] as? String == "RATE_LIMITED")
            let retryAfter = Int(m.header("Retry-After") ?? "") ?? 0
            #expect((25...30).contains(retryAfter), "Retry-After \(retryAfter)")
            let a = try HTTP.request(port: h.port, "/a\(i)", headers: [("X-Api-Key", "alice")])
            #expect(a.status == 200, "\(a.text)")
        }
        #expect(u.fromMallory.withLock { $0 } == 1)
        #expect(u.fromOthers.withLock { $0 } == 3)
    }

    /// A 503 is about the service: it still pauses everyone (whoever got
    /// it), and shows as the upstream's pause.
    @Test func a503StillPausesEveryone() throws {
        let u = Upstream(toMallory: http(503, "", headers: ["Retry-After: 999999"]))
        let h = try ProxyHarness(Self.config(upstream: u.upstream.port, whilePaused: "fail"))
        defer { h.stop(); u.upstream.stop() }
        _ = try HTTP.request(port: h.port, "/m", headers: Self.from(Self.mallory))
        let a = try HTTP.request(port: h.port, "/a", headers: Self.from(Self.alice))
        #expect(a.status == 503)
        #expect(a.json["code"] as? String == "UPSTREAM_PAUSED")
        let retryAfter = Int(a.header("Retry-After") ?? "") ?? 0
        #expect((25...30).contains(retryAfter), "Retry-After \(retryAfter)")
        #expect(u.fromOthers.withLock { $0 } == 0)
        #expect(Self.state(h).contains("\"paused_clients\":0"))
        let metrics = Self.metrics(h)
        #expect(!metrics.contains("happypath_upstream_paused_seconds{upstream=\"u\",scope=\"upstream\"} 0"), "\(metrics)")
        #expect(metrics.contains("happypath_upstream_paused_seconds{upstream=\"u\",scope=\"client\"} 0"), "\(metrics)")
    }

    /// `scope_429: upstream`: the behaviour before issue 31, Mallory's 429
    /// pauses everyone.
    @Test func scope429UpstreamPausesEveryoneAsBefore() throws {
        let u = Upstream(toMallory: Self.tooMany)
        let h = try ProxyHarness(Self.config(upstream: u.upstream.port, whilePaused: "fail", scope: "upstream"))
        defer { h.stop(); u.upstream.stop() }
        _ = try HTTP.request(port: h.port, "/m", headers: Self.from(Self.mallory))
        let a = try HTTP.request(port: h.port, "/a", headers: Self.from(Self.alice))
        #expect(a.status == 429)
        #expect(a.json["code"] as? String == "RATE_LIMITED")
        #expect(u.fromOthers.withLock { $0 } == 0)
        #expect(Self.state(h).contains("\"paused_until\":\""))
        #expect(!Self.metrics(h).contains("happypath_upstream_paused_clients"))
    }
}
