import HappyPathCore
import HappyPathPolicies
import Testing

/// `scope: cluster`'s pure parts: the script's answer read bounded, the
/// leases, the local share.
@Suite struct ClusterLimitPolicyTests {
    static func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

    @Test func aGrantIsReadBounded() {
        let r = RedisReply.array([.integer(5), .integer(0), .integer(7), .integer(120_000)])
        #expect(ClusterGrant(r, want: 10) == ClusterGrant(granted: 5, wait: .zero, remaining: 7, untilFull: .milliseconds(120)))
        // More than asked, negative, or huge: clamped, never trapped on.
        let hostile = RedisReply.array([.integer(.max), .integer(-5), .integer(.min), .integer(.max)])
        let g = ClusterGrant(hostile, want: 3)
        #expect(g?.granted == 3)
        #expect(g?.wait == .zero)
        #expect(g?.remaining == 0)
        #expect(g?.untilFull == .microseconds(ClusterGrant.maxMicroseconds))
    }

    @Test(arguments: [
        RedisReply.error("NOSCRIPT No matching script"), .integer(1), .array([.integer(1), .integer(2)]),
        .array([.integer(1), .string([49]), .integer(0), .integer(0)]), .null,
    ])
    func anythingElseIsNotAGrant(_ reply: RedisReply) {
        #expect(ClusterGrant(reply, want: 1) == nil)
    }

    @Test func leasesAreSpentThenExpire() {
        var leases = ClusterLeases(size: 5, ttl: .milliseconds(50), maxKeys: 10)
        let key = RateLimitBucketKey("a")
        #expect(leases.take(key, at: Self.at(0)) == .ask(want: 5))
        leases.answered(wanted: 5, granted: 5, for: key, at: Self.at(1))
        // One of five went to the request that asked: four left.
        #expect(leases.take(key, at: Self.at(2)) == .token(left: 3))
        #expect(leases.take(key, at: Self.at(3)) == .token(left: 2))
        // Past its life, what is left is thrown away (never given back: see ClusterLeases).
        #expect(leases.take(key, at: Self.at(51)) == .ask(want: 5))
        #expect(leases.count == 0)
        // Another key has its own.
        leases.answered(wanted: 5, granted: 2, for: key, at: Self.at(60))
        #expect(leases.take(RateLimitBucketKey("b"), at: Self.at(61)) == .ask(want: 5))
        #expect(leases.take(key, at: Self.at(61)) == .token(left: 0))
        #expect(leases.take(key, at: Self.at(62)) == .ask(want: 5))
    }

    /// Concurrent requests do not each take a lease: while one is on its
    /// way, the others ask for one token each.
    @Test func oneLeaseIsAskedForAtATime() {
        var leases = ClusterLeases(size: 100, ttl: .milliseconds(10), maxKeys: 10)
        let key = RateLimitBucketKey("a")
        #expect(leases.take(key, at: Self.at(0)) == .ask(want: 100))
        #expect(leases.take(key, at: Self.at(0)) == .ask(want: 1))
        #expect(leases.take(key, at: Self.at(0)) == .ask(want: 1))
        leases.answered(wanted: 1, granted: 1, for: key, at: Self.at(1))
        // Refused (or no answer, or its client left): the next may ask for a lease again.
        leases.answered(wanted: 100, granted: 0, for: key, at: Self.at(1))
        #expect(leases.take(key, at: Self.at(2)) == .ask(want: 100))
        // A lease that arrives on top of a live one adds to it.
        leases.answered(wanted: 100, granted: 10, for: key, at: Self.at(3))
        #expect(leases.take(key, at: Self.at(5)) == .token(left: 8))
        leases.answered(wanted: 1, granted: 4, for: key, at: Self.at(6))
        #expect(leases.take(key, at: Self.at(7)) == .token(left: 10))
    }

    @Test func aLeaseOfOneKeepsNothing() {
        var leases = ClusterLeases(size: 1, ttl: .milliseconds(50), maxKeys: 10)
        #expect(leases.take(RateLimitBucketKey("a"), at: Self.at(0)) == .ask(want: 1))
        leases.answered(wanted: 1, granted: 1, for: RateLimitBucketKey("a"), at: Self.at(0))
        #expect(leases.take(RateLimitBucketKey("a"), at: Self.at(0)) == .ask(want: 1))
        #expect(leases.count == 0)
    }

    @Test func leasesAreBoundedByKeys() {
        var leases = ClusterLeases(size: 3, ttl: .milliseconds(50), maxKeys: 2)
        for (i, k) in ["a", "b"].enumerated() {
            _ = leases.take(RateLimitBucketKey(k), at: Self.at(Int64(i)))
            leases.answered(wanted: 3, granted: 3, for: RateLimitBucketKey(k), at: Self.at(Int64(i)))
        }
        // A third key's lease cannot be kept.
        #expect(leases.take(RateLimitBucketKey("c"), at: Self.at(3)) == .ask(want: 3))
        leases.answered(wanted: 3, granted: 3, for: RateLimitBucketKey("c"), at: Self.at(3))
        #expect(leases.count == 2)
        #expect(leases.take(RateLimitBucketKey("c"), at: Self.at(4)) == .ask(want: 3))
        // Once the others expired, a new key has room again.
        leases.answered(wanted: 3, granted: 3, for: RateLimitBucketKey("c"), at: Self.at(100))
        #expect(leases.take(RateLimitBucketKey("c"), at: Self.at(101)) == .token(left: 1))
    }

    @Test func redisIsToldDigestsNotKeys() {
        let key = RateLimitBucketKey("h:secret-api-key")
        let bucket = String(decoding: ClusterScript.bucketKey(route: "/api/", key: key), as: UTF8.self)
        #expect(bucket.hasPrefix("hp:rl:{/api/}:"))
        #expect(!bucket.contains("secret"))
        #expect(bucket.count == "hp:rl:{/api/}:".count + 32)
        #expect(ClusterScript.heardKey("h:secret-api-key").hasPrefix("#"))
        #expect(ClusterScript.heardKey("a") != ClusterScript.heardKey("b"))
    }

    /// A pause heard from another replica is kept under the key's digest and holds that client, not another.
    @Test func aHeardPauseHoldsItsClientByDigest() {
        var pacing = PacingConfiguration()
        pacing.scope429 = .client
        var pause = UpstreamPause(pacing)
        let change = pause.heard(status: 429, wait: .seconds(3), client: ClusterScript.heardKey("h:alice"), at: Self.at(0))
        #expect(change == .paused(until: Self.at(3000), client: ClusterScript.heardKey("h:alice")))
        #expect(pause.pause(for: "h:alice", at: Self.at(1000))?.left == .seconds(2))
        #expect(pause.pause(for: "h:bob", at: Self.at(1000)) == nil)
        #expect(pause.pause(for: "h:alice", at: Self.at(3000)) == nil)
    }

    @Test(arguments: [(60, 1), (100, 1), (1000, 10), (50_000, 500), (10_000_000, 1000)])
    func autoLeaseIsTenMillisecondsOfRate(_ perSecond: Int, _ lease: Int) {
        #expect(ClusterLeases.auto(interval: .nanoseconds(1_000_000_000 / Int64(perSecond))) == lease)
    }

    @Test func theLocalShareDividesRateAndBurst() {
        var c = RateLimitConfiguration(count: 60, period: .seconds(1), burst: 10)
        c.scope = .cluster
        let three = ClusterShare.local(c, replicas: 3)
        #expect(three.interval == c.interval * 3)
        #expect(three.burst == 3)
        #expect(three.scope == .process)
        let many = ClusterShare.local(c, replicas: 50)
        #expect(many.burst == 1)
        #expect(ClusterShare.local(c, replicas: 0).interval == c.interval)
    }
}
