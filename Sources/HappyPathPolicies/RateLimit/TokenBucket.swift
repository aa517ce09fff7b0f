import HappyPathCore

/// A token bucket kept as one instant (GCRA, the generic cell rate
/// algorithm): `rate` tokens a second, at most `burst` saved up. Instead of
/// a token count refilled on a timer, it keeps the time at which the
/// bucket would be full again, so taking a token, reserving one ahead of
/// time and telling what is left are each a few integer operations, exact
/// over any length of time (no drift from rounding a refill). Times are
/// kept as nanoseconds in `Int64`: `Duration` arithmetic goes through
/// 128-bit attoseconds, which the hot path of a limited route would pay on
/// every request.
public struct TokenBucket: Sendable, Equatable {
    /// Time one token takes to come back, in nanoseconds.
    let intervalNs: Int64
    /// The whole bucket as a span of time, in nanoseconds.
    let capacityNs: Int64
    public let burst: Int
    /// When the bucket is full again, in monotonic nanoseconds (a time in
    /// the past: it is full).
    private(set) var fullAtNs: Int64

    public init(interval: Duration, burst: Int, now: Instant) {
        intervalNs = max(1, interval.nanoseconds)
        self.burst = max(1, burst)
        let (capacity, overflow) = intervalNs.multipliedReportingOverflow(by: Int64(self.burst))
        capacityNs = overflow ? Int64.max / 4 : capacity
        fullAtNs = now.nanoseconds
    }

    public var interval: Duration { .nanoseconds(intervalNs) }

    public enum Take: Sendable, Equatable {
        /// A token was taken; `remaining` are left now.
        case taken(remaining: Int)
        /// None left; the next is due in `retryAfter`.
        case refused(retryAfter: Duration)
    }

    /// Takes a token if one is there now.
    public mutating func take(at now: Instant) -> Take {
        let t = now.nanoseconds
        let next = max(fullAtNs, t) &+ intervalNs
        let debt = next &- t
        guard debt <= capacityNs else { return .refused(retryAfter: .nanoseconds(debt &- capacityNs)) }
        fullAtNs = next
        return .taken(remaining: Int((capacityNs &- debt) / intervalNs))
    }

    /// Reserves the next token in arrival order: the wait until it is due
    /// (zero if one is there now), or nil, with nothing reserved, if that
    /// wait would be longer than `maxWait`.
    public mutating func reserve(at now: Instant, maxWait: Duration) -> Duration? {
        let t = now.nanoseconds
        let next = max(fullAtNs, t) &+ intervalNs
        let wait = max(0, next &- t &- capacityNs)
        guard wait <= maxWait.nanoseconds else { return nil }
        fullAtNs = next
        return .nanoseconds(wait)
    }

    /// A reserved token that was never used (its client left the queue):
    /// given back, so the requests behind it move up.
    public mutating func giveBack(at now: Instant) {
        fullAtNs = max(now.nanoseconds, fullAtNs &- intervalNs)
    }

    /// Tokens left now.
    public func remaining(at now: Instant) -> Int {
        let debt = max(0, fullAtNs &- now.nanoseconds)
        return max(0, Int((capacityNs &- debt) / intervalNs))
    }

    /// How long until the bucket is full again, in nanoseconds.
    public func untilFullNs(at now: Instant) -> Int64 { max(0, fullAtNs &- now.nanoseconds) }

    /// How long until the bucket is full again.
    public func untilFull(at now: Instant) -> Duration { .nanoseconds(untilFullNs(at: now)) }

    /// Full now: nothing would be lost by forgetting this bucket.
    public func isIdle(at now: Instant) -> Bool { fullAtNs <= now.nanoseconds }
}
