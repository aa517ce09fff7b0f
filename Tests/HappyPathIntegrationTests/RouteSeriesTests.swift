import CoreMetrics
import HappyPathAdmin
import HappyPathStore
import Testing

@testable import HappyPathServer

/// The route series the status page reads hold the same values the
/// exposition shows, read from their handles (no text parsed).
@Suite struct RouteSeriesTests {
    @Test func aRouteCounterIsReadableAndExportedOnce() {
        let metrics = ProxyMetrics()
        let a = metrics.counter("happypath_requests_total", [("route", "/api/"), ("code", "OK")])
        let b = metrics.counter("happypath_requests_total", [("route", "/api/"), ("code", "OK")])
        a.increment()
        b.increment(by: 2)
        #expect(metrics.routeSeries.readings() == [RouteReading(route: "/api/", .requests(code: "OK"), 3)], "one handle per label set, as the registry keeps one series")
        #expect(metrics.registry.emitToString().contains("happypath_requests_total{route=\"/api/\",code=\"OK\"} 3"))
    }

    @Test func otherFamiliesAreNotKeptTwice() {
        let metrics = ProxyMetrics()
        metrics.counter("happypath_upstream_tries_total", [("upstream", "u"), ("outcome", "ok")]).increment()
        metrics.counter("happypath_requests_total", []).increment()
        #expect(metrics.routeSeries.readings().isEmpty, "not a route family, or no route label: exported only")
    }

    @Test func aDurationOnABoundCountsInThatBucket() {
        let metrics = ProxyMetrics()
        let timer = metrics.timer("happypath_request_duration_seconds", [("route", "/")])
        timer.recordNanoseconds(1_000_000)  // on the 1 ms bound
        timer.recordNanoseconds(1_000_001)  // just past it: the 2.5 ms bucket
        timer.recordNanoseconds(60_000_000_000)  // past the last bound
        let buckets = metrics.routeSeries.readings().compactMap { r -> (Double, Double)? in
            if case let .durationBucket(le) = r.series { return (le, r.value) }
            return nil
        }
        #expect(buckets.first?.0 == 0.001 && buckets.first?.1 == 1)
        #expect(buckets.first { $0.0 == 0.0025 }?.1 == 2, "cumulative")
        #expect(buckets.first { $0.0 == 30 }?.1 == 2)
        #expect(buckets.last?.0 == .infinity && buckets.last?.1 == 3)
        let text = metrics.registry.emitToString()
        #expect(text.contains("happypath_request_duration_seconds_bucket{route=\"/\",le=\"0.001\"} 1"), "the exported histogram agrees")
        #expect(text.contains("happypath_request_duration_seconds_bucket{route=\"/\",le=\"0.0025\"} 2"))
    }
}

/// The admin API checks a listing's `state` against `AdminAction`'s list
/// (HappyPathAdmin knows nothing of the store): it must be the store's own.
@Suite struct AdminDeliveryStatesTests {
    @Test func theAdminsStatesAreTheStores() {
        #expect(AdminAction.deliveryStates == DeliveryState.allCases.map(\.name))
    }
}
