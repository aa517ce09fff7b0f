import Foundation
import HappyPathCore

/// Two counts over the last `seconds` seconds, in one-second buckets (the
/// breaker's requests and failures, the budget's requests and retries). Pure.
public struct SlidingWindow: Sendable {
    public let seconds: Int
    private var buckets: [(at: Int64, first: Int, second: Int)]

    public init(seconds: Int) {
        self.seconds = max(1, seconds)
        buckets = Array(repeating: (-1, 0, 0), count: self.seconds)
    }

    public mutating func add(first: Int = 0, second: Int = 0, at now: Instant) {
        let s = now.nanoseconds / 1_000_000_000
        let i = Int(s % Int64(seconds))
        if buckets[i].at != s { buckets[i] = (s, 0, 0) }
        buckets[i].first += first
        buckets[i].second += second
    }

    public func totals(at now: Instant) -> (first: Int, second: Int) {
        let s = now.nanoseconds / 1_000_000_000
        var a = 0
        var b = 0
        for bucket in buckets where bucket.at > s - Int64(seconds) {
            a += bucket.first
            b += bucket.second
        }
        return (a, b)
    }

    public mutating func reset() { buckets = Array(repeating: (-1, 0, 0), count: seconds) }
}
