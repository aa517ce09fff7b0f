#!/usr/bin/env bash
# A long run with faults: wrk through happypath against the demo upstream for
# SOAK_S seconds (default 600) while
#   - a quarter of the upstream's answers are 503 (retried),
#   - the upstream process is gone for 10 s every OUTAGE_EVERY s (default
#     120; the first at 20 s): requests park and replay,
#   - the token the proxy injects expires every TOKEN_TTL s (default 60),
#   - the proxy reloads its configuration (SIGHUP) every RELOAD_EVERY s (default 30),
#   - hostile clients (deploy/soak/hostile.py; HOSTILE=0 leaves them out) read
#     8 MB answers at 64 KiB/s, hold HTTP/2 streams with shut windows and
#     abandon uploads after their first MiB, on a route of their own whose
#     answers the verdict leaves out: the normal clients must not notice them.
# Every second it samples the proxy's resident memory, open descriptors,
# parked and in-flight requests and the answers it gave, into a CSV and an
# SVG chart ($OUT, default /tmp/happypath-soak). It passes (exit 0) when no
# client saw an error outside the outages, every parked request was
# answered, and memory and descriptors at the end are within 10% of their
# values after warm-up.
#
#   deploy/soak/run.sh              make soak            (10 minutes, release build)
#   SOAK_S=60 deploy/soak/run.sh    make soak SOAK_S=60  (what `make test` runs)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../loadtest/lib.sh"
need wrk; need python3; need curl
need_binary release
OUT=${OUT:-/tmp/happypath-soak}; mkdir -p "$OUT"
SOAK_S=${SOAK_S:-600}
OUTAGE_EVERY=${OUTAGE_EVERY:-120}
OUTAGE_S=${OUTAGE_S:-10}
TOKEN_TTL=${TOKEN_TTL:-60}
RELOAD_EVERY=${RELOAD_EVERY:-30}
HOSTILE=${HOSTILE:-1}
CONNS=${CONNS:-32}
if [ -n "${PORT_BASE:-}" ]; then UP_PORT=$PORT_BASE; PX=$((UP_PORT + 1)); ADMIN=$((UP_PORT + 2)); HOSTILE_PORT=$((UP_PORT + 3))
else read -r UP_PORT PX ADMIN HOSTILE_PORT <<<"$(free_ports 4)"; fi
# The hostile clients' own upstream (a second demo process): the demo runs one
# loop, and their bursts (100 streams of answers at once) would slow the
# normal clients' upstream, which is not the proxy's doing.
HOSTILE_UPSTREAM=""; HOSTILE_ROUTE=""
if [ "$HOSTILE" != 0 ]; then
  HOSTILE_UPSTREAM="  hostile: { endpoints: [http://127.0.0.1:$HOSTILE_PORT], max_connections: 1024 }"
  HOSTILE_ROUTE="  - { match: { path_prefix: /hostile/ }, upstream: hostile, strip_prefix: /hostile, retry: { attempts: 1 } }"
fi

start_demo() {
  start_bg "$BIN" demo-upstream --listen 127.0.0.1:$UP_PORT >>"$OUT/demo.log" 2>&1; DEMO=$!
  wait_http $DEMO "the demo upstream" "http://127.0.0.1:$UP_PORT/healthz" "$OUT/demo.log"
}

# The route's deadline and park_for outlast an outage, so requests that
# arrive during one wait for the upstream instead of failing. The 503s are
# retried until they succeed (a quarter failing needs a third more tries:
# the budget allows half); the demo's Retry-After: 1 is not honoured, or
# the run would measure that sleep. The breaker counts every try: at these
# rates five 503s in a row happen by chance, so it opens only on far more.
cat > "$OUT/soak.yaml" <<YAML
listen: 127.0.0.1:$PX
admin: { listen: 127.0.0.1:$ADMIN }
workers: 2
drain_timeout: 2s
defaults:
  timeout: 30s
  retry: { attempts: 12, honor_retry_after: false, backoff: { base: 5ms, max: 50ms }, budget: { ratio: 0.5, min_per_second: 10 } }
  circuit_breaker: { consecutive_failures: 50 }
  reachability: { park_for: 25s }
  health_check: { interval: 250ms, timeout: 200ms }
upstreams:
  demo:
    endpoints: [http://127.0.0.1:$UP_PORT]
    max_connections: 1024
    auth:
      kind: oauth2_client_credentials
      token_url: http://127.0.0.1:$UP_PORT/_demo/token?ttl=$TOKEN_TTL
      client_id: soak
      client_secret: \${SOAK_SECRET:-soak-secret}
      refresh_ahead: 0s
$HOSTILE_UPSTREAM
routes:
$HOSTILE_ROUTE
  - { match: { path_prefix: / }, upstream: demo }
YAML
: > "$OUT/demo.log"
start_demo
if [ "$HOSTILE" != 0 ]; then
  start_bg "$BIN" demo-upstream --listen 127.0.0.1:$HOSTILE_PORT >"$OUT/hostile-demo.log" 2>&1
  wait_http $! "the hostile clients' demo upstream" "http://127.0.0.1:$HOSTILE_PORT/healthz" "$OUT/hostile-demo.log"
fi
start_bg "$BIN" serve --config "$OUT/soak.yaml" --log-level warning >"$OUT/proxy.log" 2>&1; PROXY=$!
wait_http $PROXY "the proxy" "http://127.0.0.1:$ADMIN/readyz" "$OUT/proxy.log"

echo "== soak: ${SOAK_S}s, wrk -c$CONNS on /private/flaky (25% 503), ${OUTAGE_S}s outage every ${OUTAGE_EVERY}s, token every ${TOKEN_TTL}s, SIGHUP every ${RELOAD_EVERY}s$( [ "$HOSTILE" != 0 ] && echo ", hostile clients on /hostile/")"
: > "$OUT/events.txt"
start_bg wrk -t2 -c"$CONNS" -d"${SOAK_S}s" --timeout 40s -s "$HERE/../loadtest/report.lua" \
  "http://127.0.0.1:$PX/private/flaky?fail=0.25&status=503" > "$OUT/wrk.txt" 2>&1; WRK=$!
start_bg python3 "$HERE/sample.py" sample "$PROXY" "127.0.0.1:$ADMIN" "$SOAK_S" "$OUT" $( [ "$HOSTILE" != 0 ] && echo "$HOSTILE_PORT"); SAMPLER=$!
if [ "$HOSTILE" != 0 ]; then
  start_bg python3 "$HERE/hostile.py" 127.0.0.1 "$PX" "$SOAK_S" > "$OUT/hostile.txt" 2>&1; HOSTILE_PID=$!
fi

start=$(date +%s)
next_outage=20; next_reload=$RELOAD_EVERY
while kill -0 $WRK 2>/dev/null; do
  t=$(( $(date +%s) - start ))
  if [ $t -ge $next_outage ] && [ $((t + OUTAGE_S + 10)) -le "$SOAK_S" ]; then
    echo "$t outage_start" >> "$OUT/events.txt"; echo "   $t s: upstream down for ${OUTAGE_S}s"
    stop "$DEMO" KILL
    sleep "$OUTAGE_S"
    start_demo
    echo "$(( $(date +%s) - start )) outage_end" >> "$OUT/events.txt"
    next_outage=$((next_outage + OUTAGE_EVERY))
  fi
  if [ $t -ge $next_reload ]; then
    kill -HUP "$PROXY"; echo "$t reload" >> "$OUT/events.txt"
    next_reload=$((next_reload + RELOAD_EVERY))
  fi
  sleep 0.5
done
wait $WRK || true
[ "$HOSTILE" != 0 ] && { wait "$HOSTILE_PID" || true; cat "$OUT/hostile.txt"; }
wait $SAMPLER || true
python3 "$HERE/sample.py" verdict "$OUT"
