#!/usr/bin/env bash
# Started by ../shared/bench/peers.sh (pinned by it): happypath with one worker
# in front of the benchmark's upstream. peers.sh sets PEERS_UPSTREAM and
# PEERS_LISTEN; `make bench` sets HAPPYPATH_BIN.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cfg=$(mktemp /tmp/happypath-bench.XXXXXX.yaml)
admin_port=$(( ${PEERS_LISTEN##*:} + 100 ))
cat > "$cfg" <<YAML
listen: ${PEERS_LISTEN}
workers: ${BENCH_WORKERS:-1}
admin: { listen: 127.0.0.1:${admin_port} }
upstreams:
  bench:
    endpoints: [http://${PEERS_UPSTREAM}]
    max_connections: 1024
routes:
  - match: { path_prefix: / }
    upstream: bench
YAML
exec "${HAPPYPATH_BIN:-$here/../../.build/release/happypath}" serve --config "$cfg" --log-level warning
