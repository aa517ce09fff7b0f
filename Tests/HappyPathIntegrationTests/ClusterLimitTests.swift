import Foundation
import HappyPathConfig
import HappyPathCore
import RedisTestServer
import Testing

/// Issue 48: `scope: cluster` rate limits and pauses shared through a real
/// `redis-server`, by real proxies on loopback.
@Suite("cluster limits", .needsRedis, .serialized) struct ClusterLimitTests {
    static func config(redis: String, upstream: Int, limit: String, top: String = "", pacing: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        cluster: { redis: { url: "\(redis)", timeout: 50ms, heartbeat: 200ms } }
        \(top)
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          u: { endpoints: [http://127.0.0.1:\(upstream)] \(pacing) }
        routes:
          - match: { path_prefix: /limited/ }
            upstream: u
            timeout: 10s
            rate_limit: \(limit)
          - match: { path_prefix: / }
            upstream: u
        """
    }

    /// `/admin/state`'s cluster mode.
    static func clusterMode(_ h: ProxyHarness) -> String? {
        guard let r = try? HTTP.request(port: h.adminPort, "/admin/state"),
            let cluster = r.json["cluster"] as? [String: Any]
        else { return nil }
        return cluster["mode"] as? String
    }

    static func shared(_ h: ProxyHarness) -> Bool { clusterMode(h) == "shared" }

    @Test func twoProxiesShareOneBucket() throws {
        let redis = try RedisServer()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let yaml = Self.config(redis: redis.url, upstream: upstream.port, limit: "{ rate: 1/m, burst: 3, key: route, scope: cluster }")
        let a = try ProxyHarness(yaml)
        let b = try ProxyHarness(yaml)
        defer {
            a.stop()
            b.stop()
            upstream.stop()
        }
        guard waitUntil("both proxies share their limits", { Self.shared(a) && Self.shared(b) }) else { return }
        #expect(try HTTP.request(port: a.port, "/limited/1").status == 200)
        #expect(try HTTP.request(port: b.port, "/limited/2").status == 200)
        let third = try HTTP.request(port: a.port, "/limited/3")
        #expect(third.status == 200)
        #expect(third.header("RateLimit") == "\"default\";r=0;t=180")
        for h in [a, b] {
            let refused = try HTTP.request(port: h.port, "/limited/4")
            #expect(refused.status == 429)
            #expect(refused.json["code"] as? String == "RATE_LIMITED")
            #expect((59...60).contains(Int(refused.header("Retry-After") ?? "") ?? 0))
        }
        #expect(upstream.appRequests.count == 3)
        // The bucket is in Redis, under the route's key, and expires.
        let ttl = try redis.command(["PTTL", "hp:rl:{/limited/}:"])
        #expect(ttl.hasPrefix(":"), "PTTL \(ttl)")
        #expect((Int(ttl.dropFirst().split(separator: "\r\n").first ?? "") ?? 0) > 60_000, "PTTL \(ttl)")
    }

    @Test func withoutRedisEachProxyDecidesAloneAndSaysSo() throws {
        // Nothing listens there: the link never connects.
        let port = NginxUpstream.freePort()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let a = try ProxyHarness(
            Self.config(redis: "redis://127.0.0.1:\(port)/0", upstream: upstream.port, limit: "{ rate: 1/m, burst: 2, key: route, scope: cluster }"))
        defer {
            a.stop()
            upstream.stop()
        }
        guard waitUntil("the cluster is degraded", { Self.clusterMode(a) == "degraded" }) else { return }
        // Never reached: one replica counted, the whole limit locally.
        #expect(try HTTP.request(port: a.port, "/limited/1").status == 200)
        #expect(try HTTP.request(port: a.port, "/limited/2").status == 200)
        #expect(try HTTP.request(port: a.port, "/limited/3").status == 429)
        let metrics = try HTTP.request(port: a.adminPort, "/metrics").text
        #expect(metrics.contains("happypath_cluster_fallback 1"))
        let page = try HTTP.request(port: a.adminPort, "/status").text
        #expect(page.contains("cluster: degraded since"))
    }
}
