import Foundation
import HappyPathCore
import HappyPathPolicies

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
    /// frame it or receive a form from it; no inline script or style. (The
    /// admin listener adds `X-Content-Type-Options: nosniff` and
    /// `Cache-Control: no-store` to every answer, this page's included.)
    public static let headers: [(String, String)] = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Security-Policy", contentSecurityPolicy),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
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
    /// `half-open (1 probe in flight)`, `forced open by an operator`.
    public static func breakerWords(_ breaker: AdminSnapshot.Breaker, takenAt: Date) -> String {
        switch breaker {
        case .closed: return "closed"
        case .forced(.open): return "forced open by an operator (refuses every try until released)"
        case .forced(.closed): return "forced closed by an operator (lets every try through, counts no failure)"
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
        if breaker.forcedTo != nil { return "not counted while forced" }
        let window = "\(f.failed) of \(f.requests) failed in the window"
        return breaker == .closed ? "\(f.consecutive) in a row; " + window : window
    }

    /// `ok`, `warn` or `bad`: the class that colours a state (a second cue only).
    public static func tone(_ breaker: AdminSnapshot.Breaker) -> String {
        switch breaker {
        case .closed: "ok"
        case .halfOpen, .forced(.closed): "warn"
        case .open, .forced(.open): "bad"
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
        html += """
            </section>
            <noscript><p class="note">Draining endpoints and forcing breakers from here needs the page's script.</p></noscript>
            <p id="upstream-action-result" role="status" data-script hidden></p>

            """
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
            \(byteSizeText(s.bufferedBytes)) of \(byteSizeText(s.maxBufferedBytes)) of request bodies held; \
            \(memoryWords(s.memory)); \
            \(byteSizeText(s.spooled)) in spool files (answers read ahead, bodies kept); \
            \(clusterWords(s.cluster))\
            config from \(escape(s.configSource)), loaded \(clockTime(s.loadedAt))
            """
    }

    /// `cluster: shared (3 replicas); ` or `cluster: degraded since 10:04:05 (why); `, or nothing without one.
    static func clusterWords(_ c: AdminSnapshot.Cluster?) -> String {
        guard let c else { return "" }
        let replicas = "\(c.replicas) replica\(c.replicas == 1 ? "" : "s")"
        switch c.mode {
        case "degraded":
            return "<span class=\"bad\" data-k=\"cluster\">cluster: degraded since \(clockTime(c.since))</span>"
                + " (\(escape(c.reason ?? "Redis cannot be reached")); each replica admits its share, \(replicas) last seen); "
        case "shared":
            return "<span class=\"ok\" data-k=\"cluster\">cluster: shared</span> (\(replicas)); "
        default:
            return "<span data-k=\"cluster\">cluster: \(escape(c.mode))</span>; "
        }
    }

    /// What the process holds for clients besides bodies, in units a person
    /// reads: `answers staged 512KiB, output queued 64KiB, kept answers 2MiB`.
    static func memoryWords(_ pools: [(pool: String, bytes: Int)]) -> String {
        let names = [
            "staged_answers": "answers staged", "client_output": "output queued", "tunnels": "tunnel bytes queued",
            "upstream_h2": "HTTP/2 upstream bytes held", "coalesced": "coalesced answer bytes",
            "admin_output": "admin output queued", "kept_answers": "kept answers",
        ]
        let words = pools.compactMap { p in names[p.pool].map { "\($0) \(byteSizeText(p.bytes))" } }
        return words.isEmpty ? "no memory reading" : words.joined(separator: ", ")
    }

    /// The last health check: `last check 1.2 s ago: 2 of 2 endpoints answered`.
    public static func healthWords(_ h: AdminSnapshot.HealthCheck?) -> String {
        guard let h else { return "no health check has ended yet" }
        let verdict = h.healthy > 0 ? "passed" : "failed"
        return
            "last check \(verdict) \(seconds(h.age)) ago (\(h.healthy) of \(h.endpoints) endpoint\(h.endpoints == 1 ? "" : "s") answered)"
    }

    /// The pause in words, with the answer that asked for it:
    /// `paused until 14:03:07 UTC (4.0 s), asked by a 503`.
    public static func pauseWords(_ u: AdminSnapshot.Upstream, takenAt: Date) -> String {
        var pause = "not paused"
        if let left = u.pausedFor {
            pause = "paused until \(clockTime(takenAt.addingTimeInterval(left.seconds))) (\(seconds(left)))"
            if u.pauseCause > 0 { pause += ", asked by a \(u.pauseCause)" }
        }
        if u.pausedClients > 0 { pause += "; \(u.pausedClients) client\(u.pausedClients == 1 ? "" : "s") paused" }
        return pause
    }

    /// The slots in words: `3 in flight of a limit of 12 (learned: baseline
    /// 25.1 ms, recent 27.0 ms); 2 queued`.
    public static func slotWords(_ c: AdminSnapshot.Concurrency) -> String {
        var words = "\(c.inFlight) in flight of a limit of \(c.limit)"
        if c.adaptive {
            words +=
                c.baseline > 0
                ? " (learned: baseline \(milliseconds(c.baseline)), recent \(milliseconds(c.recent)))" : " (learned, no sample yet)"
        }
        words += "; \(c.queued) queued"
        return c.streaming > 0 ? words + "; \(c.streaming) streaming apart" : words
    }

    /// The proxy's own HTTP/2 client in words: `2 connections, 37 streams
    /// (18.5 a connection); 3 opened, 12 streams sent again after a refusal, 1 GOAWAY`.
    public static func h2Words(_ c: AdminSnapshot.H2Client) -> String {
        func n(_ count: Int, _ word: String) -> String { "\(count) \(word)\(count == 1 ? "" : "s")" }
        var words = n(c.connections, "connection") + ", " + n(c.streams, "stream")
        if c.connections > 0 { words += " (\(Double(c.streams * 10 / c.connections) / 10) a connection)" }
        words += "; \(c.opened) opened, " + n(c.replayed, "stream") + " sent again after a refusal, "
        return words + (c.goaways == 1 ? "1 GOAWAY" : "\(c.goaways) GOAWAYs")
    }

    static func milliseconds(_ seconds: Double) -> String { "\(Double(Int(seconds * 10_000)) / 10) ms" }

    /// An endpoint's place: `in rotation`, `ejected until 14:03:07 UTC (28.0 s)`, `drained by an operator`.
    public static func rotationWords(_ e: AdminSnapshot.Endpoint, takenAt: Date) -> (tone: String, words: String) {
        if e.drained { return ("warn", "drained by an operator") }
        guard e.ejected else { return ("ok", "in rotation") }
        guard let left = e.ejectedFor else { return ("bad", "ejected") }
        return ("bad", "ejected until \(clockTime(takenAt.addingTimeInterval(left.seconds))) (\(seconds(left)))")
    }

    /// A name as one path segment of an admin URL (then escaped for the attribute).
    static func segment(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(CharacterSet(charactersIn: Unicode.Scalar(0)..<Unicode.Scalar(128)))
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    /// A button for one of the admin API's actions: the script asks
    /// `question` and sends a POST to `path` (both escaped here).
    static func actionButton(_ label: String, path: String, question: String, key: String) -> String {
        "<button type=\"button\" data-post=\"\(escape(path))\" data-confirm=\"\(escape(question))\" data-k=\"\(key)\">\(escape(label))</button>"
    }

    /// One upstream: its state as a definition list, its endpoints as a table.
    /// The actions (buttons) are hidden until the script shows them.
    public static func upstreamSection(_ u: AdminSnapshot.Upstream, index: Int, takenAt: Date) -> String {
        let name = escape(u.name)
        let reach = u.reachable ? "<span class=\"ok\">reachable</span>" : "<span class=\"bad\">unreachable</span>"
        let pauseTone = u.pausedFor == nil ? "ok" : "warn"
        let parkedWords =
            u.parked.filter { $0.count > 0 }.map { "\($0.count) \(escape($0.reason))" }.joined(separator: ", ")
        let base = "/admin/upstreams/" + segment(u.name)
        let breakerButtons = [
            actionButton(
                "Force open", path: base + "/breaker/open",
                question: "Force the breaker of \(u.name) open? Every try to it is refused until released.", key: "force-open"),
            actionButton(
                "Force closed", path: base + "/breaker/closed",
                question: "Force the breaker of \(u.name) closed? Every try goes through, failures or not, until released.",
                key: "force-closed"),
            actionButton(
                "Automatic", path: base + "/breaker/auto",
                question: "Release the breaker of \(u.name) to automatic (it starts closed)?", key: "release"),
        ].joined(separator: " ")
        var html = """
            <article class="upstream" id="u\(index)" data-upstream="\(name)">
            <h3>\(name)</h3>
            <dl>
            <dt>Health</dt><dd data-k="reachable">\(reach)</dd>
            <dt>Health check</dt><dd data-k="health_check">\(healthWords(u.healthCheck))</dd>
            <dt>Breaker</dt><dd data-k="breaker"><span class="\(tone(u.breaker))">\(escape(breakerWords(u.breaker, takenAt: takenAt)))</span></dd>
            <dt>Failures</dt><dd data-k="failures">\(failureWords(u.breakerFailures, breaker: u.breaker))</dd>
            <dt>Parked</dt><dd data-k="parked"><span class="\(u.parkedTotal > 0 ? "warn" : "ok")">\(u.parkedTotal) parked</span>\(parkedWords.isEmpty ? "" : " (\(parkedWords))")</dd>
            <dt>Slots</dt><dd data-k="slots"><span class="\(u.concurrency.queued > 0 ? "warn" : "ok")">\(slotWords(u.concurrency))</span></dd>
            <dt>Retry budget</dt><dd data-k="retries_left">\(u.retriesLeft) retries left</dd>
            <dt>Pause</dt><dd data-k="pause"><span class="\(pauseTone)">\(pauseWords(u, takenAt: takenAt))</span></dd>

            """
        if let token = u.token {
            let expires = token.expiresIn.map { "expires in \($0) s" } ?? "no token yet"
            html += "<dt>Credentials</dt><dd>\(escape(token.kind)), \(expires)</dd>\n"
        }
        if let h2 = u.h2 { html += "<dt>HTTP/2</dt><dd data-k=\"h2\">\(h2Words(h2))</dd>\n" }
        // One endpoint cannot be drained (it is the last): no button for it.
        let drains = u.endpoints.count > 1
        html += """
            </dl>
            <p class="actions" data-script hidden>Breaker: \(breakerButtons)</p>
            <table class="endpoints"><caption>Endpoints of \(name)</caption>
            <thead><tr><th scope="col">Endpoint</th><th scope="col">Rotation</th>\(drains ? "<th scope=\"col\" data-script hidden>Action</th>" : "")</tr></thead>
            <tbody>

            """
        for (i, e) in u.endpoints.enumerated() {
            let (tone, words) = rotationWords(e, takenAt: takenAt)
            html += "<tr><td>\(escape(e.url))</td><td><span class=\"\(tone)\">\(words)</span></td>"
            if drains {
                let path = base + "/endpoints/\(i)/"
                let button =
                    e.drained
                    ? actionButton(
                        "Undrain", path: path + "undrain", question: "Put \(e.url) back in the rotation of \(u.name)?",
                        key: "drain")
                    : actionButton(
                        "Drain", path: path + "drain",
                        question: "Drain \(e.url) (\(u.name))? New tries go to the other endpoints until it is undrained.",
                        key: "drain")
                html += "<td data-script hidden>\(button)</td>"
            }
            html += "</tr>\n"
        }
        html += "</tbody></table>\n</article>\n"
        return html
    }
}
