import Foundation
import HappyPathCore
import HappyPathPolicies

/// The page's routes, deliveries and events sections.
extension StatusPage {
    static func routesSection(_ s: AdminSnapshot) -> String {
        var html = "<section id=\"routes\"><h2>Routes</h2>\n"
        html += routeTotalsTable(s.routes, windows: s.windows)
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
        return html + "</section>\n"
    }

    /// One route's cells, in the table's order after its name: over what
    /// span, requests (per second over a window, else the count), errors,
    /// p50, p99, tries per request, then counts since the start: hedges
    /// won / lost, fallbacks by kind, rate-limited, coalesced. The script writes the
    /// same words from `/admin/state`.
    public static func routeCells(_ r: RouteTotals, window: RouteWindow?) -> [(key: String, tone: String, text: String)] {
        var cells: [(String, String, String)] = []
        if let w = window {
            cells.append(("r-over", "", "last \(seconds(.milliseconds(Int64((w.seconds * 1000).rounded()))))"))
            cells.append(("r-requests", "", String(format: "%.2f/s", w.requestsPerSecond)))
            let ratio = w.errorRatio.map { String(format: "%.1f%%", 100 * $0) } ?? "-"
            cells.append(("r-errors", (w.errorRatio ?? 0) > 0 ? "warn" : "", ratio))
            cells.append(("r-p50", "", latency(w.p50)))
            cells.append(("r-p99", "", latency(w.p99)))
            cells.append(("r-tries", "", w.triesPerRequest.map { String(format: "%.2f", $0) } ?? "-"))
        } else {
            cells.append(("r-over", "", "since start"))
            cells.append(("r-requests", "", count(r.requests)))
            var errors = count(r.errors)
            if r.requests > 0 { errors += String(format: " (%.1f%%)", 100 * r.errors / r.requests) }
            cells.append(("r-errors", r.errors > 0 ? "warn" : "", errors))
            cells.append(("r-p50", "", latency(r.p50)))
            cells.append(("r-p99", "", latency(r.p99)))
            cells.append(("r-tries", "", r.requests > 0 ? String(format: "%.2f", r.tries / r.requests) : "-"))
        }
        cells.append(("r-hedges", "", "\(count(r.hedgesWon)) / \(count(r.hedgesLost))"))
        cells.append(("r-fallbacks", "", fallbackWords(r)))
        cells.append(("r-rate-limited", "", count(r.rateLimited)))
        cells.append(("r-coalesced", "", coalescedWords(r)))
        return cells
    }

    /// `0`, or `1995 of 2000 (99.8%)`: requests answered from another's try.
    static func coalescedWords(_ r: RouteTotals) -> String {
        guard r.coalesced > 0, r.requests > 0 else { return count(r.coalesced) }
        return "\(count(r.coalesced)) of \(count(r.requests)) (" + String(format: "%.1f%%", 100 * r.coalesced / r.requests) + ")"
    }

    /// `0`, or `3 (2 fixed, 1 stale)`.
    static func fallbackWords(_ r: RouteTotals) -> String {
        let kinds = r.fallbacksByKind.filter { $0.value > 0 }.sorted { $0.key < $1.key }
        guard !kinds.isEmpty else { return count(r.fallbacks) }
        return "\(count(r.fallbacks)) (" + kinds.map { "\(count($0.value)) \($0.key)" }.joined(separator: ", ") + ")"
    }

    /// Each route: rates over the span since an earlier reading (the admin
    /// listener keeps readings up to a minute apart), or totals since the
    /// start at the first reading; counts of rare things since the start.
    public static func routeTotalsTable(_ routes: [RouteTotals], windows: [String: RouteWindow] = [:]) -> String {
        guard !routes.isEmpty else { return "" }
        var html = """
            <div class="wide"><table id="route-totals"><caption>Per route: rates over the span said, counts since the start</caption>
            <thead><tr><th scope="col">Route</th><th scope="col">Over</th><th scope="col">Requests</th><th scope="col">Errors</th>\
            <th scope="col">p50</th><th scope="col">p99</th><th scope="col">Tries / request</th>\
            <th scope="col">Hedges won / lost</th><th scope="col">Fallbacks</th><th scope="col">Rate-limited</th>\
            <th scope="col">Coalesced</th></tr></thead>
            <tbody>

            """
        for r in routes {
            html += "<tr><td>\(escape(r.route))</td>"
            for c in routeCells(r, window: windows[r.route]) {
                let tone = c.tone.isEmpty ? "" : " class=\"\(c.tone)\""
                html += "<td data-k=\"\(c.key)\"\(tone)>\(escape(c.text))</td>"
            }
            html += "</tr>\n"
        }
        return html + "</tbody></table></div>\n"
    }

    /// A counter's value as a whole number.
    static func count(_ v: Double) -> String { v.isFinite && abs(v) < 1e15 ? String(Int(v)) : String(v) }

    /// A bucket's upper bound: `≤ 5 ms`, `≤ 2.5 s`, `> 30 s` (past the last), `-` (no requests).
    public static func latency(_ seconds: Double?) -> String {
        guard let seconds else { return "-" }
        guard seconds.isFinite else { return "> 30 s" }
        return seconds < 1 ? String(format: "≤ %g ms", seconds * 1000) : String(format: "≤ %g s", seconds)
    }

    /// `12.0 s (hooks)`: the oldest pending delivery and its upstream.
    public static func oldestWords(_ d: AdminSnapshot.Deliveries) -> String {
        guard let pending = d.pending else { return "not read" }
        guard let oldest = pending.max(by: { $0.oldest < $1.oldest }) else { return "none pending" }
        return "\(seconds(oldest.oldest)) old (\(oldest.upstream))"
    }

    /// The delivery backlog by state and by upstream, and the store's health.
    public static func deliveriesSection(_ d: AdminSnapshot.Deliveries?) -> String {
        var html = "<section id=\"deliveries\"><h2>Deliveries</h2>\n"
        guard let d else { return html + "<p>No route delivers later.</p>\n</section>\n" }
        let backlog = d.count("queued") + d.count("in_flight")
        var store = "<span class=\"ok\">writable</span>"
        if !d.writable {
            store = "<span class=\"bad\">cannot write</span>" + (d.problem.map { ": " + escape($0) } ?? "")
        }
        let oldestTone = (d.oldestPending ?? .zero) > .zero ? "warn" : "ok"
        html += """
            <p data-k="backlog"><span class="\(backlog > 0 ? "warn" : "ok")">\(backlog) in the backlog</span> \
            (queued or in flight); store \(escape(d.store)): <span data-k="store">\(store)</span>; \
            \(d.heldBytes) of \(d.maxBytes) bytes held; \(d.roundsInFlight) rounds in flight.</p>
            <p>Oldest pending delivery: <span data-k="oldest"><span class="\(oldestTone)">\(escape(oldestWords(d)))</span></span></p>
            <table><caption>Deliveries by state</caption>
            <thead><tr><th scope="col">State</th><th scope="col">Count</th></tr></thead>
            <tbody>

            """
        for (state, count) in d.counts {
            let tone = state == "dead" && count > 0 ? " class=\"bad\"" : ""
            html += "<tr><td>\(escape(state))</td><td data-k=\"delivery-\(escape(state))\"\(tone)>\(count)</td></tr>\n"
        }
        html += """
            </tbody></table>
            <table id="pending-deliveries"><caption>Pending by upstream (queued or in flight)</caption>
            <thead><tr><th scope="col">Upstream</th><th scope="col">Pending</th><th scope="col">Oldest</th></tr></thead>
            <tbody>

            """
        for p in d.pending ?? [] {
            html += "<tr><td>\(escape(p.upstream))</td><td>\(p.count)</td><td>\(seconds(p.oldest))</td></tr>\n"
        }
        if d.pending?.isEmpty ?? true { html += "<tr><td colspan=\"3\">None pending.</td></tr>\n" }
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
