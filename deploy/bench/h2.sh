#!/usr/bin/env bash
# HTTP/2 at the edge: happypath beside nginx, both in front of one plain
# HTTP/1.1 nginx upstream (keep-alive to it, as in peers.sh), each loaded
# over HTTP/1.1 by wrk and over h2c (HTTP/2 by prior knowledge) by h2load.
# The ratios happypath/nginx of CPU per request, HTTP/1.1 and HTTP/2, come
# from the same run, and each HTTP/2 ratio is compared with the HTTP/1.1 one
# (issue 33's bar: at most 1.3 times it). Needs nginx, wrk, h2load
# (nghttp2-client), curl, taskset.
#
#   deploy/bench/h2.sh .build/release/happypath      (make bench-h2)
#   GRPC=1 deploy/bench/h2.sh .build/release/happypath     (make bench-grpc, h2c upstream)
#   GRPC=tls deploy/bench/h2.sh .build/release/happypath   (make bench-grpc, TLS upstream)
#
# GRPC=1: gRPC unary calls instead, happypath (a `grpc: {}` route to a
# `protocol: h2` upstream) beside nginx's `grpc_pass`, both in front of one
# h2c upstream that answers every call as a gRPC server answers a unary call
# (`content-type: application/grpc`, one framed message, the trailer
# `grpc-status: 0`): a third nginx that serves the reply from a file, since
# nginx cannot serve gRPC itself and a grpcio server would cost the shared
# core many times what either proxy does. h2load sends each call as gRPC
# does (POST, `-d` one framed message, `content-type: application/grpc`,
# `te: trailers`). Loads grpc-m1 and grpc-m$MULTI_STREAMS, like the HTTP/2
# ones; the rows have no bar, only the ratio. GRPC=tls: the upstream on
# TLS with ALPN h2 (a certificate made here), `grpc_pass grpcs://` and an
# `https://` endpoint: happypath multiplexes its calls on one upstream
# connection there, where to an h2c upstream it opens one per call
# (libcurl 7.88, docs/http2.md).
#
# Loads (one client thread each, on CPU 1 beside the upstream; the proxies
# on CPU 0):
#   h1        wrk -t1 -c$CONNS                        64 requests in flight
#   h2-m1     h2load -t1 -c$CONNS -m1                 64 connections, one stream each
#   h2-m100   h2load -t1 -c$MULTI_CONNS -m$MULTI_STREAMS  one connection, 100 streams
#   grpcweb-m1  h2load -t1 -c$CONNS -m1 (GRPC only)  the same calls as gRPC-Web
#             (content-type application/grpc-web+proto), happypath alone
#             (nginx has no gRPC-Web): its CPU per call against its own
#             grpc-m1 row, which is the cost of the translation.
# The many-streams load keeps the requests in flight near the other two's
# (100, not 64 x 100): at 6,400 in flight nginx opens and closes an upstream
# connection for most requests (its keep-alive pool holds 128) and happypath
# answers most of them 503 OVERLOADED (its upstream's max_connections and
# queue), so the row would measure overload, not HTTP/2.
# nginx serves HTTP/1.1 and h2c on two listeners of one process (1.22 has
# no h2c beside HTTP/1.1 on one port); happypath serves both on one port.
# Each row counts the CPU of the process it loaded over that row's run.
#
# Knobs: DURATION=10s REPEATS=3 WARMUP=2s CONNS=64 MULTI_CONNS=1
# MULTI_STREAMS=100 BAR=1.3 PORT_BASE=18880 OUT=/tmp/happypath-h2.<time>
# CPU per request = utime + stime of the proxy's process tree over the run
# (/proc/PID/stat) / the requests the client completed. Foreign CPU = what
# the machine was busy with beyond the proxy, the upstream and the client,
# in % of one core (others' load; on a shared machine it moves the figures).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../loadtest/lib.sh"
DURATION=${DURATION:-10s}; REPEATS=${REPEATS:-3}; WARMUP=${WARMUP:-2s}
CONNS=${CONNS:-64}; MULTI_CONNS=${MULTI_CONNS:-1}; MULTI_STREAMS=${MULTI_STREAMS:-100}; BAR=${BAR:-1.3}
PORT_BASE=${PORT_BASE:-18880}; GRPC=${GRPC:-}
OUT=${OUT:-/tmp/happypath-$([ -n "$GRPC" ] && { [ "$GRPC" = tls ] && echo grpc-tls || echo grpc; } || echo h2).$(date +%Y%m%d-%H%M%S)}
need nginx; need wrk; need h2load nghttp2-client; need curl; need taskset util-linux; need python3
need_binary release "${1:-}"
mkdir -p "$OUT/tmp" "$OUT/logs"
exec > >(tee -a "$OUT/run.log") 2>&1
UP=127.0.0.1:$((PORT_BASE + 1))
declare -A PORT=([nginx-h1]=$((PORT_BASE + 2)) [nginx-h2]=$((PORT_BASE + 3)) [happypath]=$((PORT_BASE + 4)))
LOADS="h1 h2-m1 h2-m$MULTI_STREAMS"; [ -n "$GRPC" ] && LOADS="grpc-m1 grpc-m$MULTI_STREAMS grpcweb-m1"
targets() { case $1 in grpcweb-*) echo happypath ;; *) echo nginx happypath ;; esac; }
declare -A PID_OF=()
spawn() { local name=$1 cpu=$2; shift 2; start_bg taskset -c "$cpu" "$@" >"$OUT/logs/$name.log" 2>&1; PID_OF[$name]=$!; }
ticks() { local p t=0; for p in $1 $(pgrep -P "$1" | tr '\n' ' '); do [ -r /proc/$p/stat ] && t=$((t + $(awk '{sub(/.*\) /, ""); print $12 + $13}' /proc/$p/stat))); done; echo $t; }
self_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13 + $14 + $15}' /proc/$$/stat; }  # this shell + reaped children (the client)
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat; }
grpc=(-H 'content-type: application/grpc' -H 'te: trailers')
grpcweb=(-H 'content-type: application/grpc-web+proto' -H 'x-grpc-web: 1')
# port file: one call, its answer (kept in file) the upstream's reply byte for byte
grpc_call() { curl -fs --http2-prior-knowledge -X POST --data-binary @"$OUT/call.bin" "${grpc[@]}" -o "$2" "http://127.0.0.1:$1/bench.v1.Bench/Call" && cmp -s "$2" "$OUT/reply.bin"; }
# port file: one gRPC-Web call: the reply's message, then the trailer frame with grpc-status 0
grpcweb_call() {
  curl -fs --http2-prior-knowledge -X POST --data-binary @"$OUT/call.bin" "${grpcweb[@]}" -o "$2" "http://127.0.0.1:$1/bench.v1.Bench/Call" &&
    head -c "$(stat -c %s "$OUT/reply.bin")" "$2" | cmp -s - "$OUT/reply.bin" && grep -q 'grpc-status: 0' "$2"
}
port() {  # load target: the port that target serves that load on
  case $2 in nginx) [ "$1" = h1 ] && echo "${PORT[nginx-h1]}" || echo "${PORT[nginx-h2]}" ;; *) echo "${PORT[$2]}" ;; esac
}

body=$(printf 'happypath-bench-small-body-%072d' 0)
common="worker_processes 1; daemon off; error_log stderr warn; events { worker_connections 8192; }"
temp="client_body_temp_path $OUT/tmp/b; proxy_temp_path $OUT/tmp/p; fastcgi_temp_path $OUT/tmp/f; uwsgi_temp_path $OUT/tmp/u; scgi_temp_path $OUT/tmp/s;"
proxy="location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }"
served="location / { default_type text/plain; return 200 \"$body\\n\"; }"
if [ -n "$GRPC" ]; then
  # The call and its answer, each one framed message (flag 0, 4-byte length,
  # protobuf bytes: field 1, a 64-byte string). The call's path is no file
  # (404), which error_page turns into the reply file's 200. The call's
  # message is read before the answer (mirror_request_body, to a location
  # that does nothing), as a gRPC server reads it: answered before its DATA
  # frame arrived, the stream would get a frame after its end, which
  # nginx's grpc_pass refuses (502 "upstream sent frame for unknown stream").
  printf '\0\0\0\0\102\n\100%064d' 0 > "$OUT/call.bin"; printf '\0\0\0\0\102\n\100%064d' 1 > "$OUT/reply.bin"
  proxy="location / { grpc_pass grpc://backend; }"
  served="location / { mirror /read; mirror_request_body on; root $OUT/tmp; log_not_found off; error_page 404 =200 /reply.bin; }
    location = /read { internal; return 204; }
    location = /reply.bin { internal; root $OUT; default_type application/grpc; etag off; add_trailer grpc-status 0 always; }"
  upstream_listen=http2
fi
if [ "$GRPC" = tls ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$OUT/tls.key" -out "$OUT/tls.crt" \
    -days 2 -subj /CN=localhost -addext "subjectAltName=DNS:localhost" 2>/dev/null || exit 2
  proxy="location / { grpc_pass grpcs://backend; }"
  upstream_listen="ssl http2"
  served="ssl_certificate $OUT/tls.crt; ssl_certificate_key $OUT/tls.key; $served"
fi
cat > "$OUT/upstream.conf" <<C
$common pid $OUT/tmp/up.pid;
http { access_log off; $temp keepalive_requests 10000000;
  server { listen $UP ${upstream_listen:-} backlog=4096; $served } }
C
# keepalive_requests also bounds the requests of one HTTP/2 connection in
# nginx 1.22 (http2_max_requests is obsolete): without it nginx would send
# GOAWAY every 1,000 streams.
cat > "$OUT/nginx.conf" <<C
$common pid $OUT/tmp/nginx.pid;
http { access_log off; $temp keepalive_requests 10000000; keepalive_timeout 120s;
  upstream backend { server $UP; keepalive 128; keepalive_requests 10000000; }
  server { listen 127.0.0.1:${PORT[nginx-h1]} backlog=4096; $proxy }
  server { listen 127.0.0.1:${PORT[nginx-h2]} http2 backlog=4096; $proxy } }
C
nginx -t -q -p "$OUT/tmp/" -c "$OUT/nginx.conf" || exit 2
spawn upstream 1 nginx -p "$OUT/tmp/" -c "$OUT/upstream.conf"
spawn nginx 0 nginx -p "$OUT/tmp/" -c "$OUT/nginx.conf"
spawn happypath 0 env BENCH_PROFILE="$([ -n "$GRPC" ] && echo grpc || echo foundation)" BENCH_UPSTREAM="$UP" \
  BENCH_UPSTREAM_CA="$([ "$GRPC" = tls ] && echo "$OUT/tls.crt")" BENCH_LISTEN="127.0.0.1:${PORT[happypath]}" BENCH_OUT="$OUT/tmp" \
  HAPPYPATH_BIN="$BIN" "$here/run-happypath-for-bench.sh"
for load in $([ -n "$GRPC" ] && echo grpc || echo h1 h2); do for t in nginx happypath; do
  if [ "$load" = grpc ]; then
    poll 10 grpc_call "$(port h2 "$t")" "$OUT/got-$t.bin" || { echo "$t does not answer a gRPC call on :$(port h2 "$t") (see $OUT/logs)"; exit 1; }
    [ "$t" = nginx ] && continue
    poll 10 grpcweb_call "$(port h2 "$t")" "$OUT/got-web-$t.bin" && continue
    echo "$t does not answer a gRPC-Web call on :$(port h2 "$t") (see $OUT/logs)"; exit 1
  fi
  p=$(port "$load" "$t"); args=(-fs -o /dev/null -w '%{http_version}'); [ "$load" = h2 ] && args+=(--http2-prior-knowledge)
  poll 10 curl "${args[@]}" "http://127.0.0.1:$p/" >/dev/null
  got=$(curl "${args[@]}" "http://127.0.0.1:$p/")
  [ "$got" = "$([ "$load" = h2 ] && echo 2 || echo 1.1)" ] || { echo "$t does not answer $load on :$p (got '$got'; see $OUT/logs)"; exit 1; }
done; done

RESULTS=$OUT/results.tsv
printf 'load\ttarget\trep\trps\trequests\terrors\tcpu_us_per_request\tforeign_pct\n' > "$RESULTS"
measure() {  # load target rep duration
  local load=$1 t=$2 rep=$3 dur=$4 c0 c1 u0 u1 s0 s1 b0 b1 n0 n1 log=$OUT/logs/$1-$2-$3.txt url
  url="http://127.0.0.1:$(port "$load" "$t")/"
  c0=$(ticks "${PID_OF[$t]}"); u0=$(ticks "${PID_OF[upstream]}"); s0=$(self_ticks); b0=$(busy_ticks); n0=$(date +%s%N)
  case $load in
    h1)    taskset -c 1 wrk -t1 -c"$CONNS" -d"$dur" "$url" > "$log" 2>&1 ;;
    h2-m1) taskset -c 1 h2load -t1 -c"$CONNS" -m1 -D "$dur" "$url" > "$log" 2>&1 ;;
    grpc-m1) taskset -c 1 h2load -t1 -c"$CONNS" -m1 -D "$dur" -d "$OUT/call.bin" "${grpc[@]}" "${url}bench.v1.Bench/Call" > "$log" 2>&1 ;;
    grpcweb-m1) taskset -c 1 h2load -t1 -c"$CONNS" -m1 -D "$dur" -d "$OUT/call.bin" "${grpcweb[@]}" "${url}bench.v1.Bench/Call" > "$log" 2>&1 ;;
    grpc-*) taskset -c 1 h2load -t1 -c"$MULTI_CONNS" -m"$MULTI_STREAMS" -D "$dur" -d "$OUT/call.bin" "${grpc[@]}" "${url}bench.v1.Bench/Call" > "$log" 2>&1 ;;
    *)     taskset -c 1 h2load -t1 -c"$MULTI_CONNS" -m"$MULTI_STREAMS" -D "$dur" "$url" > "$log" 2>&1 ;;
  esac
  b1=$(busy_ticks); n1=$(date +%s%N); c1=$(ticks "${PID_OF[$t]}"); u1=$(ticks "${PID_OF[upstream]}"); s1=$(self_ticks)
  [ "$rep" = 0 ] && return 0
  # foreign = CPU busy on the machine minus what the proxy, the upstream and the client used: others' load, in % of one core
  # wrk: "N requests in", socket errors, non-2xx; h2load: "requests: ... N done,
  # ... F failed, E errored, T timeout" (failed counts the answers that were not 2xx/3xx)
  awk -v load="$load" -v t="$t" -v rep="$rep" -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" \
      -v ours="$((c1 - c0 + u1 - u0 + s1 - s0))" -v busy="$((b1 - b0))" -v wall="$(( (n1 - n0) / 1000000 ))" '
    / requests in / { req = $1 } /Requests\/sec/ { rps = $2 }
    /Socket errors/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 } /Non-2xx/ { err += $NF }
    /^finished in / { rps = $4 + 0 }
    /^requests: / { gsub(/,/, ""); req = $6; err += $10 + $12 + $14 }
    END {
      foreign = (busy - ours) * 100 / (wall / 1000 * hz); if (foreign < 0) foreign = 0
      printf "%s\t%s\t%s\t%.0f\t%d\t%d\t%.1f\t%.0f\n", load, t, rep, rps, req, err, req ? c * 1e6 / hz / req : 0, foreign
    }' "$log" |
    tee -a "$RESULTS" | awk -F'\t' '{printf "  %-8s %-10s #%s %8s rps  %6.1f us cpu/request  err %s  foreign %s%%\n", $1, $2, $3, $4, $7, $6, $8}'
}
{
  echo "# deploy/bench/h2.sh $(date -u +%FT%TZ)"
  echo "host: $(uname -r), $(nproc) cpu; $(nginx -v 2>&1 | sed 's/.*: //'); $(h2load --version | head -1); $(wrk -v 2>&1 | awk 'NR==1{print $1, $2}')"
  echo "happypath: $BIN; -d$DURATION, repeats $REPEATS; h1: wrk -t1 -c$CONNS; h2-m1 (grpc-m1): h2load -t1 -c$CONNS -m1; h2-m$MULTI_STREAMS (grpc-m$MULTI_STREAMS): h2load -t1 -c$MULTI_CONNS -m$MULTI_STREAMS${GRPC:+; gRPC unary calls (-d call.bin, content-type application/grpc, te trailers; upstream $([ "$GRPC" = tls ] && echo "TLS, ALPN h2" || echo h2c))}"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/header.txt"
for load in $LOADS; do for t in $(targets "$load"); do measure "$load" "$t" 0 "$WARMUP"; done; done
# interleaved: repeat 1 of every cell, then repeat 2, ... so drifting load hits every cell alike
for rep in $(seq "$REPEATS"); do for load in $LOADS; do for t in $(targets "$load"); do measure "$load" "$t" "$rep" "$DURATION"; done; done; done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$RESULTS" "$BAR" $LOADS <<'PY' | tee "$OUT/summary.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
bar, loads = float(sys.argv[2]), sys.argv[3:]
def med(load, t, k): return statistics.median(float(r[k]) for r in rows if r["load"] == load and r["target"] == t)
def errors(load, t): return sum(int(r["errors"]) for r in rows if r["load"] == load and r["target"] == t)
# gRPC-Web (happypath alone): against happypath's own gRPC row instead of nginx.
web = [load for load in loads if load.startswith("grpcweb")]
loads = [load for load in loads if load not in web]
ratio = {load: med(load, "happypath", "cpu_us_per_request") / med(load, "nginx", "cpu_us_per_request") for load in loads}
def foreign(load, t): return max(float(r["foreign_pct"]) for r in rows if r["load"] == load and r["target"] == t)
print("| load | target | rps (median) | CPU µs per request | errors | foreign CPU % (max) | happypath / nginx (CPU per request) | ÷ HTTP/1.1 ratio | bar |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for load in loads:
    for t in ("nginx", "happypath"):
        r = over = verdict = ""
        if t == "happypath":
            r = f"{ratio[load]:.2f}"
            if load != "h1" and "h1" in ratio:
                over = f"{ratio[load] / ratio['h1']:.2f}"
                verdict = f"≤ {bar}: " + ("met" if ratio[load] / ratio["h1"] <= bar else "**short**")
        print(f"| {load} | {t} | {med(load, t, 'rps'):.0f} | {med(load, t, 'cpu_us_per_request'):.1f} | {errors(load, t)} | "
              f"{foreign(load, t):.0f} | {r} | {over} | {verdict} |")
for load in web:
    base = "grpc-m1"
    cost = med(load, "happypath", "cpu_us_per_request") / med(base, "happypath", "cpu_us_per_request")
    print(f"| {load} | happypath (gRPC-Web) | {med(load, 'happypath', 'rps'):.0f} | {med(load, 'happypath', 'cpu_us_per_request'):.1f} | "
          f"{errors(load, 'happypath')} | {foreign(load, 'happypath'):.0f} | {cost:.2f} × its {base} | | |")
PY
echo "raw: $RESULTS  logs: $OUT/logs"
