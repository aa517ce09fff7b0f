import Foundation
import HappyPathCore

/// `GET /status` on the admin listener: an `AdminSnapshot` and the last
/// events as one HTML page, readable without JavaScript; `/status.js`
/// keeps it live and `/status.css` lays it out (both served by the admin
/// listener, so the page loads nothing from elsewhere and its
/// `Content-Security-Policy` allows only its own origin). Pure: the same
/// snapshot and events give the same bytes.
///
/// Every text that comes from configuration or from outside (upstream
/// names, URLs, event fields, store errors) passes `escape` before it is
/// written; state is said in words, colour (a class) is a second cue.
public enum StatusPage {
    /// Events kept for the page (the newest last).
    public static let eventsShown = 50

    /// The page's headers: nothing but its own origin may load, connect,
    /// frame it or receive a form from it; no inline script or style.
    public static let headers: [(String, String)] = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Security-Policy", contentSecurityPolicy),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
        ("Cache-Control", "no-store"),
    ]

    public static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    // MARK: - Escaping

    /// `s` as HTML text or a quoted attribute value: `& < > " '` become
    /// entities, and control characters other than tab and newline (which a
    /// name from outside could carry) become U+FFFD.
    public static func escape(_ s: String) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for scalar in s.unicodeScalars {
            if let replacement = replacement(for: scalar) { out += replacement } else { out.unicodeScalars.append(scalar) }
        }
        return out
    }

    /// What `escape` writes instead of `scalar`, or nil to keep it.
    static func replacement(for scalar: Unicode.Scalar) -> String? {
        switch scalar {
        case "&": "&amp;"
        case "<": "&lt;"
        case ">": "&gt;"
        case "\"": "&quot;"
        case "'": "&#39;"
        case "\t", "\n": nil
        case _ where scalar.value < 0x20 || scalar.value == 0x7F: "\u{FFFD}"
        default: nil
        }
    }

    // MARK: - Words

    /// The breaker in words: `closed`, `open until 14:03:07 UTC (4.0 s)`,
    /// `half-open (1 probe in flight)`.
    public static func breakerWords(_ breaker: AdminSnapshot.Breaker, takenAt: Date) -> String {
        switch breaker {
        case .closed: return "closed"
        case let .open(left):
            return "open until \(clockTime(takenAt.addingTimeInterval(left.seconds))) (\(seconds(left)))"
        case let .halfOpen(probes, successes):
            var words = "half-open (\(probes) probe\(probes == 1 ? "" : "s") in flight"
            if successes > 0 { words += ", \(successes) succeeded" }
            return words + ")"
        }
    }

    /// The failures behind the breaker's state. Failures in a row are
    /// counted only while it is closed (opening starts them again), so an
    /// open or half-open breaker shows only its window.
    public static func failureWords(_ f: (consecutive: Int, requests: Int, failed: Int), breaker: AdminSnapshot.Breaker)
        -> String
    {
        let window = "\(f.failed) of \(f.requests) failed in the window"
        return breaker == .closed ? "\(f.consecutive) in a row; " + window : window
    }

    /// `ok`, `warn` or `bad`: the class that colours a state (a second cue only).
    public static func tone(_ breaker: AdminSnapshot.Breaker) -> String {
        switch breaker {
        case .closed: "ok"
        case .halfOpen: "warn"
        case .open: "bad"
        }
    }

    /// `14:03:07 UTC`.
    public static func clockTime(_ date: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let c = calendar.dateComponents([.hour, .minute, .second], from: date)
        func two(_ v: Int?) -> String { v.map { $0 < 10 ? "0\($0)" : "\($0)" } ?? "00" }
        return "\(two(c.hour)):\(two(c.minute)):\(two(c.second)) UTC"
    }

    /// `4.0 s`, `2 min 5 s`.
    public static func seconds(_ d: Duration) -> String {
        let s = max(0, d.seconds)
        if s < 60 { return String(format: "%.1f s", s) }
        let whole = Int(min(s, 1e9))
        return "\(whole / 60) min \(whole % 60) s"
    }

    // MARK: - Page

    /// The whole page.
    public static func render(_ snapshot: AdminSnapshot, events: [AdminSnapshot.Event]) -> String {
        var html = """
            <!DOCTYPE html>
            <html lang="en">
            <head>
            <meta charset="utf-8">
            <meta name="viewport" content="width=device-width, initial-scale=1">
            <title>happypath status</title>
            <link rel="stylesheet" href="/status.css">
            <script src="/status.js" defer></script>
            </head>
            <body>
            <header><h1>happypath status</h1>
            <p id="summary">\(summary(snapshot))</p>
            <p class="live" id="live">Taken at \(clockTime(snapshot.takenAt)); reload to refresh (the page updates itself when scripts run).</p>
            </header>
            <main>
            <section id="upstreams"><h2>Upstreams</h2>

            """
        for (i, upstream) in snapshot.upstreams.enumerated() {
            html += upstreamSection(upstream, index: i, takenAt: snapshot.takenAt)
        }
        html += "</section>\n"
        html += routesSection(snapshot)
        html += deliveriesSection(snapshot.deliveries)
        html += eventsSection(events)
        html += "</main>\n</body>\n</html>\n"
        return html
    }

    static func summary(_ s: AdminSnapshot) -> String {
        let ready = s.ready ? "<span class=\"ok\">ready</span>" : "<span class=\"bad\">not ready</span>"
        return """
            \(ready); <span data-k="in_flight">\(s.inFlight)</span> in flight; \
            <span data-k="parked">\(s.parked)</span> of \(s.maxParked) parked; \
            \(s.bufferedBytes) of \(s.maxBufferedBytes) body bytes buffered; \
            config from \(escape(s.configSource)), loaded \(clockTime(s.loadedAt))
            """
    }

    /// One upstream: its state as a definition list, its endpoints as a table.
    public static func upstreamSection(_ u: AdminSnapshot.Upstream, index: Int, takenAt: Date) -> String {
        let name = escape(u.name)
        let reach = u.reachable ? "<span class=\"ok\">reachable</span>" : "<span class=\"bad\">unreachable</span>"
        var pause = "not paused"
        var pauseTone = "ok"
        if let left = u.pausedFor {
            pause = "paused until \(clockTime(takenAt.addingTimeInterval(left.seconds))) (\(seconds(left)))"
            pauseTone = "warn"
        }
        if u.pausedClients > 0 { pause += "; \(u.pausedClients) client\(u.pausedClients == 1 ? "" : "s") paused" }
        let parkedWords =
            u.parked.filter { $0.count > 0 }.map { "\($0.count) \(escape($0.reason))" }.joined(separator: ", ")
        var html = """
            <article class="upstream" id="u\(index)" data-upstream="\(name)">
            <h3>\(name)</h3>
            <dl>
            <dt>Health</dt><dd data-k="reachable">\(reach)</dd>
            <dt>Breaker</dt><dd data-k="breaker"><span class="\(tone(u.breaker))">\(escape(breakerWords(u.breaker, takenAt: takenAt)))</span></dd>
            <dt>Failures</dt><dd data-k="failures">\(failureWords(u.breakerFailures, breaker: u.breaker))</dd>
            <dt>Parked</dt><dd data-k="parked"><span class="\(u.parkedTotal > 0 ? "warn" : "ok")">\(u.parkedTotal) parked</span>\(parkedWords.isEmpty ? "" : " (\(parkedWords))")</dd>
            <dt>Retry budget</dt><dd data-k="retries_left">\(u.retriesLeft) retries left</dd>
            <dt>Pause</dt><dd data-k="pause"><span class="\(pauseTone)">\(pause)</span></dd>

            """
        if let token = u.token {
            let expires = token.expiresIn.map { "expires in \($0) s" } ?? "no token yet"
            html += "<dt>Credentials</dt><dd>\(escape(token.kind)), \(expires)</dd>\n"
        }
        html += """
            </dl>
            <table class="endpoints"><caption>Endpoints of \(name)</caption>
            <thead><tr><th scope="col">Endpoint</th><th scope="col">Rotation</th></tr></thead>
            <tbody>

            """
        for e in u.endpoints {
            let rotation =
                e.ejected ? "<span class=\"bad\">ejected</span>" : "<span class=\"ok\">in rotation</span>"
            html += "<tr><td>\(escape(e.url))</td><td>\(rotation)</td></tr>\n"
        }
        html += "</tbody></table>\n</article>\n"
        return html
    }

    static func routesSection(_ s: AdminSnapshot) -> String {
        var html = "<section id=\"routes\"><h2>Routes</h2>\n"
        if s.rateLimits.isEmpty {
            html += "<p>No route has a rate limit.</p>\n"
        } else {
            html += """
                <table><caption>Rate-limited routes</caption>
                <thead><tr><th scope="col">Route</th><th scope="col">Keys tracked</th><th scope="col">Queued</th></tr></thead>
                <tbody>

                """
            for r in s.rateLimits {
                html += "<tr><td>\(escape(r.route))</td><td>\(r.keys)</td><td>\(r.queued)</td></tr>\n"
            }
            html += "</tbody></table>\n"
        }
        if let f = s.fallback {
            html += "<p>Answers kept for fallback: \(f.entries) (\(f.bytes) of \(f.maxBytes) bytes).</p>\n"
        }
        html += routeTotalsTable(s.routes)
        return html + "</section>\n"
    }

    /// Each route's totals since the process started.
    public static func routeTotalsTable(_ routes: [RouteTotals]) -> String {
        guard !routes.isEmpty else { return "" }
        var html = """
            <div class="wide"><table id="route-totals"><caption>Per route, since the process started (reload for new totals)</caption>
            <thead><tr><th scope="col">Route</th><th scope="col">Requests</th><th scope="col">Errors</th>\
            <th scope="col">p50</th><th scope="col">p99</th><th scope="col">Hedges won / lost</th>\
            <th scope="col">Fallbacks</th><th scope="col">Rate-limited</th></tr></thead>
            <tbody>

            """
        for r in routes {
            var errors = count(r.errors)
            if r.requests > 0 { errors += String(format: " (%.1f%%)", 100 * r.errors / r.requests) }
            let tone = r.errors > 0 ? " class=\"warn\"" : ""
            html += """
                <tr><td>\(escape(r.route))</td><td>\(count(r.requests))</td><td\(tone)>\(errors)</td>\
                <td>\(latency(r.p50))</td><td>\(latency(r.p99))</td><td>\(count(r.hedgesWon)) / \(count(r.hedgesLost))</td>\
                <td>\(count(r.fallbacks))</td><td>\(count(r.rateLimited))</td></tr>

                """
        }
        return html + "</tbody></table></div>\n"
    }

    /// A counter's value as a whole number.
    static func count(_ v: Double) -> String { v.isFinite && abs(v) < 1e15 ? String(Int(v)) : String(v) }

    /// A bucket's upper bound: `≤ 5 ms`, `≤ 2.5 s`, `> 30 s` (past the last), `-` (no requests).
    public static func latency(_ seconds: Double?) -> String {
        guard let seconds else { return "-" }
        guard seconds.isFinite else { return "&gt; 30 s" }
        return seconds < 1 ? String(format: "≤ %g ms", seconds * 1000) : String(format: "≤ %g s", seconds)
    }

    /// The delivery backlog by state and the store's health.
    public static func deliveriesSection(_ d: AdminSnapshot.Deliveries?) -> String {
        var html = "<section id=\"deliveries\"><h2>Deliveries</h2>\n"
        guard let d else { return html + "<p>No route delivers later.</p>\n</section>\n" }
        let backlog = d.count("queued") + d.count("in_flight")
        let store =
            d.writable
            ? "<span class=\"ok\">writable</span>" : "<span class=\"bad\">cannot write</span>"
        html += """
            <p data-k="backlog"><span class="\(backlog > 0 ? "warn" : "ok")">\(backlog) in the backlog</span> \
            (queued or in flight); store \(escape(d.store)): <span data-k="store">\(store)</span>; \
            \(d.heldBytes) of \(d.maxBytes) bytes held; \(d.roundsInFlight) rounds in flight.</p>
            <table><caption>Deliveries by state</caption>
            <thead><tr><th scope="col">State</th><th scope="col">Count</th></tr></thead>
            <tbody>

            """
        for (state, count) in d.counts {
            let tone = state == "dead" && count > 0 ? " class=\"bad\"" : ""
            html += "<tr><td>\(escape(state))</td><td data-k=\"delivery-\(escape(state))\"\(tone)>\(count)</td></tr>\n"
        }
        return html + "</tbody></table>\n" + deliveryActions + "</section>\n"
    }

    /// Buttons for the admin API's delivery actions. Hidden until the
    /// script shows them: they need it (a form's POST is refused as
    /// cross-site, on purpose), and each asks to be confirmed first.
    static let deliveryActions = """
        <noscript><p class="note">Replaying and purging deliveries from here needs the page's script.</p></noscript>
        <div id="delivery-actions" hidden>
        <h3>Actions</h3>
        <p><button type="button" id="purge-deliveries">Purge old deliveries</button> \
        <span class="note">delivered and dead deliveries older than storage.retention, as the proxy does every 10 minutes</span></p>
        <div class="wide"><table id="dead-deliveries"><caption>Dead deliveries (up to 20)</caption>
        <thead><tr><th scope="col">Delivery</th><th scope="col">Upstream</th><th scope="col">Request</th>\
        <th scope="col">Last change</th><th scope="col">Action</th></tr></thead>
        <tbody></tbody></table></div>
        <p id="action-result" role="status"></p>
        </div>

        """

    /// The last events, the newest first.
    public static func eventsSection(_ events: [AdminSnapshot.Event]) -> String {
        var html = "<section id=\"events\"><h2>Last events</h2>\n<ol id=\"event-list\" reversed>\n"
        if events.isEmpty { html += "<li class=\"none\">No events since the process started.</li>\n" }
        for e in events.suffix(eventsShown).reversed() { html += eventItem(e) }
        return html + "</ol>\n</section>\n"
    }

    public static func eventItem(_ e: AdminSnapshot.Event) -> String {
        let fields = e.fields.map { "\(escape($0.key))=\(escape($0.value))" }.joined(separator: " ")
        return "<li><time>\(escape(e.ts))</time> <b>\(escape(e.type))</b> \(fields)</li>\n"
    }
}
