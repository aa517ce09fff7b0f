import HappyPathCore

/// Decides whether a failed try is tried again, and when. Pure: time,
/// randomness and the budget are passed in.
public struct RetryPolicy: Sendable {
    public let configuration: Configuration

    public init(_ configuration: Configuration) { self.configuration = configuration }

    public enum Decision: Sendable, Equatable {
        case retry(after: Duration)
        case giveUp(Reason)
    }

    public enum Reason: Sendable, Equatable {
        case notRetryable
        case attemptsExhausted
        /// The request may have reached the upstream and its method is not
        /// safe to repeat (no `Idempotency-Key`).
        case unsafeMethod
        /// The next try could not finish before the deadline.
        case deadline
        case budgetExhausted
    }

    /// What a listener knows about the try that failed.
    public struct Failure: Sendable {
        public var outcome: Outcome
        public var attempt: Int
        public var method: String
        public var hasIdempotencyKey: Bool
        /// The request never left (connect failure): always safe to repeat.
        public var neverSent: Bool
        /// A `Retry-After` from the upstream, already parsed.
        public var retryAfter: Duration?

        public init(
            outcome: Outcome, attempt: Int, method: String, hasIdempotencyKey: Bool, neverSent: Bool, retryAfter: Duration? = nil
        ) {
            self.outcome = outcome
            self.attempt = attempt
            self.method = method
            self.hasIdempotencyKey = hasIdempotencyKey
            self.neverSent = neverSent
            self.retryAfter = retryAfter
        }
    }

    /// - Parameters:
    ///   - remaining: time left before the command's deadline.
    ///   - random: a number in [0, 1) for the jitter.
    ///   - budget: asked last, so a refused retry spends nothing.
    public func decide(_ failure: Failure, remaining: Duration, random: Double, budget: () -> Bool) -> Decision {
        guard let name = failure.outcome.retryOnName, configuration.on.contains(name) else { return .giveUp(.notRetryable) }
        guard failure.attempt < configuration.attempts else { return .giveUp(.attemptsExhausted) }
        guard failure.neverSent || failure.hasIdempotencyKey || configuration.methods.contains(failure.method) else {
            return .giveUp(.unsafeMethod)
        }
        let delay: Duration
        if configuration.honorRetryAfter, let retryAfter = failure.retryAfter {
            delay = retryAfter
        } else {
            delay = backoff(afterAttempt: failure.attempt, random: random)
        }
        guard delay < remaining else { return .giveUp(.deadline) }
        guard budget() else { return .giveUp(.budgetExhausted) }
        return .retry(after: delay)
    }

    /// Full jitter: uniform in [0, min(max, base · 2^(attempt-1))].
    public func backoff(afterAttempt attempt: Int, random: Double) -> Duration {
        let base = Double(configuration.backoffBase.nanoseconds)
        let cap = Double(configuration.backoffMax.nanoseconds)
        let exponential = min(cap, base * pow2(max(0, attempt - 1)))
        let ns = configuration.jitter ? exponential * min(max(random, 0), 1) : exponential
        return .nanoseconds(Int64(ns))
    }

    private func pow2(_ n: Int) -> Double { n >= 62 ? Double(Int64.max) : Double(Int64(1) << Int64(n)) }
}
