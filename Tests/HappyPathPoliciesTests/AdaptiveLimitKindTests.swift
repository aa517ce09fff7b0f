import HappyPathCore
@testable import HappyPathPolicies
import Testing

/// Issue 44: a slow kind of request is not an overloaded upstream. Each
/// kind (route and path) is compared with its own baseline, and the limit
/// follows the median of those ratios: a slow path, a slow route or a
/// minority of heavy queries on a fast path leave the limit where the
/// fast traffic puts it; the whole upstream slowing down still lowers it.
@Suite struct AdaptiveLimitKindTests {
    static let fast: UInt64 = 1
    static let slow: UInt64 = 2

    static func limit(initial: Int = 20, min: Int = 2, max: Int = 100) -> AdaptiveLimit {
        AdaptiveLimitTests.limit(initial: initial, min: min, max: max)
    }

    /// The first attack, as samples: a path that takes 2 s beside
    /// one that takes 0.1 ms, interleaved as their clients' rates make
    /// them (the fast path answers far more often), the limit in use.
    @Test func aSlowPathBesideAFastOneDoesNotLowerTheLimit() {
        var l = Self.limit()
        for i in 0..<3000 {
            if i % 50 == 0 { _ = l.sample(latency: .seconds(2), inFlight: l.current, kind: Self.slow) }
            _ = l.sample(latency: .microseconds(100), inFlight: l.current, kind: Self.fast)
        }
        #expect(l.current == 100, "\(l.current)")
        #expect(l.ratio < 1.25, "\(l.ratio)")
    }

    /// More slow tries than fast ones: still each at its own baseline.
    @Test func aSlowPathThatDominatesTheSamplesDoesNotLowerItEither() {
        var l = Self.limit()
        for _ in 0..<1000 {
            _ = l.sample(latency: .seconds(2), inFlight: l.current, kind: Self.slow)
            _ = l.sample(latency: .seconds(2), inFlight: l.current, kind: Self.slow)
            _ = l.sample(latency: .microseconds(100), inFlight: l.current, kind: Self.fast)
        }
        #expect(l.current == 100, "\(l.current)")
    }

    /// One client's heavy queries on the fast path, 50 times slower: a
    /// vote counts at most 3 (`mostVote`), so a minority adds at most
    /// twice its share to the average. A twentieth of the tries leaves the
    /// limit growing; a tenth does not bring it down.
    @Test(arguments: [(20, 100), (10, 20)])
    func aMinorityOfHeavyQueriesOnOnePathDoesNotLowerIt(every: Int, atLeast: Int) {
        var l = Self.limit()
        for i in 0..<3000 {
            let ms: Int64 = i % every == 0 ? 500 : 10
            _ = l.sample(latency: .milliseconds(ms), inFlight: l.current, kind: Self.fast)
        }
        #expect(l.current >= atLeast, "\(l.current)")
    }

    /// Every kind 10 times slower at once (the upstream as a whole is
    /// saturated): every ratio rises, and the limit falls to its minimum.
    @Test func theWholeUpstreamSlowingDownStillLowersTheLimit() {
        var l = Self.limit(initial: 50)
        for _ in 0..<200 {
            _ = l.sample(latency: .milliseconds(20), inFlight: l.current, kind: Self.fast)
            _ = l.sample(latency: .milliseconds(200), inFlight: l.current, kind: Self.slow)
        }
        let before = l.current
        for _ in 0..<60 {
            _ = l.sample(latency: .milliseconds(200), inFlight: l.current, kind: Self.fast)
            _ = l.sample(latency: .seconds(2), inFlight: l.current, kind: Self.slow)
        }
        #expect(before > 50)
        #expect(l.current == 2, "\(before) → \(l.current)")
        #expect(l.ratio > 2.9, "\(l.ratio)")  // each vote counted as 3 at most
    }

    /// An answer of 0.1 ms that takes up to 4 ms on a busy host is not 40
    /// times slower: below `latency_floor` (5 ms) differences are jitter,
    /// and a used limit grows. Past it, a fast path's queue still shows.
    @Test func differencesUnderTheLatencyFloorAreJitter() {
        var l = Self.limit()
        for i in 0..<2000 {
            let us: Int64 = i % 2 == 0 ? 100 : 4_000
            _ = l.sample(latency: .microseconds(us), inFlight: l.current, kind: Self.fast)
        }
        #expect(l.current == 100, "\(l.current)")
        for _ in 0..<60 { _ = l.sample(latency: .milliseconds(30), inFlight: l.current, kind: Self.fast) }
        #expect(l.current == 2, "\(l.current)")
    }

    /// A client that makes up a path per request: a made-up kind is seen
    /// once and never votes (a kind's first sample only sets its baseline),
    /// and it cannot push out the kinds in use (their baselines stay, so
    /// the upstream slowing down is still seen).
    @Test func madeUpPathsNeitherOutvoteNorPushOutTheKindsInUse() {
        var l = Self.limit(initial: 50)
        for i in 0..<2000 {
            _ = l.sample(latency: .milliseconds(10), inFlight: l.current, kind: Self.fast)
            // 10× slower, each once: a kind's first sample sets its
            // baseline and does not vote.
            _ = l.sample(latency: .milliseconds(10), inFlight: l.current, kind: 1_000 + UInt64(i))
        }
        #expect(l.current == 100)
        for i in 0..<200 {
            _ = l.sample(latency: .milliseconds(100), inFlight: l.current, kind: Self.fast)
            _ = l.sample(latency: .milliseconds(100), inFlight: l.current, kind: 100_000 + UInt64(i))
        }
        #expect(l.current == 2, "\(l.current)")
    }

    /// The table of kinds is bounded: past its capacity a new kind waits
    /// for a place whose kind has gone idle.
    @Test func theTableOfKindsIsBoundedAndReusesIdlePlaces() {
        var table = AdaptiveLimit.KindBaselines(idleAfter: 10, recentSamples: 4)
        var placed = 0
        for k in 0..<1000 where table.entry(for: UInt64(k), at: 1) != nil { placed += 1 }
        #expect(placed <= AdaptiveLimit.KindBaselines.capacity && placed > AdaptiveLimit.KindBaselines.capacity / 2)
        #expect(table.entry(for: 5_000, at: 5) == nil || placed < AdaptiveLimit.KindBaselines.capacity)
        // Long after: the old kinds are idle, a new one finds a place.
        #expect(table.entry(for: 5_000, at: 100) != nil)
        #expect(table.entry(for: 5_000, at: 101) == table.entry(for: 5_000, at: 102))
    }

    @Test(arguments: [
        ([1.0], 1.0), ([3.0, 1.0], 2.0), ([5.0, 1.0, 3.0], 3.0),
        // The window keeps 3: the 9 left, the median of 1, 3, 2 is 2.
        ([9.0, 1.0, 3.0, 2.0], 2.0), ([1.0, 1.0, 1.0, 7.0, 7.0], 7.0),
    ])
    func theMedianOfTheLastValues(values: [Double], median: Double) {
        var w = AdaptiveLimit.MedianWindow(size: 3)
        var last = 0.0
        for v in values { last = w.insert(v) }
        #expect(last == median)
    }
}
