import Foundation
import HappyPathConfig
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 19, part 2: an upstream's own 429/503 with Retry-After pauses the
/// whole upstream, through the real proxy and a scripted upstream.
@Suite("pacing") struct PacingTests {
    static func config(upstream: Int, whilePaused: String = "wait", maxPause: String = "60s") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults:
          reachability: { park_for: 0s }
          retry: { on: [429, 503, connect-failure, reset], attempts: 3, backoff: { base: 10ms, max: 20ms } }
        upstreams:
          u:
            endpoints: [http://127.0.0.1:\(upstream)]
            pacing: { on: [429, 503], max_pause: \(maxPause), while_paused: \(whilePaused) }
        routes:
          - match: { path_prefix: / }
            upstream: u
            timeout: 20s
        """
    }

    static let slowDown = http(429, "{\"error\":\"slow down\"}", headers: ["Retry-After: 2"])

    /// Answers 429 Retry-After: 2 to the first request, 200 to the rest,
    /// and records when each arrived.
    final class Throttled: @unchecked Sendable {
        let arrivals = Locked<[Date]>([])
        var upstream: ScriptedUpstream!

        init(first: String = PacingTests.slowDown) {
            let arrivals = self.arrivals
            upstream = ScriptedUpstream(comingUpOnFreshPort: { _ in
                let n = arrivals.withLock { list -> Int in
                    list.append(Date())
                    return list.count
                }
                return n == 1 ? first : http(200, "ok")
            }).started()
        }

        var count: Int { arrivals.withLock { $0.count } }
    }

    /// `n` clients at once (threads of their own).
    static func clients(_ n: Int, port: Int) -> [TestResponse?] {
        let results = Locked<[TestResponse?]>(Array(repeating: nil, count: n))
        let group = DispatchGroup()
        for i in 0..<n {
            group.enter()
            Thread {
                let r = try? HTTP.request(port: port, "/work/\(i)", timeout: 30)
                results.withLock { $0[i] = r }
                group.leave()
            }.start()
        }
        group.wait()
        return results.withLock { $0 }
    }

    /// The upstream is paused, or (a 429 under `scope_429: client`, the
    /// default) a client: every client here is 127.0.0.1, one key.
    static func paused(_ h: ProxyHarness) -> Bool {
        guard let state = try? HTTP.request(port: h.adminPort, "/admin/state").text else { return false }
        return state.contains("\"paused_until\":\"") || !state.contains("\"paused_clients\":0")
    }

    /// The issue's scenario: one 429 with Retry-After: 2, twenty clients.
    /// The upstream gets nothing more during the 2 s, then the rest; every
    /// client (the one that got the 429 included) ends with 200.
    @Test func aRetryAfterPausesTheWholeUpstreamAndEveryClientGetsItsAnswer() throws {
        let t = Throttled()
        let h = try ProxyHarness(Self.config(upstream: t.upstream.port))
        defer { h.stop(); t.upstream.stop() }
        let firstAnswer = Locked<TestResponse?>(nil)
        let port = h.port
        let first = Thread { firstAnswer.withLock { $0 = try? HTTP.request(port: port, "/first", timeout: 30) } }
        first.start()
        #expect(eventually(10) { Self.paused(h) })
        let answers = Self.clients(19, port: h.port)
        #expect(eventually(30) { firstAnswer.withLock { $0 } != nil })
        #expect(firstAnswer.withLock { $0?.status } == 200, "\(firstAnswer.withLock { $0?.text ?? "" })")
        #expect(answers.allSatisfy { $0?.status == 200 }, "\(answers.map { $0?.status })")
        let times = t.arrivals.withLock { $0 }.sorted()
        #expect(times.count == 21)  // the 429, its retry, the 19 others
        // Nothing reached the upstream during the pause (a little slack for
        // the clock the proxy measured it on).
        if let start = times.first { #expect(times.dropFirst().allSatisfy { $0.timeIntervalSince(start) >= 1.8 }) }
        let events = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(events.contains("happypath_upstream_paused_seconds{upstream=\"u\",scope=\"client\"} 0"), "\(events)")
        #expect(events.contains("happypath_upstream_paused_seconds{upstream=\"u\",scope=\"upstream\"} 0"), "\(events)")
        // The breaker did not count the 429 as a failure.
        let state = try HTTP.request(port: h.adminPort, "/admin/state").text
        #expect(state.contains("\"circuit_breaker\":{\"state\":\"closed\"}"))
        #expect(state.contains("\"paused_until\":null"))
    }

    /// `while_paused: fail`: requests during the pause are answered at once,
    /// 429 RATE_LIMITED (a 429 caused it) with the pause's time left; the
    /// upstream sees none of them.
    @Test func failAnswersAtOnceDuringThePause() throws {
        let t = Throttled(first: http(429, "", headers: ["Retry-After: 30"]))
        let h = try ProxyHarness(Self.config(upstream: t.upstream.port, whilePaused: "fail"))
        defer { h.stop(); t.upstream.stop() }
        let first = try HTTP.request(port: h.port, "/first")
        // Its retry met the pause: answered at once too.
        #expect(first.status == 429)
        for _ in 0..<5 {
            let r = try HTTP.request(port: h.port, "/during")
            #expect(r.status == 429)
            #expect(r.json["code"] as? String == "RATE_LIMITED")
            let retryAfter = Int(r.header("Retry-After") ?? "") ?? 0
            #expect((25...30).contains(retryAfter), "Retry-After \(retryAfter)")
        }
        #expect(t.count == 1)
    }

    /// A 503 cause is 503 UPSTREAM_PAUSED; max_pause caps what the upstream asks.
    @Test func a503PauseIsUpstreamPausedAndMaxPauseCapsIt() throws {
        let t = Throttled(first: http(503, "", headers: ["Retry-After: 3600"]))
        let h = try ProxyHarness(Self.config(upstream: t.upstream.port, whilePaused: "fail", maxPause: "5s"))
        defer { h.stop(); t.upstream.stop() }
        _ = try HTTP.request(port: h.port, "/first")
        let r = try HTTP.request(port: h.port, "/during")
        #expect(r.status == 503)
        #expect(r.json["code"] as? String == "UPSTREAM_PAUSED")
        let retryAfter = Int(r.header("Retry-After") ?? "") ?? 0
        #expect((1...5).contains(retryAfter), "Retry-After \(retryAfter)")
    }

    /// A reload that changes the upstream ends its pause: what waited goes now.
    @Test func aReloadEndsThePauseEarly() throws {
        let t = Throttled(first: http(429, "", headers: ["Retry-After: 60"]))
        // The request that got the 429 waits for the pause (up to its route's
        // 20 s deadline); the reload ends the pause long before.
        let yaml = Self.config(upstream: t.upstream.port)
        let h = try ProxyHarness(yaml, workers: 1)
        defer { h.stop(); t.upstream.stop() }
        let answer = Locked<TestResponse?>(nil)
        let port = h.port
        Thread { answer.withLock { $0 = try? HTTP.request(port: port, "/waits", timeout: 30) } }.start()
        #expect(eventually(10) { Self.paused(h) })
        var next = try ConfigLoader.parse(yaml.replacingOccurrences(of: "max_pause: 60s", with: "max_pause: 30s"), file: "t.yaml")
        next.listen = h.proxy.runtime.configuration.listen
        next.admin = h.proxy.runtime.configuration.admin
        #expect(h.proxy.reload(next).isEmpty)
        #expect(eventually(10) { answer.withLock { $0 } != nil })
        #expect(answer.withLock { $0?.status } == 200)
        #expect(t.count == 2)
    }
}
