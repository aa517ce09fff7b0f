import HappyPathCore

/// How long a route's tries took to their response head over the last
/// `seconds` seconds, for `hedge: { after: p95 }`. One-second buckets (as
/// `SlidingWindow`), each a log-scale histogram with 4 bins per power of
/// two from 1 µs to about 68 s: recording is O(1) and allocates nothing
/// (the counters are made once); a quantile is read as the upper bound of
/// the bin that holds it, at most 25% above the true value (a bin spans a
/// quarter of its octave). Pure: time is passed in.
public struct LatencyWindow: Sendable {
    public let seconds: Int
    /// Fewer tries than this in the window: no quantile (too few to trust).
    public static let minimumSamples = 20

    static let firstOctave = 10  // 2^10 ns ≈ 1 µs
    static let octaves = 26  // up to 2^36 ns ≈ 68.7 s
    static let binsPerOctave = 4
    static let bins = octaves * binsPerOctave

    private var stamps: [Int64]
    private var counts: [UInt32]

    public init(seconds: Int = 10) {
        self.seconds = max(1, seconds)
        stamps = Array(repeating: -1, count: self.seconds)
        counts = Array(repeating: 0, count: self.seconds * Self.bins)
    }

    public mutating func record(_ latency: Duration, at now: Instant) {
        let second = now.nanoseconds / 1_000_000_000
        let bucket = Int(second % Int64(seconds))
        if stamps[bucket] != second {
            stamps[bucket] = second
            let base = bucket * Self.bins
            for i in base..<(base + Self.bins) { counts[i] = 0 }
        }
        let i = bucket * Self.bins + Self.bin(latency.nanoseconds)
        if counts[i] < UInt32.max { counts[i] += 1 }
    }

    /// The `q` quantile (0...1) of the window's tries, or nil with fewer
    /// than `minimumSamples` of them.
    public func quantile(_ q: Double, at now: Instant) -> Duration? {
        let second = now.nanoseconds / 1_000_000_000
        var totals = [Int](repeating: 0, count: Self.bins)
        var total = 0
        for bucket in 0..<seconds where stamps[bucket] > second - Int64(seconds) && stamps[bucket] <= second {
            let base = bucket * Self.bins
            for bin in 0..<Self.bins {
                let n = Int(counts[base + bin])
                totals[bin] += n
                total += n
            }
        }
        guard total >= Self.minimumSamples else { return nil }
        let rank = max(1, Int((min(max(q, 0), 1) * Double(total)).rounded(.up)))
        var seen = 0
        for bin in 0..<Self.bins {
            seen += totals[bin]
            if seen >= rank { return .nanoseconds(Self.upperBound(bin)) }
        }
        return .nanoseconds(Self.upperBound(Self.bins - 1))
    }

    static func bin(_ nanoseconds: Int64) -> Int {
        guard nanoseconds >= 1 << firstOctave else { return 0 }
        let log2 = 63 - nanoseconds.leadingZeroBitCount
        let octave = log2 - firstOctave
        guard octave < octaves else { return bins - 1 }
        let sub = Int((nanoseconds >> (log2 - 2)) & 3)
        return octave * binsPerOctave + sub
    }

    /// The largest latency the bin holds.
    static func upperBound(_ bin: Int) -> Int64 {
        let octave = bin / binsPerOctave
        let sub = Int64(bin % binsPerOctave)
        let start = Int64(1) << Int64(octave + firstOctave)
        return start + start * (sub + 1) / 4
    }
}
