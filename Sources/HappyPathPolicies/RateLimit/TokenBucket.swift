import HappyPathCore

/// A token bucket kept as one instant (GCRA, the generic cell rate
/// algorithm): `rate` tokens a second, at most `burst` saved up. Instead of
/// a token count refilled on a timer, it keeps the time at which the
/// bucket would be full again, so taking a token, reserving one ahead of
/// time and telling what is left are each a few integer operations, exact
/// over any length of time (no drift from rounding a refill).
public struct TokenBucket: Sendable, Equatable {
    /// Time one token takes to come back.
    public let interval: Duration
    public let burst: Int
    /// When the bucket is full again (a time in the past: it is full).
    private(set) var fullAt: Instant

    public init(interval: Duration, burst: Int, now: Instant) {
        self.interval = interval
        self.burst = max(1, burst)
        fullAt = now
    }

    public enum Take: Sendable, Equatable {
        /// A token was taken; `remaining` are left now.
        case taken(remaining: Int)
        /// None left; the next is due in `retryAfter`.
        case refused(retryAfter: Duration)
    }

    /// The whole bucket, as a span of time.
    private var capacity: Duration { interval * burst }

    /// Takes a token if one is there now.
    public mutating func take(at now: Instant) -> Take {
        let start = max(fullAt, now)
        let next = start + interval
        let debt = next - now
        guard debt <= capacity else { return .refused(retryAfter: debt - capacity) }
        fullAt = next
        return .taken(remaining: remaining(at: now))
    }

    /// Reserves the next token in arrival order: the wait until it is due
    /// (zero if one is there now), or nil, with nothing reserved, if that
    /// wait would be longer than `maxWait`.
    public mutating func reserve(at now: Instant, maxWait: Duration) -> Duration? {
        let start = max(fullAt, now)
        let next = start + interval
        let wait = max(.zero, next - now - capacity)
        guard wait <= maxWait else { return nil }
        fullAt = next
        return wait
    }

    /// A reserved token that was never used (its client left the queue):
    /// given back, so the requests behind it move up.
    public mutating func giveBack(at now: Instant) {
        fullAt = max(now, fullAt - interval)
    }

    /// Tokens left now.
    public func remaining(at now: Instant) -> Int {
        let debt = fullAt > now ? fullAt - now : .zero
        let left = (capacity - debt).nanoseconds / interval.nanoseconds
        return max(0, Int(left))
    }

    /// How long until the bucket is full again.
    public func untilFull(at now: Instant) -> Duration { fullAt > now ? fullAt - now : .zero }

    /// Full now: nothing would be lost by forgetting this bucket.
    public func isIdle(at now: Instant) -> Bool { fullAt <= now }
}
