import HappyPathCore

/// `hedge:` on a route: when a try has not answered after a while, a
/// second one goes out alongside it (to another endpoint when there is
/// one), and the first usable answer wins (docs/retry.md, "Hedging").
public struct HedgeConfiguration: Sendable, Equatable {
    public enum Delay: Sendable, Equatable {
        /// A fixed wait (`after: 50ms`).
        case fixed(Duration)
        /// The route's observed 95th percentile of try latency over the
        /// last 10 seconds, clamped to [`min`, `max`] (`max` until enough
        /// tries were seen).
        case p95
    }

    /// How long a try goes unanswered before a hedge (`after:`, required:
    /// a duration or `p95`).
    public var after: Delay
    /// The shortest `p95` wait. Default 10ms.
    public var min: Duration = .milliseconds(10)
    /// The longest `p95` wait, and the wait until enough tries were seen. Default 1s.
    public var max: Duration = .seconds(1)
    /// Extra tries in flight at once, beside the first (1 to 8). Default 1.
    public var maxExtra = 1

    public init(after: Delay) { self.after = after }

    /// The wait before a hedge, given the observed percentile (nil: too few tries seen yet).
    public func delay(observed: Duration?) -> Duration {
        switch after {
        case let .fixed(delay):
            return delay
        case .p95:
            guard let observed else { return max }
            return Swift.min(Swift.max(observed, min), max)
        }
    }
}
