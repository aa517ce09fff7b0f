import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `GET /status` on the admin listener, after real traffic: a healthy
/// upstream (the demo), one whose breaker opened on a 500 and parks what
/// comes next, one that refuses connections behind a route that delivers
/// later (a backlog, the oldest pending delivery) with its breaker forced
/// open by an operator, one of two endpoints ejected (and until when), and
/// an upstream paused by a 503's `Retry-After`. The page is read as bytes,
/// then in headless Chromium after its script ran (docs/operations.md,
/// "The status page").
@Suite("status page") struct StatusPageServingTests {
    /// Parked requests held while the page is read.
    static let parkedRequests = 2

    final class Scenario {
        let store: DeliverLaterTests.StoreDirectory
        let refusing = RefusingPort()
        let flaky = ScriptedUpstream(responses: [http(500)]).started()
        /// Healthy to its health checks, a 503 asking for a pause to anything else.
        let busy = ScriptedUpstream(answering: { head in
            head.hasPrefix("GET /healthz") ? http(200) : http(503, "{}", headers: ["Retry-After: 120"])
        }).started()
        let h: ProxyHarness
        var admin: Int { h.adminPort }

        init() throws {
            store = try DeliverLaterTests.StoreDirectory()
            h = try ProxyHarness(
                """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                \(store.yaml(""))
                defaults: { reachability: { park_for: 20s } }
                upstreams:
                  demo:
                    endpoints: [{{DEMO}}]
                    adaptive_concurrency: { min_limit: 2, max_limit: 8 }
                  flaky:
                    endpoints: [http://127.0.0.1:\(flaky.port)]
                    connect_timeout: 500ms
                    retry: { on: [500], attempts: 1 }
                    circuit_breaker: { consecutive_failures: 1, open_for: 60s, while_open: park }
                  hooks:
                    endpoints: [\(refusing.url)]
                    connect_timeout: 200ms
                  pool:
                    endpoints: [{{DEMO}}, \(refusing.url)]
                    connect_timeout: 200ms
                    outlier_detection: { consecutive_failures: 1, base_ejection: 120s }
                  busy:
                    endpoints: [http://127.0.0.1:\(busy.port)]
                    pacing: { while_paused: fail }
                routes:
                  - match: { path_prefix: /pool/ }
                    upstream: pool
                    strip_prefix: /pool
                  - match: { path_prefix: /busy/ }
                    upstream: busy
                  - match: { path_prefix: /hooks/ }
                    upstream: hooks
                    strip_prefix: /hooks
                    timeout: 2s
                    delivery: { mode: later, backoff: { base: 10s, max: 20s } }
                  - match: { path_prefix: /dead/ }
                    upstream: demo
                    strip_prefix: /dead
                    delivery: { mode: later }
                  - match: { path_prefix: /flaky/ }
                    upstream: flaky
                    timeout: 30s
                  - match: { path_prefix: / }
                    upstream: demo
                """, holding: [refusing])
            h.scripted += [flaky, busy]
        }

        /// The traffic: a request through the demo, a 500 that opens the
        /// flaky upstream's breaker, requests parked behind it, and a
        /// delivery that cannot be made. Returns once `/admin/state` shows
        /// all of it.
        func drive() throws {
            let ok = try HTTP.request(port: h.port, "/ok")
            #expect(ok.status == 200, "\(ok.status) \(ok.text)")
            let failed = try HTTP.request(port: h.port, "/flaky/first")
            #expect(failed.status == 503 && failed.text.contains("answered 500"), "\(failed.status) \(failed.text)")
            let port = h.port
            for i in 0..<StatusPageServingTests.parkedRequests {
                Thread.detachNewThread { _ = try? HTTP.request(port: port, "/flaky/parked-\(i)", timeout: 40) }
            }
            let accepted = try HTTP.request(
                port: h.port, "POST", "/hooks/orders", headers: [("Content-Type", "application/json")],
                body: Array("{\"order\":1}".utf8))
            #expect(accepted.status == 202)
            let shown = waitUntil("the breaker open, requests parked and a backlog in /admin/state", timeout: 15) {
                let state = try HTTP.request(port: admin, "/admin/state").json
                let upstreams = state["upstreams"] as? [[String: Any]] ?? []
                let flaky = upstreams.first { $0["name"] as? String == "flaky" }
                let breaker = (flaky?["circuit_breaker"] as? [String: Any])?["state"] as? String
                let parked = (flaky?["parked"] as? [String: Any])?["circuit_open"] as? Int
                let deliveries = state["deliveries"] as? [String: Any]
                let backlog = (deliveries?["queued"] as? Int ?? 0) + (deliveries?["in_flight"] as? Int ?? 0)
                // Requests are counted just after their answer is written.
                let counted = metricSamples(try HTTP.request(port: admin, "/metrics").text)
                let answered = counted["happypath_requests_total{route=\"/flaky/\",code=\"UPSTREAM_UNAVAILABLE\"}"]
                return breaker == "open" && parked == StatusPageServingTests.parkedRequests && backlog >= 1 && answered == 1
            }
            #expect(shown)

            // One endpoint of two refuses: ejected after its first failed try.
            #expect(
                waitUntil("an endpoint of pool ejected, with its end", timeout: 15) {
                    _ = try HTTP.request(port: h.port, "/pool/ok")
                    return try upstream("pool")?["endpoints"].flatMap { $0 as? [[String: Any]] }?
                        .contains { $0["ejected_until"] is String } == true
                })
            // A 503 with Retry-After pauses the upstream (its reason, its end).
            _ = try HTTP.request(port: h.port, "/busy/x")
            #expect(
                waitUntil("busy paused by its 503") { try upstream("busy")?["pause_cause"] as? Int == 503 })
            // An operator forces the refusing upstream's breaker open.
            let forced = try HTTP.request(port: admin, "POST", "/admin/upstreams/hooks/breaker/open")
            #expect(forced.status == 200, "\(forced.text)")
            // Health checks run every 2 s: the first has ended for each
            // upstream (but busy, which gets none while paused).
            #expect(
                waitUntil("a health check ended for every upstream not paused", timeout: 15) {
                    let state = try HTTP.request(port: admin, "/admin/state").json
                    return (state["upstreams"] as? [[String: Any]] ?? []).allSatisfy {
                        $0["name"] as? String == "busy" || $0["health_check"] is [String: Any]
                    }
                })
        }

        func upstream(_ name: String) throws -> [String: Any]? {
            let state = try HTTP.request(port: admin, "/admin/state").json
            return (state["upstreams"] as? [[String: Any]])?.first { $0["name"] as? String == name }
        }
    }

    @Test func theServerRenderedPageShowsTheStateInWords() throws {
        let s = try Scenario()
        try s.drive()
        let page = try HTTP.request(port: s.admin, "/status")
        #expect(page.status == 200)
        #expect(page.header("Content-Type") == "text/html; charset=utf-8")
        let csp = try #require(page.header("Content-Security-Policy"))
        #expect(csp.contains("default-src 'none'") && csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"))
        #expect(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"))
        #expect(page.header("X-Content-Type-Options") == "nosniff")
        #expect(page.header("X-Frame-Options") == "DENY")
        let html = page.text
        for name in ["demo", "flaky", "hooks", "pool", "busy"] { #expect(html.contains("<h3>\(name)</h3>"), "\(name)") }
        #expect(html.contains("<span class=\"bad\">open until "))
        #expect(html.contains("1 of 1 failed in the window"))
        #expect(html.contains("<span class=\"warn\">\(Self.parkedRequests) parked</span> (\(Self.parkedRequests) circuit_open)"))
        #expect(html.contains("in the backlog</span>"))
        #expect(html.contains("store \(s.store.file): <span data-k=\"store\"><span class=\"ok\">writable</span>"))
        // What the registry counts per route: the failed request, and the
        // demo's (rates over a span, or totals at the first reading).
        #expect(html.contains("<tr><td>/flaky/</td><td data-k=\"r-over\">"))
        let routes = try HTTP.request(port: s.admin, "/admin/state").json["routes"] as? [[String: Any]] ?? []
        let flaky = routes.first { $0["route"] as? String == "/flaky/" }
        #expect(flaky?["requests"] as? Double == 1 && flaky?["errors"] as? Double == 1 && flaky?["tries"] as? Double == 1)
        #expect(routes.first { $0["route"] as? String == "/" }?["errors"] as? Double == 0)
        // Endpoints, health checks, pauses, an operator's override, the oldest delivery.
        #expect(html.contains("<span class=\"bad\">ejected until "))
        #expect(html.contains("<span class=\"bad\">forced open by an operator"))
        #expect(html.contains("asked by a 503"))
        #expect(html.contains("<dd data-k=\"health_check\">last check passed "))
        // Slots against the limit: learned for demo, max_connections for the others.
        #expect(html.contains("in flight of a limit of 256; 0 queued"))
        #expect(html.contains("in flight of a limit of ") && html.contains("(learned: baseline "))
        #expect(html.contains("old (hooks)</span>"))
        #expect(html.contains("<b>breaker_forced_open</b> upstream=hooks by=127.0.0.1"))
        // The breaker's opening is among the last events, rendered by the server.
        #expect(html.contains("<b>breaker_opened</b> upstream=flaky"))
        // Nothing it loads comes from elsewhere.
        #expect(!html.contains("src=\"http") && !html.contains("href=\"http"))
        #expect(!html.contains("<script>") && !html.contains("style="))

        let script = try HTTP.request(port: s.admin, "/status.js")
        #expect(script.status == 200 && script.header("Content-Type") == "text/javascript; charset=utf-8")
        #expect(script.text.contains("/admin/events"))
        let style = try HTTP.request(port: s.admin, "/status.css")
        #expect(style.status == 200 && style.header("Content-Type") == "text/css; charset=utf-8")

        let root = try HTTP.request(port: s.admin, "/")
        #expect(root.status == 302 && root.header("Location") == "/status")
    }

    @Test func thePageKeepsTheAdminListenersRules() throws {
        let s = try Scenario()
        let port = s.admin
        let browser = AdminBrowserTests()
        // A DNS-rebinding page cannot read it, its script or the redirect.
        for path in ["/status", "/status.js", "/"] {
            let rebound = try browser.send(port, "GET \(path) HTTP/1.1\r\nHost: evil.example:\(port)\r\n")
            #expect(rebound.status == 403, "\(path)")
            #expect(!rebound.body.contains("<h3>") && !rebound.body.contains("admin/events"), "\(path)")
        }
        #expect(try browser.send(port, "GET /status HTTP/1.1\r\nHost: localhost:\(port)\r\n").status == 200)
        // Read-only: a POST to the page is refused, cross-site or not.
        #expect(try browser.send(port, "POST /status HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n").status == 400)
        let forged = try browser.send(
            port, "POST /status HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nOrigin: https://evil.example\r\n")
        #expect(forged.status == 403)
    }

    // MARK: - In a browser

    /// Where the screenshots are kept after the run.
    static let artifacts = NSTemporaryDirectory() + "happypath-status-page"

    static let noChromium = "chromium is not installed: `make test-deps` installs it (Debian package chromium)"

    @Test(.enabled(if: HeadlessChromium.path != nil, Comment(rawValue: noChromium)))
    func aBrowserShowsTheLivePageAtBothWidths() throws {
        let s = try Scenario()
        try s.drive()
        let url = "http://127.0.0.1:\(s.admin)/status"

        // The DOM after the page's script ran under its CSP: it fetched
        // /admin/state and rewrote the page (data-live, "Live: updated").
        let dom = try HeadlessChromium.run(["--window-size=1280,900", "--dump-dom"], url: url)
        #expect(dom.contains("data-live=\"1\""), "the script did not run: \(dom.prefix(2000))")
        #expect(dom.contains("Live: updated"))
        for name in ["demo", "flaky", "hooks", "pool", "busy"] { #expect(dom.contains("<h3>\(name)</h3>"), "\(name)") }
        #expect(dom.contains("<span class=\"bad\">open until "))
        // As the script rewrote them from /admin/state.
        #expect(dom.contains("<span class=\"bad\">ejected until "))
        #expect(dom.contains("<span class=\"bad\">forced open by an operator"))
        #expect(dom.contains("asked by a 503"))
        #expect(dom.contains("last check passed "))
        #expect(dom.contains("(learned: baseline ") && dom.contains("in flight of a limit of 256; 0 queued"))
        #expect(dom.contains("old (hooks)</span>"))
        // The actions are shown once the script runs.
        #expect(dom.contains("<p class=\"actions\" data-script=\"\">Breaker: "))
        #expect(dom.contains("\(Self.parkedRequests) parked</span>"))
        #expect(dom.contains("in the backlog</span>"))
        #expect(dom.contains("breaker_opened"))
        #expect(dom.contains("data-fits=\"1\""), "wider than 1280 pixels")

        // At a phone's width nothing is wider than the window.
        let narrow = try HeadlessChromium.run(["--window-size=390,844", "--dump-dom"], url: url)
        #expect(narrow.contains("data-live=\"1\""))
        #expect(narrow.contains("data-fits=\"1\""), "wider than 390 pixels")

        try FileManager.default.createDirectory(atPath: Self.artifacts, withIntermediateDirectories: true)
        // The two widths, and the whole page at the wider one (docs/images/status.png).
        for (width, height) in [(1280, 900), (390, 844), (1280, 1800)] {
            let file = Self.artifacts + "/status-\(width)x\(height).png"
            try? FileManager.default.removeItem(atPath: file)
            _ = try HeadlessChromium.run(["--window-size=\(width),\(height)", "--screenshot=\(file)"], url: url)
            let size = HeadlessChromium.pngSize(file)
            #expect(size?.width == width && size?.height == height, "\(file): \(String(describing: size))")
        }
    }

    /// Without reloading: an event that happens while the page is open is
    /// listed by the script from `/admin/events`, and the state it changed
    /// is read again from `/admin/state`.
    @Test(.enabled(if: HeadlessChromium.path != nil, Comment(rawValue: noChromium)))
    func anOpenPageFollowsWhatHappensNext() throws {
        let s = try Scenario()
        try s.drive()
        let parkedEvents = "document.querySelectorAll('#event-list li').length"
        let flakyParked = "document.querySelector('[data-upstream=\"flaky\"] [data-k=\"parked\"]').textContent"
        let page = try HeadlessChromium.LivePage(
            url: "http://127.0.0.1:\(s.admin)/status",
            ready: "document.documentElement.getAttribute('data-events') === 'open' && "
                + "document.documentElement.getAttribute('data-live') === '1'",
            report: [parkedEvents, flakyParked])
        let loaded = page.next()
        #expect(loaded["met"] as? Bool == true, "the page did not go live: \(loaded)")
        let before = (loaded["report"] as? [Any])?.first as? Int ?? -1
        #expect(before >= 3, "breaker_opened and two command_parked, rendered by the server")

        // One more request parks behind the open breaker.
        let port = s.h.port
        Thread.detachNewThread { _ = try? HTTP.request(port: port, "/flaky/later", timeout: 40) }
        let after = page.wait(for: "\(parkedEvents) > \(before) && \(flakyParked).indexOf('3 parked') === 0")
        #expect(after["met"] as? Bool == true, "not followed: \(after)")
        #expect((after["report"] as? [Any])?.last as? String == "3 parked (3 circuit_open)")
    }

    /// A dead delivery is listed with a Replay button; confirmed, the
    /// replay is sent, its answer shown, and its event names who asked.
    @Test(.enabled(if: HeadlessChromium.path != nil, Comment(rawValue: noChromium)))
    func aDeadDeliveryIsReplayedFromThePage() throws {
        let s = try Scenario()
        // The demo answers 404: the upstream refused it, dead at once.
        let accepted = try HTTP.request(port: s.h.port, "POST", "/dead/status/404", body: Array("{}".utf8))
        #expect(accepted.status == 202)
        #expect(
            waitUntil("the delivery dead") {
                let deliveries = try HTTP.request(port: s.admin, "/admin/state").json["deliveries"] as? [String: Any]
                return deliveries?["dead"] as? Int == 1
            })
        let buttons = "document.querySelectorAll('#dead-deliveries tbody button').length"
        let result = "document.getElementById('action-result').textContent"
        let events = "document.getElementById('event-list').textContent"
        let page = try HeadlessChromium.LivePage(
            url: "http://127.0.0.1:\(s.admin)/status",
            ready: "document.documentElement.getAttribute('data-events') === 'open' && \(buttons) === 1",
            report: [result, events])
        #expect(page.next()["met"] as? Bool == true, "no Replay button")

        // Refused when not confirmed: nothing is sent.
        let declined = page.wait(
            for: "(window.confirm = function () { return false; }, "
                + "document.querySelector('#dead-deliveries tbody button').click(), \(result) === '')")
        #expect(declined["met"] as? Bool == true, "\(declined)")
        let confirmed = page.wait(
            for: "(window.confirm = function () { return true; }, "
                + "document.querySelector('#dead-deliveries tbody button').click(), true)")
        #expect(confirmed["met"] as? Bool == true)
        let replayed = page.wait(for: "\(result).indexOf('Replayed dlv_') === 0 && \(events).indexOf('delivery_replayed') >= 0")
        #expect(replayed["met"] as? Bool == true, "\(replayed)")
        let report = replayed["report"] as? [String] ?? []
        #expect(report.first?.hasPrefix("Replayed dlv_") == true)
        #expect(report.last?.contains("by=127.0.0.1") == true, "the event says who asked: \(report)")
    }

    /// An operator drains an endpoint and forces a breaker from the page:
    /// nothing is sent when the confirmation is declined; confirmed, the
    /// admin API's POST is sent, the page says the new state in words, and
    /// the events name who asked.
    @Test(.enabled(if: HeadlessChromium.path != nil, Comment(rawValue: noChromium)))
    func anOperatorDrainsAndForcesFromThePage() throws {
        let s = try Scenario()
        try s.drive()
        let drain = "document.querySelector('[data-upstream=\"pool\"] table.endpoints tbody tr:nth-child(2) button')"
        let rotation =
            "document.querySelector('[data-upstream=\"pool\"] table.endpoints tbody tr:nth-child(2)').cells[1].textContent"
        let force = "document.querySelector('[data-upstream=\"flaky\"] button[data-k=\"force-closed\"]')"
        let breaker = "document.querySelector('[data-upstream=\"flaky\"] [data-k=\"breaker\"]').textContent"
        let result = "document.getElementById('upstream-action-result').textContent"
        let events = "document.getElementById('event-list').textContent"
        let page = try HeadlessChromium.LivePage(
            url: "http://127.0.0.1:\(s.admin)/status",
            ready: "document.documentElement.getAttribute('data-events') === 'open' && "
                + "document.documentElement.getAttribute('data-live') === '1' && \(drain) !== null && !\(drain).closest('td').hidden",
            report: [result, rotation, breaker, events])
        let loaded = page.next()
        #expect(loaded["met"] as? Bool == true, "no Drain button shown: \(loaded)")

        let declined = page.wait(
            for: "(window.confirm = function () { return false; }, \(drain).click(), \(result) === '')")
        #expect(declined["met"] as? Bool == true, "\(declined)")
        #expect(try s.upstream("pool")?["endpoints"].flatMap { $0 as? [[String: Any]] }?[1]["drained"] as? Bool == false)

        _ = page.wait(for: "(window.confirm = function () { return true; }, \(drain).click(), true)")
        let drained = page.wait(
            for: "\(rotation) === 'drained by an operator' && \(events).indexOf('endpoint_drained') >= 0")
        #expect(drained["met"] as? Bool == true, "\(drained)")
        let report = drained["report"] as? [String] ?? []
        #expect(report.first?.hasSuffix("of pool: drained.") == true, "\(report)")
        #expect(report.last?.contains("endpoint_drained upstream=pool endpoint=1") == true)
        #expect(report.last?.contains("by=127.0.0.1") == true)
        #expect(try s.upstream("pool")?["endpoints"].flatMap { $0 as? [[String: Any]] }?[1]["drained"] as? Bool == true)
        // The button now puts it back.
        let label = page.wait(for: "\(drain).textContent === 'Undrain'")
        #expect(label["met"] as? Bool == true)

        _ = page.wait(for: "(\(force).click(), true)")
        let forced = page.wait(
            for: "\(breaker).indexOf('forced closed by an operator') === 0 && \(events).indexOf('breaker_forced_closed') >= 0")
        #expect(forced["met"] as? Bool == true, "\(forced)")
        let breakerState = try s.upstream("flaky")?["circuit_breaker"] as? [String: Any]
        #expect(breakerState?["forced"] as? String == "closed")
    }

    /// Names from the configuration and fields of events are text, never
    /// markup: an upstream and a route named as an injection show as
    /// written, in the server's HTML, in what the script rewrites, and in
    /// an event it lists, and nothing of them runs.
    @Test(.enabled(if: HeadlessChromium.path != nil, Comment(rawValue: noChromium)))
    func namesThatLookLikeMarkupStayText() throws {
        let name = "<img src=x onerror=window.pwned=1>"
        let up = ScriptedUpstream(responses: [http(500)]).started()
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { reachability: { park_for: 0s } }
            upstreams:
              "\(name)":
                endpoints: ['http://127.0.0.1:\(up.port)/a<b>"c']
                retry: { on: [500], attempts: 1 }
                circuit_breaker: { consecutive_failures: 1, open_for: 60s, while_open: fail }
            routes:
              - match: { path_prefix: "/<script>window.pwned=2</script>/" }
                upstream: "\(name)"
              - match: { path_prefix: / }
                upstream: "\(name)"
            """)
        h.scripted.append(up)
        let html = try HTTP.request(port: h.adminPort, "/status").text
        #expect(html.contains("<h3>&lt;img src=x onerror=window.pwned=1&gt;</h3>"))
        #expect(html.contains("<td>http://127.0.0.1:\(up.port)/a&lt;b&gt;&quot;c</td>"))
        #expect(!html.contains("<img") && !html.contains("<script>window"))

        let page = try HeadlessChromium.LivePage(
            url: "http://127.0.0.1:\(h.adminPort)/status",
            ready: "document.documentElement.getAttribute('data-events') === 'open' && "
                + "document.documentElement.getAttribute('data-live') === '1'",
            report: [
                "document.querySelector('article.upstream h3').textContent",
                "document.getElementById('event-list').textContent",
                "document.images.length + document.scripts.length * 10",
                "String(window.pwned)",
                "document.querySelector('#route-totals tbody td').textContent",
            ])
        #expect(page.next()["met"] as? Bool == true)
        // The breaker opens: its event, naming the upstream, comes over the stream.
        #expect(try HTTP.request(port: h.port, "/x").status == 503)
        let after = page.wait(
            for: "document.getElementById('event-list').textContent.indexOf('breaker_opened') >= 0 && "
                + "document.querySelector('[data-k=\"breaker\"]').textContent.indexOf('open until') === 0")
        #expect(after["met"] as? Bool == true, "\(after)")
        let report = after["report"] as? [Any] ?? []
        #expect(report.count == 5)
        guard report.count == 5 else { return }
        #expect(report[0] as? String == name, "the script found and rewrote the card by its name")
        #expect((report[1] as? String)?.contains("upstream=\(name)") == true)
        #expect(report[2] as? Int == 10, "no image; one script, the page's own")
        #expect(report[3] as? String == "undefined", "nothing ran")
        #expect(report[4] as? String == "/<script>window.pwned=2</script>/")
    }
}
