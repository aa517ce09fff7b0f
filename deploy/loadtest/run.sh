#!/usr/bin/env bash
# Load-test scenarios through happypath, one command each:
#
#   deploy/loadtest/run.sh steady|flaky|outage|token-storm|breaker|throttled|tail|overload|coalesce [--short]
#   make loadtest SCENARIO=flaky
#
# Starts the demo upstream and the proxy on loopback (free ports: lib.sh),
# drives them with wrk (report.lua), samples the proxy's /metrics while it
# runs (sample.py), prints a table and writes an SVG chart and JSON data to
# $OUT (default /tmp/happypath-loadtest). --short runs ~10 s and checks the
# scenario's promise (exit 1 if it is broken); `make test` runs them so.
# throttled: the demo's /_demo/throttle?rps=$RPS (default 200) answers 200 to
# RPS requests a wall-clock second and 429 Retry-After: 1 to the rest; the
# upstream has pacing: { on: [429] }, so each 429 pauses it for a second and
# the requests wait parked. Promise: no client error, and in every second
# from the first 429 on the upstream receives at most RPS + SLACK (default
# CONNS: the requests already on their way when it said 429, one per client
# connection), by its own count (/_demo/throttle/stats, $OUT/throttled.upstream.json).
# Those re-sends wait for the pause and spend no retry budget (the pause
# bounds the load), so more connections (CONNS=128) give no client errors
# either; they count against retry.attempts (5 here).
# To test your own service: UPSTREAM=http://host:port PATH_UNDER_TEST=/api/x run.sh steady
# tail: two endpoints, 5 % of answers take 1 s; the same load without and
# with hedge: { after: 50ms }, then 5 requests/s on a slow upstream with
# hedging, upstream tries per client request checked against the retry
# budget's bound (deploy/loadtest/tail.sh says what it promises).
# overload: an upstream of fixed capacity, steady critical traffic and a 12x
# spike of sheddable traffic, through no limit, a fixed max_connections and
# adaptive concurrency with priorities (deploy/loadtest/overload.sh).
# coalesce: 2,000 clients on five paths meet an upstream back from a 10 s
# outage, without and with coalesce: true; with it the replay reaches the
# upstream as at most one request per path per worker
# (deploy/loadtest/coalesce.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SCENARIO=${1:?usage: run.sh steady|flaky|outage|token-storm|breaker|throttled|tail|overload|coalesce [--short]}
[ "$SCENARIO" = tail ] && exec "$HERE/tail.sh" "${@:2}"
[ "$SCENARIO" = overload ] && exec "$HERE/overload.sh" "${@:2}"
[ "$SCENARIO" = coalesce ] && exec "$HERE/coalesce.sh" "${@:2}"
SHORT=0; [ "${2:-}" = "--short" ] && SHORT=1
. "$HERE/lib.sh"
need wrk; need python3; need curl
need_binary debug
OUT=${OUT:-/tmp/happypath-loadtest}; mkdir -p "$OUT"
read -r UP_PORT PX ADMIN <<<"$(free_ports 3)"
DURATION=${DURATION:-30}; [ $SHORT = 1 ] && DURATION=${SHORT_DURATION:-10}
CONNS=${CONNS:-32}
UPSTREAM=${UPSTREAM:-}

start_demo() {
  start_bg "$BIN" demo-upstream --listen 127.0.0.1:$UP_PORT >>"$OUT/$SCENARIO.demo.log" 2>&1; DEMO=$!
  wait_http $DEMO "the demo upstream" "http://127.0.0.1:$UP_PORT/healthz" "$OUT/$SCENARIO.demo.log"
}

path=/ok
defaults="{ }"
auth=""
pacing=""
RPS=${RPS:-200}
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
  throttled)  # the upstream allows RPS requests a second and answers the rest 429 Retry-After: 1; pacing pauses it
    path="/_demo/throttle?rps=$RPS"
    defaults="{ timeout: 10s, retry: { on: [429, connect-failure, reset], attempts: 5 } }"
    pacing="pacing: { on: [429], max_pause: 5s, while_paused: wait }" ;;
  *) echo "unknown scenario $SCENARIO"; exit 2 ;;
esac
[ -n "${PATH_UNDER_TEST:-}" ] && path=$PATH_UNDER_TEST
[ "$SCENARIO" = throttled ] && [ -n "$UPSTREAM" ] && { echo "throttled counts at the demo upstream: unset UPSTREAM"; exit 2; }
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
    $pacing
routes:
  - { match: { path_prefix: / }, upstream: target }
YAML
: > "$OUT/$SCENARIO.demo.log"
[ -z "$UPSTREAM" ] && start_demo
start_bg "$BIN" serve --config "$OUT/$SCENARIO.yaml" --log-level warning >"$OUT/$SCENARIO.proxy.log" 2>&1; PROXY=$!
wait_http $PROXY "the proxy" "http://127.0.0.1:$ADMIN/readyz" "$OUT/$SCENARIO.proxy.log"

echo "== $SCENARIO: wrk -c$CONNS for ${DURATION}s on $path"
start_bg wrk -t2 -c"$CONNS" -d"${DURATION}s" --timeout 30s -s "$HERE/report.lua" "http://127.0.0.1:$PX$path" > "$OUT/$SCENARIO.wrk.txt" 2>&1; WRK=$!
start_bg python3 "$HERE/sample.py" "127.0.0.1:$ADMIN" "$OUT/$SCENARIO" "$DURATION" "$OUT/$SCENARIO.wrk.txt" > "$OUT/$SCENARIO.table.txt"; SAMPLER=$!
third=$(python3 -c "print($DURATION/3)")
case "$SCENARIO" in
  outage)
    sleep "$third"; stop "$DEMO"
    down=$([ $SHORT = 1 ] && echo 3 || echo 10); echo "   upstream down for ${down}s"; sleep "$down"; start_demo ;;
  breaker)
    sleep "$third"; curl -s "http://127.0.0.1:$UP_PORT/_demo/outage?ms=3000&status=503" >/dev/null; echo "   upstream failing for 3s" ;;
esac
wait $WRK || true
wait $SAMPLER || true
cat "$OUT/$SCENARIO.table.txt"
if [ "$SCENARIO" = throttled ] && [ -z "$UPSTREAM" ]; then
  # What the upstream itself counted, per wall-clock second.
  curl -sf "http://127.0.0.1:$UP_PORT/_demo/throttle/stats" > "$OUT/$SCENARIO.upstream.json"
  python3 - "$OUT/$SCENARIO.upstream.json" "$RPS" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
first = s["first_429_at"]
print(f"upstream, per second (rps={sys.argv[2]}; first 429 at {first}):")
print("  " + " ".join(f'{x["received"]}/{x["passed"]}' for x in s["seconds"]) + "   (received/passed)")
PY
fi

# The scenario's promise, checked in --short mode.
if [ $SHORT = 1 ]; then
  if python3 - "$OUT/$SCENARIO.json" "$SCENARIO" "$RPS" "${SLACK:-$CONNS}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["result"]
scenario = sys.argv[2]
problems = []
if not r["requests"]: problems.append("no requests completed")
if r["client_errors"] != 0: problems.append(f'{r["client_errors"]} client-visible errors')
if scenario == "outage" and r["replayed"] == 0: problems.append("nothing was parked and replayed during the outage")
if scenario == "breaker" and not r["breaker_opened"]: problems.append("the breaker never opened")
if scenario == "token-storm" and r["token_refreshes"] < 2: problems.append("tokens were not refreshed during the run")
if scenario == "throttled":
    # The upstream counts each second's requests itself. After its first
    # 429 of a second, the requests already on their way still arrive (and
    # get 429 too): at most one per client connection, because the proxy
    # parks each 429'd request until the pause ends, a whole second later.
    # Hence at most RPS + CONNS a second (measured with 32: 4 to 29 over 200).
    rps, slack = int(sys.argv[3]), int(sys.argv[4])
    s = json.load(open(sys.argv[1].replace(".json", ".upstream.json")))
    if s["first_429_at"] is None:
        problems.append(f"the upstream never answered 429 (the offered load stayed under {rps}/s)")
    else:
        over = [x for x in s["seconds"] if x["t"] >= int(s["first_429_at"]) and x["received"] > rps + slack]
        if over: problems.append(f"the upstream received more than {rps} + {slack} in a second after the first 429: {over}")
if problems:
    print(f"loadtest {scenario}: FAILED: " + "; ".join(problems)); sys.exit(1)
print(f"loadtest {scenario}: promise kept")
PY
  then :
  else
    # What a failed run leaves to read: who was still running, and the logs' ends.
    [ -n "${DEMO:-}" ] && { kill -0 "$DEMO" 2>/dev/null && echo "   demo upstream still running" || echo "   demo upstream NOT running"; }
    kill -0 "$PROXY" 2>/dev/null && echo "   proxy still running" || echo "   proxy NOT running"
    echo "   proxy log ($OUT/$SCENARIO.proxy.log), last lines:"; tail -n 15 "$OUT/$SCENARIO.proxy.log" | sed 's/^/     /'
    [ -s "$OUT/$SCENARIO.demo.log" ] && { echo "   demo log:"; tail -n 5 "$OUT/$SCENARIO.demo.log" | sed 's/^/     /'; }
    exit 1
  fi
fi
