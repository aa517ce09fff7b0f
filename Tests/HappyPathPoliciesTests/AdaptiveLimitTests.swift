import HappyPathCore
import HappyPathPolicies
import Testing

/// The limit learned from latency (issue 35): it grows only while used and
/// while nothing queues, holds within the tolerance, shrinks past it, never
/// leaves its bounds, follows a faster upstream down, and settles at an
/// upstream's capacity in a closed loop instead of growing without bound.
@Suite struct AdaptiveLimitTests {
    static func limit(initial: Int = 20, min: Int = 2, max: Int = 200) -> AdaptiveLimit {
        var c = AdaptiveLimit.Configuration()
        c.initialLimit = initial
        c.minLimit = min
        c.maxLimit = max
        return AdaptiveLimit(c)
    }

    @Test func theFirstSampleIsTheBaselineAndAnUnusedLimitDoesNotGrow() {
        var l = Self.limit()
        #expect(l.sample(latency: .milliseconds(10), inFlight: 1) == nil)
        #expect(l.baseline == 0.01 && l.recent == 0.01)
        for _ in 0..<500 { _ = l.sample(latency: .milliseconds(10), inFlight: 9) }  // under half of 20
        #expect(l.current == 20)
    }

    @Test func aUsedLimitGrowsWhileNothingQueuesUpToItsMaximum() {
        var l = Self.limit(max: 60)
        var seen = [l.current]
        for _ in 0..<400 {
            if let c = l.sample(latency: .milliseconds(10), inFlight: l.current) { seen.append(c) }
        }
        #expect(seen == seen.sorted(), "never shrinks at the baseline")
        #expect(l.current == 60)
        #expect(seen.count > 5)
    }

    @Test func withinTheToleranceTheLimitHolds() {
        var l = Self.limit()
        _ = l.sample(latency: .milliseconds(10), inFlight: 20)
        let start = l.current
        for _ in 0..<200 { _ = l.sample(latency: .milliseconds(13), inFlight: 20) }  // 1.3× the baseline
        #expect(l.current >= start)
        // It grew at most while `recent` was still near the baseline (the first few samples).
        #expect(l.current <= start + 6)
    }

    @Test func pastTheToleranceItShrinksAtMostByHalfASampleNeverBelowItsMinimum() {
        var l = Self.limit(initial: 100, min: 5)
        _ = l.sample(latency: .milliseconds(10), inFlight: 100)
        var last = Double(l.current)
        for _ in 0..<300 {
            _ = l.sample(latency: .milliseconds(100), inFlight: 100)
            #expect(Double(l.current) >= last * 0.5 - 1)
            last = Double(l.current)
        }
        #expect(l.current == 5)
    }

    @Test func theBaselineFollowsAFasterUpstreamDown() {
        var l = Self.limit()
        for _ in 0..<50 { _ = l.sample(latency: .milliseconds(100), inFlight: 20) }
        for _ in 0..<60 { _ = l.sample(latency: .milliseconds(10), inFlight: 20) }
        #expect(l.baseline <= 2 * l.recent + 1e-9)
        #expect(l.baseline < 0.05)
    }

    /// An upstream that serves 4 at a time in 25 ms (a try waits behind the
    /// others once more than 4 are in flight), its clients always using the
    /// whole limit: the limit settles near 4 to 6 and stays there.
    @Test func aClosedLoopSettlesAtTheUpstreamsCapacity() {
        var l = Self.limit(initial: 50, min: 1, max: 200)
        var tail: [Int] = []
        for i in 0..<3000 {
            let inFlight = l.current
            let ms = 25.0 * max(1, Double(inFlight) / 4)
            _ = l.sample(latency: .microseconds(Int64(ms * 1000)), inFlight: inFlight)
            if i >= 2000 { tail.append(l.current) }
        }
        #expect(tail.min()! >= 3, "\(tail.min()!)")
        #expect(tail.max()! <= 8, "\(tail.max()!)")
    }

    @Test(arguments: [Duration.zero, .nanoseconds(-5), .seconds(-1), .seconds(Int64.max), .seconds(1_000_000)])
    func anyLatencyIsBounded(_ d: Duration) {
        var l = Self.limit()
        _ = l.sample(latency: .milliseconds(10), inFlight: 20)
        _ = l.sample(latency: d, inFlight: Int.max)
        _ = l.sample(latency: d, inFlight: Int.min)
        #expect(l.current >= 2 && l.current <= 200)
        #expect(l.recent.isFinite && l.baseline.isFinite)
    }

    @Test func aBadConfigurationIsNamed() {
        #expect(AdaptiveLimit.Configuration().validate().isEmpty)
        var cases: [(AdaptiveLimit.Configuration, String)] = []
        var c = AdaptiveLimit.Configuration()
        c.minLimit = 0
        cases.append((c, "min_limit must be at least 1"))
        c = AdaptiveLimit.Configuration()
        c.maxLimit = 1
        cases.append((c, "max_limit (1) must not be below min_limit (2)"))
        c = AdaptiveLimit.Configuration()
        c.initialLimit = 500
        cases.append((c, "initial_limit must be within"))
        c = AdaptiveLimit.Configuration()
        c.smoothing = 0
        cases.append((c, "smoothing must be above 0"))
        c = AdaptiveLimit.Configuration()
        c.tolerance = 0.5
        cases.append((c, "tolerance must be between 1 and 10"))
        c = AdaptiveLimit.Configuration()
        c.recentSamples = 0
        cases.append((c, "baseline_samples must be at least"))
        for (config, message) in cases {
            #expect(config.validate().contains { $0.contains(message) }, "\(config.validate())")
        }
    }
}
