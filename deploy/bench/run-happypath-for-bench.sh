#!/usr/bin/env bash
# Started (and pinned) by deploy/bench/peers.sh: happypath with one worker and
# every feature at its default (retries, circuit breaker, health checks,
# reachability parking, admin listener) in front of the benchmark's upstream.
# BENCH_UPSTREAM = host:port of the upstream, BENCH_LISTEN = host:port to
# listen on (the admin listener takes port + 100), HAPPYPATH_BIN = the binary,
# BENCH_OUT = where the generated config goes (default /tmp), BENCH_WRAPPER =
# a command to run it under (valgrind ..., unquoted words).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
upstream=${BENCH_UPSTREAM:-${PEERS_UPSTREAM:?BENCH_UPSTREAM (host:port of the upstream) is not set}}
listen=${BENCH_LISTEN:-${PEERS_LISTEN:?BENCH_LISTEN (host:port to listen on) is not set}}
admin_port=$(( ${listen##*:} + 100 ))
cfg=${BENCH_OUT:-/tmp}/happypath-${listen##*:}.yaml
cat > "$cfg" <<YAML
listen: ${listen}
workers: ${BENCH_WORKERS:-1}
admin: { listen: 127.0.0.1:${admin_port} }
upstreams:
  bench:
    endpoints: [http://${upstream}]
    max_connections: 1024
routes:
  - match: { path_prefix: / }
    upstream: bench
YAML
# shellcheck disable=SC2086
exec ${BENCH_WRAPPER:-} "${HAPPYPATH_BIN:-$here/../../.build/release/happypath}" serve --config "$cfg" --log-level warning
