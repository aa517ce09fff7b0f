import HappyPathCore

/// A concurrency limit learned from latency (issue 35, docs/plans/overload.md):
/// how many tries one worker may have in flight to one upstream, moved by
/// how the recent latency compares with a baseline, as Netflix's Gradient2,
/// with the failure modes its users and Envoy's met designed out:
///
/// - **A slow kind of request is not an overloaded upstream** (issue 44).
///   Each kind of request (a route and the path it asks for) has its own
///   baseline: the least of its recent latency (the median of its last
///   `recentSamples` tries) over the last one to two half windows of
///   `baselineSamples` of its tries. Each try is compared with its own
///   kind's baseline, and the limit follows an average of about the last
///   `recentSamples` of those ratios, each counted as at most `mostVote`
///   (`ratio`). A path that always takes 2 s is at its baseline; heavy
///   queries that are a small minority of a path's tries add at most twice
///   their share; the whole upstream slowing down raises every kind's
///   ratio, and the average with them (`AdaptiveLimit+Kinds.swift`).
/// - **No probe drops.** Baselines are learned from live traffic only.
///   The limit is never forced down to re-measure them (the 503 dips
///   of envoy#8337 and #9007): near capacity the queue empties now and
///   then, and the recent latency shows it. A faster kind lowers its
///   baseline at once; a slower one raises it once a window has passed.
/// - **No growth while the limit is not used, nor under mild overload.**
///   The limit grows only while the recent latency is at the baseline and
///   at least half the limit was in flight; with some queue (within
///   `tolerance`) it drifts down slowly instead of growing (Gradient2's
///   growth under mild overload, concurrency-limits #134), which also finds
///   out a limit that started above the upstream's capacity.
/// - **Only completed tries are samples.** The caller reports a try that
///   reached its end; a request refused, shed or timed out in a queue never
///   reaches `sample` (the fast samples of concurrency-limits #176).
///
/// Each voting sample moves the limit by `ratio`, in three zones:
/// - **at the baseline** (at most `growUnder`, 1.25 times it by default): the target
///   is `limit + √limit` (the square root: the queue an upstream can hold at
///   its baseline latency), taken only from a sample that used the limit;
/// - **within `tolerance`**: the target is `holdDrift` (0.98) of the limit;
/// - **past it**: `limit × max(0.5, tolerance / ratio)`.
/// The limit moves `smoothing` of the way to its target per sample, within
/// `[minLimit, maxLimit]`. In a closed loop against an upstream of 4 slots
/// it settles between 4 and 12 from any start (`AdaptiveLimitTests`).
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
        /// Tries of a kind its baseline is the least recent latency over. Default 600.
        public var baselineSamples: Int = 600
        /// Tries the recent latency (a kind's median) and the recent ratio
        /// (an average) are taken over. Default 10.
        public var recentSamples: Int = 10
        /// Recent latency at most this many times the baseline counts as
        /// "at the baseline", where a used limit grows: the allowance for
        /// an upstream's ordinary jitter (Envoy's adaptive concurrency adds
        /// 25 % to its minimum latency for the same reason). Default 1.25:
        /// at 1.1, latencies 30 % either side of their mean kept a used
        /// limit near its minimum (`AdaptiveLimitTests`), because the
        /// baseline is a minimum and sits below a noisy average.
        public var growUnder: Double = 1.25
        /// Latencies are compared as if each were at least this long, in
        /// seconds: below it a difference is the proxy's, the network's or
        /// the machine's own jitter, not a queue at the upstream (issue 44:
        /// an answer of 0.1 ms that takes 1 ms on a busy host is not ten
        /// times slower). Default 5 ms (`latency_floor`).
        public var latencyFloor: Double = 0.005

        public init() {}

        /// Where a limit starts unless told (within its bounds).
        public static let defaultInitialLimit = 20

        /// The most `recentSamples` may be (a kind's window is kept sorted).
        public static let mostRecentSamples = 1_000

        /// The messages a configuration error would give, empty when valid.
        public func validate() -> [String] {
            var problems: [String] = []
            if minLimit < 1 { problems.append("min_limit must be at least 1, got \(minLimit)") }
            if maxLimit < minLimit {
                problems.append("max_limit (\(maxLimit)) must not be below min_limit (\(minLimit))")
            }
            if initialLimit < minLimit || initialLimit > maxLimit {
                problems.append("initial_limit must be within min_limit and max_limit, got \(initialLimit)")
            }
            if !(smoothing > 0 && smoothing <= 1) {
                problems.append("smoothing must be above 0 and at most 1, got \(smoothing)")
            }
            if !(tolerance >= 1 && tolerance <= 10) {
                problems.append("tolerance must be between 1 and 10, got \(tolerance)")
            }
            if baselineSamples < recentSamples || recentSamples < 1 {
                problems.append("baseline_samples must be at least recent_samples, and both at least 1")
            }
            if !(latencyFloor >= 0 && latencyFloor <= 10) {
                problems.append("latency_floor must be between 0s and 10s")
            }
            if recentSamples > Self.mostRecentSamples {
                problems.append("recent_samples must be at most \(Self.mostRecentSamples), got \(recentSamples)")
            }
            return problems
        }
    }

    public let configuration: Configuration
    /// The limit as a fraction (it moves in small steps); `current` is what applies.
    public private(set) var limit: Double
    /// The baseline of the kind of request last measured, in seconds (0: no sample yet).
    public var baseline: Double { lastKind.map { kinds.entries[$0].baseline } ?? 0 }
    /// That kind's recent latency, in seconds (0: no sample yet).
    public var recent: Double { lastKind.map { kinds.entries[$0].recent } ?? 0 }
    /// How much slower than their own kinds' baselines the recent tries
    /// were: an average over about `recentSamples` ratios, each counted as
    /// at most `mostVote` (1: at the baselines; 0: no kind has voted yet).
    /// What moves the limit.
    public private(set) var ratio: Double = 0
    /// Samples taken so far (saturating).
    public private(set) var samples = 0
    private var kinds: KindBaselines
    private var lastKind: Int?
    /// An average over about `recentSamples` votes, as an exponential weight.
    private let recentWeight: Double

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        limit = Double(min(max(configuration.initialLimit, configuration.minLimit), configuration.maxLimit))
        let recentSamples = min(max(1, configuration.recentSamples), Configuration.mostRecentSamples)
        kinds = KindBaselines(idleAfter: configuration.baselineSamples, recentSamples: recentSamples)
        recentWeight = 2 / Double(recentSamples + 1)
    }

    /// Tries that may be in flight now.
    public var current: Int { Int(limit.rounded(.down)) }

    /// A try of `kind` completed after `latency`, with `inFlight` tries in
    /// flight when it started (itself included). Returns the new `current`
    /// when it changed, else nil.
    public mutating func sample(latency: Duration, inFlight: Int, queued: Bool = false, kind: UInt64 = 0) -> Int? {
        sample(seconds: Self.seconds(latency), inFlight: inFlight, queued: queued, kind: kind)
    }

    /// The same, from two readings of the monotonic clock: no `Duration`
    /// arithmetic (128-bit) on the hot path.
    public mutating func sample(
        from start: Instant, to end: Instant, inFlight: Int, queued: Bool = false, kind: UInt64 = 0
    ) -> Int? {
        // Bounded before any arithmetic: a day at most, never negative.
        let ns = end.nanoseconds >= start.nanoseconds ? min(end.nanoseconds &- start.nanoseconds, 86_400_000_000_000) : 0
        return sample(seconds: Double(ns) / 1e9, inFlight: inFlight, queued: queued, kind: kind)
    }

    /// `queued`: requests were waiting for a slot as the try ended (the
    /// limit is saturated): the sample may lower its kind's baseline, never raise it.
    private mutating func sample(seconds: Double, inFlight: Int, queued: Bool, kind: UInt64) -> Int? {
        let before = current
        samples = samples == Int.max ? samples : samples + 1
        // Its kind's baseline (a kind the table has no room for learns
        // nothing and does not vote).
        guard let k = kinds.entry(for: kind, at: samples) else { return nil }
        lastKind = k
        // Not from a saturated limit, though: at the minimum it counts (if
        // the latency is still high there, the upstream is slower).
        let votes = kinds.entries[k].measured(
            seconds, recentSamples: configuration.recentSamples, baselineSamples: configuration.baselineSamples,
            floor: configuration.latencyFloor, movesWindow: !queued || limit <= Double(configuration.minLimit))
        guard let vote = votes else { return nil }
        // An average over about `recentSamples` votes, each at most
        // `mostVote`: a minority of heavy tries adds at most its share of
        // that, where a queue at the upstream raises every vote.
        let clipped = min(vote, Self.mostVote)
        ratio = ratio == 0 ? clipped : ratio + (clipped - ratio) * recentWeight
        let target: Double
        // With requests waiting, growing turns them into load on the
        // upstream at once: there the limit grows only within 10 % of the
        // baseline (the jitter allowance is for a limit that is not yet
        // holding anyone back).
        if ratio <= (queued ? min(configuration.growUnder, Self.saturatedGrowUnder) : configuration.growUnder) {
            // Growth only from samples that used the limit.
            guard Double(max(0, inFlight)) >= limit / 2 else { return nil }
            target = limit + limit.squareRoot()
        } else if ratio <= configuration.tolerance {
            // Some queue, within the tolerance: the limit drifts down slowly,
            // so a limit set (or learned) above the upstream's capacity is
            // found out without a forced drop: below it, the tries find no
            // queue again and it grows back.
            target = limit * Self.holdDrift
        } else {
            target = limit * max(0.5, configuration.tolerance / ratio)
        }
        limit += (target - limit) * configuration.smoothing
        limit = min(Double(configuration.maxLimit), max(Double(configuration.minLimit), limit))
        return current != before ? current : nil
    }

    /// A vote counts at most this much (past it the limit halves anyway).
    static let mostVote = 3.0

    /// `growUnder` while requests wait for a slot.
    public static let saturatedGrowUnder = 1.1
    /// In the tolerance zone, the target is this fraction of the limit.
    public static let holdDrift = 0.98


    /// A latency in seconds, bounded (a day at most; never negative).
    static func seconds(_ d: Duration) -> Double {
        let (s, atto) = d.components
        guard s >= 0 else { return 0 }
        return min(86_400, Double(s) + Double(atto) / 1e18)
    }
}
