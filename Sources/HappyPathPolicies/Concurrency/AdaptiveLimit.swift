import HappyPathCore

/// A concurrency limit learned from latency (issue 35, docs/plans/overload.md):
/// how many tries one worker may have in flight to one upstream, moved by
/// the gradient of a long-term latency baseline over the recent latency,
/// as Netflix's Gradient2, with the three failure modes its users and
/// Envoy's met designed out:
///
/// - **No probe drops.** The baseline (`baseline`, an average over about
///   `baselineSamples` tries) is learned from live traffic only; the limit
///   is never forced down to re-measure it (the 503 dips of envoy#8337 and
///   #9007). When the recent latency stays well below the baseline (the
///   upstream got faster) the baseline follows it down faster.
/// - **No growth while the limit is not used.** The limit grows only from
///   samples taken while at least half of it was in flight: an idle or
///   lightly loaded upstream does not earn a limit it never tested (the
///   unbounded growth of concurrency-limits #134).
/// - **Only completed tries are samples.** The caller reports a try that
///   reached its end (an answer, or a failure after it was sent); a request
///   refused, shed or timed out in the queue never reaches `sample` (the
///   fast samples of concurrency-limits #176).
///
/// Each sample moves `recent` toward the sample's latency (an average over
/// about `recentSamples` tries), then compares it with the baseline, in
/// three zones:
/// - **at the baseline** (`recent` at most 1.1 × `baseline`): nothing
///   queues at the upstream, so the limit may grow: the target is
///   `limit + √limit` (the square root: the queue an upstream can hold at
///   its baseline latency), taken only from a sample that used the limit;
/// - **within `tolerance`**: the limit holds (Gradient2 keeps growing here,
///   and that is the growth under mild overload of concurrency-limits #134);
/// - **past it**: the target is `limit × max(0.5, tolerance × baseline /
///   recent)`, at most halving it.
/// The limit moves `smoothing` of the way to its target per sample, within
/// `[minLimit, maxLimit]`.
///
/// A pure value on injected samples (no clock: latency is measured by the
/// caller); table-tested in `AdaptiveLimitTests`.
public struct AdaptiveLimit: Sendable, Equatable {
    public struct Configuration: Sendable, Equatable {
        /// The limit never goes below this (at least 1). Default 2.
        public var minLimit: Int = 2
        /// Nor above this. Default 200.
        public var maxLimit: Int = 200
        /// Where it starts. Default 20 (within the bounds).
        public var initialLimit: Int = 20
        /// How far the limit moves toward its target per sample (0 to 1). Default 0.2.
        public var smoothing: Double = 0.2
        /// How much slower than the baseline the recent latency may be
        /// before the limit shrinks. Default 1.5.
        public var tolerance: Double = 1.5
        /// Tries the baseline averages over. Default 600.
        public var baselineSamples: Int = 600
        /// Tries the recent latency averages over. Default 10.
        public var recentSamples: Int = 10

        public init() {}

        /// The messages a configuration error would give, empty when valid.
        public func validate() -> [String] {
            var problems: [String] = []
            if minLimit < 1 { problems.append("adaptive_concurrency.min_limit must be at least 1, got \(minLimit)") }
            if maxLimit < minLimit {
                problems.append("adaptive_concurrency.max_limit (\(maxLimit)) must not be below min_limit (\(minLimit))")
            }
            if initialLimit < minLimit || initialLimit > maxLimit {
                problems.append("adaptive_concurrency.initial_limit must be within min_limit and max_limit, got \(initialLimit)")
            }
            if !(smoothing > 0 && smoothing <= 1) {
                problems.append("adaptive_concurrency.smoothing must be above 0 and at most 1, got \(smoothing)")
            }
            if !(tolerance >= 1 && tolerance <= 10) {
                problems.append("adaptive_concurrency.tolerance must be between 1 and 10, got \(tolerance)")
            }
            if baselineSamples < recentSamples || recentSamples < 1 {
                problems.append("adaptive_concurrency: baseline_samples must be at least recent_samples, and both at least 1")
            }
            return problems
        }
    }

    public let configuration: Configuration
    /// The limit as a fraction (it moves in small steps); `current` is what applies.
    public private(set) var limit: Double
    /// The long-term latency, in seconds (0: no sample yet).
    public private(set) var baseline: Double = 0
    /// The recent latency, in seconds (0: no sample yet).
    public private(set) var recent: Double = 0
    /// Samples taken so far (saturating).
    public private(set) var samples = 0

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        limit = Double(min(max(configuration.initialLimit, configuration.minLimit), configuration.maxLimit))
    }

    /// Tries that may be in flight now.
    public var current: Int { Int(limit.rounded(.down)) }

    /// A try completed after `latency`, with `inFlight` tries in flight
    /// when it started (itself included). Returns the new `current` when it
    /// changed, else nil.
    public mutating func sample(latency: Duration, inFlight: Int) -> Int? {
        let seconds = Self.seconds(latency)
        let before = current
        samples = samples == Int.max ? samples : samples + 1
        if baseline == 0 {
            baseline = seconds
            recent = seconds
        } else {
            recent += (seconds - recent) * Self.weight(configuration.recentSamples)
            baseline += (seconds - baseline) * Self.weight(configuration.baselineSamples)
            // The upstream got faster: the baseline follows it down.
            if recent > 0, baseline > 2 * recent { baseline = (baseline + recent) / 2 }
        }
        guard recent > 0, baseline > 0 else { return nil }
        let ratio = recent / baseline
        let target: Double
        if ratio <= Self.growUnder {
            // Growth only from samples that used the limit.
            guard Double(max(0, inFlight)) >= limit / 2 else { return nil }
            target = limit + limit.squareRoot()
        } else if ratio <= configuration.tolerance {
            return nil
        } else {
            target = limit * max(0.5, configuration.tolerance / ratio)
        }
        limit += (target - limit) * configuration.smoothing
        limit = min(Double(configuration.maxLimit), max(Double(configuration.minLimit), limit))
        return current != before ? current : nil
    }

    /// Recent latency at most this many times the baseline counts as "at the baseline".
    public static let growUnder = 1.1

    /// An average over about `n` samples, as an exponential weight.
    static func weight(_ n: Int) -> Double { 2 / Double(max(1, n) + 1) }

    /// A latency in seconds, bounded (a day at most; never negative).
    static func seconds(_ d: Duration) -> Double {
        let (s, atto) = d.components
        guard s >= 0 else { return 0 }
        return min(86_400, Double(s) + Double(atto) / 1e18)
    }
}
