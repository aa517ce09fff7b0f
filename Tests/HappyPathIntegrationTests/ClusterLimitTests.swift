import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import RedisTestServer
import Testing

/// Issue 48: `scope: cluster` rate limits and pauses shared through a real
/// `redis-server`, by real proxies on loopback.
@Suite("cluster limits", .needsRedis, .serialized) struct ClusterLimitTests {
    /// `timeout`: 250 ms unless a test is about it: a loaded machine (the
    /// sanitizers, tests in parallel) must not send requests to the local
    /// share where a test counts what Redis admitted.
    static func config(
        redis: String, upstream: Int, limit: String, top: String = "", pacing: String = "", timeout: String = "250ms",
        redisExtra: String = ""
    ) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        cluster: { redis: { url: "\(redis)", timeout: \(timeout), heartbeat: 200ms\(redisExtra) } }
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

    /// The Redis key of `/limited/`'s one bucket (`key: route`): the route, then the key's digest.
    static let routeBucket = String(decoding: ClusterScript.bucketKey(route: "/limited/", key: RateLimitBucketKey("")), as: UTF8.self)

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
        let ttl = try redis.command(["PTTL", Self.routeBucket])
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

    /// Leases: a request that finds none takes five tokens from Redis and
    /// uses one; the next four use the rest without a round trip. Two
    /// proxies' leases never admit more than the shared bucket held.
    @Test func leasesSaveRoundTripsAndNeverOverAdmit() throws {
        let redis = try RedisServer()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let yaml = Self.config(
            redis: redis.url, upstream: upstream.port, limit: "{ rate: 1/m, burst: 10, key: route, scope: cluster }",
            redisExtra: ", lease: 5")
        // One worker each: a lease is per process, shared by its workers.
        let a = try ProxyHarness(yaml, workers: 1)
        let b = try ProxyHarness(yaml, workers: 1)
        defer {
            a.stop()
            b.stop()
            upstream.stop()
        }
        guard waitUntil("both proxies share their limits", { Self.shared(a) && Self.shared(b) }) else { return }
        _ = try redis.command(["CONFIG", "RESETSTAT"])
        var admitted = 0
        for i in 0..<8 where try HTTP.request(port: a.port, "/limited/a\(i)").status == 200 { admitted += 1 }
        for i in 0..<8 where try HTTP.request(port: b.port, "/limited/b\(i)").status == 200 { admitted += 1 }
        // a took 5 then 5 (8 used, 2 left in its lease); b found the bucket empty.
        #expect(admitted == 8 + 0, "admitted \(admitted)")
        #expect(upstream.appRequests.count == 8)
        let stats = try redis.command(["INFO", "commandstats"])
        let calls = stats.split(separator: "\r\n").first { $0.hasPrefix("cmdstat_evalsha:") }
        // Two round trips for a's eight, one per refused request of b.
        #expect(calls?.hasPrefix("cmdstat_evalsha:calls=10,") == true, "\(calls ?? "no EVALSHA")")
    }

    /// `over_limit: queue` with `scope: cluster`: Redis reserves the token,
    /// the request waits for it in this process, then goes.
    @Test func aQueuedRequestWaitsForTheTokenRedisReserved() throws {
        let redis = try RedisServer()
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let yaml = Self.config(
            redis: redis.url, upstream: upstream.port,
            limit: "{ rate: 10/s, burst: 1, key: route, over_limit: queue, max_wait: 5s, scope: cluster }")
        let a = try ProxyHarness(yaml)
        let b = try ProxyHarness(yaml)
        defer {
            a.stop()
            b.stop()
            upstream.stop()
        }
        guard waitUntil("both proxies share their limits", { Self.shared(a) && Self.shared(b) }) else { return }
        let started = ContinuousClock.now
        let ports = [a.port, b.port]
        let results = Locked<[Int]>([])
        let group = DispatchGroup()
        for i in 0..<6 {
            group.enter()
            Thread {
                let status = (try? HTTP.request(port: ports[i % 2], "/limited/q\(i)", timeout: 10).status) ?? 0
                results.withLock { $0.append(status) }
                group.leave()
            }.start()
        }
        group.wait()
        #expect(results.withLock { $0 } == Array(repeating: 200, count: 6))
        // One token now, then one every 100 ms across both proxies: the last went 0.5 s after the first.
        #expect(seconds(since: started) >= 0.45)
        let metrics = try HTTP.request(port: a.adminPort, "/metrics").text + HTTP.request(port: b.adminPort, "/metrics").text
        #expect(metrics.contains("happypath_rate_limited_total{route=\"/limited/\",outcome=\"queued\"}"))
    }

    /// `happypath check --connect` opens the link as a worker would, or
    /// says why it cannot, never with the password.
    @Test func checkConnectReachesRedisOrSaysWhyNot() throws {
        let redis = try RedisServer(password: "s3cret-pw")
        func check(_ url: String) throws -> (status: Int32, out: String, err: String) {
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
            defer { try? FileManager.default.removeItem(at: file) }
            try Self.config(redis: url, upstream: 9, limit: "{ rate: 1/s, scope: cluster }").write(
                to: file, atomically: true, encoding: .utf8)
            return try runProcess(happypathBinary, ["check", "--connect", "--config", file.path], timeout: 30)
        }
        let ok = try check(redis.url)
        #expect(ok.status == 0, "\(ok.err)")
        #expect(ok.out.contains("cluster.redis.url: connected to redis://127.0.0.1:\(redis.port)/0"), "\(ok.out)")
        let wrong = try check("redis://:not-it@127.0.0.1:\(redis.port)/0")
        #expect(wrong.status == 1)
        #expect(wrong.err.contains("WRONGPASS") && wrong.err.contains("check the password in cluster.redis.url"), "\(wrong.err)")
        #expect(!wrong.err.contains("not-it"))
        let down = try check("redis://:s3cret-pw@127.0.0.1:\(NginxUpstream.freePort())/0")
        #expect(down.status == 1)
        #expect(down.err.contains("could not connect"), "\(down.err)")
        #expect(!down.err.contains("s3cret-pw") && !ok.out.contains("s3cret-pw"))
    }

    /// `rediss://`: the link speaks TLS (no ALPN), checks the server's
    /// certificate against `tls.ca`, and refuses one it cannot verify.
    @Test func rediss() throws {
        let certificates = try TestCertificates()
        let pair = try certificates.make("redis", names: ["localhost"])
        let redis = try RedisServer(tls: (pair.cert, pair.key))
        let tlsPort = try #require(redis.tlsPort)
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let yaml = Self.config(
            redis: "rediss://127.0.0.1:\(tlsPort)/0", upstream: upstream.port,
            limit: "{ rate: 1/m, burst: 1, key: route, scope: cluster }", redisExtra: ", tls: { ca: \(pair.cert) }")
        let a = try ProxyHarness(yaml)
        defer {
            a.stop()
            upstream.stop()
        }
        guard waitUntil("the proxy shares its limits over TLS", { Self.shared(a) }) else { return }
        #expect(try HTTP.request(port: a.port, "/limited/1").status == 200)
        #expect(try HTTP.request(port: a.port, "/limited/2").status == 429)
        #expect(try redis.command(["EXISTS", Self.routeBucket]).hasPrefix(":1"))
        // Without the CA, the certificate is not trusted: the link never comes up, and says why.
        let b = try ProxyHarness(yaml.replacingOccurrences(of: ", tls: { ca: \(pair.cert) }", with: ""))
        defer { b.stop() }
        guard waitUntil("the untrusting proxy is degraded", { Self.clusterMode(b) == "degraded" }) else { return }
        let state = try HTTP.request(port: b.adminPort, "/admin/state").json["cluster"] as? [String: Any]
        #expect((state?["reason"] as? String)?.contains("TLS") == true, "\(String(describing: state))")
    }
}
