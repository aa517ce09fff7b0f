#!/usr/bin/env bash
# Deliver later, the accept path: how many requests/s a `delivery: { mode:
# later }` route accepts (stored durably, 202) with storage.sync full and
# normal; the upstream down (accept path only, the dispatcher finding nothing
# to claim), stuck (64 rounds in flight, the dispatcher idle) and up
# (accepting and delivering together); wrk -t1 -c64 and -c256 POSTing a
# 200-byte JSON body. Reports requests/s, client p50/p99, the store's write
# latency p50/p99 from its histogram on /metrics (bucketed), fsyncs/s (perf,
# root), deliveries/s and CPU of each process. Then the accept rate as an
# outage's backlog grows to 50,000, and how fast that backlog drains. Bar:
# >= 5,000 requests/s with sync: full. Everything on loopback, ports
# 19620-19622; every process started here is stopped at exit. The steps are
# in deliver-later.py.
#
#   deploy/bench/deliver-later.sh [path/to/happypath]      make bench-deliver-later
#
# DURATION (10s), WARMUP (2s), CONNS ("64 256"), SYNCS ("full normal"),
# UPSTREAMS ("down stuck up"), BAR (5000), BACKLOG (50000; 0 skips that part);
# OUT (/tmp/happypath-bench-deliver-later) keeps the raw output; STORE_DIR
# (/var/tmp/happypath-bench-deliver-later) holds the store: keep it on a disk,
# not tmpfs, or fsync costs nothing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../loadtest/lib.sh"
need wrk; need python3
need_binary release "${1:-}"
command -v perf >/dev/null || echo "   (no perf: fsyncs/s not counted; make bench-deps installs linux-perf)"
exec python3 "$HERE/deliver-later.py" "$BIN"
