#!/usr/bin/env python3
"""Writes deploy/grafana/happypath.json, the Grafana dashboard (import it, or
let the compose profile `observability` provision it). Edit the panels here,
then run it from the repository's root:

  python3 deploy/grafana/dashboard.py

Variables: `datasource` (a Prometheus data source), `job` (the scrape job),
`upstream` and `route` (several or all). MetricsExpositionTests checks every
selector of every query against the /metrics of a proxy that has seen every
kind of traffic: a metric or label the proxy does not export fails it.
"""
import json

DS = {"type": "prometheus", "uid": "${datasource}"}
J = 'job=~"$job"'
U = f'{J}, upstream=~"$upstream"'
R = f'{J}, route=~"$route"'
RI = "$__rate_interval"
FAILED = 'code=~"UPSTREAM_.*|BAD_GATEWAY|CIRCUIT_OPEN|OVERLOADED|STORE_UNAVAILABLE|TRUNCATED"'

panels = []
y = 0


def row(title):
    global y
    panels.append({"type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                   "id": len(panels) + 1, "panels": []})
    y += 1


def panel(title, description, targets, unit="short", kind="timeseries", x=0, w=8, h=8, extra=None):
    p = {
        "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": x, "y": y}, "id": len(panels) + 1,
        "targets": [{"datasource": DS, "expr": e, "legendFormat": l, "refId": chr(65 + i)} for i, (e, l) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }
    if extra:
        p["fieldConfig"]["defaults"].update(extra)
    panels.append(p)


def line(*specs):
    """Panels side by side on one line of the grid, each 24/len wide."""
    global y
    w = 24 // len(specs)
    for i, spec in enumerate(specs):
        options = dict(spec[3]) if len(spec) > 3 else {}
        panel(*spec[:3], **options, x=i * w, w=w)
    y += 8


def quantiles(metric, by, selector, qs=(0.5, 0.95, 0.99)):
    return [(f"histogram_quantile({q}, sum by ({by}le) (rate({metric}_bucket{{{selector}}}[{RI}])))",
             f"p{int(q * 100)}" + (" {{route}}" if "route" in by else "")) for q in qs]


row("Requests")
line(
    ("Requests per second by code",
     "Client requests answered, by the code they got: OK is the upstream's own 2xx/3xx, the rest are error codes (docs/errors.md).",
     [(f"sum by (code) (rate(happypath_requests_total{{{R}}}[{RI}]))", "{{code}}")], {"unit": "reqps"}),
    ("Error ratio by route",
     "Share of answers that were failures of the upstream or of the proxy (timeouts, unreachable, 5xx, circuit open, "
     "overloaded, truncated); not clients' own errors. The HappypathErrorRatioHigh alert fires above 5 % for 10 minutes.",
     [(f"sum by (route) (rate(happypath_requests_total{{{R}, {FAILED}}}[{RI}])) / "
       f"sum by (route) (rate(happypath_requests_total{{{R}}}[{RI}]))", "{{route}}")], {"unit": "percentunit"}),
    ("Latency by route (p50, p95, p99)",
     "From a request's arrival to its answer, all tries, waits and parking included.",
     quantiles("happypath_request_duration_seconds", "route, ", R), {"unit": "s"}),
)

row("gRPC")
line(
    ("gRPC calls per second by status",
     "gRPC calls answered, by the grpc-status their client read (0 OK, 4 DEADLINE_EXCEEDED, 14 UNAVAILABLE, ...; "
     "unknown: cut off). The proxy's own answers and the upstream's are both counted (docs/grpc.md).",
     [(f"sum by (grpc_status) (rate(happypath_grpc_requests_total{{{R}}}[{RI}]))", "{{grpc_status}}")], {"unit": "reqps"}),
    ("gRPC calls not OK by route",
     "Share of gRPC calls that ended with any status but OK, clients' own errors (NOT_FOUND, INVALID_ARGUMENT) included.",
     [(f"sum by (route) (rate(happypath_grpc_requests_total{{{R}, grpc_status!=\"0\"}}[{RI}])) / "
       f"sum by (route) (rate(happypath_grpc_requests_total{{{R}}}[{RI}]))", "{{route}}")], {"unit": "percentunit"}),
    ("UNAVAILABLE and DEADLINE_EXCEEDED by route",
     "The two statuses that mean the service could not answer in time or at all: the ones gRPC clients retry or give up on.",
     [(f"sum by (route, grpc_status) (rate(happypath_grpc_requests_total{{{R}, grpc_status=~\"14|4\"}}[{RI}]))",
       "{{route}} {{grpc_status}}")], {"unit": "reqps"}),
)

row("Upstreams: tries, retries, breakers, parking, credentials")
line(
    ("Tries per request",
     "Tries sent upstream per client request (1: no retry was needed).",
     [(f"sum by (upstream) (rate(happypath_upstream_tries_total{{{U}}}[{RI}])) / "
       f"(sum by (upstream) (rate(happypath_upstream_tries_total{{{U}}}[{RI}])) - "
       f"sum by (upstream) (rate(happypath_retries_total{{{U}}}[{RI}])))", "{{upstream}}")]),
    ("Tries by outcome",
     "Every try sent upstream: success, server_error, client_error, timeout, unreachable, reset.",
     [(f"sum by (upstream, outcome) (rate(happypath_upstream_tries_total{{{U}}}[{RI}]))", "{{upstream}} {{outcome}}")],
     {"unit": "reqps"}),
    ("Retry budget: retries made and refused",
     "Retries per second, and retries or hedges the retry budget refused (then the client got the error).",
     [(f"sum by (upstream) (rate(happypath_retries_total{{{U}}}[{RI}]))", "{{upstream}} retries"),
      (f"sum by (upstream) (rate(happypath_retry_budget_exhausted_total{{{U}}}[{RI}]))", "{{upstream}} refused")],
     {"unit": "reqps"}),
)
line(
    ("Circuit breaker state",
     "Per upstream: 0 closed, 1 half-open, 2 open.",
     [(f"max by (upstream) (happypath_circuit_state{{{U}}})", "{{upstream}}")],
     {"extra": {"min": 0, "max": 2, "mappings": [{"type": "value", "options": {
         "0": {"text": "closed", "color": "green"}, "1": {"text": "half-open", "color": "yellow"},
         "2": {"text": "open", "color": "red"}}}]}}),
    ("Parked requests",
     "Requests waiting for their upstream (unreachable, circuit_open, auth, paused), and limits.max_parked.",
     [(f"sum by (upstream, reason) (happypath_parked_commands{{{U}}})", "{{upstream}} {{reason}}"),
      (f"max(happypath_parked_commands_limit{{{J}}})", "limit")]),
    ("Token refreshes",
     "Credential refreshes per upstream, by result; failures mean requests soon fail with AUTH_FAILED.",
     [(f"sum by (upstream, result) (increase(happypath_token_refreshes_total{{{U}}}[{RI}]))", "{{upstream}} {{result}}")]),
)

row("Overload: concurrency limits and shedding")
line(
    ("Limit, in flight and queued",
     "Tries each upstream may have in flight (max_connections, or the adaptive limit), tries in flight, requests waiting for a slot, and answers streaming apart from an adaptive limit (max_streams).",
     [(f"sum by (upstream) (happypath_upstream_concurrency_limit{{{U}}})", "{{upstream}} limit"),
      (f"sum by (upstream) (happypath_upstream_in_flight{{{U}}})", "{{upstream}} in flight"),
      (f"sum by (upstream) (happypath_upstream_queued{{{U}}})", "{{upstream}} queued"),
      (f"sum by (upstream) (happypath_upstream_streaming{{{U}}})", "{{upstream}} streaming")]),
    ("Shed by priority",
     "Requests answered OVERLOADED by an upstream's limit (queue full, displaced, or shed from a queue that stood), by priority. Critical ones should be none.",
     [(f"sum by (upstream, priority) (rate(happypath_upstream_shed_total{{{U}}}[{RI}]))", "{{upstream}} {{priority}}")],
     {"unit": "reqps"}),
    ("Adaptive latency: baseline and recent",
     "An adaptive upstream's latency baseline (the least recent latency of its last window) and its recent latency, of the kind of request (route and path) a worker last measured. The limit follows each try's latency against its own kind's baseline, and shrinks when their average passes the tolerance.",
     [(f"max by (upstream) (happypath_upstream_latency_baseline_seconds{{{U}}})", "{{upstream}} baseline"),
      (f"max by (upstream) (happypath_upstream_latency_recent_seconds{{{U}}})", "{{upstream}} recent")],
     {"unit": "s"}),
)

row("Shaping, hedging and fallback")
line(
    ("Rate-limited requests",
     "Requests a route's rate_limit held back: queued (waited for a token) or rejected (429).",
     [(f"sum by (route, outcome) (rate(happypath_rate_limited_total{{{R}}}[{RI}]))", "{{route}} {{outcome}}")],
     {"unit": "reqps"}),
    ("Paused upstreams",
     "Seconds left in a pause an upstream asked for (pacing: 429/503 with Retry-After); its requests wait parked.",
     [(f"max by (upstream) (happypath_upstream_paused_seconds{{{U}}})", "{{upstream}}")], {"unit": "s"}),
    ("Fallbacks and hedges",
     "Answers a route's fallback gave instead of an error (stale or fixed, by reason), and hedged tries by outcome.",
     [(f"sum by (route, kind, reason) (rate(happypath_fallback_total{{{R}}}[{RI}]))", "fallback {{route}} {{kind}} {{reason}}"),
      (f"sum by (route, outcome) (rate(happypath_hedges_total{{{R}}}[{RI}]))", "hedge {{route}} {{outcome}}")],
     {"unit": "reqps"}),
)
line(
    ("Coalesced requests",
     "Requests answered from another request's upstream try (coalesce: true), beside the requests on coalescing routes "
     "that went on their own try, by reason (docs/coalescing.md).",
     [(f"sum by (route) (rate(happypath_coalesced_requests_total{{{R}}}[{RI}]))", "{{route}} followers"),
      (f"sum by (route, reason) (rate(happypath_coalesce_alone_total{{{R}}}[{RI}]))", "{{route}} alone: {{reason}}")],
     {"unit": "reqps"}),
    ("Coalesced group sizes",
     "Requests one upstream try served (its leader and followers): the median and the 99th percentile of the groups "
     "that ended, by route.",
     [(f"histogram_quantile(0.5, sum by (route, le) (rate(happypath_coalesce_group_size_bucket{{{R}}}[{RI}])))",
       "{{route}} p50"),
      (f"histogram_quantile(0.99, sum by (route, le) (rate(happypath_coalesce_group_size_bucket{{{R}}}[{RI}])))",
       "{{route}} p99")]),
    ("Coalescing handovers and cuts",
     "Groups whose leader ended for reasons of its own (its deadline, its client left) and whose next follower led a "
     "new try; members cut for reading too far behind the fastest.",
     [(f"sum by (route) (rate(happypath_coalesce_handovers_total{{{R}}}[{RI}]))", "{{route}} handovers"),
      (f"sum by (route) (rate(happypath_coalesce_cut_total{{{R}}}[{RI}]))", "{{route}} cut")]),
)

row("Cluster (Redis)")
line(
    ("Fallback: deciding without Redis",
     "Per instance: 0 while its scope: cluster rate limits count in Redis (cluster.redis), 1 while it decides alone "
     "with its local share (Redis cannot be reached, or it is still connecting after a start). "
     "The HappypathClusterDegraded alert fires after 5 minutes at 1.",
     [(f"max by (instance) (happypath_cluster_fallback{{{J}}})", "{{instance}}")],
     {"extra": {"min": 0, "max": 1, "mappings": [{"type": "value", "options": {
         "0": {"text": "shared", "color": "green"}, "1": {"text": "alone", "color": "red"}}}]}}),
    ("Replicas seen",
     "Live replicas each instance's last heartbeat counted in Redis, beside the instances Prometheus scrapes: the two "
     "agree within three heartbeats of a replica starting or stopping. While Redis cannot be reached, a replica admits "
     "its scope: cluster limits divided by this count (1, the whole limit, if it never reached Redis since it started).",
     [(f"max by (instance) (happypath_cluster_replicas{{{J}}})", "{{instance}}"),
      (f"count(happypath_cluster_replicas{{{J}}})", "instances scraped")]),
)
line(
    ("Redis round trip (p50, p99)",
     "From a scope: cluster rate-limit decision sent to Redis to its answer; one that took longer than "
     "cluster.redis.timeout (50ms by default) counts at the timeout, and its request was decided by the local share.",
     quantiles("happypath_cluster_redis_rtt_seconds", "", J, qs=(0.5, 0.99)), {"unit": "s"}),
    ("Redis errors per second by kind",
     "Commands to Redis that failed: timeout (no answer within cluster.redis.timeout), connection (the link failed "
     "with the command in flight), reply_error (Redis answered an error, such as OOM when it is full), "
     "bad_reply (an answer the proxy could not read). A rate-limit decision that failed was made by the local share.",
     [(f"sum by (instance, kind) (rate(happypath_cluster_redis_errors_total{{{J}}}[{RI}]))", "{{instance}} {{kind}}")]),
)

row("Deliver later")
line(
    ("Deliveries by outcome",
     "Deliver-later requests accepted, refused, delivered, retried and dead, per second.",
     [(f"sum by (upstream, outcome) (rate(happypath_deliveries_total{{{U}}}[{RI}]))", "{{upstream}} {{outcome}}")],
     {"unit": "reqps"}),
    ("Backlog: queued and in flight",
     "Deliveries not yet delivered or dead, per upstream.",
     [(f"sum by (upstream) (happypath_deliveries_queued{{{U}}})", "{{upstream}}")]),
    ("Oldest delivery waiting",
     "Age of the oldest delivery not yet delivered or dead; a steady rise means its upstream takes none.",
     [(f"max by (upstream) (happypath_delivery_oldest_queued_seconds{{{U}}})", "{{upstream}}")], {"unit": "s"}),
)
line(
    ("Store write latency (p50, p95, p99)",
     "From a request handed to the store to its durable commit (group commit; with sync: full, mostly the fsync).",
     quantiles("happypath_delivery_store_write_seconds", "", J), {"unit": "s"}),
    ("Store size against storage.max_bytes",
     "Bytes the store holds that count against storage.max_bytes; when full, later routes answer 503 OVERLOADED.",
     [(f"max(happypath_delivery_store_bytes{{{J}}})", "held"), (f"max(happypath_delivery_store_max_bytes{{{J}}})", "max_bytes")],
     {"unit": "bytes"}),
)

row("Process")
line(
    ("CPU", "CPU time used, in cores.",
     [(f"rate(process_cpu_seconds_total{{{J}}}[{RI}])", "{{instance}}")], {"unit": "none"}),
    ("Resident memory", "Resident memory of each process.",
     [(f"process_resident_memory_bytes{{{J}}}", "{{instance}}")], {"unit": "bytes"}),
    ("Descriptors and client connections", "Open file descriptors and their limit; client connections open.",
     [(f"process_open_fds{{{J}}}", "{{instance}} open"), (f"process_max_fds{{{J}}}", "{{instance}} limit"),
      (f"happypath_client_connections{{{J}}}", "{{instance}} client connections")]),
)


def variable(name, label, query, multi=True):
    return {
        "name": name, "label": label, "type": "query", "datasource": DS, "refresh": 2, "sort": 1,
        "query": {"query": query, "refId": name}, "definition": query,
        "multi": multi, "includeAll": multi, "allValue": ".*" if multi else None,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {},
    }


dashboard = {
    "title": "happypath", "uid": "happypath", "description": "The happypath proxy: traffic, upstreams, shaping, "
    "deliver later and the process (deploy/grafana/dashboard.py writes this file).",
    "tags": ["happypath"], "timezone": "browser", "schemaVersion": 39, "version": 1, "editable": True,
    "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "graphTooltip": 1,
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {},
         "refresh": 1, "hide": 0},
        variable("job", "Job", "label_values(happypath_requests_total, job)", multi=False),
        variable("upstream", "Upstream", 'label_values(happypath_upstream_tries_total{job=~"$job"}, upstream)'),
        variable("route", "Route", 'label_values(happypath_requests_total{job=~"$job"}, route)'),
    ]},
    "annotations": {"list": []},
    "panels": panels,
}
with open("deploy/grafana/happypath.json", "w") as f:
    json.dump(dashboard, f, indent=1)
    f.write("\n")
