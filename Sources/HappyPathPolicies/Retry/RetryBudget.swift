import HappyPathCore

/// Retries may add at most `ratio` of the requests seen over the last
/// `window`, plus `minPerSecond` per second whatever the traffic (so a quiet
/// upstream can still be retried). Counted in one-second buckets. Pure.
public struct RetryBudget: Sendable {
    public let ratio: Double
    public let minPerSecond: Int
    public let windowSeconds: Int
    private var buckets: [(second: Int64, requests: Int, retries: Int)]

    public init(ratio: Double, minPerSecond: Int, windowSeconds: Int = 10) {
        self.ratio = ratio
        self.minPerSecond = minPerSecond
        self.windowSeconds = max(1, windowSeconds)
        buckets = Array(repeating: (-1, 0, 0), count: self.windowSeconds)
    }

    private mutating func bucket(_ now: Instant) -> Int {
        let second = now.nanoseconds / 1_000_000_000
        let i = Int(second % Int64(windowSeconds))
        if buckets[i].second != second { buckets[i] = (second, 0, 0) }
        return i
    }

    private func totals(_ now: Instant) -> (requests: Int, retries: Int) {
        let second = now.nanoseconds / 1_000_000_000
        var requests = 0
        var retries = 0
        for b in buckets where b.second > second - Int64(windowSeconds) {
            requests += b.requests
            retries += b.retries
        }
        return (requests, retries)
    }

    /// A first try.
    public mutating func recordRequest(at now: Instant) { buckets[bucket(now)].requests += 1 }

    /// Takes one retry from the budget if there is one.
    public mutating func tryWithdraw(at now: Instant) -> Bool {
        let (requests, retries) = totals(now)
        let allowed = Double(minPerSecond * windowSeconds) + ratio * Double(requests)
        guard Double(retries + 1) <= allowed else { return false }
        buckets[bucket(now)].retries += 1
        return true
    }
}
