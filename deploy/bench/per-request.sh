#!/usr/bin/env bash
# System calls and libc allocations per request, for one or more happypath
# binaries (and nginx as a reference), each alone with one worker on CPU 0 in
# front of an nginx upstream on CPU 1, loaded by wrk -t1 -c64 (keep-alive) on /small;
# LOAD=h2: by h2load -t1 -c64 -m1 over h2c instead (nginx listens with `http2`).
#
#   deploy/bench/per-request.sh new=.build/release/happypath old=/tmp/old/happypath
#
# Needs root, perf (linux-perf) with uprobes. In each run, while wrk is loading:
#   window 1: `perf trace -s -p PID` (syscall counts, all threads of the proxy)
#   window 2: `perf stat -e probe_libc:{malloc,calloc,realloc,posix_memalign,free}`
# and divides by the requests the upstream served in that window (its
# stub_status counter; health checks add a handful). Tracing slows the proxy
# down: the counts per request hold, the rates do not.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../loadtest/lib.sh"
WINDOW=${WINDOW:-3}
PORT_BASE=${PORT_BASE:-18480}
OUT=${OUT:-/tmp/happypath-perreq.$(date +%Y%m%d-%H%M%S)}
UP=127.0.0.1:$((PORT_BASE + 1)); STATUS=127.0.0.1:$((PORT_BASE + 2)); PX=127.0.0.1:$((PORT_BASE + 3))
LIBC=$(ldconfig -p | awk '/libc.so.6 .*x86-64/{print $NF; exit}')
LOAD=${LOAD:-h1}
case $LOAD in
  h1) h2=""; client=wrk; client_package=wrk; probe=(curl -fs -o /dev/null) ;;
  h2) h2=" http2"; client=h2load; client_package=nghttp2-client; probe=(curl -fs -o /dev/null --http2-prior-knowledge) ;;
  *) echo "LOAD must be h1 or h2, not $LOAD" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
need perf linux-perf; need nginx; need "$client" "$client_package"; need curl; need taskset util-linux
have=$(perf probe -l 2>/dev/null)
for f in malloc calloc realloc posix_memalign free; do
  [[ $have == *"probe_libc:$f "* ]] || perf probe -q -x "$LIBC" "$f" || { echo "no uprobe on $f"; exit 2; }
done

cat > "$OUT/upstream.conf" <<EOF
worker_processes 1; daemon off; pid $OUT/up.pid; error_log $OUT/up.err warn;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 10000000; keepalive_timeout 120s;
  client_body_temp_path $OUT/t1; proxy_temp_path $OUT/t2; fastcgi_temp_path $OUT/t3; uwsgi_temp_path $OUT/t4; scgi_temp_path $OUT/t5;
  server { listen $UP backlog=4096; location / { default_type text/plain; return 200 "$(printf 'per-request-bench-body-%076d' 0)\n"; } }
  server { listen $STATUS; location / { stub_status; } }
}
EOF
cat > "$OUT/nginx.conf" <<EOF
worker_processes 1; daemon off; pid $OUT/px.pid; error_log $OUT/px.err warn;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 10000000; keepalive_timeout 120s;
  client_body_temp_path $OUT/p1; proxy_temp_path $OUT/p2; fastcgi_temp_path $OUT/p3; uwsgi_temp_path $OUT/p4; scgi_temp_path $OUT/p5;
  upstream up { server $UP; keepalive 128; }
  server { listen $PX$h2 backlog=4096; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
EOF
start_bg taskset -c 1 nginx -p "$OUT/" -c "$OUT/upstream.conf" -e "$OUT/up.err"
served_in() { awk 'NR==3{print $3}' "$1"; }  # stub_status: the third number of line 3 = requests
poll 10 curl -fs -o /dev/null "http://$UP/small" || { echo "upstream down"; exit 1; }

echo "| target | window | requests | per request |" > "$OUT/summary.md"
for spec in "$@" nginx=nginx; do
  name=${spec%%=*}; bin=${spec#*=}
  if [ "$bin" = nginx ]; then
    start_bg taskset -c 0 nginx -p "$OUT/" -c "$OUT/nginx.conf" -e "$OUT/px.err"; ppid=$!
    poll 10 "${probe[@]}" "http://$PX/small"; pid=$(pgrep -P "$ppid" | head -1)   # trace the worker
  else
    start_bg taskset -c 0 env BENCH_UPSTREAM="$UP" BENCH_LISTEN="$PX" BENCH_OUT="$OUT" HAPPYPATH_BIN="$bin" \
      "$here/run-happypath-for-bench.sh" > "$OUT/$name.log" 2>&1; ppid=$!; pid=$ppid
    poll 10 "${probe[@]}" "http://$PX/small" || { echo "$name did not start"; cat "$OUT/$name.log"; exit 1; }
  fi
  echo "== $name (pid $pid)"
  if [ "$LOAD" = h2 ]; then start_bg taskset -c 1 h2load -t1 -c64 -m1 -D $((2 * WINDOW + 4))s "http://$PX/small" > "$OUT/$name.h2load" 2>&1; wrk=$!
  else start_bg taskset -c 1 wrk -t1 -c64 -d$((2 * WINDOW + 4))s "http://$PX/small" > "$OUT/$name.wrk" 2>&1; wrk=$!; fi
  sleep 1
  # the window is perf's workload: it starts once the counters are on, so the
  # upstream's counter is read at both edges of what was counted
  window="curl -s http://$STATUS/ > $OUT/$name.r0; sleep $WINDOW; curl -s http://$STATUS/ > $OUT/$name.r1"
  perf trace -s -p "$pid" -o "$OUT/$name.trace" -- sh -c "$window" 2>/dev/null
  r0=$(served_in "$OUT/$name.r0"); r1=$(served_in "$OUT/$name.r1")
  sleep 1
  perf stat -x, -e probe_libc:malloc,probe_libc:calloc,probe_libc:realloc,probe_libc:posix_memalign,probe_libc:free \
    -p "$pid" -o "$OUT/$name.mallocs" -- sh -c "$window"
  r2=$(served_in "$OUT/$name.r0"); r3=$(served_in "$OUT/$name.r1")
  wait $wrk
  stop "$ppid"
  # perf trace -s prints a table per thread: sum the calls of each syscall over all threads
  awk -v n=$((r1 - r0)) -v name="$name" '
    $1 ~ /^[a-z_0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 8 { c[$1] += $2 }
    END { for (s in c) printf "%s\tsyscalls\t%d\t%s\t%.2f\n", name, n, s, c[s] / n }' "$OUT/$name.trace" | sort -t$'\t' -k5,5nr > "$OUT/$name.syscalls.tsv"
  awk -F, -v n=$((r3 - r2)) -v name="$name" '$3 ~ /probe_libc/ { split($3, a, ":"); printf "%s\tlibc\t%d\t%s\t%.2f\n", name, n, a[2], $1 / n }' "$OUT/$name.mallocs" > "$OUT/$name.libc.tsv"
  awk -F'\t' '{t += $5} END {printf "  syscalls/request: %.2f over %d requests\n", t, $3}' "$OUT/$name.syscalls.tsv"
  cat "$OUT/$name.syscalls.tsv" "$OUT/$name.libc.tsv" | awk -F'\t' '{printf "    %-16s %-6.2f %s\n", $4, $5, $2}'
done
cat "$OUT"/*.syscalls.tsv "$OUT"/*.libc.tsv > "$OUT/all.tsv"
echo "raw: $OUT"
