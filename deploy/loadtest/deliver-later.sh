#!/usr/bin/env bash
# Deliver later, "nothing lost": requests accepted (202) while the upstream
# is down, then delivered while the proxy is killed with SIGKILL twice and
# restarted on the same store. Every 202 must arrive upstream; duplicates
# only from rounds in flight at a kill; a refusal is 503 OVERLOADED and
# never arrives. The steps and the promises are in deliver-later.py.
#
#   deploy/loadtest/deliver-later.sh [--short]
#   make loadtest-deliver-later         (release build, 10,000 requests)
#   make loadtest-short                 (debug build, --short: 2,000 requests)
#
# Three free loopback ports (recording upstream, proxy, admin). Logs, the
# config, the store and the upstream's record of arrivals go to
# $OUT/deliver-later* (default /tmp/happypath-loadtest). REQUESTS overrides
# the number of requests; MAX_BYTES (e.g. 400KiB) sets storage.max_bytes so
# the store fills during the outage and the rest are refused with 503.
# KILL_WHILE_ACCEPTING=1 also kills the proxy (SIGKILL) halfway through
# accepting: every 202 must still arrive; requests cut off may or may not.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHORT=0; [ "${1:-}" = "--short" ] && SHORT=1
. "$HERE/lib.sh"
need python3
need_binary debug
OUT=${OUT:-/tmp/happypath-loadtest}; mkdir -p "$OUT"
REQUESTS=${REQUESTS:-$([ $SHORT = 1 ] && echo 2000 || echo 10000)}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-$([ $SHORT = 1 ] && echo 90 || echo 300)}
MAX_BYTES=${MAX_BYTES:-}
KILL_WHILE_ACCEPTING=${KILL_WHILE_ACCEPTING:-0}
exec python3 "$HERE/deliver-later.py" --bin "$BIN" --out "$OUT" --requests "$REQUESTS" --drain-timeout "$DRAIN_TIMEOUT" ${MAX_BYTES:+--max-bytes "$MAX_BYTES"} $([ "$KILL_WHILE_ACCEPTING" = 1 ] && echo --kill-while-accepting)
