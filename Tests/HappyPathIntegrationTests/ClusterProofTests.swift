import Foundation
import HappyPathConfig
import HappyPathCore
import RedisTestServer
import Testing

/// Issue 48's proof: proxies sharing one `redis-server` hold one limit
/// between them, hear each other's pauses, and keep answering, within
/// their local shares, while Redis is killed, restarted or slow.
@Suite("cluster proof", .needsRedis, .serialized) struct ClusterProofTests {
    /// Sends requests to `ports` in turn from `threads` threads until
    /// `seconds` have passed; the statuses, and each request's own time.
    static func load(
        ports: [Int], threads: Int, seconds duration: Double, target: String = "/limited/x", headers: [(String, String)] = []
    ) -> (statuses: [Int], slowest: Double) {
        let results = Locked<(statuses: [Int], slowest: Double)>(([], 0))
        let group = DispatchGroup()
        let start = ContinuousClock.now
        for t in 0..<threads {
            group.enter()
            Thread {
                var i = t
                while Self.seconds(since: start) < duration {
                    let port = ports[i % ports.count]
                    i += 1
                    let began = ContinuousClock.now
                    let status = (try? HTTP.request(port: port, target, headers: headers, timeout: 5).status) ?? 0
                    let took = Self.seconds(since: began)
                    results.withLock {
                        $0.statuses.append(status)
                        $0.slowest = max($0.slowest, took)
                    }
                }
                group.leave()
            }.start()
        }
        group.wait()
        return results.withLock { $0 }
    }

    static func seconds(since start: ContinuousClock.Instant) -> Double { HappyPathIntegrationTests.seconds(since: start) }

    static func state(_ h: ProxyHarness) -> [String: Any]? {
        guard let r = try? HTTP.request(port: h.adminPort, "/admin/state") else { return nil }
        return r.json["cluster"] as? [String: Any]
    }

    static func shared(_ h: ProxyHarness, replicas: Int) -> Bool {
        guard let c = state(h) else { return false }
        return c["mode"] as? String == "shared" && c["replicas"] as? Int == replicas
    }

    static func proxies(
        _ n: Int, redis: RedisServer, upstream: Int, limit: String, pacing: String = "", timeout: String = "250ms"
    ) throws -> [ProxyHarness] {
        let yaml = ClusterLimitTests.config(redis: redis.url, upstream: upstream, limit: limit, pacing: pacing, timeout: timeout)
        var all: [ProxyHarness] = []
        for _ in 0..<n { all.append(try ProxyHarness(yaml)) }
        return all
    }

    @Test func threeProxiesHoldOneLimitBetweenThem() throws {
        let redis = try RedisServer()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let all = try Self.proxies(3, redis: redis, upstream: upstream.port, limit: "{ rate: 60/s, burst: 10, key: route, scope: cluster }")
        defer {
            for h in all { h.stop() }
            upstream.stop()
        }
        guard waitUntil("three replicas share their limits", { all.allSatisfy { Self.shared($0, replicas: 3) } }) else { return }
        let result = Self.load(ports: all.map(\.port), threads: 6, seconds: 5)
        let admitted = result.statuses.count { $0 == 200 }
        let refused = result.statuses.count { $0 == 429 }
        // 60/s over 5 s and a burst of 10: 310, within 10 %.
        #expect((279...341).contains(admitted), "admitted \(admitted) of \(result.statuses.count)")
        #expect(refused + admitted == result.statuses.count, "only 200 and 429: \(Set(result.statuses))")
        #expect(refused > 0)
        for h in all {
            let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
            #expect(!metrics.contains("happypath_cluster_redis_errors_total"), "no request was decided without Redis")
        }
    }

    @Test func aClientsPauseSeenByOneProxyHoldsItOnTheOthers() throws {
        let redis = try RedisServer()
        // The upstream asks alice's first request to wait 3 s.
        let upstream = ScriptedUpstream { head in
            head.contains("/limited/first") ? http(429, "slow down", headers: ["Retry-After: 3"]) : http(200, "ok")
        }.started()
        let all = try Self.proxies(
            3, redis: redis, upstream: upstream.port, limit: "{ rate: 1000/s, key: header:X-Api-Key, scope: cluster }",
            pacing: ", pacing: { on: [429], scope_429: client, while_paused: fail }")
        defer {
            for h in all { h.stop() }
            upstream.stop()
        }
        guard waitUntil("three replicas share their limits", { all.allSatisfy { Self.shared($0, replicas: 3) } }) else { return }
        let alice = [("X-Api-Key", "alice")]
        let bob = [("X-Api-Key", "bob")]
        #expect(try HTTP.request(port: all[0].port, "/limited/first", headers: alice).status == 429)
        for h in all[1...] {
            guard
                waitUntil("the pause is heard", {
                    let r = try HTTP.request(port: h.adminPort, "/admin/state")
                    let ups = r.json["upstreams"] as? [[String: Any]]
                    return ups?.first?["paused_clients"] as? Int == 1
                })
            else { return }
        }
        let before = upstream.appRequests.count
        for h in all[1...] {
            let held = try HTTP.request(port: h.port, "/limited/again", headers: alice)
            #expect(held.status == 429, "alice is paused on every replica")
            #expect((2...3).contains(Int(held.header("Retry-After") ?? "") ?? 0), "until the same instant")
            #expect(try HTTP.request(port: h.port, "/limited/again", headers: bob).status == 200, "bob is not")
        }
        // Redis holds the pause, and the buckets, under the keys' digests: never an API key.
        let keys = try redis.command(["KEYS", "hp:*"])
        #expect(keys.contains("hp:pause:{u}:#") && keys.contains("hp:rl:{/limited/}:"), "\(keys)")
        #expect(!keys.contains("alice") && !keys.contains("bob"), "\(keys)")
        // Only bob's two requests reached the upstream.
        #expect(upstream.appRequests.count == before + 2)
        #expect(upstream.appRequests.allSatisfy { !$0.head.contains("/limited/again") || $0.head.contains("bob") })
        // A replica that starts (or reconnects) later finds the pause in Redis.
        let late = try ProxyHarness(
            ClusterLimitTests.config(
                redis: redis.url, upstream: upstream.port, limit: "{ rate: 1000/s, key: header:X-Api-Key, scope: cluster }",
                pacing: ", pacing: { on: [429], scope_429: client, while_paused: fail }"))
        defer { late.stop() }
        guard
            waitUntil("the late replica caught up", {
                let ups = try HTTP.request(port: late.adminPort, "/admin/state").json["upstreams"] as? [[String: Any]]
                return ups?.first?["paused_clients"] as? Int == 1
            })
        else { return }
        #expect(try HTTP.request(port: late.port, "/limited/again", headers: alice).status == 429)
    }

    @Test func redisKilledMidLoadThenBack() throws {
        let redis = try RedisServer()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let all = try Self.proxies(2, redis: redis, upstream: upstream.port, limit: "{ rate: 60/s, burst: 10, key: route, scope: cluster }")
        defer {
            for h in all { h.stop() }
            upstream.stop()
        }
        guard waitUntil("two replicas share their limits", { all.allSatisfy { Self.shared($0, replicas: 2) } }) else { return }
        try redis.kill()
        guard waitUntil("both proxies fall back", { all.allSatisfy { Self.state($0)?["mode"] as? String == "degraded" } }) else {
            return
        }
        // Two seconds without Redis: each admits its share (30/s, burst 5), together about the whole limit.
        let outage = Self.load(ports: all.map(\.port), threads: 4, seconds: 2)
        let admitted = outage.statuses.count { $0 == 200 }
        #expect(outage.statuses.allSatisfy { $0 == 200 || $0 == 429 }, "every proxy kept answering: \(Set(outage.statuses))")
        #expect(admitted <= 60 * 2 + 10 + 12, "within the local shares: \(admitted)")
        #expect(admitted >= 60 * 2 / 2, "the shares admit: \(admitted)")
        let metrics = try HTTP.request(port: all[0].adminPort, "/metrics").text
        #expect(metrics.contains("happypath_cluster_fallback 1"))
        #expect(metrics.contains("happypath_cluster_redis_errors_total"))
        // Back on the same port, empty: counting is shared again within a few heartbeats.
        try redis.start()
        let back = ContinuousClock.now
        guard waitUntil("both proxies share again", { all.allSatisfy { Self.shared($0, replicas: 2) } }) else { return }
        #expect(Self.seconds(since: back) < 5)
        #expect(try HTTP.request(port: all[1].port, "/limited/y").status != 0)
        #expect(try redis.command(["EXISTS", ClusterLimitTests.routeBucket]).hasPrefix(":1"), "the bucket is in Redis again")
        let page = try HTTP.request(port: all[0].adminPort, "/status").text
        #expect(page.contains("cluster: shared"))
    }

    @Test func aSlowRedisHoldsNoRequestLongerThanTheTimeout() throws {
        let redis = try RedisServer()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let all = try Self.proxies(
            1, redis: redis, upstream: upstream.port, limit: "{ rate: 1000/s, key: route, scope: cluster }", timeout: "50ms")
        defer {
            for h in all { h.stop() }
            upstream.stop()
        }
        guard waitUntil("the proxy shares its limits", { Self.shared(all[0], replicas: 1) }) else { return }
        // The server sleeps 1.5 s (one connection's DEBUG SLEEP holds them all).
        let sleeper = Thread { _ = try? redis.command(["DEBUG", "SLEEP", "1.5"]) }
        sleeper.start()
        guard waitUntil("the proxy falls back", { Self.state(all[0])?["mode"] as? String == "degraded" }) else { return }
        let result = Self.load(ports: [all[0].port], threads: 4, seconds: 1)
        // Answered (or refused by the local share, which admits 1,000/s and a burst of 1,000), never failed.
        let counts = result.statuses.reduce(into: [:]) { $0[$1, default: 0] += 1 }
        #expect(result.statuses.allSatisfy { $0 == 200 || $0 == 429 }, "\(counts)")
        #expect(counts[200, default: 0] > 0, "\(counts)")
        // Each request's own time: the 50 ms timeout and the proxy's work (slow under the sanitizers), never the 1.5 s sleep.
        #expect(result.slowest < 0.4, "slowest \(result.slowest) s")
        guard waitUntil("it shares again", { Self.shared(all[0], replicas: 1) }) else { return }
    }
}
