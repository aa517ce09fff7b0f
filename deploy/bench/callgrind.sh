#!/usr/bin/env bash
# Instructions (and malloc calls) per request under callgrind, by library:
# each binary serves N1 and then N2 keep-alive requests (one curl, one
# connection) in two separate runs; (run N2 - run N1) / (N2 - N1) removes
# start-up and shutdown. valgrind 3.19 cannot read Swift 6's DWARF 5, so it
# runs a `strip --strip-debug` copy.
#
#   deploy/bench/callgrind.sh new=.build/release/happypath old=/tmp/old/happypath
#   deploy/bench/callgrind.sh happypath=.build/release/happypath nginx=nginx
#
# `NAME=nginx` measures nginx as the proxy instead (one process:
# master_process off, upstream keep-alive as in peers.sh).
#
# LOAD=h2 sends the requests over HTTP/2 instead, by prior knowledge (h2c),
# with h2load on one connection, STREAMS=1 at a time (STREAMS=10: ten); nginx
# then listens with `http2`. The upstream stays HTTP/1.1. BODY=N (with
# LOAD=h2): each request is a POST of N bytes (h2load -d), its body in DATA
# frames after the HEADERS: happypath streams it to the upstream.
#
# UPSTREAM_H2=1: the upstream nginx speaks h2c (`listen … http2`) instead of
# HTTP/1.1, for a happypath profile with `protocol: h2` (BENCH_PROFILE=h2up:
# the proxy's own HTTP/2 client); nginx as a proxy cannot speak h2 upstream.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../loadtest/lib.sh"
N1=${N1:-300}; N2=${N2:-1800}
LOAD=${LOAD:-h1}; STREAMS=${STREAMS:-1}; BODY=${BODY:-}; UPSTREAM_H2=${UPSTREAM_H2:-}
up_h2=""; up_probe=(curl -fs -o /dev/null)
if [ -n "$UPSTREAM_H2" ]; then up_h2=" http2"; up_probe=(curl -fs -o /dev/null --http2-prior-knowledge); fi
PORT_BASE=${PORT_BASE:-18580}
OUT=${OUT:-/tmp/happypath-callgrind.$(date +%Y%m%d-%H%M%S)}
UP=127.0.0.1:$((PORT_BASE + 1)); PX=127.0.0.1:$((PORT_BASE + 2))
mkdir -p "$OUT"
post=()
if [ -n "$BODY" ]; then head -c "$BODY" /dev/zero | tr '\0' x > "$OUT/body"; post=(-d "$OUT/body"); fi
case $LOAD in
  h1) h2=""; probe=(curl -fs -o /dev/null) ;;
  h2) h2=" http2"; probe=(curl -fs -o /dev/null --http2-prior-knowledge); need h2load nghttp2-client ;;
  *) echo "LOAD must be h1 or h2, not $LOAD" >&2; exit 2 ;;
esac
need valgrind; need callgrind_annotate valgrind; need nginx; need curl; need strip binutils
cat > "$OUT/upstream.conf" <<EOF
worker_processes 1; daemon off; pid $OUT/up.pid; error_log $OUT/up.err warn;
events { worker_connections 1024; }
http {
  access_log off; keepalive_requests 10000000;
  client_body_temp_path $OUT/t1; proxy_temp_path $OUT/t2; fastcgi_temp_path $OUT/t3; uwsgi_temp_path $OUT/t4; scgi_temp_path $OUT/t5;
  server { listen $UP$up_h2; location / { default_type text/plain; return 200 "$(printf 'callgrind-bench-body-%078d' 0)\n"; } }
}
EOF
start_bg nginx -p "$OUT/" -c "$OUT/upstream.conf" -e "$OUT/up.err"
poll 60 "${up_probe[@]}" "http://$UP/" || { echo "upstream down"; exit 1; }

cat > "$OUT/proxy.conf" <<EOF
master_process off; daemon off; pid $OUT/px.pid; error_log $OUT/px.err warn;
events { worker_connections 1024; }
http {
  access_log off; keepalive_requests 10000000;
  client_body_temp_path $OUT/p1; proxy_temp_path $OUT/p2; fastcgi_temp_path $OUT/p3; uwsgi_temp_path $OUT/p4; scgi_temp_path $OUT/p5;
  upstream up { server $UP; keepalive 128; }
  server { listen $PX$h2; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
EOF

for spec in "$@"; do
  name=${spec%%=*}; bin=${spec#*=}
  [ "$bin" = nginx ] || strip --strip-debug -o "$OUT/$name" "$bin"
  for n in $N1 $N2; do
    vgargs="valgrind --tool=callgrind --callgrind-out-file=$OUT/$name.$n.out"
    if [ "$bin" = nginx ]; then
      start_bg $vgargs nginx -p "$OUT/" -c "$OUT/proxy.conf" -e "$OUT/px.err" > "$OUT/$name.$n.log" 2>&1; vg=$!
    else
      start_bg env BENCH_UPSTREAM="$UP" BENCH_LISTEN="$PX" BENCH_OUT="$OUT" HAPPYPATH_BIN="$OUT/$name" BENCH_WRAPPER="$vgargs" \
        "$here/run-happypath-for-bench.sh" > "$OUT/$name.$n.log" 2>&1; vg=$!
    fi
    poll 60 "${probe[@]}" "http://$PX/small" || { echo "$name did not start under valgrind"; exit 1; }
    # + the readiness probe = n requests, on one connection
    if [ "$LOAD" = h2 ]; then
      h2load -t1 -c1 -m"$STREAMS" -n$((n - 1)) "${post[@]}" "http://$PX/small" > "$OUT/$name.$n.h2load" 2>&1
      grep -q " $((n - 1)) succeeded" "$OUT/$name.$n.h2load" || { echo "$name: h2load did not complete $((n - 1)) requests (see $OUT/$name.$n.h2load)"; exit 1; }
    else curl -s -o /dev/null "http://$PX/small?[1-$((n - 1))]"; fi
    stop $vg INT
    callgrind_annotate --inclusive=no --threshold=100 "$OUT/$name.$n.out" > "$OUT/$name.$n.txt" 2>/dev/null
  done
done
# per request = (run N2 - run N1) / (N2 - N1), summed by shared object
python3 - "$OUT" "$N1" "$N2" "$@" <<'PY' | tee "$OUT/summary.md"
import collections, re, sys
out, n1, n2, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [a.split("=")[0] for a in sys.argv[4:]]
line = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*?)(?: \[(.*)\])?$")
def by_object(name, n):
    c = collections.Counter()
    for l in open(f"{out}/{name}.{n}.txt"):
        m = line.match(l)
        if m and "PROGRAM TOTALS" not in l:
            obj = (m.group(3) or "?").rsplit("/", 1)[-1]
            c["the binary itself" if obj == name else obj] += int(m.group(1).replace(",", ""))
    return c
per = {}
for name in names:
    a, b = by_object(name, n1), by_object(name, n2)
    per[name] = {k: (b[k] - a[k]) / (n2 - n1) for k in set(a) | set(b)}
objs = sorted({k for d in per.values() for k in d}, key=lambda k: -max(d.get(k, 0) for d in per.values()))
print("| instructions per request | " + " | ".join(names) + " |")
print("|---|" + "---:|" * len(names))
for o in objs:
    if max(abs(d.get(o, 0)) for d in per.values()) >= 100:
        print(f"| {o} | " + " | ".join(f"{per[n].get(o, 0):,.0f}" for n in names) + " |")
print("| **total** | " + " | ".join(f"**{sum(per[n].values()):,.0f}**" for n in names) + " |")
PY
echo "raw: $OUT (callgrind_annotate --inclusive=no output in *.txt)"
