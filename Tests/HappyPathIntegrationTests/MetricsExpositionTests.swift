import Foundation
import HappyPathPolicies
import HappyPathCore
import HappyPathIO
import Testing

@testable import HappyPathServer

/// `/metrics` as Prometheus reads it: a proxy that has seen many kinds of
/// traffic (answers and errors, retries, deliver later, a rate limit, hedges,
/// fallbacks, refused requests, HTTP/2 connections, streams, resets and
/// GOAWAYs) is scraped; every family has its `# HELP`,
/// and `promtool check metrics` (Debian's `prometheus`, which `make test`
/// installs) finds nothing to report.
@Suite("Metrics exposition", .serialized)
struct MetricsExpositionTests {
    /// Routes for every kind of traffic: answers and client errors, deliver
    /// later (delivered, and queued for an upstream that is down), a rate
    /// limit, hedges, a fallback, credentials, retries a tight budget refuses
    /// and a breaker that opens, parking, and an upstream with pacing.
    static func yaml(store: String, down: Int, tls: TestCertificates.Pair) -> String {
        """
        listen:
          - 127.0.0.1:0
          - { address: 127.0.0.1:0, tls: { certificates: [ { cert: \(tls.cert), key: \(tls.key) } ] } }
        admin: { listen: 127.0.0.1:0 }
        storage: { path: \(store) }
        cluster: { redis: { url: "redis://127.0.0.1:\(down)/0" } }
        upstreams:
          demo:
            endpoints: ["{{DEMO}}"]
            pacing: { on: [429] }
            adaptive_concurrency: { min_limit: 1, max_limit: 64, initial_limit: 32 }
          authed:
            endpoints: ["{{DEMO}}"]
            auth: { kind: oauth2_client_credentials, token_url: "{{DEMO}}/_demo/token?ttl=60", client_id: t, client_secret: t }
          fragile:
            endpoints: ["{{DEMO}}"]
            retry: { attempts: 3, backoff: { base: 1ms, max: 1ms }, budget: { ratio: 0.01, min_per_second: 1 } }
            circuit_breaker: { consecutive_failures: 100, minimum_requests: 1000 }
          down:
            endpoints: [http://127.0.0.1:\(down)]
            connect_timeout: 200ms
            reachability: { park_for: 300ms }
          h2down:
            endpoints: [http://127.0.0.1:\(down)]
            protocol: h2
            connect_timeout: 200ms
            reachability: { park_for: 0s }
        routes:
          - { match: { path_prefix: /later/ }, upstream: demo, strip_prefix: /later, delivery: { mode: later } }
          - { match: { path_prefix: /later-down/ }, upstream: down, strip_prefix: /later-down, delivery: { mode: later } }
          - match: { path_prefix: /limited/ }
            upstream: demo
            strip_prefix: /limited
            rate_limit: { rate: 1/m, burst: 1, over_limit: reject }
          - { match: { path_prefix: /hedged/ }, upstream: demo, strip_prefix: /hedged, hedge: { after: 1ms } }
          - match: { path_prefix: /fallback/ }
            upstream: demo
            strip_prefix: /fallback
            fallback: { response: { status: 200, content_type: application/json, body: '{}' } }
          - { match: { path_prefix: /authed/ }, upstream: authed, strip_prefix: /authed }
          - { match: { path_prefix: /fragile/ }, upstream: fragile, strip_prefix: /fragile }
          - { match: { path_prefix: /down/ }, upstream: down, strip_prefix: /down }
          - { match: { path_prefix: /h2down/ }, upstream: h2down, strip_prefix: /h2down }
          - { match: { path_prefix: / }, upstream: demo }
        """
    }

    /// The scrape of a proxy that has seen all of that traffic.
    static func scrape() throws -> String {
        let directory = NSTemporaryDirectory() + "happypath-metrics-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let down = RefusingPort()
        let certs = try TestCertificates()
        let tls = try certs.make("metrics", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml(store: directory + "/deliveries.db", down: down.port, tls: tls), holding: [down])
        for path in [
            "/ok", "/status/404", "/limited/ok", "/limited/ok", "/hedged/slow?ms=20", "/fallback/status/503",
            "/authed/private/ok", "/down/ok", "/h2down/ok",
        ] + Array(repeating: "/fragile/status/502", count: 20) {
            _ = try HTTP.request(port: h.port, path)
        }
        _ = try HTTP.request(port: h.port, "POST", "/later/echo", body: Array("{}".utf8))
        _ = try HTTP.request(port: h.port, "POST", "/later-down/x", body: Array("{}".utf8))
        _ = try EdgeHardeningTests.raw(h.port, "GET / HTTP/1.1\r\n\r\n")  // no Host: refused by the edge
        // HTTP/2's events as its driver reports them to a worker, and a refused stream.
        h.proxy.onWorker { w in
            w.http2ConnectionOpened(tls: true)
            w.http2ConnectionOpened(tls: false)
            w.http2StreamOpened()
            w.http2StreamOpened()
            w.http2StreamClosed()
            w.http2StreamReset(byClient: true, code: .cancel)
            w.http2StreamReset(byClient: false, code: .enhanceYourCalm)
            w.http2GoawayReceived(code: .noError)
            w.http2ConnectionClosed(reason: .rapidReset, sentGoaway: true)
            let stream = RecordingStream()
            stream.protocolName = "HTTP/2"
            let request = HTTPRequest(stream: stream)
            stream.carried = request
            w.reject(request, refusal: .malformed(.connectionSpecificField))
            // gRPC calls' statuses, a known one and one no client could read.
            w.metrics.grpcCall(route: w.runtime.routes[0], status: .unavailable)
            w.metrics.grpcCall(route: w.runtime.routes[0], status: nil)
            // A request the concurrency limit shed.
            w.metrics.shed(upstream: "demo", priority: .sheddable)
            // A coalesced group's series (coalesce: true; CoalescingTests drives them for real).
            let label = w.runtime.routes[0].label
            w.metrics.coalesced(route: label, 3)
            w.metrics.coalesceGroupEnded(route: label, size: 4)
            w.metrics.coalesceAlone(route: label, .ineligible)
            w.metrics.coalesceHandover(route: label)
            w.metrics.coalesceCut(route: label)
        }
        let admin = AdminProbe(port: h.adminPort)
        guard
            waitUntil("the delivery to the demo delivered", {
                try admin.metric("happypath_deliveries_total{upstream=\"demo\",outcome=\"delivered\"}") == 1
            })
        else { throw TestError("nothing delivered") }
        let refusedStream = "happypath_requests_refused_total{reason=\"connection_specific_field\",status=\"400\"}"
        guard waitUntil("the HTTP/2 refusal counted", { try admin.metric(refusedStream) == 1 }) else {
            throw TestError("the HTTP/2 events did not reach the worker")
        }
        return String(decoding: try HTTP.request(port: h.adminPort, "/metrics").body, as: UTF8.self)
    }

    /// Series names in a scrape, each with the label names it carries.
    static func series(_ text: String) -> [String: Set<String>] {
        var out: [String: Set<String>] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let head = line.split(separator: " ")[0]
            let name = String(head.prefix { $0 != "{" })
            var labels = out[name] ?? []
            if let open = head.firstIndex(of: "{") {
                for pair in head[head.index(after: open)...].dropLast().split(separator: ",") {
                    labels.insert(String(pair.prefix { $0 != "=" }))
                }
            }
            out[name] = labels
        }
        return out
    }

    /// What in `expr` the scrape does not have: a metric it does not
    /// export, a label matched on a metric that does not carry it, a
    /// `by (...)` label none of the expression's metrics carries.
    /// (`job` and `instance` are the scrape's own labels.)
    static func unknownSelectors(_ expr: String, _ exported: [String: Set<String>]) -> [String] {
        var problems: [String] = []
        let targetLabels: Set = ["job", "instance"]
        var metricsHere: [String] = []
        let selector = try! Regex(#"\b((?:happypath|process)_[a-z_]+)\s*(\{([^}]*)\})?"#)
        for match in expr.matches(of: selector) {
            let name = String(match.output[1].substring ?? "")
            metricsHere.append(name)
            guard let labels = exported[name] else {
                problems.append("\(name): not exported")
                continue
            }
            if let matchers = match.output[3].substring {
                for m in matchers.matches(of: try! Regex(#"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)"#)) {
                    let label = String(m.output[1].substring ?? "")
                    if !labels.contains(label), !targetLabels.contains(label) { problems.append("\(name): no label \(label)") }
                }
            }
        }
        for by in expr.matches(of: try! Regex(#"\bby\s*\(([^)]*)\)"#)) {
            for label in (by.output[1].substring ?? "").split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) })
            where !label.isEmpty && !targetLabels.contains(label) {
                if !metricsHere.contains(where: { exported[$0]?.contains(label) == true }) {
                    problems.append("by (\(label)): no metric of the expression carries it")
                }
            }
        }
        return problems
    }

    /// The families in an exposition: name -> (TYPE, HELP).
    static func families(_ text: String) -> [String: (type: String?, help: String?)] {
        var out: [String: (type: String?, help: String?)] = [:]
        for line in text.split(separator: "\n") where line.hasPrefix("# ") {
            let parts = line.split(separator: " ", maxSplits: 3)
            guard parts.count >= 3 else { continue }
            let name = String(parts[2])
            let rest = parts.count > 3 ? String(parts[3]) : ""
            if parts[1] == "TYPE" { out[name, default: (nil, nil)].type = rest }
            if parts[1] == "HELP" { out[name, default: (nil, nil)].help = rest }
        }
        return out
    }

    @Test func everyFamilyHasItsHelp() throws {
        let text = try Self.scrape()

        let families = Self.families(text)
        for name in [
            "happypath_requests_total", "happypath_request_duration_seconds", "happypath_upstream_tries_total",
            "happypath_retries_total", "happypath_deliveries_total", "happypath_delivery_store_write_seconds",
            "happypath_rate_limited_total", "happypath_hedges_total", "happypath_fallback_total",
            "happypath_coalesced_requests_total", "happypath_coalesce_group_size", "happypath_coalesce_alone_total",
            "happypath_coalesce_handovers_total", "happypath_coalesce_cut_total", "happypath_requests_refused_total", "happypath_client_connections", "happypath_retry_budget_exhausted_total",
            "happypath_circuit_state", "happypath_parked_commands", "happypath_token_refreshes_total",
            "happypath_upstream_paused_seconds", "happypath_deliveries_queued", "happypath_delivery_oldest_queued_seconds",
            "process_cpu_seconds_total", "process_open_fds", "happypath_tls_certificate_expiry_seconds",
            "happypath_http2_connections", "happypath_http2_connections_total", "happypath_http2_streams_open",
            "happypath_http2_streams_total", "happypath_http2_resets_total", "happypath_http2_goaways_total",
            "happypath_upstream_h2_connections", "happypath_upstream_h2_streams",
            "happypath_upstream_h2_connections_opened_total", "happypath_upstream_h2_streams_replayed_total",
            "happypath_upstream_h2_goaways_total",
        ] {
            #expect(families[name]?.type != nil, "\(name) is not in the scrape")
        }
        for (name, family) in families.sorted(by: { $0.key < $1.key }) {
            #expect(family.type != nil, "\(name): # HELP without # TYPE")
            #expect(!(family.help ?? "").isEmpty, "\(name): no # HELP")
        }
    }

    /// Debian's `promtool` (the `prometheus` package), if it is here.
    static let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }
    /// A plain `swift test` without promtool skips its check (one line says
    /// why); `make test` installs it and sets `HAPPYPATH_TEST_SERVICES=required`,
    /// so there the check always runs and a missing promtool fails it.
    static let promtoolRuns = promtool != nil || ProcessInfo.processInfo.environment["HAPPYPATH_TEST_SERVICES"] == "required"

    @Test(.enabled(if: promtoolRuns, "no promtool here (Debian's prometheus: make test installs it and runs this)"))
    func promtoolFindsNothing() throws {
        let text = try Self.scrape()
        guard let promtool = Self.promtool else {
            Issue.record("promtool is not installed (Debian: apt-get install prometheus; make test-deps does it)")
            return
        }
        let checked = try runProcess(promtool, ["check", "metrics"], input: text)
        #expect(checked.status == 0 && checked.out.isEmpty && checked.err.isEmpty, "promtool: \(checked.out) \(checked.err)")
    }

    /// Every query of the Grafana dashboard, and every alert rule, refers
    /// only to metrics and labels the proxy exports.
    @Test func theDashboardAndTheAlertsAskOnlyForWhatIsExported() throws {
        let exported = Self.series(try Self.scrape())
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let dashboard = try JSONSerialization.jsonObject(
            with: Data(contentsOf: root.appendingPathComponent("deploy/grafana/happypath.json"))) as? [String: Any] ?? [:]
        var exprs: [String] = []
        for panel in dashboard["panels"] as? [[String: Any]] ?? [] {
            for target in panel["targets"] as? [[String: Any]] ?? [] { exprs.append(target["expr"] as? String ?? "") }
        }
        let templating = (dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]] ?? []
        for variable in templating {
            if let query = (variable["query"] as? [String: Any])?["query"] as? String { exprs.append(query) }
        }
        #expect(exprs.count > 25)
        for expr in exprs {
            let problems = Self.unknownSelectors(expr, exported)
            #expect(problems.isEmpty, "dashboard: \(expr): \(problems)")
        }
        // The alert rules, the same way (the file is YAML: its expr lines are enough here).
        let rules = try String(contentsOf: root.appendingPathComponent("deploy/prometheus/happypath-rules.yaml"), encoding: .utf8)
        var ruleExprs: [String] = []
        var current: String?
        for line in rules.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("expr:") {
                if let c = current { ruleExprs.append(c) }
                let rest = trimmed.dropFirst(5).trimmingCharacters(in: .whitespaces)
                current = rest == "|" ? "" : rest
            } else if let c = current, line.hasPrefix("          "), !trimmed.hasPrefix("#") {
                current = c + " " + trimmed
            } else if let c = current {
                ruleExprs.append(c)
                current = nil
            }
        }
        #expect(ruleExprs.count == 13)
        for expr in ruleExprs {
            let problems = Self.unknownSelectors(expr, exported)
            #expect(problems.isEmpty, "rules: \(expr): \(problems)")
        }
        // The check itself: a metric or a label that is not there is found.
        #expect(!Self.unknownSelectors("rate(happypath_nothing_total[5m])", exported).isEmpty)
        #expect(!Self.unknownSelectors("sum by (colour) (happypath_requests_total{route=\"/\"})", exported).isEmpty)
        #expect(!Self.unknownSelectors("happypath_requests_total{colour=\"red\"}", exported).isEmpty)
    }

    /// Every series docs/operations.md lists has its help text.
    @Test func everyDocumentedSeriesHasHelpText() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let docs = try String(contentsOf: root.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        var names: Set<String> = []
        for line in docs.split(separator: "\n") where line.hasPrefix("| `happypath_") {
            let cell = line.split(separator: "|")[0]
            for part in cell.split(separator: "`") where part.hasPrefix("happypath_") { names.insert(String(part)) }
        }
        #expect(names.count > 30)
        // The ones registered with a descriptor of their own carry their text there.
        let described: Set = [
            "happypath_rate_limited_total", "happypath_rate_limit_queue_depth", "happypath_rate_limit_queue_wait_seconds",
            "happypath_upstream_paused_seconds", "happypath_upstream_paused_clients", "happypath_delivery_store_errors_total",
        ]
        for name in names.sorted() where !described.contains(name) {
            #expect(MetricHelp.text[name] != nil, "\(name) has no help text in MetricHelp")
        }
    }
}
