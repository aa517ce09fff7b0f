import CoreMetrics
import Prometheus

/// What each series means, as its `# HELP` line says it (docs/operations.md,
/// "Metrics", says the same at more length). Every series the proxy
/// exports has one: `MetricHelpTests` scrapes a proxy that has seen every
/// kind of traffic and fails on a `# TYPE` without its `# HELP`, and on
/// anything `promtool check metrics` reports.
enum MetricHelp {
    static let text: [String: String] = [
        "happypath_requests_total":
            "Client requests answered, by route and code (OK for the upstream's own 2xx/3xx, else the error code).",
        "happypath_grpc_requests_total":
            "gRPC calls answered, by route and grpc_status (the status number the client read, or unknown).",
        "happypath_request_duration_seconds": "Time from a client request's arrival to its answer, by route.",
        "happypath_request_tries_total":
            "Tries counted for the client requests answered, by route (their X-Happypath-Attempts summed; a coalesced follower sends none).",
        "happypath_upstream_tries_total": "Tries sent upstream, by upstream and outcome.",
        "happypath_retries_total": "Tries that were retries, by upstream.",
        "happypath_retry_budget_exhausted_total":
            "Retries the upstream's retry budget refused (and hedges, when it had no retry left either), by upstream.",
        "happypath_trace_spans_exported_total": "Spans the OTLP exporter sent to the collector (tracing).",
        "happypath_trace_spans_dropped_total":
            "Spans dropped: the exporter's queue was full, or the collector did not take an export (tracing).",
        "happypath_parked_commands_limit": "limits.max_parked: requests the process parks at most.",
        "process_start_time_seconds": "Start time of the process since the Unix epoch, in seconds.",
        "process_cpu_seconds_total": "User and system CPU time the process spent, in seconds.",
        "process_resident_memory_bytes": "Resident memory of the process, in bytes.",
        "process_open_fds": "File descriptors the process has open.",
        "process_max_fds": "The process's limit of open file descriptors.",
        "happypath_circuit_state": "Circuit breaker state per upstream: 0 closed, 1 half-open, 2 open.",
        "happypath_parked_commands": "Requests parked now, waiting for their upstream, by upstream and reason.",
        "happypath_upstream_concurrency_limit":
            "Tries an upstream may have in flight now, over all workers: max_connections x endpoints, or the adaptive limit.",
        "happypath_upstream_in_flight": "Tries in flight to an upstream now (each holds one of its slots).",
        "happypath_upstream_queued": "Requests waiting for one of an upstream's slots now.",
        "happypath_upstream_streaming":
            "Answers of an adaptive upstream streaming past their head now, counted apart from its limit (max_streams).",
        "happypath_upstream_shed_total":
            "Requests answered OVERLOADED by an upstream's concurrency limit (queue full, or shed from it), by priority.",
        "happypath_upstream_latency_baseline_seconds":
            "An adaptive upstream's latency baseline, of the kind of request (route and path) last measured: the least recent latency of its last window of tries.",
        "happypath_upstream_latency_recent_seconds":
            "The recent latency of that kind of request: the median of its last 10 tries, to their response head.",
        "happypath_replayed_commands_total": "Parked requests replayed once their upstream could take them, by upstream.",
        "happypath_token_refreshes_total": "Upstream credential refreshes, by upstream and result.",
        "happypath_requests_refused_total": "Requests the edge (HTTP/1.1 or HTTP/2) refused before routing, by rule and status.",
        "happypath_accept_capped_total": "Times a listener stopped accepting because limits.max_connections was reached.",
        "happypath_silent_connections_closed_total":
            "Client connections that never sent a byte, closed at limits.max_connections to make room for a new one.",
        "happypath_admin_accept_capped_total": "Times the admin listener stopped accepting because it held its 64 connections.",
        "happypath_event_subscribers_dropped_total": "/admin/events subscribers dropped because more than 1 MiB waited unread for them.",
        "happypath_accept_paused_total": "Times a listener paused because the process ran out of descriptors or socket memory.",
        "happypath_client_connections": "Client connections open in the process now.",
        "happypath_client_connections_limit": "limits.max_connections: client connections the process holds at most.",
        "happypath_buffered_body_bytes": "Request and response body bytes buffered in the process now.",
        "happypath_memory_limit_bytes": "limits.max_memory: what the process may hold for clients in all.",
        "happypath_memory_pressure":
            "1 while the process holds 90% of limits.max_memory for clients (new connections wait, new HTTP/2 streams are refused, stream windows shrink) until it falls below 75%.",
        "happypath_memory_pressure_changes_total": "Times the memory overload action began or ended.",
        "happypath_memory_bytes":
            "Bytes the process holds for clients now, by pool: request_bodies, staged_answers (HTTP/2, not yet framed), client_output (queued for sockets), tunnels (client bytes queued for upstreams), upstream_h2 (answer bytes the proxy's own HTTP/2 client holds for slow clients' streams, a stream window each at most), coalesced (answer bytes kept once for the members of coalesced groups that have not read them yet), admin_output (queued for admin clients: event streams), kept_answers (fallback.serve_stale).",
        "happypath_buffered_body_bytes_limit": "Body bytes the process buffers at most.",
        "happypath_spool_bytes":
            "Bytes in spool files now, on disk: answers read ahead of slow clients (limits.read_ahead) and request bodies kept for retries (limits.body_in_memory).",
        "happypath_spool_limit_bytes": "limits.max_spooled_bytes: bytes the process keeps in spool files at most.",
        "happypath_tls_handshakes_total": "TLS handshakes completed on TLS listeners, by protocol version.",
        "happypath_tls_handshake_failures_total": "TLS handshakes that failed, by reason.",
        "happypath_tls_certificate_expiry_seconds": "When each listener certificate expires, as Unix time in seconds.",
        "happypath_tunnels_open": "WebSocket (upgrade) tunnels open now.",
        "happypath_upstream_h2_connections":
            "Connections the proxy's own HTTP/2 client (protocol: h2) holds to the upstream now, all workers and the health checks.",
        "happypath_upstream_h2_streams": "Streams open on those connections now.",
        "happypath_upstream_h2_connections_opened_total": "Connections the proxy's own HTTP/2 client opened to the upstream.",
        "happypath_upstream_h2_streams_replayed_total":
            "Tries sent again on another stream because the upstream refused theirs unprocessed (REFUSED_STREAM, past a GOAWAY, never sent); not retries: no attempt or retry budget spent.",
        "happypath_upstream_h2_goaways_total": "GOAWAY frames the upstream sent the proxy's own HTTP/2 client.",
        "happypath_tunnels_total": "Tunnels closed, by upstream and reason.",
        "happypath_tunnel_bytes_total": "Bytes tunnels carried, by upstream and direction.",
        "happypath_tunnel_duration_seconds": "How long tunnels lasted, by upstream.",
        "happypath_deliveries_total": "Deliver-later requests by upstream and outcome (accepted, duplicate, refused, delivered, dead, ...).",
        "happypath_deliveries_queued": "Deliveries not yet delivered or dead (queued and in flight), by upstream.",
        "happypath_delivery_oldest_queued_seconds": "Age of the oldest delivery not yet delivered or dead, by upstream.",
        "happypath_delivery_store_write_seconds": "Time from a request handed to the delivery store to its durable commit.",
        "happypath_delivery_store_bytes": "Bytes the delivery store holds that count against storage.max_bytes.",
        "happypath_delivery_store_max_bytes": "storage.max_bytes: bytes the delivery store holds at most.",
        "happypath_cluster_fallback":
            "1 while this replica decides its scope: cluster rate limits without Redis (its local share), 0 while they are shared.",
        "happypath_cluster_replicas": "Replicas alive as the last cluster heartbeat counted them.",
        "happypath_cluster_redis_rtt_seconds": "Round trip of a scope: cluster rate-limit decision through Redis.",
        "happypath_cluster_redis_errors_total":
            "Errors talking to Redis by kind: timeout, connection (once an outage), reply_error, bad_reply.",
        "happypath_hedges_total": "Hedged tries by route and outcome (won, lost, skipped).",
        "happypath_fallback_total": "Answers a route's fallback gave instead of an error, by route, kind and reason.",
        "happypath_coalesced_requests_total":
            "Requests answered from another request's upstream try (followers of a coalesced group), by route.",
        "happypath_coalesce_group_size":
            "Requests that shared one upstream try (its leader and followers), by route; observed as each group ends.",
        "happypath_coalesce_alone_total":
            "Requests on a coalescing route that sent their own try instead of sharing one, by route and reason (ineligible, full, no_store, set_cookie, unshareable, large).",
        "happypath_coalesce_handovers_total":
            "Groups whose leader ended before its answer (its deadline, a shed, its client left) and whose next follower led a new try, by route.",
        "happypath_coalesce_cut_total":
            "Members of a coalesced group cut off mid-answer because they read more than limits.connection_buffer behind the fastest member, after their own read-ahead.",
        "happypath_http2_connections": "HTTP/2 client connections open now.",
        "happypath_http2_connections_total":
            "HTTP/2 client connections opened, by whether they came over TLS (ALPN h2) or not (h2c).",
        "happypath_http2_streams_open": "HTTP/2 streams (requests) open now.",
        "happypath_http2_streams_total": "HTTP/2 streams (requests) opened.",
        "happypath_http2_resets_total": "HTTP/2 streams reset, by side (client or proxy) and error code.",
        "happypath_http2_goaways_total":
            "HTTP/2 GOAWAY frames, by side: sent, by why the connection ended; received, by the client's error code.",
    ]
}

/// swift-metrics' factory for the proxy's registry, like
/// `PrometheusMetricsFactory` but giving each series its `# HELP` text
/// (`MetricHelp`). Histogram buckets per name, as there.
/// The families the status page reads per route are made readable by
/// `routes` (`RouteSeriesBook`).
struct HelpfulMetricsFactory: CoreMetrics.MetricsFactory {
    let registry: PrometheusCollectorRegistry
    let routes: RouteSeriesBook
    var defaultDurationHistogramBuckets: [Duration] = []
    var durationHistogramBuckets: [String: [Duration]] = [:]
    var defaultValueHistogramBuckets: [Double] = [0.01, 0.1, 1, 10, 100]
    var valueHistogramBuckets: [String: [Double]] = [:]

    private func descriptor(_ label: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: label, unitName: "", helpText: MetricHelp.text[label] ?? "")
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CoreMetrics.CounterHandler {
        routes.counter(registry.makeCounter(descriptor: descriptor(label), labels: dimensions), family: label, labels: dimensions)
    }

    func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any CoreMetrics.FloatingPointCounterHandler {
        registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any CoreMetrics.RecorderHandler {
        guard aggregate else { return registry.makeGauge(descriptor: descriptor(label), labels: dimensions) }
        return registry.makeValueHistogram(
            descriptor: descriptor(label), labels: dimensions, buckets: valueHistogramBuckets[label] ?? defaultValueHistogramBuckets)
    }

    func makeMeter(label: String, dimensions: [(String, String)]) -> any CoreMetrics.MeterHandler {
        registry.makeGauge(descriptor: descriptor(label), labels: dimensions)
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any CoreMetrics.TimerHandler {
        let buckets = durationHistogramBuckets[label] ?? defaultDurationHistogramBuckets
        return routes.timer(
            registry.makeDurationHistogram(descriptor: descriptor(label), labels: dimensions, buckets: buckets),
            family: label, labels: dimensions, buckets: buckets)
    }

    func destroyCounter(_ handler: any CoreMetrics.CounterHandler) {
        if let counter = handler as? Prometheus.Counter { registry.unregisterCounter(counter) }
        if let counter = handler as? ReadableCounter { registry.unregisterCounter(counter.exported) }
    }

    func destroyFloatingPointCounter(_ handler: any CoreMetrics.FloatingPointCounterHandler) {
        if let counter = handler as? Prometheus.Counter { registry.unregisterCounter(counter) }
    }

    func destroyRecorder(_ handler: any CoreMetrics.RecorderHandler) {
        if let gauge = handler as? Prometheus.Gauge { registry.unregisterGauge(gauge) }
        if let histogram = handler as? ValueHistogram { registry.unregisterValueHistogram(histogram) }
    }

    func destroyMeter(_ handler: any CoreMetrics.MeterHandler) {
        if let gauge = handler as? Prometheus.Gauge { registry.unregisterGauge(gauge) }
    }

    func destroyTimer(_ handler: any CoreMetrics.TimerHandler) {
        if let histogram = handler as? DurationHistogram { registry.unregisterDurationHistogram(histogram) }
        if let timer = handler as? ReadableTimer { registry.unregisterDurationHistogram(timer.exported) }
    }
}
