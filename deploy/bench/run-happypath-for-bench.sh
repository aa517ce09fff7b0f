#!/usr/bin/env bash
# Started (and pinned) by the scripts in deploy/bench/: happypath in front of
# the benchmark's upstream, in one of two profiles:
#
#   BENCH_PROFILE=foundation (default): one route, no policies (1 attempt,
#     breaker thresholds out of reach, no parking, health checks hourly),
#     log level `warning` (no access log).
#   BENCH_PROFILE=shaping: foundation plus a rate limit on the route (per
#     client address, never reached: its cost, not its refusals) and pacing
#     on the upstream (never paused), to count what shaping costs a request.
#   BENCH_PROFILE=hedge: foundation plus `hedge: { after: 1s }` on the route
#     (armed on every try, never due): what hedging costs a request that
#     is not hedged.
#   BENCH_PROFILE=stale: foundation plus `fallback: { serve_stale: 10m }`
#     on the route: every answer is copied once and kept (what keeping costs).
#   BENCH_PROFILE=upgrades: foundation plus `upgrades: [websocket]` on the
#     route: what a plain request pays on a route that also takes WebSocket.
#   BENCH_PROFILE=adaptive: foundation plus `adaptive_concurrency` on the
#     upstream and `priority: critical` on the route: every try a latency sample.
#   BENCH_PROFILE=tracing0 / tracing1: foundation plus `tracing` toward a
#     collector that is not there, sample_ratio 0 / 1.
#   BENCH_PROFILE=h2up: foundation with `protocol: h2` on the upstream (an
#     h2c nginx: callgrind.sh UPSTREAM_H2=1): the proxy's own HTTP/2 client.
#   BENCH_PROFILE=grpc: foundation with `protocol: h2` on the upstream (h2c
#     to an http:// endpoint; with BENCH_UPSTREAM_CA, https:// trusting that
#     CA for `localhost`; the calls multiplexed by the proxy's own HTTP/2
#     client) and `grpc: {}` on the route: gRPC calls passed through;
#     BENCH_H2_CLIENT=libcurl carries protocol: h2 on libcurl instead of the proxy's own HTTP/2 client.
#   BENCH_PROFILE=cluster / cluster1: the shaping profile's rate limit with
#     `scope: cluster`, counted in the Redis at BENCH_REDIS (host:port),
#     50,000/s, above what one worker serves: tokens leased `auto` (500 at a time, for 10 ms), or
#     one at a time (`cluster1`: a Redis round trip on every request).
#   BENCH_PROFILE=process: the same limit with `scope: process`, beside them.
#   BENCH_PROFILE=cors: foundation plus `cors` on the route (its requests
#     carry no Origin: the cost of a route that has it, per request).
#   BENCH_PROFILE=policies: config/happypath.yaml as shipped (retry, budget,
#     breaker, health checks, ejection, concurrency limit, metrics) with only
#     the addresses changed, log level `info`: one JSON access-log line per
#     request, written to stderr (which the caller sends to a file).
#
# BENCH_UPSTREAM = host:port of the upstream, BENCH_LISTEN = host:port to
# listen on (the admin listener takes port + 100), BENCH_TLS_CERT and
# BENCH_TLS_KEY (foundation only): that listener speaks TLS with this pair,
# BENCH_WORKERS (default 1),
# HAPPYPATH_BIN = the binary, BENCH_OUT = where the generated config goes
# (default /tmp), BENCH_WRAPPER = a command to run it under (valgrind ...,
# unquoted words).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../loadtest/lib.sh"
need_binary release
upstream=${BENCH_UPSTREAM:?BENCH_UPSTREAM (host:port of the upstream) is not set}
listen=${BENCH_LISTEN:?BENCH_LISTEN (host:port to listen on) is not set}
workers=${BENCH_WORKERS:-1}
admin_port=$(( ${listen##*:} + 100 ))
profile=${BENCH_PROFILE:-foundation}
cfg=${BENCH_OUT:-/tmp}/happypath-$profile-${listen##*:}.yaml
scheme=http; [ -n "${BENCH_UPSTREAM_CA:-}" ] && scheme=https
# The foundation profile's file; $1 and $2 are lines added to its upstream and its route.
foundation_yaml() {
  if [ -n "${BENCH_TLS_CERT:-}" ]; then
    printf 'listen:\n  - address: %s\n    tls: { certificates: [ { cert: %s, key: %s } ] }\n' \
      "$listen" "$BENCH_TLS_CERT" "${BENCH_TLS_KEY:?BENCH_TLS_KEY goes with BENCH_TLS_CERT}"
  else
    echo "listen: ${listen}"
  fi
  cat <<YAML
workers: ${workers}
admin: { listen: 127.0.0.1:${admin_port} }
defaults:
  retry: { attempts: 1 }
  circuit_breaker: { consecutive_failures: 1000000, minimum_requests: 1000000 }
  reachability: { park_for: 0s }
  health_check: { interval: 1h }
upstreams:
  bench:
    endpoints: [${scheme}://${upstream}]
    max_connections: 1024
$1
routes:
  - match: { path_prefix: / }
    upstream: bench
$2
YAML
}
case $profile in
  foundation)
    level=warning
    foundation_yaml "" "" > "$cfg"
    ;;
  shaping)
    level=warning
    foundation_yaml "    pacing: { on: [429, 503], max_pause: 60s, while_paused: wait }" \
      "    rate_limit: { rate: 1000000000/s, burst: 1000000000, key: client_ip, over_limit: reject }" > "$cfg"
    ;;
  process|cluster|cluster1)
    level=warning
    scope=process; [ "$profile" != process ] && scope=cluster
    foundation_yaml "" "    rate_limit: { rate: 50000/s, burst: 1000000, key: client_ip, over_limit: reject, scope: ${scope} }" > "$cfg"
    if [ "$scope" = cluster ]; then
      lease=auto; [ "$profile" = cluster1 ] && lease=1
      echo "cluster: { redis: { url: 'redis://${BENCH_REDIS:?BENCH_REDIS (host:port of a redis-server) is not set}/0', lease: ${lease} } }" >> "$cfg"
    fi
    ;;
  cors)
    level=warning
    foundation_yaml "" "    cors: { allow_origins: [https://app.example.com] }" > "$cfg"
    ;;
  hedge)
    level=warning
    foundation_yaml "" "    hedge: { after: 1s }" > "$cfg"
    ;;
  stale)
    level=warning
    foundation_yaml "" "    fallback: { serve_stale: 10m }" > "$cfg"
    ;;
  coalesce)
    # One connection: each request leads a group of its own (its key, a
    # table entry, the group closed at its head): what a coalescing route
    # costs a request that shares with nobody.
    level=warning
    foundation_yaml "" "    coalesce: true" > "$cfg"
    ;;
  upgrades)
    level=warning
    foundation_yaml "" "    upgrades: [websocket]" > "$cfg"
    ;;
  adaptive)
    # An adaptive concurrency limit (its ceiling above what the load uses)
    # and a priority on the route: every try is a latency sample.
    level=warning
    foundation_yaml "    adaptive_concurrency: { min_limit: 1, max_limit: 1024, initial_limit: 64 }" \
      "    priority: critical" > "$cfg"
    ;;
  h2up)
    # The proxy's own HTTP/2 client towards an h2c upstream (callgrind.sh UPSTREAM_H2=1).
    level=warning
    foundation_yaml "    protocol: h2" "" > "$cfg"
    ;;
  grpc)
    level=warning
    upstream_lines="    protocol: h2"
    # BENCH_H2_CLIENT=libcurl: protocol: h2 on libcurl (the default is the proxy's own HTTP/2 client).
    [ -n "${BENCH_H2_CLIENT:-}" ] && upstream_lines+=$'\n'"    h2_client: ${BENCH_H2_CLIENT}"
    [ -n "${BENCH_UPSTREAM_CA:-}" ] && upstream_lines+=$'\n'"    tls: { ca: ${BENCH_UPSTREAM_CA}, server_name: localhost }"
    foundation_yaml "$upstream_lines" "    grpc: {}" > "$cfg"
    ;;
  tracing0|tracing1)
    # Tracing to a collector that is not there (the exports fail, counted):
    # sample_ratio 0 (no request traced: the sampling decision alone) or 1
    # (every request: its spans built, queued, encoded, the export tried).
    level=warning
    foundation_yaml "" "" > "$cfg"
    echo "tracing: { otlp_endpoint: 'http://127.0.0.1:9/v1/traces', sample_ratio: ${profile#tracing} }" >> "$cfg"
    ;;
  policies)
    level=info
    example=$here/../../config/happypath.yaml
    # Only addresses and the worker count change; every policy stays as shipped.
    sed -e "s|^listen: .*|listen: ${listen}|" \
        -e "s|^workers: .*|workers: ${workers}|" \
        -e "s|^  listen: 127.0.0.1:9901 |  listen: 127.0.0.1:${admin_port} |" \
        -e "s|endpoints: \[http://127.0.0.1:9000\]|endpoints: [http://${upstream}]|" \
        "$example" > "$cfg"
    grep -q "http://${upstream}" "$cfg" || { echo "config/happypath.yaml changed shape: could not point it at ${upstream}" >&2; exit 2; }
    ;;
  *) echo "BENCH_PROFILE must be foundation, shaping, process, cluster, cluster1, cors, hedge, stale, upgrades, adaptive, h2up, grpc, tracing0, tracing1 or policies, not $profile" >&2; exit 2 ;;
esac
"$BIN" check --config "$cfg" >/dev/null
# shellcheck disable=SC2086
exec ${BENCH_WRAPPER:-} "$BIN" serve --config "$cfg" --log-level "$level"
