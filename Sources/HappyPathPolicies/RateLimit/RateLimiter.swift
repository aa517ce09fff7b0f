import HappyPathCore

/// A route's rate limit (`rate_limit:`): one token bucket per key (client
/// address, header value, or the route as a whole), at most `maxKeys` of
/// them. Pure and single-threaded: the server keeps one per route behind a
/// lock, shared by every worker, so a key's limit holds for the process.
///
/// When a new key arrives and `maxKeys` are kept, an idle bucket (one that
/// is full again, so forgetting it loses nothing) is dropped, the least
/// recently used first as far as a CLOCK sweep can tell (each use marks a
/// bucket; the sweep clears marks and drops the first unmarked idle one).
/// If none is idle after two sweeps, the oldest unmarked one goes anyway:
/// its key starts again with a full bucket, which is the most a flood of
/// new keys can win.
///
/// Keys are kept as `RateLimitBucketKey`s (a long one as its digest), so
/// the limiter's memory is bounded by `maxKeys` whatever the keys' length.
///
/// With `over_limit: queue`, each bucket also keeps its waiting requests
/// (a ticket and the instant its token is due), in arrival order. Their
/// tokens were reserved one interval apart; when one leaves before its
/// turn, each one behind it moves up to the instant of the one before it
/// (`leave`), so a departure shortens the waits of everyone behind, not
/// only of whoever arrives next.
public struct RateLimiter: Sendable {
    public let configuration: RateLimitConfiguration
    private var buckets: [RateLimitBucketKey: Int] = [:]
    private var slots: [Slot] = []
    private var hand = 0
    /// Bytes the kept keys hold besides their slots (`heldBytes`).
    public private(set) var keyBytes = 0

    private var nextTicket: UInt64 = 1

    private struct Slot: Sendable {
        var key: RateLimitBucketKey
        var bucket: TokenBucket
        var used: Bool
        /// Requests waiting for a token reserved in this bucket, in arrival order.
        var waiting: [Waiter] = []
    }

    /// A request waiting in a bucket's queue.
    public struct Waiter: Sendable, Equatable {
        public let ticket: UInt64
        /// When its token is due.
        public var due: Instant
    }

    public init(_ configuration: RateLimitConfiguration) {
        self.configuration = configuration
        slots.reserveCapacity(min(configuration.maxKeys, 1024))
    }

    /// Buckets kept now (for `/admin/state`).
    public var keys: Int { slots.count }

    public enum Decision: Sendable, Equatable {
        /// Go now; `remaining` tokens are left for this key.
        case pass(remaining: Int)
        /// Wait this long first (`over_limit: queue`); the token is reserved.
        case wait(Duration)
        /// Refused: the next token is due in `retryAfter`.
        case refuse(retryAfter: Duration)
    }

    /// Takes (or, for `queue`, reserves) a token for `key`.
    /// - Parameter maxWait: the longest a queued request may wait (the
    ///   route's `max_wait`, or less if its deadline is sooner).
    public mutating func admit(key: String, at now: Instant, maxWait: Duration) -> Decision {
        admitWithState(key: RateLimitBucketKey(key), at: now, maxWait: maxWait).decision
    }

    /// The decision, with the key's bucket as it is after it (for the
    /// `RateLimit` field), from one lookup.
    public struct Admitted: Sendable {
        public let decision: Decision
        public let remaining: Int
        public let untilFullNs: Int64
        /// For `.wait`: the request's place in its bucket's queue (`served`, `leave`).
        public var ticket: UInt64 = 0
    }

    public mutating func admitWithState(key: RateLimitBucketKey, at now: Instant, maxWait: Duration) -> Admitted {
        let i = slot(for: key, at: now)
        slots[i].used = true
        let decision: Decision
        var ticket: UInt64 = 0
        switch configuration.overLimit {
        case .reject:
            switch slots[i].bucket.take(at: now) {
            case let .taken(remaining): decision = .pass(remaining: remaining)
            case let .refused(retryAfter): decision = .refuse(retryAfter: retryAfter)
            }
        case .queue:
            if let wait = slots[i].bucket.reserve(at: now, maxWait: maxWait) {
                if wait == .zero {
                    decision = .pass(remaining: slots[i].bucket.remaining(at: now))
                } else {
                    decision = .wait(wait)
                    ticket = nextTicket
                    nextTicket &+= 1
                    slots[i].waiting.append(Waiter(ticket: ticket, due: now + wait))
                }
            } else {
                // The wait is the time until the queue in front has drained
                // and a token is due: what the client should wait before trying again.
                var probe = slots[i].bucket
                decision = .refuse(retryAfter: probe.reserve(at: now, maxWait: .seconds(86_400 * 365)) ?? .zero)
            }
        }
        let bucket = slots[i].bucket
        return Admitted(
            decision: decision, remaining: bucket.remaining(at: now), untilFullNs: bucket.untilFullNs(at: now),
            ticket: ticket)
    }

    /// The latest request queued for `key` left before its turn: its token
    /// goes back (nobody is behind it).
    public mutating func cancel(key: String, at now: Instant) {
        let key = RateLimitBucketKey(key)
        guard let i = buckets[key], let last = slots[i].waiting.last else { return }
        _ = leave(ticket: last.ticket, key: key, at: now)
    }

    /// A queued request's turn came: it leaves the queue, having used its token.
    public mutating func served(ticket: UInt64, key: RateLimitBucketKey) {
        guard let i = buckets[key], let j = slots[i].waiting.firstIndex(where: { $0.ticket == ticket }) else { return }
        slots[i].waiting.remove(at: j)
    }

    /// A queued request left before its turn (its client went away, the
    /// queue was full, the drain ended): its token goes back, and each
    /// request queued behind it on the same key moves up to the instant of
    /// the one before it. Returns those that moved, with their new instants
    /// (the caller re-arms their timers).
    public mutating func leave(ticket: UInt64, key: RateLimitBucketKey, at now: Instant) -> [Waiter] {
        guard let i = buckets[key], let j = slots[i].waiting.firstIndex(where: { $0.ticket == ticket }) else { return [] }
        var due = slots[i].waiting[j].due
        slots[i].waiting.remove(at: j)
        var moved: [Waiter] = []
        for k in j..<slots[i].waiting.count {
            swap(&due, &slots[i].waiting[k].due)
            moved.append(slots[i].waiting[k])
        }
        slots[i].bucket.giveBack(at: now)
        return moved
    }

    /// The requests waiting for `key`'s tokens, in arrival order.
    public func waiting(key: RateLimitBucketKey) -> [Waiter] {
        guard let i = buckets[key] else { return [] }
        return slots[i].waiting
    }

    /// Tokens left for `key` and how long until its bucket is full again
    /// (the `RateLimit` field of an answer).
    public func state(key: String, at now: Instant) -> (remaining: Int, untilFull: Duration) {
        state(key: RateLimitBucketKey(key), at: now)
    }

    public func state(key: RateLimitBucketKey, at now: Instant) -> (remaining: Int, untilFull: Duration) {
        guard let i = buckets[key] else { return (configuration.burst, .zero) }
        return (slots[i].bucket.remaining(at: now), slots[i].bucket.untilFull(at: now))
    }

    private mutating func slot(for key: RateLimitBucketKey, at now: Instant) -> Int {
        if let i = buckets[key] { return i }
        let bucket = TokenBucket(interval: configuration.interval, burst: configuration.burst, now: now)
        keyBytes += key.heldBytes
        if slots.count < configuration.maxKeys {
            slots.append(Slot(key: key, bucket: bucket, used: false))
            buckets[key] = slots.count - 1
            return slots.count - 1
        }
        let victim = evict(at: now)
        keyBytes -= slots[victim].key.heldBytes
        buckets[slots[victim].key] = nil
        slots[victim] = Slot(key: key, bucket: bucket, used: false)
        buckets[key] = victim
        return victim
    }

    /// The CLOCK sweep: the first idle bucket not used since the hand last
    /// passed it; after two turns without one, the first unmarked bucket.
    private mutating func evict(at now: Instant) -> Int {
        let n = slots.count
        var fallback: Int?
        for _ in 0..<(2 * n) {
            let i = hand
            hand = (hand + 1) % n
            if slots[i].used {
                slots[i].used = false
                continue
            }
            if slots[i].bucket.isIdle(at: now) { return i }
            if fallback == nil { fallback = i }
        }
        return fallback ?? hand
    }
}

/// `rate_limit:` on a route, validated.
public struct RateLimitConfiguration: Sendable, Equatable {
    public enum Key: Sendable, Equatable {
        /// The client's address (the TCP peer, or the rightmost
        /// X-Forwarded-For hop that is not a trusted proxy).
        case clientIP
        /// One bucket for the whole route.
        case route
        /// The value of this header (its name as configured); a request
        /// without it falls back to its client address.
        case header(String)
    }

    public enum OverLimit: String, Sendable, Equatable, CaseIterable {
        /// Wait for a token, in arrival order, up to `max_wait`.
        case queue
        /// 429 RATE_LIMITED at once.
        case reject
    }

    /// Time per token: `rate: 100/s` is 10 ms.
    public var interval: Duration
    /// Tokens per period as written (`100` of `100/s`), for `RateLimit-Policy`.
    public var count: Int
    /// The period of `rate` (1 s, 1 min or 1 h).
    public var period: Duration
    /// Tokens a bucket holds. Default one second's worth of `rate` (at least 1).
    public var burst: Int
    /// Whose bucket a request takes from. Default `client_ip`.
    public var key: Key = .clientIP
    /// Default `reject`.
    public var overLimit: OverLimit = .reject
    /// `queue`: the longest wait for a token; a longer one (or one past the
    /// route's `timeout`) is refused with 429. Default 2s.
    public var maxWait: Duration = .seconds(2)
    /// `queue`: requests waiting at once in the process; more are refused. Default 1000.
    public var maxQueue = 1000
    /// Buckets kept; a new key beyond it takes the place of an idle one. Default 100,000.
    public var maxKeys = 100_000

    /// Where the buckets are counted (`scope`).
    public enum Scope: String, Sendable, Equatable, CaseIterable {
        /// In this process (the default): each replica admits the whole rate.
        case process
        /// In Redis (`cluster.redis`), shared by every replica.
        case cluster
    }

    public var scope: Scope = .process
    /// `scope: cluster`: tokens taken from Redis at once (`cluster.redis.lease`; `auto` is `max(1, rate × 10ms)`).
    public var lease = 1

    public init(count: Int, period: Duration, burst: Int) {
        self.count = count
        self.period = period
        self.burst = burst
        interval = .nanoseconds(max(1, period.nanoseconds / Int64(max(1, count))))
    }
}
