import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Testing

/// Issue 48: `cluster.redis` and `rate_limit.scope`, their defaults and every refusal.
@Suite struct ClusterConfigTests {
    static func yaml(cluster: String?, limit: String = "{ rate: 100/s, scope: cluster }") -> String {
        """
        \(cluster.map { "cluster: \($0)" } ?? "")
        upstreams:
          api: { endpoints: [http://127.0.0.1:9000] }
        routes:
          - match: { path_prefix: / }
            upstream: api
            rate_limit: \(limit)
        """
    }

    @Test func defaults() throws {
        let c = try ConfigLoader.parse(Self.yaml(cluster: "{ redis: { url: redis://redis:6379/0 } }"), file: "t.yaml")
        let cluster = try #require(c.cluster)
        #expect(cluster.redis == RedisEndpoint(host: "redis"))
        #expect(cluster.timeout == .milliseconds(50))
        #expect(cluster.heartbeat == .seconds(1))
        #expect(cluster.lease == nil)
        let limit = try #require(c.routes[0].rateLimit)
        #expect(limit.scope == .cluster)
        #expect(limit.lease == 1, "auto at 100/s: one token per 10 ms")
        #expect(cluster.isUsed(by: c.routes))
        let process = try ConfigLoader.parse(Self.yaml(cluster: nil, limit: "{ rate: 100/s }"), file: "t.yaml")
        #expect(process.routes[0].rateLimit?.scope == .process)
        #expect(process.cluster == nil)
    }

    @Test func everyKeyIsRead() throws {
        let c = try ConfigLoader.parse(
            Self.yaml(
                cluster: "{ redis: { url: \"rediss://:${REDIS_PASSWORD}@cache:6380/2\", timeout: 20ms, lease: 8, heartbeat: 500ms, tls: { ca: /etc/ca.pem, verify: false } } }",
                limit: "{ rate: 5000/s, scope: cluster }"),
            file: "t.yaml", environment: ["REDIS_PASSWORD": "s3cret"])
        let cluster = try #require(c.cluster)
        #expect(cluster.redis == RedisEndpoint(tls: true, host: "cache", port: 6380, password: Secret("s3cret"), database: 2))
        #expect(cluster.timeout == .milliseconds(20))
        #expect(cluster.heartbeat == .milliseconds(500))
        #expect(cluster.lease == 8)
        #expect(cluster.tls?.ca == "/etc/ca.pem")
        #expect(cluster.tls?.verify == false)
        #expect(c.routes[0].rateLimit?.lease == 8)
        let auto = try ConfigLoader.parse(
            Self.yaml(cluster: "{ redis: { url: redis://r, lease: auto } }", limit: "{ rate: 5000/s, scope: cluster }"), file: "t.yaml")
        #expect(auto.routes[0].rateLimit?.lease == 50)
    }

    @Test(arguments: [
        (nil, "{ rate: 1/s, scope: cluster }", "scope: cluster counts in Redis, which needs cluster.redis"),
        ("{ redis: { url: redis://r } }", "{ rate: 1/s, scope: everywhere }", "scope"),
        ("{}", "{ rate: 1/s }", "cluster needs redis"),
        ("{ redis: {} }", "{ rate: 1/s }", "cluster.redis needs url"),
        ("{ redis: { url: http://r } }", "{ rate: 1/s }", "must start with redis:// or rediss://"),
        ("{ redis: { url: \"redis://:pw@r:0\" } }", "{ rate: 1/s }", "port from 1 to 65535"),
        ("{ redis: { url: redis://r, timeout: 2s } }", "{ rate: 1/s }", "cluster.redis.timeout must be at most 1s"),
        ("{ redis: { url: redis://r, heartbeat: 10ms } }", "{ rate: 1/s }", "cluster.redis.heartbeat must be between"),
        ("{ redis: { url: redis://r, lease: 0 } }", "{ rate: 1/s }", "cluster.redis.lease"),
        ("{ redis: { url: redis://r, tls: { verify: false } } }", "{ rate: 1/s }", "applies to rediss:// URLs only"),
        ("{ redis: { url: redis://r, pool: 3 } }", "{ rate: 1/s }", "pool"),
    ])
    func refusals(_ cluster: String?, _ limit: String, _ message: String) {
        let found = errors(Self.yaml(cluster: cluster, limit: limit)).map(\.message)
        #expect(found.contains { $0.contains(message) }, "\(found)")
        #expect(!found.contains { $0.contains("pw") && $0.contains("redis://:pw") }, "a password in a message: \(found)")
    }
}
