import HappyPathCore

/// Retries may add at most `ratio` of the requests seen over the last
/// `window`, plus `minPerSecond` per second whatever the traffic (so a quiet
/// upstream can still be retried). Counted in one-second buckets. Pure.
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

    /// Takes one retry from the budget if there is one.
    public mutating func tryWithdraw(at now: Instant) -> Bool {
        let (requests, retries) = window.totals(at: now)
        let allowed = Double(minPerSecond * windowSeconds) + ratio * Double(requests)
        guard Double(retries + 1) <= allowed else { return false }
        window.add(second: 1, at: now)
        return true
    }
}
