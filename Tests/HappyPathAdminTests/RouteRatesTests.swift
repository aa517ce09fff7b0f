import HappyPathCore
import HappyPathAdmin
import HappyPathPolicies
import Testing

/// Rates per route from two readings of the registry's totals.
@Suite struct RouteRatesTests {
    func totals(
        _ route: String = "/api/", requests: Double, errors: Double = 0, tries: Double? = nil, buckets: [(Double, Double)] = []
    )
        -> RouteTotals
    {
        var t = RouteTotals(route: route)
        t.requests = requests
        t.errors = errors
        t.tries = tries ?? requests
        t.buckets = buckets.map { RouteTotals.Bucket(le: $0.0, count: $0.1) }
        return t
    }

    @Test func aWindowIsTheDifferenceOverTheSpan() throws {
        let before = totals(requests: 100, errors: 5, tries: 110, buckets: [(0.005, 50), (0.1, 95), (.infinity, 100)])
        let after = totals(requests: 200, errors: 15, tries: 260, buckets: [(0.005, 60), (0.1, 150), (.infinity, 200)])
        let w = try #require(RouteWindow.between(before, after, seconds: 10))
        #expect(w.requestsPerSecond == 10)
        #expect(w.errorRatio == 0.1)
        #expect(w.triesPerRequest == 1.5)
        // The span's 100 requests: 10 under 5 ms, 55 under 100 ms, 45 past it.
        #expect(w.p50 == 0.1)
        #expect(w.p99 == .infinity)
    }

    @Test func noRequestsInTheSpanIsARateOfZeroAndNoRatio() throws {
        let w = try #require(RouteWindow.between(totals(requests: 7), totals(requests: 7), seconds: 5))
        #expect(w.requestsPerSecond == 0)
        #expect(w.errorRatio == nil && w.p50 == nil && w.triesPerRequest == nil)
    }

    @Test func aCounterThatWentBackGivesNoWindow() {
        #expect(RouteWindow.between(totals(requests: 7), totals(requests: 3), seconds: 5) == nil)
        #expect(RouteWindow.between(totals(requests: 7), totals(requests: 9), seconds: 0) == nil)
    }

    @Test func readingsAreKeptSpacedAndUpToTheHorizon() {
        let clock = ManualClock()
        var rates = RouteRates(spacing: .seconds(5), horizon: .seconds(60), minimumSpan: .seconds(1))
        // The first reading has nothing to compare with.
        #expect(rates.read([totals(requests: 0)], at: clock.now()).isEmpty)
        // Half a second later: too short a span.
        clock.advance(by: .milliseconds(500))
        #expect(rates.read([totals(requests: 5)], at: clock.now()).isEmpty)
        #expect(rates.kept == 1)
        clock.advance(by: .milliseconds(1500))
        #expect(rates.read([totals(requests: 20)], at: clock.now())["/api/"]?.requestsPerSecond == 10)
        #expect(rates.kept == 1, "2 s after the last kept: not kept")
        // Every 5 s for two minutes, 1 request a second: the span stops growing at the horizon.
        var requests = 20.0
        var last: RouteWindow?
        for _ in 0..<24 {
            clock.advance(by: .seconds(5))
            requests += 5
            last = rates.read([totals(requests: requests)], at: clock.now())["/api/"]
        }
        #expect(rates.kept <= 14)
        #expect((last?.seconds ?? 0) <= 65 && (last?.seconds ?? 0) >= 60, "\(String(describing: last))")
        #expect(last?.requestsPerSecond == 1)
    }

    @Test func afterAQuietSpellTheSpanIsThatSpell() {
        let clock = ManualClock()
        var rates = RouteRates()
        _ = rates.read([totals(requests: 0)], at: clock.now())
        clock.advance(by: .seconds(3600))
        let w = rates.read([totals(requests: 360)], at: clock.now())["/api/"]
        #expect(w?.seconds == 3600)
        #expect(w?.requestsPerSecond == 0.1)
    }

    @Test func aRouteTheEarlierReadingDidNotHaveHasNoWindowYet() {
        let clock = ManualClock()
        var rates = RouteRates()
        _ = rates.read([totals(requests: 0)], at: clock.now())
        clock.advance(by: .seconds(5))
        let windows = rates.read([totals(requests: 1), totals("/new/", requests: 1)], at: clock.now())
        #expect(windows["/api/"] != nil && windows["/new/"] == nil)
    }
}
