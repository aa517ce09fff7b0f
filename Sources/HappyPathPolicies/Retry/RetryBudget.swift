import HappyPathCore

/// Retries may add at most `ratio` of the requests seen over the last
/// `window`, plus `minPerSecond` per second whatever the traffic (so a quiet
/// upstream can still be retried). Hedges spend from the same count but
/// only from `ratio`: the floor is for retrying a failure, and a hedge
/// goes out for a try that has not failed, so at low traffic the floor
/// would let every request be hedged (docs/retry.md, "What it costs the
/// upstream"). Counted in one-second buckets. Pure.
public struct RetryBudget: Sendable {
    public let ratio: Double
    public let minPerSecond: Int
    public var windowSeconds: Int { window.seconds }
    /// first: requests, second: retries.
    private var window: SlidingWindow

    /// `budget.ratio` when nothing is configured: retries add at most 20% load.
    public static let defaultRatio = 0.2
    /// `budget.min_per_second` when nothing is configured.
    public static let defaultMinPerSecond = 10

    public init(ratio: Double, minPerSecond: Int, windowSeconds: Int = 10) {
        self.ratio = ratio
        self.minPerSecond = minPerSecond
        window = SlidingWindow(seconds: windowSeconds)
    }

    /// A first try.
    public mutating func recordRequest(at now: Instant) { window.add(first: 1, at: now) }

    /// Takes one retry from the budget if there is one: retries and hedges
    /// of the window, this one included, at most `minPerSecond`·window +
    /// `ratio`·requests.
    public mutating func tryWithdraw(at now: Instant) -> Bool { withdraw(floor: minPerSecond * windowSeconds, at: now) }

    /// Takes one hedge from the budget if there is one: retries and hedges
    /// of the window, this one included, at most `ratio`·requests (no floor).
    public mutating func tryWithdrawHedge(at now: Instant) -> Bool { withdraw(floor: 0, at: now) }

    /// Whether a retry would be granted now (nothing is taken): a refused
    /// hedge counts as the budget exhausted only then.
    public func retryAvailable(at now: Instant) -> Bool {
        let (requests, spent) = window.totals(at: now)
        return Double(spent + 1) <= Double(minPerSecond * windowSeconds) + ratio * Double(requests)
    }

    /// Retries the budget would grant now, one after another (nothing is
    /// taken): the status page's "retry budget left".
    public func retriesLeft(at now: Instant) -> Int {
        let (requests, spent) = window.totals(at: now)
        let allowed = Double(minPerSecond * windowSeconds) + ratio * Double(requests)
        return max(0, Int(allowed.rounded(.down)) - spent)
    }

    private mutating func withdraw(floor: Int, at now: Instant) -> Bool {
        let (requests, spent) = window.totals(at: now)
        let allowed = Double(floor) + ratio * Double(requests)
        guard Double(spent + 1) <= allowed else { return false }
        window.add(second: 1, at: now)
        return true
    }
}
