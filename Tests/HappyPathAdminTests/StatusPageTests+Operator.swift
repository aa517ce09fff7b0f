import Foundation
import HappyPathCore
import HappyPathAdmin
import HappyPathPolicies
import Testing

/// What the page says about endpoints, health checks, pauses, rates,
/// pending deliveries and an operator's overrides, and the same in
/// `/admin/state`'s JSON.
@Suite struct StatusPageOperatorTests {
    /// 2026-11-27 14:00:00 UTC.
    let noon = Date(timeIntervalSince1970: 1_795_788_000)

    func upstream() -> AdminSnapshot.Upstream {
        var u = AdminSnapshot.Upstream(
            name: "pay<ments>", breaker: .forced(.open), breakerFailures: (3, 9, 4),
            endpoints: [
                AdminSnapshot.Endpoint(url: "http://a.example"),
                AdminSnapshot.Endpoint(url: "http://b.example", ejectedFor: .seconds(28)),
                AdminSnapshot.Endpoint(url: "http://c.example/\"x", drained: true),
            ], pausedFor: .seconds(4))
        u.pauseCause = 503
        u.healthCheck = AdminSnapshot.HealthCheck(age: .milliseconds(1200), healthy: 2, endpoints: 3)
        return u
    }

    @Test(arguments: [
        (AdminSnapshot.Breaker.forced(.open), "forced open by an operator (refuses every try until released)", "bad"),
        (.forced(.closed), "forced closed by an operator (lets every try through, counts no failure)", "warn"),
    ])
    func saysAForcedBreakerInWords(breaker: AdminSnapshot.Breaker, words: String, tone: String) {
        #expect(StatusPage.breakerWords(breaker, takenAt: noon) == words)
        #expect(StatusPage.tone(breaker) == tone)
        #expect(StatusPage.failureWords((3, 9, 4), breaker: breaker) == "not counted while forced")
    }

    @Test func aForcedBreakerFromTheStateMachine() {
        let now = Instant(nanoseconds: 50_000_000_000)
        let forced = AdminSnapshot.Breaker(.open(until: Instant(nanoseconds: .max)), forced: .open, at: now)
        #expect(forced == .forced(.open) && forced.name == "open" && forced.forcedTo == .open)
        #expect(AdminSnapshot.Breaker(.closed, forced: .closed, at: now).name == "closed")
        #expect(AdminSnapshot.Breaker(.closed, at: now).forcedTo == nil)
    }

    @Test func rendersRotationHealthCheckAndPause() {
        let html = StatusPage.upstreamSection(upstream(), index: 0, takenAt: noon)
        #expect(html.contains("<td>http://a.example</td><td><span class=\"ok\">in rotation</span>"))
        #expect(html.contains("<td>http://b.example</td><td><span class=\"bad\">ejected until 14:00:28 UTC (28.0 s)</span>"))
        #expect(html.contains("<td>http://c.example/&quot;x</td><td><span class=\"warn\">drained by an operator</span>"))
        #expect(html.contains("<dd data-k=\"health_check\">last check passed 1.2 s ago (2 of 3 endpoints answered)</dd>"))
        #expect(html.contains("paused until 14:00:04 UTC (4.0 s), asked by a 503"))
        #expect(html.contains("<span class=\"bad\">forced open by an operator"))
        #expect(StatusPage.healthWords(nil) == "no health check has ended yet")
        #expect(
            StatusPage.healthWords(AdminSnapshot.HealthCheck(age: .seconds(3), healthy: 0, endpoints: 1))
                == "last check failed 3.0 s ago (0 of 1 endpoint answered)")
    }

    /// The buttons: hidden until the script shows them, each naming its
    /// POST with the upstream's name as one escaped path segment.
    @Test func rendersTheActionsHiddenAndEscaped() {
        let html = StatusPage.upstreamSection(upstream(), index: 0, takenAt: noon)
        #expect(html.contains("<p class=\"actions\" data-script hidden>Breaker: "))
        #expect(html.contains("data-post=\"/admin/upstreams/pay%3Cments%3E/breaker/open\""))
        #expect(html.contains("data-post=\"/admin/upstreams/pay%3Cments%3E/breaker/auto\""))
        #expect(html.contains("data-post=\"/admin/upstreams/pay%3Cments%3E/endpoints/0/drain\""))
        #expect(html.contains("data-post=\"/admin/upstreams/pay%3Cments%3E/endpoints/2/undrain\""))
        #expect(html.contains("data-confirm=\"Force the breaker of pay&lt;ments&gt; open?"))
        #expect(html.contains("<td data-script hidden><button"))
        #expect(!html.contains("<ments>"))
        #expect(StatusPage.render(AdminSnapshot(takenAt: noon), events: []).contains("<noscript>"))
    }

    @Test func rendersRatesOverTheirSpan() {
        var r = RouteTotals(route: "/api/")
        r.requests = 50
        r.fallbacks = 3
        r.fallbacksByKind = ["stale": 1, "fixed": 2]
        let w = RouteWindow(
            seconds: 55, requestsPerSecond: 0.4, errorRatio: 0.25, p50: 0.01, p99: .infinity, triesPerRequest: 1.5)
        let cells = Dictionary(StatusPage.routeCells(r, window: w).map { ($0.key, $0.text) }, uniquingKeysWith: { a, _ in a })
        #expect(cells["r-over"] == "last 55.0 s")
        #expect(cells["r-requests"] == "0.40/s")
        #expect(cells["r-errors"] == "25.0%")
        #expect(cells["r-p50"] == "≤ 10 ms" && cells["r-p99"] == "> 30 s")
        #expect(cells["r-tries"] == "1.50")
        #expect(cells["r-fallbacks"] == "3 (2 fixed, 1 stale)")
        #expect(cells["r-coalesced"] == "0")
        let html = StatusPage.routeTotalsTable([r], windows: ["/api/": w])
        #expect(html.contains("<td data-k=\"r-p99\">&gt; 30 s</td>"))
        #expect(html.contains("<td data-k=\"r-errors\" class=\"warn\">25.0%</td>"))
    }

    /// Issue 50: a coalescing route's line says how many of its requests
    /// shared another's try, in the page and in `/admin/state`.
    @Test func aCoalescingRouteSaysHowManyOfItsRequestsSharedATry() {
        var r = RouteTotals(route: "/catalog/")
        r.requests = 2000
        r.coalesced = 1995
        let cells = Dictionary(StatusPage.routeCells(r, window: nil).map { ($0.key, $0.text) }, uniquingKeysWith: { a, _ in a })
        #expect(cells["r-coalesced"] == "1995 of 2000 (99.8%)")
        #expect(StatusPage.routeTotalsTable([r]).contains("<th scope=\"col\">Coalesced</th>"))
        var snapshot = AdminSnapshot(takenAt: noon)
        snapshot.routes = [r]
        #expect(snapshot.json.contains("\"coalesced\":1995.0"))
        let readings = [RouteReading(route: "/catalog/", .coalesced, 7), RouteReading(route: "/catalog/", .requests(code: "OK"), 8)]
        #expect(RouteTotals.read(readings, routes: ["/catalog/"])[0].coalesced == 7)
        #expect(RouteReading.Series(family: "happypath_coalesced_requests_total", labels: [("route", "/catalog/")]) == .coalesced)
    }

    func deliveries() -> AdminSnapshot.Deliveries {
        var d = AdminSnapshot.Deliveries(
            counts: [("queued", 2), ("in_flight", 1), ("delivered", 0), ("dead", 0)], store: "postgres", writable: false)
        d.problem = "connection <refused>"
        d.pending = [("hooks", 2, .seconds(12)), ("mail", 1, .seconds(3))]
        return d
    }

    @Test func rendersTheOldestPendingDeliveryAndWhyTheStoreCannotWrite() {
        let html = StatusPage.deliveriesSection(deliveries())
        #expect(html.contains("<span data-k=\"oldest\"><span class=\"warn\">12.0 s old (hooks)</span></span>"))
        #expect(html.contains("<tr><td>hooks</td><td>2</td><td>12.0 s</td></tr>"))
        #expect(html.contains("<span class=\"bad\">cannot write</span>: connection &lt;refused&gt;"))
        var none = deliveries()
        none.pending = []
        #expect(StatusPage.deliveriesSection(none).contains("none pending"))
        none.pending = nil
        #expect(StatusPage.oldestWords(none) == "not read")
    }

    @Test func theStateJSONSaysTheSame() throws {
        var r = RouteTotals(route: "/api/")
        r.requests = 4
        r.tries = 6
        r.p99 = .infinity
        r.fallbacksByKind = ["stale": 1]
        var s = AdminSnapshot(takenAt: noon, deliveries: deliveries(), upstreams: [upstream()])
        s.routes = [r]
        s.windows = [
            "/api/": RouteWindow(seconds: 10, requestsPerSecond: 0.4, errorRatio: 0, p50: 0.005, p99: nil, triesPerRequest: 1.5)
        ]
        let json = try #require(try JSONSerialization.jsonObject(with: Data(s.json.utf8)) as? [String: Any])
        let u = try #require((json["upstreams"] as? [[String: Any]])?.first)
        let breaker = try #require(u["circuit_breaker"] as? [String: Any])
        #expect(breaker["state"] as? String == "open" && breaker["forced"] as? String == "open")
        let endpoints = try #require(u["endpoints"] as? [[String: Any]])
        #expect(endpoints[1]["ejected"] as? Bool == true && endpoints[1]["ejected_until"] as? String == "2026-11-27T14:00:28Z")
        #expect(endpoints[2]["drained"] as? Bool == true && endpoints[2]["ejected_until"] is NSNull)
        #expect(u["pause_cause"] as? Int == 503)
        let health = try #require(u["health_check"] as? [String: Any])
        #expect(health["healthy_endpoints"] as? Int == 2 && health["age_s"] as? Double == 1.2)
        #expect(health["checked_at"] as? String == "2026-11-27T13:59:58Z")
        let d = try #require(json["deliveries"] as? [String: Any])
        #expect(d["oldest_pending_s"] as? Double == 12 && d["store_problem"] as? String == "connection <refused>")
        #expect((d["pending"] as? [[String: Any]])?.first?["upstream"] as? String == "hooks")
        let route = try #require((json["routes"] as? [[String: Any]])?.first)
        #expect(route["tries"] as? Double == 6 && route["p99_s"] as? String == "+Inf")
        #expect((route["fallbacks"] as? [String: Any])?["stale"] as? Double == 1)
        let window = try #require(route["window"] as? [String: Any])
        #expect(window["requests_per_s"] as? Double == 0.4 && window["tries_per_request"] as? Double == 1.5)
        #expect(window["p99_s"] is NSNull)
    }

    @Test func readsTriesAndFallbacksByKind() {
        let readings = [
            RouteReading(route: "/api/", .tries, 7),
            RouteReading(route: "/api/", .fallbacks(kind: "stale"), 1),  // reason timeout
            RouteReading(route: "/api/", .fallbacks(kind: "stale"), 2),  // reason 5xx
            RouteReading(route: "/api/", .fallbacks(kind: "fixed"), 1),
            RouteReading(route: "/api/", .durationBucket(le: 0.005), 1),
            RouteReading(route: "/api/", .durationBucket(le: .infinity), 2),
        ]
        let api = RouteTotals.read(readings, routes: ["/api/"])[0]
        #expect(api.tries == 7)
        #expect(api.fallbacks == 4 && api.fallbacksByKind == ["stale": 3, "fixed": 1])
        #expect(api.buckets == [RouteTotals.Bucket(le: 0.005, count: 1), RouteTotals.Bucket(le: .infinity, count: 2)])
    }
}
