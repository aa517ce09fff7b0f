import HappyPathCore

/// What happens to a stored request after one delivery round: delivered,
/// tried again after a backoff, or dead. Pure: the caller gives the round's
/// result, the delivery's counts and limits, the time and a random number.
public enum DeliveryPolicy {
    public enum Decision: Equatable, Sendable {
        case delivered
        /// The next round starts at this wall time (milliseconds since 1970).
        case retry(atMilliseconds: Int64)
        case dead(Reason)
    }

    public enum Reason: String, Equatable, Sendable {
        /// The upstream refused the request itself (a 4xx a retry cannot change).
        case refused
        case maxAttempts = "max_attempts"
        case maxAge = "max_age"
    }

    public struct Limits: Equatable, Sendable {
        public var maxAttempts: Int
        /// Wall time (ms) after which the delivery is dead.
        public var expiresAt: Int64
        public var backoffBase: Duration
        public var backoffMax: Duration

        public init(maxAttempts: Int, expiresAt: Int64, backoffBase: Duration, backoffMax: Duration) {
            self.maxAttempts = maxAttempts
            self.expiresAt = expiresAt
            self.backoffBase = backoffBase
            self.backoffMax = backoffMax
        }
    }

    /// 4xx answers that may change if the same request comes again later:
    /// credentials (401, 403), timing (408, 425, 429), a conflict (409).
    public static let retryableClientStatuses: Set<Int> = [401, 403, 408, 409, 425, 429]

    /// - Parameters:
    ///   - status: the status the round ended with: the upstream's, or the
    ///     problem's when the proxy answered (503 unreachable, 504 timeout…).
    ///   - answeredByUpstream: the status is the upstream's own answer.
    ///   - attempts: rounds started, this one included.
    ///   - random: in [0, 1), for the jitter.
    public static func decide(
        status: Int, answeredByUpstream: Bool, attempts: Int, limits: Limits, now: Int64, random: Double
    ) -> Decision {
        if (200..<400).contains(status) { return .delivered }
        if answeredByUpstream, (400..<500).contains(status), !retryableClientStatuses.contains(status) {
            return .dead(.refused)
        }
        if attempts >= limits.maxAttempts { return .dead(.maxAttempts) }
        let at = now + backoff(attempt: attempts, base: limits.backoffBase, max: limits.backoffMax, random: random)
        if at >= limits.expiresAt { return .dead(.maxAge) }
        return .retry(atMilliseconds: at)
    }

    /// Milliseconds before the round after `attempt`: `base·2^(attempt-1)`
    /// capped at `max`, full jitter over its upper half (never less than half
    /// the step, so rounds do not bunch at zero).
    public static func backoff(attempt: Int, base: Duration, max: Duration, random: Double) -> Int64 {
        let baseMs = Swift.max(1, base.nanoseconds / 1_000_000)
        let maxMs = Swift.max(baseMs, max.nanoseconds / 1_000_000)
        let shift = Swift.min(Swift.max(attempt - 1, 0), 40)
        let step = baseMs > (maxMs >> shift) ? maxMs : Swift.min(maxMs, baseMs << shift)
        return step / 2 + Int64(Double(step - step / 2) * Swift.min(Swift.max(random, 0), 1))
    }
}
