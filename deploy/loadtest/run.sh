#!/usr/bin/env bash
# Load-test scenarios through happypath, one command each:
#
#   deploy/loadtest/run.sh steady|flaky|outage|token-storm|breaker [--short]
#   make loadtest SCENARIO=flaky
#
# Starts the demo upstream and the proxy on loopback (ports 19600-19602),
# drives them with wrk (report.lua), samples the proxy's /metrics while it
# runs (sample.py), prints a table and writes an SVG chart and JSON data to
# $OUT (default /tmp/happypath-loadtest). --short runs ~10 s and checks the
# scenario's promise (exit 1 if it is broken); `make test` runs them so.
# To test your own service: UPSTREAM=http://host:port PATH_UNDER_TEST=/api/x run.sh steady
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SCENARIO=${1:?usage: run.sh steady|flaky|outage|token-storm|breaker [--short]}
SHORT=0; [ "${2:-}" = "--short" ] && SHORT=1
BIN=${HAPPYPATH_BIN:-$HERE/../../.build/debug/happypath}
OUT=${OUT:-/tmp/happypath-loadtest}; mkdir -p "$OUT"
UP_PORT=19600; PX=19601; ADMIN=19602
DURATION=${DURATION:-30}; [ $SHORT = 1 ] && DURATION=${SHORT_DURATION:-10}
CONNS=${CONNS:-32}
UPSTREAM=${UPSTREAM:-}
for tool in wrk python3 curl; do command -v $tool >/dev/null || { echo "missing $tool: apt-get install -y wrk python3 curl"; exit 2; }; done
[ -x "$BIN" ] || { echo "no binary at $BIN (swift build, or set HAPPYPATH_BIN)"; exit 2; }

PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; }; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_http() { for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "no answer from $1"; exit 1; }
start_demo() { "$BIN" demo-upstream --listen 127.0.0.1:$UP_PORT >/dev/null 2>&1 & DEMO=$!; PIDS+=($DEMO); wait_http "http://127.0.0.1:$UP_PORT/healthz"; }

path=/ok
defaults="{ }"
auth=""
case "$SCENARIO" in
  steady) ;;
  flaky)   # a quarter of the upstream's answers are 503
    path="/flaky?fail=0.25&status=503"
    defaults="{ retry: { attempts: 12, honor_retry_after: false, backoff: { base: 5ms, max: 50ms }, budget: { ratio: 0.5, min_per_second: 10 } }, circuit_breaker: { consecutive_failures: 50 } }" ;;
  outage)  # the upstream process is gone for a while; requests park and replay
    defaults="{ timeout: 30s, reachability: { park_for: 25s }, health_check: { interval: 250ms, timeout: 200ms } }" ;;
  token-storm)  # tokens live 2 s: every request in flight at expiry waits for one refresh
    path="/private/ok"
    auth="auth: { kind: oauth2_client_credentials, token_url: 'http://127.0.0.1:$UP_PORT/_demo/token?ttl=2', client_id: load, client_secret: test, refresh_ahead: 0s }" ;;
  breaker) # the upstream answers 503 to everything for 3 s; the breaker opens, parks, probes, closes
    defaults="{ timeout: 20s, retry: { attempts: 4 }, circuit_breaker: { consecutive_failures: 5, open_for: 1s, while_open: park }, reachability: { park_for: 15s } }" ;;
  *) echo "unknown scenario $SCENARIO"; exit 2 ;;
esac
[ -n "${PATH_UNDER_TEST:-}" ] && path=$PATH_UNDER_TEST
endpoint=${UPSTREAM:-http://127.0.0.1:$UP_PORT}
cat > "$OUT/$SCENARIO.yaml" <<YAML
listen: 127.0.0.1:$PX
admin: { listen: 127.0.0.1:$ADMIN }
drain_timeout: 1s
limits: { max_parked: 20000 }
defaults: $defaults
upstreams:
  target:
    endpoints: [$endpoint]
    max_connections: 1024
    $auth
routes:
  - { match: { path_prefix: / }, upstream: target }
YAML
[ -z "$UPSTREAM" ] && start_demo
"$BIN" serve --config "$OUT/$SCENARIO.yaml" --log-level warning >"$OUT/$SCENARIO.proxy.log" 2>&1 & PIDS+=($!)
wait_http "http://127.0.0.1:$ADMIN/readyz"

echo "== $SCENARIO: wrk -c$CONNS for ${DURATION}s on $path"
wrk -t2 -c"$CONNS" -d"${DURATION}s" --timeout 30s -s "$HERE/report.lua" "http://127.0.0.1:$PX$path" > "$OUT/$SCENARIO.wrk.txt" 2>&1 & WRK=$!
python3 "$HERE/sample.py" "127.0.0.1:$ADMIN" "$OUT/$SCENARIO" "$DURATION" "$OUT/$SCENARIO.wrk.txt" > "$OUT/$SCENARIO.table.txt" & SAMPLER=$!
third=$(python3 -c "print($DURATION/3)")
case "$SCENARIO" in
  outage)
    sleep "$third"; kill "$DEMO"; wait "$DEMO" 2>/dev/null || true
    down=$([ $SHORT = 1 ] && echo 3 || echo 10); echo "   upstream down for ${down}s"; sleep "$down"; start_demo ;;
  breaker)
    sleep "$third"; curl -s "http://127.0.0.1:$UP_PORT/_demo/outage?ms=3000&status=503" >/dev/null; echo "   upstream failing for 3s" ;;
esac
wait $WRK || true
wait $SAMPLER || true
cat "$OUT/$SCENARIO.table.txt"

# The scenario's promise, checked in --short mode.
if [ $SHORT = 1 ]; then
  python3 - "$OUT/$SCENARIO.json" "$SCENARIO" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["result"]
scenario = sys.argv[2]
problems = []
if not r["requests"]: problems.append("no requests completed")
if r["client_errors"] != 0: problems.append(f'{r["client_errors"]} client-visible errors')
if scenario == "outage" and r["replayed"] == 0: problems.append("nothing was parked and replayed during the outage")
if scenario == "breaker" and not r["breaker_opened"]: problems.append("the breaker never opened")
if scenario == "token-storm" and r["token_refreshes"] < 2: problems.append("tokens were not refreshed during the run")
if problems:
    print(f"loadtest {scenario}: FAILED: " + "; ".join(problems)); sys.exit(1)
print(f"loadtest {scenario}: promise kept")
PY
fi
