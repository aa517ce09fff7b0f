#!/usr/bin/env bash
# Load-test scenario `overload` (deploy/loadtest/run.sh overload [--short],
# make loadtest SCENARIO=overload, make bench-overload): what a 12x spike of
# sheddable traffic does to critical traffic, with no limit, with a fixed
# max_connections, and with adaptive concurrency and priorities (issue 35).
#
# The upstream (capacity-upstream.py) serves SLOTS=4 requests at a time,
# SERVICE_MS=25 each: capacity 160 requests a second; past it requests queue
# inside it and wait. The load (overload-load.py, open: requests start on a
# schedule whatever the answers do): GET /login (route priority critical) at
# CRITICAL_RATE=25/s throughout; GET /reports/N (priority sheddable) at
# SPIKE=12 times that (300/s) during the middle phase. Phases
# PHASES=10,20,10 s (before, spike, after; --short: 2,4,2). The proxy and the
# upstream are started afresh for each configuration, one after the other:
#   nolimit   max_connections: 4096
#   fixed     max_connections: $FIXED (6)
#   adaptive  max_connections: 4096, adaptive_concurrency: $ADAPTIVE, and the
#             routes' priorities
# Proxy timeout 5 s, the client's 6 s (a request past it has failed); with
# --short, answers still due 1 s after the last phase count as failed.
# Printed and written to $OUT/overload (default /tmp/happypath-loadtest/overload):
# a table per configuration (overload.md, overload-summary.csv), per-request
# and per-sample CSVs, and a chart of limit, in flight and latency over time
# (overload.png, matplotlib from Debian's python3-matplotlib). The adaptive
# row's targets are printed PASS/FAIL; exit 1 on a FAIL only with
# CHECK_TARGETS=1 (make bench-overload sets it). --short (make loadtest-short)
# checks only that every configuration ran and produced numbers: its phases
# are too short, and CI machines too noisy, to hold the targets to.
# How to read it: docs/performance.md, "The overload scenario".
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHORT=0; [ "${1:-}" = "--short" ] && SHORT=1
. "$HERE/lib.sh"
need python3; need curl
need_binary debug
OUT=${OUT:-/tmp/happypath-loadtest}/overload; mkdir -p "$OUT"
PHASES=${PHASES:-10,20,10}; [ $SHORT = 1 ] && PHASES=${SHORT_PHASES:-2,4,2}
SLOTS=${SLOTS:-4}
SERVICE_MS=${SERVICE_MS:-25}
CRITICAL_RATE=${CRITICAL_RATE:-25}
SPIKE=${SPIKE:-12}
FIXED=${FIXED:-6}
ADAPTIVE=${ADAPTIVE:-"{ min_limit: 2, max_limit: 200 }"}
CONFIGS=${CONFIGS:-nolimit fixed adaptive}
WORKERS=${WORKERS:-auto}
CHECK_TARGETS=${CHECK_TARGETS:-0}
# The chart needs matplotlib: Debian's package installs it for /usr/bin/python3,
# which may not be the python3 first on PATH (pyenv).
CHART_PYTHON=${CHART_PYTHON:-$(for p in /usr/bin/python3 python3; do "$p" -c 'import matplotlib' 2>/dev/null && { echo "$p"; break; }; done)}

run_config() {
  local name=$1 upstream_keys routes
  read -r UP PX ADMIN <<<"$(free_ports 3)"
  case "$name" in
    nolimit)  upstream_keys="max_connections: 4096" ;;
    fixed)    upstream_keys="max_connections: $FIXED" ;;
    adaptive) upstream_keys="max_connections: 4096
    adaptive_concurrency: $ADAPTIVE" ;;
    *) echo "unknown configuration $name (nolimit, fixed, adaptive)"; exit 2 ;;
  esac
  if [ "$name" = adaptive ]; then
    routes="  - { match: { path_prefix: /login }, upstream: api, priority: critical }
  - { match: { path_prefix: /reports/ }, upstream: api, priority: sheddable }"
  else
    routes="  - { match: { path_prefix: /login }, upstream: api }
  - { match: { path_prefix: /reports/ }, upstream: api }"
  fi
  cat > "$OUT/$name.yaml" <<YAML
listen: 127.0.0.1:$PX
admin: { listen: 127.0.0.1:$ADMIN }
workers: $WORKERS
drain_timeout: 1s
defaults: { timeout: 5s }
upstreams:
  api:
    endpoints: [http://127.0.0.1:$UP]
    $upstream_keys
routes:
$routes
YAML
  if ! "$BIN" check --config "$OUT/$name.yaml" >"$OUT/$name.check.txt" 2>&1; then
    echo "== $name: the proxy refuses its configuration ($OUT/$name.yaml):"; sed 's/^/   /' "$OUT/$name.check.txt"
    return 1
  fi
  start_bg python3 "$HERE/capacity-upstream.py" "$UP" "$SLOTS" "$SERVICE_MS" >"$OUT/$name.upstream.log" 2>&1; local upstream=$!
  wait_http $upstream "the capacity upstream" "http://127.0.0.1:$UP/healthz" "$OUT/$name.upstream.log"
  start_bg "$BIN" serve --config "$OUT/$name.yaml" --log-level warning >"$OUT/$name.proxy.log" 2>&1; local proxy=$!
  wait_http $proxy "the proxy" "http://127.0.0.1:$ADMIN/readyz" "$OUT/$name.proxy.log"
  echo "== $name: phases $PHASES s, critical $CRITICAL_RATE/s, sheddable ${SPIKE}x during the spike"
  python3 "$HERE/overload-load.py" --name "$name" --proxy 127.0.0.1:$PX --admin 127.0.0.1:$ADMIN \
    --upstream 127.0.0.1:$UP --out "$OUT" --phases "$PHASES" --critical-rate "$CRITICAL_RATE" --spike "$SPIKE" \
    $([ $SHORT = 1 ] && echo "--drain 1")
  stop $proxy; stop $upstream
}

ran=(); refused=()
for name in $CONFIGS; do
  rm -f "$OUT/$name".{requests,samples}.csv "$OUT/$name.run.json"
  if run_config "$name"; then ran+=("$name"); else refused+=("$name"); fi
done
[ ${#ran[@]} -gt 0 ] || { echo "loadtest overload: FAILED: no configuration ran"; exit 1; }
report_args=(--out "$OUT" --configs "${ran[@]}")
[ -n "$CHART_PYTHON" ] || echo "   no matplotlib (apt-get install -y python3-matplotlib): no chart"
[ "$CHECK_TARGETS" = 1 ] && report_args+=(--check)
[ $SHORT = 1 ] && report_args+=(--short)
"${CHART_PYTHON:-python3}" "$HERE/overload-report.py" "${report_args[@]}" $([ -z "$CHART_PYTHON" ] && echo --no-chart)
# The others' numbers are worth reading even so (the table above), but the run is not whole.
[ ${#refused[@]} -eq 0 ] || { echo "loadtest overload: FAILED: refused: ${refused[*]}"; exit 1; }
