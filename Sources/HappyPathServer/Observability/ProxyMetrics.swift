import HappyPathConfig
import HappyPathIO
import CoreMetrics
import Foundation
import HappyPathAdmin
import HappyPathCore
import HappyPathPolicies
import Metrics
import Prometheus

/// The proxy's metrics through swift-metrics, exposed by swift-prometheus
/// (`GET /metrics` on the admin listener). One registry per server, so
/// servers in one process (tests) do not share series.
final class ProxyMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    let factory: HelpfulMetricsFactory
    /// The route series the status page reads (`RouteTotals`), readable.
    let routeSeries = RouteSeriesBook()
    private let process = ProcessMetrics()

    init() {
        var factory = HelpfulMetricsFactory(registry: registry, routes: routeSeries)
        factory.defaultDurationHistogramBuckets = [
            .milliseconds(1), .microseconds(2500), .milliseconds(5), .milliseconds(10), .milliseconds(25),
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
            .microseconds(2_500_000), .seconds(5), .seconds(10), .seconds(30),
        ]
        // A Redis round trip on loopback or in a zone takes a fraction of a millisecond.
        factory.durationHistogramBuckets["happypath_cluster_redis_rtt_seconds"] = [
            .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2),
            .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100),
            .milliseconds(250), .seconds(1),
        ]
        // The store's commits take milliseconds: finer buckets there.
        factory.durationHistogramBuckets["happypath_delivery_store_write_seconds"] = [
            .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(3),
            .milliseconds(5), .microseconds(7500), .milliseconds(10), .milliseconds(15), .milliseconds(25),
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .seconds(1),
        ]
        // Tunnels last from seconds to hours.
        factory.durationHistogramBuckets["happypath_tunnel_duration_seconds"] = [
            .seconds(1), .seconds(10), .seconds(60), .seconds(300), .seconds(900), .seconds(3600), .seconds(4 * 3600),
        ]
        // A coalesced group is one request, or thousands.
        factory.valueHistogramBuckets["happypath_coalesce_group_size"] = [1, 2, 5, 10, 25, 100, 1000, 10000]
        self.factory = factory
    }

    func recorder(_ name: String, _ dimensions: [(String, String)]) -> CoreMetrics.Recorder {
        CoreMetrics.Recorder(label: name, dimensions: dimensions, aggregate: true, factory: factory)
    }

    func counter(_ name: String, _ dimensions: [(String, String)]) -> CoreMetrics.Counter {
        CoreMetrics.Counter(label: name, dimensions: dimensions, factory: factory)
    }

    func timer(_ name: String, _ dimensions: [(String, String)]) -> CoreMetrics.Timer {
        CoreMetrics.Timer(label: name, dimensions: dimensions, preferredDisplayUnit: .seconds, factory: factory)
    }

    /// `happypath_tls_certificate_expiry_seconds`: when each listener's
    /// certificates expire (Unix time), for alerts; set at start and reload.
    func certificateExpiry(_ config: Configuration, _ contexts: [TLSServerContext?]) {
        for (listener, context) in zip(config.listeners, contexts) {
            guard let context else { continue }
            for (i, pair) in context.certificates.enumerated() {
                guard let notAfter = context.notAfter(i) else { continue }
                gauge("happypath_tls_certificate_expiry_seconds", [("listener", "\(listener.address)"), ("cert", pair.cert)])
                    .record(Double(notAfter))
            }
        }
    }

    func gauge(_ name: String, _ dimensions: [(String, String)]) -> CoreMetrics.Gauge {
        CoreMetrics.Gauge(label: name, dimensions: dimensions, factory: factory)
    }

    /// Prometheus text exposition format.
    /// The text format; gauges that are read rather than kept (the body
    /// budget) are set just before.
    /// `http2`: HTTP/2 connections and streams open in the process now.
    func exposition(
        bodies: BodyBudget, connections: ConnectionBudget, tunnels: Int = 0, http2: (connections: Int, streams: Int) = (0, 0),
        parkedLimit: Int? = nil, memory: MemoryReading? = nil
    ) -> String {
        if let memory {
            for (pool, bytes) in memory.pools { gauge("happypath_memory_bytes", [("pool", pool)]).record(bytes) }
            gauge("happypath_memory_limit_bytes", []).record(memory.limit)
            gauge("happypath_memory_pressure", []).record(memory.pressure ? 1 : 0)
            gauge("happypath_spool_bytes", []).record(memory.spooled)
            gauge("happypath_spool_limit_bytes", []).record(memory.spoolLimit)
        }
        if let parkedLimit { gauge("happypath_parked_commands_limit", []).record(parkedLimit) }
        process.record(into: self)
        gauge("happypath_tunnels_open", []).record(tunnels)
        gauge("happypath_http2_connections", []).record(http2.connections)
        gauge("happypath_http2_streams_open", []).record(http2.streams)
        gauge("happypath_buffered_body_bytes", []).record(bodies.current)
        gauge("happypath_buffered_body_bytes_limit", []).record(bodies.limit)
        gauge("happypath_client_connections", []).record(connections.current)
        gauge("happypath_client_connections_limit", []).record(connections.limit)
        return registry.emitToString()
    }

    // MARK: - Series (docs/operations.md, "Metrics")

    func tokenRefresh(upstream: String, success: Bool) {
        counter("happypath_token_refreshes_total", [("upstream", upstream), ("result", success ? "success" : "failure")])
            .increment()
    }

    func circuitState(upstream: String, gauge value: Int) {
        gauge("happypath_circuit_state", [("upstream", upstream)]).record(value)
    }

    func replayed(upstream: String, count: Int) {
        counter("happypath_replayed_commands_total", [("upstream", upstream)]).increment(by: count)
    }

    /// `happypath_upstream_paused_seconds{upstream,scope}`: how long the
    /// pause still lasts (0: not paused); `scope="upstream"` the whole
    /// upstream's, `scope="client"` the longest of its clients' own (a 429
    /// under `scope_429: client`). Set at scrape time and when a pause ends.
    func paused(upstream: String, scope: PacingConfiguration.Scope, seconds: Double) {
        registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "happypath", metricName: "upstream_paused", unitName: "seconds",
                helpText:
                    "Seconds left in the pause an upstream asked for (pacing: 429/503 with Retry-After); scope upstream: the whole upstream, scope client: the longest of one client's; 0 when not paused."
            ),
            labels: [("upstream", upstream), ("scope", scope.rawValue)]
        ).set(seconds)
    }

    /// `happypath_upstream_paused_clients{upstream}`: client keys whose own
    /// 429 holds them now (at most `pacing.max_clients`); set at scrape time.
    func pausedClients(upstream: String, count: Int) {
        registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "happypath", metricName: "upstream_paused_clients", unitName: "",
                helpText: "Client keys an upstream's 429 paused (pacing.scope_429: client) whose pause is in force now."),
            labels: [("upstream", upstream)]
        ).set(Double(count))
    }

    /// The exporter's counts so far, as counters (they only grow).
    func spans(exported: Int, dropped: Int) {
        let (e, d) = spanCounts.withLock { c -> (Int, Int) in
            defer { c = (exported, dropped) }
            return (max(0, exported - c.exported), max(0, dropped - c.dropped))
        }
        counter("happypath_trace_spans_exported_total", []).increment(by: e)
        counter("happypath_trace_spans_dropped_total", []).increment(by: d)
    }
    private let spanCounts = Locked<(exported: Int, dropped: Int)>((0, 0))

    /// `/admin/events` subscribers dropped for not reading, as the bus counts them.
    func eventSubscribersDropped(_ total: Int) {
        let d = droppedSubscribers.withLock { last -> Int in
            defer { last = max(last, total) }
            return max(0, total - last)
        }
        counter("happypath_event_subscribers_dropped_total", []).increment(by: d)
    }
    private let droppedSubscribers = Locked(0)

    /// An upstream's slots (UpstreamGuard+Concurrency), read at a scrape.
    func concurrency(upstream: String, _ c: AdminSnapshot.Concurrency) {
        let labels = [("upstream", upstream)]
        gauge("happypath_upstream_concurrency_limit", labels).record(c.limit)
        gauge("happypath_upstream_in_flight", labels).record(c.inFlight)
        gauge("happypath_upstream_queued", labels).record(c.queued)
        // The latency series only for an adaptive upstream (a fixed limit learns none).
        if c.adaptive {
            gauge("happypath_upstream_streaming", labels).record(c.streaming)
            gauge("happypath_upstream_latency_baseline_seconds", labels).record(c.baseline)
            gauge("happypath_upstream_latency_recent_seconds", labels).record(c.recent)
        }
    }

    /// The proxy's own HTTP/2 client for one upstream, read at a scrape:
    /// gauges as they are, counters by what they grew since the last scrape.
    func h2Client(upstream: String, _ c: HTTP2ClientCounters) {
        let labels = [("upstream", upstream)]
        gauge("happypath_upstream_h2_connections", labels).record(c.connections.now)
        gauge("happypath_upstream_h2_streams", labels).record(c.streams.now)
        let now = (c.opened.now, c.replayed.now, c.goaways.now)
        let grown = h2Totals.withLock { totals -> (Int, Int, Int) in
            let last = totals[upstream] ?? (0, 0, 0)
            totals[upstream] = now
            return (max(0, now.0 - last.0), max(0, now.1 - last.1), max(0, now.2 - last.2))
        }
        counter("happypath_upstream_h2_connections_opened_total", labels).increment(by: grown.0)
        counter("happypath_upstream_h2_streams_replayed_total", labels).increment(by: grown.1)
        counter("happypath_upstream_h2_goaways_total", labels).increment(by: grown.2)
    }
    private let h2Totals = Locked<[String: (Int, Int, Int)]>([:])

    func parked(upstream: String, reason: String, count: Int) {
        gauge("happypath_parked_commands", [("upstream", upstream), ("reason", reason)]).record(count)
    }
}

/// A worker's handles on the hot-path series, made once per label set and
/// kept, so a request costs a dictionary lookup and an atomic add.
final class WorkerMetrics {
    private let metrics: ProxyMetrics
    // Nested by label values: a lookup hashes the strings it is given and
    // builds none.
    private var requests: [String: [String: CoreMetrics.Counter]] = [:]
    private var durations: [String: CoreMetrics.Timer] = [:]
    private var tries: [String: [String: CoreMetrics.Counter]] = [:]
    private var retries: [String: CoreMetrics.Counter] = [:]
    private var refusals: [HTTP2RequestRefusal: CoreMetrics.Counter] = [:]

    init(_ metrics: ProxyMetrics) { self.metrics = metrics }

    /// The series the previous request used: consecutive requests mostly
    /// share route and code, and comparing two strings that share storage
    /// costs less than hashing them.
    private var lastRequest:
        (label: String, code: String, counter: CoreMetrics.Counter, timer: CoreMetrics.Timer, tries: CoreMetrics.Counter)?
    private var lastTry: (upstream: String, outcome: String, counter: CoreMetrics.Counter)?
    private var routeTries: [String: CoreMetrics.Counter] = [:]

    /// A request answered: its code, its time, and the tries it counted
    /// (its `X-Happypath-Attempts`; the status page's tries per request is
    /// `happypath_request_tries_total` over `happypath_requests_total`, one
    /// atomic add more than the two counted before).
    func request(route: RuntimeRoute, code: String, duration: Duration, tries: Int) {
        if let last = lastRequest, last.label == route.label, last.code == code {
            last.counter.increment()
            last.timer.recordNanoseconds(duration.nanoseconds)
            last.tries.increment(by: tries)
            return
        }
        let counter =
            requests[route.label]?[code]
            ?? {
                let c = metrics.counter("happypath_requests_total", [("route", route.label), ("code", code)])
                requests[route.label, default: [:]][code] = c
                return c
            }()
        counter.increment()
        let timer =
            durations[route.label]
            ?? {
                let t = metrics.timer("happypath_request_duration_seconds", [("route", route.label)])
                durations[route.label] = t
                return t
            }()
        timer.recordNanoseconds(duration.nanoseconds)
        let triesCounter =
            routeTries[route.label]
            ?? {
                let c = metrics.counter("happypath_request_tries_total", [("route", route.label)])
                routeTries[route.label] = c
                return c
            }()
        triesCounter.increment(by: tries)
        lastRequest = (route.label, code, counter, timer, triesCounter)
    }

    /// Per route, one counter per `grpc_status` value (the 17 codes, then
    /// `unknown`), made when first used: at most 18 series a route.
    private var grpcCalls: [String: [CoreMetrics.Counter?]] = [:]

    /// A gRPC call answered, by the status its client read (nil: `unknown`).
    func grpcCall(route: RuntimeRoute, status: GRPCStatus?) {
        let index = status?.rawValue ?? GRPCStatus.allCases.count
        var counters = grpcCalls[route.label] ?? Array(repeating: nil, count: GRPCStatus.allCases.count + 1)
        if let counter = counters[index] { return counter.increment() }
        let counter = metrics.counter(
            "happypath_grpc_requests_total", [("route", route.label), ("grpc_status", GRPCCall.label(status))])
        counters[index] = counter
        grpcCalls[route.label] = counters
        counter.increment()
    }

    /// A request the edge refused, by rule: an HTTP/1.1 rule counts in the
    /// same series whichever protocol broke it.
    func refused(_ refusal: HTTP2RequestRefusal) {
        let counter =
            refusals[refusal]
            ?? {
                let c = metrics.counter(
                    "happypath_requests_refused_total", [("reason", refusal.label), ("status", String(refusal.status))])
                refusals[refusal] = c
                return c
            }()
        counter.increment()
    }

    /// The listener paused because descriptors (or memory) ran out.
    func acceptCapped() {
        let c = acceptCappedCounter ?? metrics.counter("happypath_accept_capped_total", [])
        acceptCappedCounter = c
        c.increment()
    }
    private var acceptCappedCounter: CoreMetrics.Counter?

    /// At the cap, a connection that never sent a byte was closed to make room.
    func silentConnectionClosed() { rare("happypath_silent_connections_closed_total", []).increment() }

    func acceptPaused() {
        let c = acceptPausedCounter ?? metrics.counter("happypath_accept_paused_total", [])
        acceptPausedCounter = c
        c.increment()
    }
    private var acceptPausedCounter: CoreMetrics.Counter?

    func upstreamTry(upstream: String, outcome: String) {
        if let last = lastTry, last.upstream == upstream, last.outcome == outcome { return last.counter.increment() }
        let counter =
            tries[upstream]?[outcome]
            ?? {
                let c = metrics.counter("happypath_upstream_tries_total", [("upstream", upstream), ("outcome", outcome)])
                tries[upstream, default: [:]][outcome] = c
                return c
            }()
        counter.increment()
        lastTry = (upstream, outcome, counter)
    }

    /// A hedge (`hedge:` on the route): `won`, `lost` (another try answered
    /// first, or it failed) or `skipped` (due, but not sent).
    func hedge(route: RuntimeRoute, outcome: String) {
        rare("happypath_hedges_total", [("route", route.label), ("outcome", outcome)]).increment()
    }

    /// An answer the route's `fallback` gave instead of an error: `kind`
    /// `stale` or `fixed`, `reason` the way the upstream failed.
    func fallback(route: RuntimeRoute, kind: String, reason: String) {
        rare("happypath_fallback_total", [("route", route.label), ("kind", kind), ("reason", reason)]).increment()
    }

    /// Followers answered from their leader's try (`coalesce:`).
    func coalesced(route label: String, _ count: Int) {
        guard count > 0 else { return }
        rare("happypath_coalesced_requests_total", [("route", label)]).increment(by: count)
    }

    /// A request on a coalescing route went on its own try.
    func coalesceAlone(route label: String, _ reason: CoalesceRules.AloneReason) {
        rare("happypath_coalesce_alone_total", [("route", label), ("reason", reason.rawValue)]).increment()
    }

    /// A leader ended before its answer, and a follower led a new try.
    func coalesceHandover(route label: String) {
        rare("happypath_coalesce_handovers_total", [("route", label)]).increment()
    }

    /// A member fell too far behind the fastest and was cut.
    func coalesceCut(route label: String) { rare("happypath_coalesce_cut_total", [("route", label)]).increment() }

    /// A group ended: how many requests its try served.
    func coalesceGroupEnded(route label: String, size: Int) {
        let recorder =
            groupSizes[label]
            ?? {
                let r = metrics.recorder("happypath_coalesce_group_size", [("route", label)])
                groupSizes[label] = r
                return r
            }()
        recorder.record(size)
    }
    private var groupSizes: [String: CoreMetrics.Recorder] = [:]

    /// A series counted off the hot path (a hedge, a fallback answer), kept
    /// by its name and label values joined: one key built per event.
    func tlsHandshake(version: Int) {
        rare("happypath_tls_handshakes_total", [("version", version == 13 ? "1.3" : "1.2")]).increment()
    }

    func tlsHandshakeFailed(reason: TLSHandshakeFailure) {
        rare("happypath_tls_handshake_failures_total", [("reason", reason.rawValue)]).increment()
    }

    /// A tunnel closed (docs/websocket.md): why, its bytes each way, how long it lasted.
    func tunnelClosed(upstream: String, _ summary: Tunnel.Summary) {
        rare("happypath_tunnels_total", [("upstream", upstream), ("reason", summary.reason.rawValue)]).increment()
        rare("happypath_tunnel_bytes_total", [("upstream", upstream), ("direction", "to_upstream")])
            .increment(by: summary.bytesToUpstream)
        rare("happypath_tunnel_bytes_total", [("upstream", upstream), ("direction", "to_client")])
            .increment(by: summary.bytesToClient)
        metrics.timer("happypath_tunnel_duration_seconds", [("upstream", upstream)]).recordNanoseconds(
            summary.duration.nanoseconds)
    }

    // MARK: HTTP/2 (docs/http2.md)

    /// A connection began speaking HTTP/2 (`happypath_http2_connections_total{tls}`).
    func http2ConnectionOpened(tls: Bool) {
        if tls {
            let c = http2TLSConnections ?? metrics.counter("happypath_http2_connections_total", [("tls", "true")])
            http2TLSConnections = c
            c.increment()
        } else {
            let c = http2PlainConnections ?? metrics.counter("happypath_http2_connections_total", [("tls", "false")])
            http2PlainConnections = c
            c.increment()
        }
    }
    private var http2TLSConnections: CoreMetrics.Counter?
    private var http2PlainConnections: CoreMetrics.Counter?

    /// An HTTP/2 connection ended; a GOAWAY we sent is counted by the reason
    /// the connection ended for (a few per connection at most: `rare`).
    func http2ConnectionClosed(reason: HTTP2ConnectionStateMachine.Reason, sentGoaway: Bool) {
        guard sentGoaway else { return }
        rare("happypath_http2_goaways_total", [("side", "sent"), ("reason", reason.label)]).increment()
    }

    /// The client sent GOAWAY, by its code: kept per code, as resets are (a
    /// client may send GOAWAY after GOAWAY; each costs a lookup, no key).
    func http2GoawayReceived(code: HTTP2ErrorCode) {
        Self.kept(&receivedGoaways, code) {
            metrics.counter("happypath_http2_goaways_total", [("side", "received"), ("reason", code.label)])
        }.increment()
    }
    private var receivedGoaways: [HTTP2ErrorCode: CoreMetrics.Counter] = [:]

    /// A stream opened: one per HTTP/2 request, so a kept handle.
    func http2StreamOpened() {
        let c = http2Streams ?? metrics.counter("happypath_http2_streams_total", [])
        http2Streams = c
        c.increment()
    }
    private var http2Streams: CoreMetrics.Counter?

    /// A stream reset by the client or by us, by code. Kept per code, not
    /// made by `rare`: a rapid-reset flood resets thousands a second, and
    /// a lookup by the code builds no key.
    func http2StreamReset(byClient: Bool, code: HTTP2ErrorCode) {
        if byClient {
            Self.kept(&clientResets, code) {
                metrics.counter("happypath_http2_resets_total", [("side", "client"), ("code", code.label)])
            }.increment()
        } else {
            Self.kept(&proxyResets, code) {
                metrics.counter("happypath_http2_resets_total", [("side", "proxy"), ("code", code.label)])
            }.increment()
        }
    }
    private var clientResets: [HTTP2ErrorCode: CoreMetrics.Counter] = [:]
    private var proxyResets: [HTTP2ErrorCode: CoreMetrics.Counter] = [:]

    /// The counter `counters` keeps for `code`, made the first time.
    private static func kept(
        _ counters: inout [HTTP2ErrorCode: CoreMetrics.Counter], _ code: HTTP2ErrorCode, _ make: () -> CoreMetrics.Counter
    ) -> CoreMetrics.Counter {
        if let c = counters[code] { return c }
        let c = make()
        counters[code] = c
        return c
    }

    /// A request the concurrency limit answered OVERLOADED (queue full, or shed from it).
    func shed(upstream: String, priority: RequestPriority) {
        rare("happypath_upstream_shed_total", [("upstream", upstream), ("priority", priority.rawValue)]).increment()
    }

    private func rare(_ name: String, _ labels: [(String, String)]) -> CoreMetrics.Counter {
        let key = labels.reduce(name) { $0 + "\u{0}" + $1.1 }
        if let counter = rareCounters[key] { return counter }
        let counter = metrics.counter(name, labels)
        rareCounters[key] = counter
        return counter
    }
    private var rareCounters: [String: CoreMetrics.Counter] = [:]

    /// A retry or hedge the retry budget refused (rare: made when it happens).
    func retryBudgetExhausted(upstream: String) {
        metrics.counter("happypath_retry_budget_exhausted_total", [("upstream", upstream)]).increment()
    }

    func retry(upstream: String) {
        let counter =
            retries[upstream]
            ?? {
                let c = metrics.counter("happypath_retries_total", [("upstream", upstream)])
                retries[upstream] = c
                return c
            }()
        counter.increment()
    }
}

extension Outcome {
    /// The `outcome` label of `happypath_upstream_tries_total`.
    var metricLabel: String {
        switch self {
        case .success: "success"
        case .serverError: "server_error"
        case .clientError: "client_error"
        case .timeout: "timeout"
        case .unreachable: "unreachable"
        case .reset: "reset"
        case .grpcError: "grpc_error"
        }
    }
}
