#!/usr/bin/env bash
# TLS termination: happypath beside nginx, each plain and with TLS (the same
# certificate, made here), in front of one plain nginx upstream, loaded by
# wrk over loopback. Two loads: keep-alive (wrk -c64: requests over
# established TLS sessions) and handshakes (wrk -c16 with `Connection:
# close`: one TLS handshake per request). The ratios happypath/nginx, plain
# and TLS, come from the same run. Needs nginx, wrk, curl, openssl, taskset.
#
#   deploy/bench/tls.sh .build/release/happypath
#
# Knobs: DURATION=10s REPEATS=3 WARMUP=2s PORT_BASE=18680 OUT=/tmp/happypath-tls.<time>
# Pinned: the proxies on CPU 0; the upstream and wrk on CPU 1. CPU per
# request = utime + stime of the proxy's process tree over the run / requests.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../loadtest/lib.sh"
DURATION=${DURATION:-10s}; REPEATS=${REPEATS:-3}; WARMUP=${WARMUP:-2s}
PORT_BASE=${PORT_BASE:-18680}
OUT=${OUT:-/tmp/happypath-tls.$(date +%Y%m%d-%H%M%S)}
need nginx; need wrk; need curl; need openssl; need taskset util-linux
need_binary release "${1:-}"
mkdir -p "$OUT/tmp" "$OUT/logs"
exec > >(tee -a "$OUT/run.log") 2>&1
UP=127.0.0.1:$((PORT_BASE + 1))
declare -A PORT=([nginx]=$((PORT_BASE + 2)) [nginx-tls]=$((PORT_BASE + 3)) [happypath]=$((PORT_BASE + 4)) [happypath-tls]=$((PORT_BASE + 5)))
TARGETS="nginx happypath nginx-tls happypath-tls"
declare -A PID_OF=()
spawn() { local name=$1 cpu=$2; shift 2; start_bg taskset -c "$cpu" "$@" >"$OUT/logs/$name.log" 2>&1; PID_OF[$name]=$!; }
ticks() { local p t=0; for p in $1 $(pgrep -P "$1" | tr '\n' ' '); do [ -r /proc/$p/stat ] && t=$((t + $(awk '{sub(/.*\) /, ""); print $12 + $13}' /proc/$p/stat))); done; echo $t; }
url() { case $1 in *-tls) echo "https://localhost:${PORT[$1]}/";; *) echo "http://127.0.0.1:${PORT[$1]}/";; esac; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$OUT/tls.key" -out "$OUT/tls.crt" \
  -days 2 -subj /CN=localhost -addext "subjectAltName=DNS:localhost" 2>/dev/null || exit 2
body=$(printf 'happypath-bench-small-body-%072d' 0)
common="worker_processes 1; daemon off; error_log stderr warn; events { worker_connections 8192; }"
temp="client_body_temp_path $OUT/tmp/b; proxy_temp_path $OUT/tmp/p; fastcgi_temp_path $OUT/tmp/f; uwsgi_temp_path $OUT/tmp/u; scgi_temp_path $OUT/tmp/s;"
cat > "$OUT/upstream.conf" <<C
$common pid $OUT/tmp/up.pid;
http { access_log off; $temp keepalive_requests 10000000;
  server { listen $UP; location / { default_type text/plain; return 200 "$body\n"; } } }
C
cat > "$OUT/nginx.conf" <<C
$common pid $OUT/tmp/nginx.pid;
http { access_log off; $temp keepalive_requests 10000000; keepalive_timeout 120s;
  upstream backend { server $UP; keepalive 128; keepalive_requests 10000000; }
  ssl_certificate $OUT/tls.crt; ssl_certificate_key $OUT/tls.key;
  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:bench:10m; ssl_session_tickets on;
  server { listen 127.0.0.1:${PORT[nginx]} backlog=4096;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  server { listen 127.0.0.1:${PORT[nginx-tls]} ssl backlog=4096;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
C
spawn upstream 1 nginx -p "$OUT/tmp/" -c "$OUT/upstream.conf"
# One nginx process serves both of its listeners: it is measured once per row,
# its CPU over that row's run.
spawn nginx 0 nginx -p "$OUT/tmp/" -c "$OUT/nginx.conf"
PID_OF[nginx-tls]=${PID_OF[nginx]}
spawn happypath 0 env BENCH_UPSTREAM="$UP" BENCH_LISTEN="127.0.0.1:${PORT[happypath]}" BENCH_OUT="$OUT/tmp" \
  HAPPYPATH_BIN="$BIN" "$here/run-happypath-for-bench.sh"
spawn happypath-tls 0 env BENCH_UPSTREAM="$UP" BENCH_LISTEN="127.0.0.1:${PORT[happypath-tls]}" BENCH_OUT="$OUT/tmp" \
  BENCH_TLS_CERT="$OUT/tls.crt" BENCH_TLS_KEY="$OUT/tls.key" HAPPYPATH_BIN="$BIN" "$here/run-happypath-for-bench.sh"
for t in $TARGETS; do
  poll 10 curl -fs --cacert "$OUT/tls.crt" -o /dev/null "$(url $t)" || { echo "$t does not answer (see $OUT/logs)"; exit 1; }
done

RESULTS=$OUT/results.tsv
printf 'load\ttarget\trep\trps\trequests\terrors\tcpu_us_per_request\n' > "$RESULTS"
measure() {  # load target rep duration
  local load=$1 t=$2 rep=$3 dur=$4 c0 c1 log=$OUT/logs/wrk-$1-$2-$3.txt args=(-t1 -c64)
  [ "$load" = handshake ] && args=(-t1 -c16 -H "Connection: close")
  c0=$(ticks "${PID_OF[$t]}")
  taskset -c 1 wrk "${args[@]}" -d"$dur" "$(url "$t")" > "$log" 2>&1
  c1=$(ticks "${PID_OF[$t]}")
  [ "$rep" = 0 ] && return 0
  awk -v load="$load" -v t="$t" -v rep="$rep" -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" '
    / requests in / { req = $1 } /Requests\/sec/ { rps = $2 }
    /Socket errors/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 } /Non-2xx/ { err += $NF }
    END { printf "%s\t%s\t%s\t%.0f\t%d\t%d\t%.1f\n", load, t, rep, rps, req, err, req ? c * 1e6 / hz / req : 0 }' "$log" |
    tee -a "$RESULTS" | awk -F'\t' '{printf "  %-9s %-14s #%s %8s rps  %6.1f us cpu/request  err %s\n", $1, $2, $3, $4, $7, $6}'
}
{
  echo "# deploy/bench/tls.sh $(date -u +%FT%TZ)"
  echo "host: $(uname -r), $(nproc) cpu; $(nginx -v 2>&1 | sed 's/.*: //'); $(openssl version)"
  echo "happypath: $BIN; wrk -d$DURATION, repeats $REPEATS; keep-alive -c64, handshake -c16 Connection: close"
} | tee "$OUT/header.txt"
for load in keepalive handshake; do for t in $TARGETS; do measure $load "$t" 0 "$WARMUP"; done; done
for rep in $(seq "$REPEATS"); do for load in keepalive handshake; do for t in $TARGETS; do measure $load "$t" "$rep" "$DURATION"; done; done; done
echo
python3 - "$RESULTS" <<'PY' | tee "$OUT/summary.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def med(load, t, k): return statistics.median(float(r[k]) for r in rows if r["load"] == load and r["target"] == t)
print("| load | target | rps (median) | CPU µs per request | happypath / nginx (CPU per request) |")
print("|---|---|---:|---:|---:|")
for load in ("keepalive", "handshake"):
    for t in ("nginx", "happypath", "nginx-tls", "happypath-tls"):
        ratio = ""
        if t.startswith("happypath"):
            peer = t.replace("happypath", "nginx")
            ratio = f"{med(load, t, 'cpu_us_per_request') / med(load, peer, 'cpu_us_per_request'):.2f}"
        print(f"| {load} | {t} | {med(load, t, 'rps'):.0f} | {med(load, t, 'cpu_us_per_request'):.1f} | {ratio} |")
PY
echo "raw: $RESULTS  logs: $OUT/logs"
