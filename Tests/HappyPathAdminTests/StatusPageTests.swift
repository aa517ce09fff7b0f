import Foundation
import HappyPathCore
import HappyPathAdmin
import HappyPathPolicies
import Testing

@Suite struct StatusPageTests {
    /// 2026-11-27 14:00:00 UTC.
    let noon = Date(timeIntervalSince1970: 1_795_788_000)

    // MARK: - Escaping

    @Test(arguments: [
        ("api", "api"),
        ("", ""),
        ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
        ("a & b", "a &amp; b"),
        ("\"onmouseover=x", "&quot;onmouseover=x"),
        ("it's", "it&#39;s"),
        ("&amp;", "&amp;amp;"),  // escaped once more, never taken as already escaped
        ("line\nnext\ttab", "line\nnext\ttab"),
        ("nul\u{0}bell\u{7}del\u{7F}", "nul\u{FFFD}bell\u{FFFD}del\u{FFFD}"),
        ("héllo ✓ 名前", "héllo ✓ 名前"),
    ])
    func escapesWhatHTMLWouldRead(input: String, escaped: String) {
        #expect(StatusPage.escape(input) == escaped)
    }

    @Test func nothingEscapedKeepsNoMarkupCharacter() {
        let nasty = "<>&\"'" + String((0..<32).map { Character(Unicode.Scalar(UInt8($0))) })
        let out = StatusPage.escape(nasty)
        for c in ["<", ">", "\"", "'"] { #expect(!out.contains(c)) }
        #expect(
            !out.replacingOccurrences(of: "&amp;", with: "").replacingOccurrences(of: "&lt;", with: "")
                .replacingOccurrences(of: "&gt;", with: "").replacingOccurrences(of: "&quot;", with: "")
                .replacingOccurrences(of: "&#39;", with: "").contains("&"))
    }

    // MARK: - Words

    @Test(arguments: [
        (AdminSnapshot.Breaker.closed, "closed", "ok"),
        (.open(for: .seconds(4)), "open until 14:00:04 UTC (4.0 s)", "bad"),
        (.open(for: .seconds(125)), "open until 14:02:05 UTC (2 min 5 s)", "bad"),
        (.open(for: .zero), "open until 14:00:00 UTC (0.0 s)", "bad"),
        (.halfOpen(probesInFlight: 1, successes: 0), "half-open (1 probe in flight)", "warn"),
        (.halfOpen(probesInFlight: 2, successes: 1), "half-open (2 probes in flight, 1 succeeded)", "warn"),
    ])
    func saysTheBreakerInWords(breaker: AdminSnapshot.Breaker, words: String, tone: String) {
        #expect(StatusPage.breakerWords(breaker, takenAt: noon) == words)
        #expect(StatusPage.tone(breaker) == tone)
    }

    @Test func breakerFromTheStateMachine() {
        let now = Instant(nanoseconds: 50_000_000_000)
        #expect(AdminSnapshot.Breaker(.closed, at: now) == .closed)
        #expect(AdminSnapshot.Breaker(.open(until: now + .seconds(3)), at: now) == .open(for: .seconds(3)))
        // Past its end and not yet asked: open for no more time, not a negative one.
        #expect(AdminSnapshot.Breaker(.open(until: now - .seconds(3)), at: now) == .open(for: .zero))
        #expect(AdminSnapshot.Breaker(.halfOpen(probesInFlight: 1, successes: 0), at: now).name == "half_open")
    }

    @Test func countsTheFailuresBehindTheBreaker() {
        var breaker = CircuitBreakerStateMachine(CircuitBreakerStateMachine.Configuration())
        let now = Instant(nanoseconds: 1_000_000_000)
        _ = breaker.record(failure: true, probe: false, at: now)
        _ = breaker.record(failure: false, probe: false, at: now)
        _ = breaker.record(failure: true, probe: false, at: now)
        _ = breaker.record(failure: true, probe: false, at: now)
        let f = breaker.failures(at: now)
        #expect(f.consecutive == 2 && f.requests == 4 && f.failed == 3)
        #expect(StatusPage.failureWords(f, breaker: .closed) == "2 in a row; 3 of 4 failed in the window")
        #expect(StatusPage.failureWords(f, breaker: .open(for: .seconds(1))) == "3 of 4 failed in the window")
    }

    @Test func retriesLeftAgreesWithWhatTheBudgetGrants() {
        var budget = RetryBudget(ratio: 0.5, minPerSecond: 1, windowSeconds: 2)
        let now = Instant(nanoseconds: 1_000_000_000)
        for _ in 0..<4 { budget.recordRequest(at: now) }
        // 1·2 + 0.5·4 = 4 retries.
        #expect(budget.retriesLeft(at: now) == 4)
        var granted = 0
        while budget.tryWithdraw(at: now) { granted += 1 }
        #expect(granted == 4)
        #expect(budget.retriesLeft(at: now) == 0)
    }

    // MARK: - The page

    func snapshot() -> AdminSnapshot {
        AdminSnapshot(
            takenAt: noon, inFlight: 3, parked: 2, maxParked: 100,
            deliveries: AdminSnapshot.Deliveries(
                counts: [("queued", 7), ("in_flight", 1), ("delivered", 40), ("dead", 2)], heldBytes: 900, maxBytes: 10_000,
                store: "sqlite", writable: false),
            rateLimits: [("/api/<x>", 5, 1)],
            configSource: "config/<happypath>.yaml",
            upstreams: [
                AdminSnapshot.Upstream(
                    name: "pay<ments>", reachable: false, breaker: .open(for: .seconds(5)), breakerFailures: (5, 5, 5),
                    retriesLeft: 20,
                    endpoints: [
                        AdminSnapshot.Endpoint(url: "http://a.example:80/?x=\"y\""),
                        AdminSnapshot.Endpoint(url: "http://b.example:80", ejected: true),
                    ],
                    parked: [("unreachable", 0), ("circuit_open", 2)], pausedFor: .seconds(30), pausedClients: 1),
                AdminSnapshot.Upstream(name: "catalog", endpoints: [AdminSnapshot.Endpoint(url: "http://c.example")]),
            ])
    }

    @Test(arguments: [
        (AdminSnapshot.Concurrency(limit: 512, inFlight: 3), "3 in flight of a limit of 512; 0 queued"),
        (AdminSnapshot.Concurrency(limit: 12, inFlight: 12, queued: 4, adaptive: true), "12 in flight of a limit of 12 (learned, no sample yet); 4 queued"),
        (AdminSnapshot.Concurrency(limit: 9, inFlight: 9, queued: 0, adaptive: true, baseline: 0.02514, recent: 0.0270),
         "9 in flight of a limit of 9 (learned: baseline 25.1 ms, recent 27.0 ms); 0 queued"),
    ])
    func slotsInWords(c: AdminSnapshot.Concurrency, words: String) {
        #expect(StatusPage.slotWords(c) == words)
    }

    @Test(arguments: [
        (AdminSnapshot.H2Client(), "0 connections, 0 streams; 0 opened, 0 streams sent again after a refusal, 0 GOAWAYs"),
        (AdminSnapshot.H2Client(connections: 2, streams: 37, opened: 3, replayed: 1, goaways: 1),
         "2 connections, 37 streams (18.5 a connection); 3 opened, 1 stream sent again after a refusal, 1 GOAWAY"),
        (AdminSnapshot.H2Client(connections: 1, streams: 1, opened: 1), "1 connection, 1 stream (1.0 a connection); 1 opened, 0 streams sent again after a refusal, 0 GOAWAYs"),
    ])
    func theOwnHTTP2ClientInWords(c: AdminSnapshot.H2Client, words: String) {
        #expect(StatusPage.h2Words(c) == words)
    }

    @Test func rendersEachUpstreamItsBreakerAndItsEndpoints() {
        let html = StatusPage.render(snapshot(), events: [])
        #expect(html.hasPrefix("<!DOCTYPE html>"))
        #expect(html.contains("<h3>pay&lt;ments&gt;</h3>"))
        #expect(html.contains("data-upstream=\"pay&lt;ments&gt;\""))
        #expect(html.contains("<h3>catalog</h3>"))
        #expect(html.contains("<span class=\"bad\">open until 14:00:05 UTC (5.0 s)</span>"))
        #expect(html.contains("<span class=\"ok\">closed</span>"))
        #expect(html.contains("<dd data-k=\"failures\">5 of 5 failed in the window</dd>"))
        #expect(html.contains("<dd data-k=\"failures\">0 in a row; 0 of 0 failed in the window</dd>"))
        #expect(html.contains("<span class=\"bad\">unreachable</span>"))
        #expect(html.contains("<span class=\"warn\">2 parked</span> (2 circuit_open)"))
        #expect(html.contains("20 retries left"))
        #expect(html.contains("<span class=\"ok\">0 in flight of a limit of 0; 0 queued</span>"))
        #expect(html.contains("paused until 14:00:30 UTC (30.0 s); 1 client paused"))
        #expect(html.contains("<td>http://a.example:80/?x=&quot;y&quot;</td><td><span class=\"ok\">in rotation</span>"))
        #expect(html.contains("<td>http://b.example:80</td><td><span class=\"bad\">ejected</span>"))
        #expect(html.contains("config from config/&lt;happypath&gt;.yaml"))
        #expect(html.contains("<td>/api/&lt;x&gt;</td><td>5</td><td>1</td>"))
        // Nothing from outside the page, no inline script or style.
        #expect(!html.contains("http-equiv"))
        #expect(!html.contains("<script>"))
        #expect(!html.contains("style="))
        #expect(html.contains("<script src=\"/status.js\" defer></script>"))
    }

    @Test func rendersTheDeliveryBacklogAndTheStoresHealth() {
        let html = StatusPage.deliveriesSection(snapshot().deliveries)
        #expect(html.contains("<span class=\"warn\">8 in the backlog</span>"))
        #expect(html.contains("<span class=\"bad\">cannot write</span>"))
        #expect(html.contains("<td>dead</td><td data-k=\"delivery-dead\" class=\"bad\">2</td>"))
        #expect(StatusPage.deliveriesSection(nil).contains("No route delivers later."))
        // The actions wait for the script: hidden, and said so without it.
        #expect(html.contains("<div id=\"delivery-actions\" hidden>"))
        #expect(html.contains("<noscript>"))
        #expect(!StatusPage.deliveriesSection(nil).contains("delivery-actions"))
    }

    @Test func listsTheLastFiftyEventsNewestFirstEscaped() {
        var events: [AdminSnapshot.Event] = (0..<60).map { (type: "tick", ts: "t\($0)", fields: [(key: "n", value: "\($0)")]) }
        events.append(
            (type: "circuit_opened", ts: "t60", fields: [(key: "upstream", value: "<img src=x onerror=alert(1)>")]))
        let html = StatusPage.eventsSection(events)
        #expect(html.components(separatedBy: "<li>").count - 1 == StatusPage.eventsShown)
        let newest = html.range(of: "t60")!.lowerBound
        let older = html.range(of: "t59")!.lowerBound
        #expect(newest < older)
        #expect(!html.contains("t10<"), "the eleventh is not kept")
        #expect(html.contains("upstream=&lt;img src=x onerror=alert(1)&gt;"))
        #expect(!html.contains("<img"))
        #expect(StatusPage.eventsSection([]).contains("No events since the process started."))
    }

    @Test func theContentSecurityPolicyAllowsOnlyItsOwnOrigin() {
        let csp = StatusPage.contentSecurityPolicy
        #expect(csp.contains("default-src 'none'"))
        #expect(csp.contains("script-src 'self'"))
        #expect(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval") && !csp.contains("http"))
        #expect(csp.contains("frame-ancestors 'none'"))
        #expect(StatusPage.headers.contains { $0 == ("Content-Type", "text/html; charset=utf-8") })
    }

    @Test func theScriptWritesTextNeverHTML() {
        #expect(!StatusPage.script.contains("innerHTML"))
        #expect(!StatusPage.script.contains("eval("))
        #expect(StatusPage.script.contains("/admin/events") && StatusPage.script.contains("/admin/state"))
    }

    // MARK: - Per route

    static let readings: [RouteReading] = [
        RouteReading(route: "/api/", .requests(code: "OK"), 8),
        RouteReading(route: "/api/", .requests(code: "UPSTREAM_TIMEOUT"), 2),
        RouteReading(route: "/q\"x", .requests(code: "OK"), 1),
        RouteReading(route: "/gone/", .requests(code: "OK"), 5),
        RouteReading(route: "/api/", .hedges(outcome: "won"), 3),
        RouteReading(route: "/api/", .hedges(outcome: "lost"), 4),
        RouteReading(route: "/api/", .hedges(outcome: "skipped"), 9),
        RouteReading(route: "/api/", .fallbacks(kind: "stale"), 1),
        RouteReading(route: "/api/", .fallbacks(kind: "fixed"), 1),
        RouteReading(route: "/api/", .rateLimited, 6),
        RouteReading(route: "/api/", .durationBucket(le: 2.5), 9),
        RouteReading(route: "/api/", .durationBucket(le: 0.005), 4),
        RouteReading(route: "/api/", .durationBucket(le: .infinity), 10),
        RouteReading(route: "/api/", .durationBucket(le: 0.01), 5),
    ]

    @Test func readsTheRouteSeriesPerRoute() {
        let totals = RouteTotals.read(Self.readings, routes: ["/api/", "/q\"x", "/idle/", "/api/"])
        #expect(totals.map(\.route) == ["/api/", "/q\"x", "/idle/"], "in the configuration's order, once each")
        let api = totals[0]
        #expect(api.requests == 10 && api.errors == 2)
        #expect(api.hedgesWon == 3 && api.hedgesLost == 4)
        #expect(api.fallbacks == 2 && api.rateLimited == 6)
        #expect(api.buckets.map(\.le) == [0.005, 0.01, 2.5, .infinity], "buckets sorted by bound, whatever order they came in")
        #expect(api.p50 == 0.01, "5 of 10 are within 10 ms")
        #expect(api.p99 == .infinity, "the tenth is past the last bucket")
        #expect(totals[1].requests == 1, "a quote in a route's name is only a character")
        #expect(totals[2] == RouteTotals(route: "/idle/"), "a route without requests is listed, empty")
    }

    @Test func twoHandlesOfOneSeriesAddUp() {
        // Each worker holds its own handles: their readings of one series sum.
        let readings = [
            RouteReading(route: "/api/", .requests(code: "OK"), 2), RouteReading(route: "/api/", .requests(code: "OK"), 3),
            RouteReading(route: "/api/", .durationBucket(le: 0.005), 1),
            RouteReading(route: "/api/", .durationBucket(le: 0.005), 2),
            RouteReading(route: "/api/", .durationBucket(le: .infinity), 5),
        ]
        let api = RouteTotals.read(readings, routes: ["/api/"])[0]
        #expect(api.requests == 5)
        #expect(api.buckets == [RouteTotals.Bucket(le: 0.005, count: 3), RouteTotals.Bucket(le: .infinity, count: 5)])
    }

    @Test func aFamilyAndItsLabelsNameTheSeries() {
        #expect(RouteReading.Series(family: "happypath_requests_total", labels: [("route", "/"), ("code", "OK")]) == .requests(code: "OK"))
        #expect(RouteReading.Series(family: "happypath_fallback_total", labels: [("kind", "stale"), ("reason", "5xx")]) == .fallbacks(kind: "stale"))
        #expect(RouteReading.Series(family: "happypath_rate_limited_total", labels: [("outcome", "queued")]) == .rateLimited)
        #expect(RouteReading.Series(family: "happypath_tunnels_open", labels: []) == nil, "a family the page does not read")
    }

    @Test(arguments: [
        (0.005 as Double?, "≤ 5 ms"), (0.0025, "≤ 2.5 ms"), (0.25, "≤ 250 ms"), (1, "≤ 1 s"), (2.5, "≤ 2.5 s"),
        (.infinity, "> 30 s"), (nil, "-"),
    ])
    func saysALatencyBucket(seconds: Double?, words: String) {
        #expect(StatusPage.latency(seconds) == words)
    }

    @Test func rendersTheRouteTotals() {
        var totals = RouteTotals(route: "/a<b>/")
        totals.requests = 200
        totals.errors = 3
        totals.p50 = 0.005
        totals.p99 = 0.25
        let html = StatusPage.routeTotalsTable([totals])
        totals.tries = 300
        #expect(
            html.contains(
                "<tr><td>/a&lt;b&gt;/</td><td data-k=\"r-over\">since start</td><td data-k=\"r-requests\">200</td>"
                    + "<td data-k=\"r-errors\" class=\"warn\">3 (1.5%)</td><td data-k=\"r-p50\">≤ 5 ms</td>"
                    + "<td data-k=\"r-p99\">≤ 250 ms</td>"))
        #expect(StatusPage.routeTotalsTable([totals]).contains("<td data-k=\"r-tries\">1.50</td>"))
        #expect(StatusPage.routeTotalsTable([]).isEmpty)
    }
}
