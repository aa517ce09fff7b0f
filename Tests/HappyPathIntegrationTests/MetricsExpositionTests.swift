import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

/// `/metrics` as Prometheus reads it: a proxy that has seen many kinds of
/// traffic (answers and errors, retries, deliver later, a rate limit, hedges,
/// fallbacks, refused requests) is scraped; every family has its `# HELP`,
/// and `promtool check metrics` (Debian's `prometheus`, which `make test`
/// installs) finds nothing to report.
@Suite("Metrics exposition", .serialized)
struct MetricsExpositionTests {
    static func yaml(store: String) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        storage: { path: \(store) }
        upstreams:
          demo: { endpoints: ["{{DEMO}}"] }
        routes:
          - match: { path_prefix: /later/ }
            upstream: demo
            strip_prefix: /later
            delivery: { mode: later }
          - match: { path_prefix: /limited/ }
            upstream: demo
            strip_prefix: /limited
            rate_limit: { rate: 1/m, burst: 1, over_limit: reject }
          - match: { path_prefix: /hedged/ }
            upstream: demo
            strip_prefix: /hedged
            hedge: { after: 1ms }
          - match: { path_prefix: /fallback/ }
            upstream: demo
            strip_prefix: /fallback
            fallback: { response: { status: 200, content_type: application/json, body: '{}' } }
          - match: { path_prefix: / }
            upstream: demo
        """
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

    @Test func everyFamilyHasItsHelpAndPromtoolFindsNothing() throws {
        let directory = NSTemporaryDirectory() + "happypath-metrics-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let h = try ProxyHarness(Self.yaml(store: directory + "/deliveries.db"))
        for path in [
            "/ok", "/status/404", "/flaky?fail=0.5&status=503", "/flaky?fail=0.5&status=503", "/limited/ok", "/limited/ok",
            "/hedged/slow?ms=20", "/fallback/status/503",
        ] {
            _ = try HTTP.request(port: h.port, path)
        }
        _ = try HTTP.request(port: h.port, "POST", "/later/echo", body: Array("{}".utf8))
        _ = try EdgeHardeningTests.raw(h.port, "GET / HTTP/1.1\r\n\r\n")  // no Host: refused by the edge
        let admin = AdminProbe(port: h.adminPort)
        guard waitUntil("the delivery delivered", { try admin.metric("happypath_deliveries_total{upstream=\"demo\",outcome=\"delivered\"}") == 1 })
        else { return }
        let text = String(decoding: try HTTP.request(port: h.adminPort, "/metrics").body, as: UTF8.self)

        let families = Self.families(text)
        for name in [
            "happypath_requests_total", "happypath_request_duration_seconds", "happypath_upstream_tries_total",
            "happypath_retries_total", "happypath_deliveries_total", "happypath_delivery_store_write_seconds",
            "happypath_rate_limited_total", "happypath_hedges_total", "happypath_fallback_total",
            "happypath_requests_refused_total", "happypath_client_connections",
        ] {
            #expect(families[name]?.type != nil, "\(name) is not in the scrape")
        }
        for (name, family) in families.sorted(by: { $0.key < $1.key }) {
            #expect(family.type != nil, "\(name): # HELP without # TYPE")
            #expect(!(family.help ?? "").isEmpty, "\(name): no # HELP")
        }

        let candidates: [String] = ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        guard let promtool = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            Issue.record("promtool is not installed (Debian: apt-get install prometheus; make test-deps does it)")
            return
        }
        let checked = try runProcess(promtool, ["check", "metrics"], input: text)
        #expect(checked.status == 0 && checked.out.isEmpty && checked.err.isEmpty, "promtool: \(checked.out) \(checked.err)")
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
            "happypath_upstream_paused_seconds", "happypath_delivery_store_errors_total",
        ]
        for name in names.sorted() where !described.contains(name) {
            #expect(MetricHelp.text[name] != nil, "\(name) has no help text in MetricHelp")
        }
    }
}
