import HappyPathCore
import Testing

@testable import HappyPathPolicies

@Suite struct TokenBucketTests {
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    @Test func aFullBucketGivesItsBurstThenRefusesUntilATokenIsDue() {
        var b = TokenBucket(interval: .milliseconds(100), burst: 3, now: Self.t0)
        #expect(b.take(at: Self.t0) == .taken(remaining: 2))
        #expect(b.take(at: Self.t0) == .taken(remaining: 1))
        #expect(b.take(at: Self.t0) == .taken(remaining: 0))
        #expect(b.take(at: Self.t0) == .refused(retryAfter: .milliseconds(100)))
        #expect(b.take(at: Self.t0 + .milliseconds(40)) == .refused(retryAfter: .milliseconds(60)))
        #expect(b.take(at: Self.t0 + .milliseconds(100)) == .taken(remaining: 0))
        #expect(b.untilFull(at: Self.t0 + .milliseconds(100)) == .milliseconds(300))
        #expect(b.isIdle(at: Self.t0 + .milliseconds(400)))
        #expect(b.remaining(at: Self.t0 + .seconds(10)) == 3)
    }

    /// Over any run, what passes is exactly rate × time + burst, however
    /// the requests are spread (here: twice the rate, for 10 s).
    @Test func passesExactlyRateTimesSecondsPlusBurst() {
        var b = TokenBucket(interval: .milliseconds(10), burst: 50, now: Self.t0)
        var passed = 0
        var t = Self.t0
        for _ in 0..<2000 {
            if case .taken = b.take(at: t) { passed += 1 }
            t = t + .milliseconds(5)
        }
        // The last request is at 9.995 s: 999 tokens came back by then, plus the burst.
        #expect(passed == 999 + 50)
    }

    @Test func reservationsQueueInArrivalOrderUpToMaxWait() {
        var b = TokenBucket(interval: .milliseconds(100), burst: 1, now: Self.t0)
        #expect(b.reserve(at: Self.t0, maxWait: .seconds(1)) == .zero)
        #expect(b.reserve(at: Self.t0, maxWait: .seconds(1)) == .milliseconds(100))
        #expect(b.reserve(at: Self.t0, maxWait: .seconds(1)) == .milliseconds(200))
        #expect(b.reserve(at: Self.t0, maxWait: .milliseconds(250)) == nil)
        // The one that left gives its place back.
        b.giveBack(at: Self.t0)
        #expect(b.reserve(at: Self.t0, maxWait: .milliseconds(250)) == .milliseconds(200))
    }
}

@Suite struct RateLimiterTests {
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    static func limiter(_ over: RateLimitConfiguration.OverLimit, burst: Int = 2, maxKeys: Int = 100) -> RateLimiter {
        var c = RateLimitConfiguration(count: 10, period: .seconds(1), burst: burst)
        c.overLimit = over
        c.maxKeys = maxKeys
        return RateLimiter(c)
    }

    @Test func eachKeyHasItsOwnBucket() {
        var l = Self.limiter(.reject)
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .zero) == .pass(remaining: 1))
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .zero) == .pass(remaining: 0))
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .zero) == .refuse(retryAfter: .milliseconds(100)))
        #expect(l.admit(key: "b", at: Self.t0, maxWait: .zero) == .pass(remaining: 1))
        #expect(l.state(key: "a", at: Self.t0).remaining == 0)
        #expect(l.state(key: "a", at: Self.t0).untilFull == .milliseconds(200))
    }

    @Test func queueWaitsThenRefusesPastMaxWait() {
        var l = Self.limiter(.queue, burst: 1)
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .milliseconds(250)) == .pass(remaining: 0))
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .milliseconds(250)) == .wait(.milliseconds(100)))
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .milliseconds(250)) == .wait(.milliseconds(200)))
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .milliseconds(250)) == .refuse(retryAfter: .milliseconds(300)))
        l.cancel(key: "a", at: Self.t0)
        #expect(l.admit(key: "a", at: Self.t0, maxWait: .milliseconds(250)) == .wait(.milliseconds(200)))
    }

    /// A flood of new keys cannot grow the table; an idle bucket goes first,
    /// and a busy key keeps its (empty) bucket.
    @Test func keepsAtMostMaxKeysDroppingIdleOnesFirst() {
        var l = Self.limiter(.reject, burst: 1, maxKeys: 3)
        _ = l.admit(key: "busy", at: Self.t0, maxWait: .zero)
        _ = l.admit(key: "idle1", at: Self.t0, maxWait: .zero)
        _ = l.admit(key: "idle2", at: Self.t0, maxWait: .zero)
        let later = Self.t0 + .milliseconds(150)
        // "busy" is used again (empty, not idle); the others are full again.
        #expect(l.admit(key: "busy", at: later, maxWait: .zero) == .pass(remaining: 0))
        // Two new keys take the two idle buckets' places.
        _ = l.admit(key: "new1", at: later, maxWait: .zero)
        _ = l.admit(key: "new2", at: later, maxWait: .zero)
        #expect(l.keys == 3)
        #expect(l.admit(key: "busy", at: later, maxWait: .zero) == .refuse(retryAfter: .milliseconds(100)))
        // A flood of new keys never grows the table.
        for i in 0..<50 { _ = l.admit(key: "flood\(i)", at: later, maxWait: .zero) }
        #expect(l.keys == 3)
    }

    // MARK: - The queue's order (issue 31)

    /// A, B and C wait 100, 200 and 300 ms; B leaves: C moves up to B's
    /// turn (not only the next arrival), A keeps its own, and D, arriving
    /// after, gets the turn C had.
    @Test func aRequestThatLeavesLetsEveryoneBehindItMoveUp() {
        var l = Self.limiter(.queue, burst: 1)
        let key = RateLimitBucketKey("a")
        let wait = Duration.seconds(1)
        #expect(l.admit(key: "a", at: Self.t0, maxWait: wait) == .pass(remaining: 0))
        let a = l.admitWithState(key: key, at: Self.t0, maxWait: wait)
        let b = l.admitWithState(key: key, at: Self.t0, maxWait: wait)
        let c = l.admitWithState(key: key, at: Self.t0, maxWait: wait)
        #expect([a, b, c].map(\.decision) == [.wait(.milliseconds(100)), .wait(.milliseconds(200)), .wait(.milliseconds(300))])
        #expect(Set([a.ticket, b.ticket, c.ticket]).count == 3)
        let left = Self.t0 + .milliseconds(50)
        let moved = l.leave(ticket: b.ticket, key: key, at: left)
        #expect(moved == [RateLimiter.Waiter(ticket: c.ticket, due: Self.t0 + .milliseconds(200))])
        #expect(l.waiting(key: key).map(\.due) == [Self.t0 + .milliseconds(100), Self.t0 + .milliseconds(200)])
        #expect(l.admit(key: "a", at: left, maxWait: wait) == .wait(.milliseconds(250)))
    }

    /// A request whose turn came leaves without moving anyone; one that
    /// leaves last moves nobody; another key's queue is untouched.
    @Test func servedAndLastLeaversMoveNobody() {
        var l = Self.limiter(.queue, burst: 1)
        let (x, y) = (RateLimitBucketKey("x"), RateLimitBucketKey("y"))
        _ = l.admitWithState(key: x, at: Self.t0, maxWait: .seconds(1))
        _ = l.admitWithState(key: y, at: Self.t0, maxWait: .seconds(1))
        let x1 = l.admitWithState(key: x, at: Self.t0, maxWait: .seconds(1))
        let x2 = l.admitWithState(key: x, at: Self.t0, maxWait: .seconds(1))
        let y1 = l.admitWithState(key: y, at: Self.t0, maxWait: .seconds(1))
        l.served(ticket: x1.ticket, key: x)
        #expect(l.waiting(key: x).map(\.ticket) == [x2.ticket])
        #expect(l.leave(ticket: x2.ticket, key: x, at: Self.t0).isEmpty)
        #expect(l.waiting(key: x).isEmpty)
        #expect(l.waiting(key: y) == [RateLimiter.Waiter(ticket: y1.ticket, due: Self.t0 + .milliseconds(100))])
        // Leaving twice, or with a ticket never given, changes nothing.
        #expect(l.leave(ticket: x2.ticket, key: x, at: Self.t0).isEmpty)
        #expect(l.leave(ticket: 999, key: y, at: Self.t0).isEmpty)
    }

    // MARK: - Long keys (issue 30)

    /// Two long keys that differ only in their last byte: a bucket each.
    @Test func twoDistinctLongKeysGetDistinctBuckets() {
        var l = Self.limiter(.reject, burst: 1)
        let stem = String(repeating: "k", count: 32 * 1024)
        #expect(l.admit(key: stem + "a", at: Self.t0, maxWait: .zero) == .pass(remaining: 0))
        #expect(l.admit(key: stem + "b", at: Self.t0, maxWait: .zero) == .pass(remaining: 0))
        #expect(l.keys == 2)
        #expect(RateLimitBucketKey(stem + "a") != RateLimitBucketKey(stem + "b"))
    }

    /// A long key finds its bucket again (its token is spent), and the
    /// same key always makes the same digest.
    @Test func aLongKeyMapsStably() {
        var l = Self.limiter(.reject, burst: 1)
        let key = String(repeating: "API-KEY-", count: 4096)
        #expect(l.admit(key: key, at: Self.t0, maxWait: .zero) == .pass(remaining: 0))
        #expect(l.admit(key: String(key), at: Self.t0, maxWait: .zero) == .refuse(retryAfter: .milliseconds(100)))
        #expect(l.keys == 1)
        #expect(RateLimitBucketKey(key) == RateLimitBucketKey(String(repeating: "API-KEY-", count: 4096)))
    }

    /// Up to 64 bytes a key is kept as it is; longer, as its digest, which
    /// no short key can equal.
    @Test(arguments: [0, 1, 64, 65, 65536])
    func aKeyIsKeptWholeUpTo64BytesElseAsItsDigest(length: Int) {
        let key = String(repeating: "x", count: length)
        let kept = RateLimitBucketKey(key)
        if length <= RateLimitBucketKey.maxPlainBytes {
            #expect(kept == .plain(key))
            #expect(kept.heldBytes == length)
        } else {
            guard case .digest = kept else { return #expect(Bool(false), "\(kept)") }
            #expect(kept.heldBytes == 0)
        }
    }

    /// What the keys hold is bounded by max_keys × 64 bytes, whatever the
    /// keys' length: 1,000 distinct 32 KiB keys hold nothing beyond their
    /// slots, and evicted keys give their bytes back.
    @Test func theKeysMemoryIsBoundedByMaxKeys() {
        var l = Self.limiter(.reject, maxKeys: 100)
        let filler = String(repeating: "k", count: 32 * 1024)
        for i in 0..<1000 { _ = l.admit(key: "\(i)-" + filler, at: Self.t0 + .seconds(i), maxWait: .zero) }
        #expect(l.keys == 100)
        #expect(l.keyBytes == 0)
        for i in 0..<1000 { _ = l.admit(key: "short-\(i)", at: Self.t0 + .seconds(2000 + i), maxWait: .zero) }
        #expect(l.keys == 100)
        // The hundred kept are the last hundred short keys, 9 or 10 bytes each.
        #expect(l.keyBytes == 100 * 9)
        #expect(l.keyBytes <= 100 * RateLimitBucketKey.maxPlainBytes)
    }
}
