#!/usr/bin/env bash
# happypath next to nginx, HAProxy and Caddy (all Debian packages), all in
# front of one nginx upstream on loopback, loaded by wrk. Self-contained: needs
# only nginx, haproxy, caddy, wrk, curl, taskset, python3 (make bench-deps).
#
# happypath runs twice: `happypath` is the foundation profile (one route, no
# policies, log `warning`), `happypath-policies` is config/happypath.yaml with
# every policy on and the access log at `info` (run-happypath-for-bench.sh).
#
#   HAPPYPATH_BIN=.build/release/happypath deploy/bench/peers.sh
#   # also an older build as a second target, in the same interleaved run:
#   HAPPYPATH_BIN=... BASELINE_BIN=/tmp/hp-old/.build/release/happypath deploy/bench/peers.sh
#
# Knobs (environment):
#   REPEATS=3          measured runs per (target, body); the table shows medians
#   DURATION=10s       wrk -d of a measured run (WARMUP=2s: one unrecorded run first)
#   BODIES="small 16k" small = 100-byte `return 200`, 16k = a 16,384-byte file
#   MODES="pinned unpinned"  pinned: every proxy on CPU 0, upstream + wrk on CPU 1;
#                      unpinned: no taskset at all
#   WORKERS=1          happypath's workers = nginx's worker_processes = HAProxy's
#                      nbthread = Caddy's GOMAXPROCS
#   RSS_CONNS=400      after the measured runs (first mode), wrk -c$RSS_CONNS on
#                      /16k for RSS_DURATION=10s, then each target's resident
#                      memory (VmRSS and peak VmHWM, its whole process tree)
#   CONNS=64           wrk -c (always -t1)
#   TARGETS            default: direct nginx haproxy caddy happypath happypath-policies [BASELINE_NAME]
#   BASELINE_BIN, BASELINE_NAME (default happypath-base): a second happypath binary
#   PORT_BASE=18380    upstream +1, direct = upstream, proxies +2 ...
#   OUT=/tmp/happypath-bench.<time>
#
# CPU per request = (utime + stime of the target's process tree, from
# /proc/PID/stat, over the wrk run) / requests wrk completed. On a shared
# 2-core machine it is the steadiest figure; rps and latency move with load.
# Every process started here is stopped by its PID on exit.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../loadtest/lib.sh"

REPEATS=${REPEATS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
BODIES=${BODIES:-small 16k}
MODES=${MODES:-pinned unpinned}
WORKERS=${WORKERS:-1}
RSS_CONNS=${RSS_CONNS:-400}
RSS_DURATION=${RSS_DURATION:-10s}
CONNS=${CONNS:-64}
PORT_BASE=${PORT_BASE:-18380}
BASELINE_BIN=${BASELINE_BIN:-}
BASELINE_NAME=${BASELINE_NAME:-happypath-base}
OUT=${OUT:-/tmp/happypath-bench.$(date +%Y%m%d-%H%M%S)}
if [ -z "${TARGETS:-}" ]; then
  TARGETS="direct nginx haproxy caddy happypath happypath-policies"
  [ -n "$BASELINE_BIN" ] && TARGETS="$TARGETS $BASELINE_NAME"
fi

need nginx; need haproxy; need caddy; need wrk; need curl; need taskset util-linux; need python3
need_binary release

mkdir -p "$OUT/conf" "$OUT/logs" "$OUT/www" "$OUT/tmp"
exec > >(tee -a "$OUT/run.log") 2>&1
UP=127.0.0.1:$((PORT_BASE + 1))
declare -A PORT=([direct]=$((PORT_BASE + 1)) [nginx]=$((PORT_BASE + 2)) [haproxy]=$((PORT_BASE + 3))
                 [caddy]=$((PORT_BASE + 4)) [happypath]=$((PORT_BASE + 5)) [happypath-policies]=$((PORT_BASE + 7)))
PORT[$BASELINE_NAME]=$((PORT_BASE + 6))   # happypath admin ports are listen + 100

# ---- processes: started in the background (lib.sh's start_bg), remembered,
# stopped by PID (its cleanup: at exit, and after each mode) ----
declare -A PID_OF=()
spawn() {  # name cpu-or-empty command...
  local name=$1 cpu=$2; shift 2
  if [ -n "$cpu" ]; then start_bg taskset -c "$cpu" "$@" >"$OUT/logs/$name.log" 2>&1
  else start_bg "$@" >"$OUT/logs/$name.log" 2>&1; fi
  PID_OF[$name]=$!
}
trap 'exit 130' INT TERM

tree_kb() {  # the sum of a /proc/PID/status field (VmRSS, VmHWM) over a PID and its children, in KiB
  local p t=0
  for p in $1 $(pgrep -P "$1" | tr '\n' ' '); do
    [ -r /proc/$p/status ] && t=$((t + $(awk -v f="$2:" '$1 == f {print $2}' /proc/$p/status)))
  done
  echo $t
}
tree_ticks() {  # utime+stime of a PID and its children (nginx master + worker), in clock ticks; $2=sys: stime only
  local pids p t=0 f='$12 + $13'
  [ "${2:-}" = sys ] && f='$13'
  pids="$1 $(pgrep -P "$1" | tr '\n' ' ')"
  for p in $pids; do
    [ -r /proc/$p/stat ] && t=$((t + $(awk "{sub(/.*\\) /, \"\"); print $f}" /proc/$p/stat)))
  done
  echo $t
}
self_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13 + $14 + $15}' /proc/$$/stat; }  # this shell + reaped children (wrk)
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit}' /proc/stat; }

up_at() { poll 10 curl -fs -o /dev/null --max-time 1 "$1"; }  # url: wait up to 10 s for a 200

# ---- configurations ----
head -c 16384 /dev/zero | tr '\0' 'k' > "$OUT/www/16k"
small=$(printf 'happypath-bench-small-body-%072d' 0)  # 99 bytes + the newline
nginx_conf() {  # name port proxy-or-empty workers
  cat <<EOF
worker_processes $4;
daemon off;
pid $OUT/tmp/$1.pid;
error_log $OUT/logs/$1.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $OUT/tmp/$1.body; proxy_temp_path $OUT/tmp/$1.proxy;
  fastcgi_temp_path $OUT/tmp/$1.fcgi; uwsgi_temp_path $OUT/tmp/$1.uwsgi; scgi_temp_path $OUT/tmp/$1.scgi;
  keepalive_requests 10000000;
  keepalive_timeout 120s;
EOF
  if [ -z "${3:-}" ]; then cat <<EOF
  sendfile on;
  open_file_cache max=8;
  server {
    listen 127.0.0.1:$2 backlog=4096;
    location = /16k { root $OUT/www; default_type application/octet-stream; }
    location / { default_type text/plain; return 200 "$small\n"; }
  }
}
EOF
  else cat <<EOF
  upstream backend { server $UP; keepalive 128; keepalive_requests 10000000; }
  server {
    listen 127.0.0.1:$2 backlog=4096;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
  fi
}
nginx_conf upstream "${PORT[direct]}" "" 1 > "$OUT/conf/upstream.conf"
nginx_conf nginx "${PORT[nginx]}" proxy "$WORKERS" > "$OUT/conf/nginx.conf"
cat > "$OUT/conf/haproxy.cfg" <<EOF
global
  nbthread $WORKERS
  maxconn 8192
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend bench
  bind 127.0.0.1:${PORT[haproxy]}
  default_backend upstream
backend upstream
  server up $UP
EOF
cat > "$OUT/conf/Caddyfile" <<EOF
{
  admin off
  auto_https off
}
http://127.0.0.1:${PORT[caddy]} {
  reverse_proxy $UP
}
EOF
nginx -t -q -p "$OUT/tmp/" -c "$OUT/conf/upstream.conf" -e "$OUT/logs/nginx-t.err" || exit 2
nginx -t -q -p "$OUT/tmp/" -c "$OUT/conf/nginx.conf" -e "$OUT/logs/nginx-t.err" || exit 2
haproxy -c -q -f "$OUT/conf/haproxy.cfg" || exit 2

start_target() {  # target cpu
  case $1 in
    direct)  ;;  # the upstream itself, already running
    nginx)   spawn nginx "$2" nginx -p "$OUT/tmp/" -c "$OUT/conf/nginx.conf" -e "$OUT/logs/nginx.err" ;;
    haproxy) spawn haproxy "$2" haproxy -db -f "$OUT/conf/haproxy.cfg" ;;
    caddy)   spawn caddy "$2" env GOMAXPROCS="$WORKERS" HOME="$OUT/tmp" XDG_DATA_HOME="$OUT/tmp" XDG_CONFIG_HOME="$OUT/tmp" \
               caddy run --adapter caddyfile --config "$OUT/conf/Caddyfile" ;;
    happypath|happypath-policies)
             spawn "$1" "$2" env BENCH_UPSTREAM="$UP" BENCH_LISTEN="127.0.0.1:${PORT[$1]}" BENCH_WORKERS="$WORKERS" \
               BENCH_PROFILE="$([ "$1" = happypath ] && echo foundation || echo policies)" \
               BENCH_OUT="$OUT/conf" HAPPYPATH_BIN="$BIN" "$here/run-happypath-for-bench.sh" ;;
    "$BASELINE_NAME") spawn "$1" "$2" env BENCH_UPSTREAM="$UP" BENCH_LISTEN="127.0.0.1:${PORT[$1]}" BENCH_WORKERS="$WORKERS" \
               BENCH_OUT="$OUT/conf" HAPPYPATH_BIN="$BASELINE_BIN" "$here/run-happypath-for-bench.sh" ;;
    *) echo "unknown target $1" >&2; exit 2 ;;
  esac
}
path_of() { [ "$1" = small ] && echo /small || echo "/$1"; }

# ---- one wrk run -> one line of results.tsv ----
RESULTS=$OUT/results.tsv
printf 'target\trss_kib\thwm_kib\trequests\terrors\n' > "$OUT/rss.tsv"
printf 'mode\ttarget\tbody\trep\trps\tp50_us\tp99_us\trequests\terrors\tcpu_s\tsys_s\tforeign_pct\n' > "$RESULTS"
measure() {  # mode target body rep duration loadcpu
  local mode=$1 t=$2 body=$3 rep=$4 dur=$5 lcpu=$6 pid c0 c1 b0 b1 w0 w1 s0 s1 n0 n1 k0 k1 log
  pid=${PID_OF[$t]:-${PID_OF[upstream]}}
  log=$OUT/logs/wrk-$mode-$t-$body-$rep.txt
  c0=$(tree_ticks "$pid"); k0=$(tree_ticks "$pid" sys); w0=$(tree_ticks "${PID_OF[upstream]}"); s0=$(self_ticks); b0=$(busy_ticks); n0=$(date +%s%N)
  if [ -n "$lcpu" ]; then taskset -c "$lcpu" wrk -t1 -c"$CONNS" -d"$dur" --latency "http://127.0.0.1:${PORT[$t]}$(path_of "$body")" > "$log" 2>&1
  else wrk -t1 -c"$CONNS" -d"$dur" --latency "http://127.0.0.1:${PORT[$t]}$(path_of "$body")" > "$log" 2>&1; fi
  b1=$(busy_ticks); n1=$(date +%s%N); c1=$(tree_ticks "$pid"); k1=$(tree_ticks "$pid" sys); w1=$(tree_ticks "${PID_OF[upstream]}"); s1=$(self_ticks)
  [ "$rep" = 0 ] && return 0
  # foreign = CPU busy on the machine minus what the target, the upstream and wrk used: others' load, in % of one core
  awk -v mode="$mode" -v t="$t" -v body="$body" -v rep="$rep" -v hz="$(getconf CLK_TCK)" \
      -v c="$((c1 - c0))" -v k="$((k1 - k0))" -v w="$((w1 - w0))" -v me="$((s1 - s0))" -v wall="$(( (n1 - n0) / 1000000 ))" -v b0="$b0" -v b1="$b1" -v self="$([ "$t" = direct ] && echo 1 || echo 0)" '
    function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; if (v ~ /s$/) return v * 1e6; return v }
    /^ +50%/ { p50 = us($2) } /^ +99%/ { p99 = us($2) }
    / requests in / { req = $1; secs = $4 + 0 }
    /Requests\/sec/ { rps = $2 }
    /Socket errors/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 }
    /Non-2xx/ { err += $NF }
    END {
      split(b0, x, " "); split(b1, y, " ")
      ours = c + (self ? 0 : w) + me
      foreign = (y[1] - x[1] - ours) * 100 / (wall / 1000 * hz); if (foreign < 0) foreign = 0
      printf "%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\t%d\t%d\t%.2f\t%.2f\t%.0f\n", mode, t, body, rep, rps, p50, p99, req, err, c / hz, k / hz, foreign
    }' "$log" | tee -a "$RESULTS" | awk -F'\t' '{printf "  %-8s %-15s %-5s #%s %8s rps  p50 %6.2f ms  p99 %6.2f ms  cpu %5.2f s  err %s  foreign %s%%\n", $1, $2, $3, $4, $5, $6/1000, $7/1000, $10, $9, $12}'
}

# ---- header ----
{
  echo "# deploy/bench/peers.sh $(date -u +%FT%TZ)"
  echo "host: $(uname -r), $(nproc) cpu, $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
  echo "versions: $(nginx -v 2>&1 | sed 's/.*: //'), haproxy $(haproxy -v | awk 'NR==1{print $3}'), $(wrk -v 2>&1 | awk 'NR==1{print $1, $2}')$(command -v caddy >/dev/null && echo ", caddy $(caddy version | awk '{print $1}')")"
  echo "happypath: $BIN${BASELINE_BIN:+; $BASELINE_NAME: $BASELINE_BIN}"
  echo "wrk -t1 -c$CONNS -d$DURATION, warm-up $WARMUP, repeats $REPEATS, modes [$MODES], bodies [$BODIES], targets [$TARGETS]"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "output: $OUT"
} | tee "$OUT/header.txt"

for mode in $MODES; do
  case $mode in
    pinned)   pcpu=0; lcpu=1 ;;
    unpinned) pcpu=""; lcpu="" ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  echo "== $mode"
  spawn upstream "$lcpu" nginx -p "$OUT/tmp/" -c "$OUT/conf/upstream.conf" -e "$OUT/logs/upstream.err"
  up_at "http://$UP/small" || { echo "upstream did not start (see $OUT/logs/)"; exit 1; }
  ready=()
  for t in $TARGETS; do
    start_target "$t" "$pcpu"
    if ! up_at "http://127.0.0.1:${PORT[$t]}/small"; then echo "  $t did not answer: skipped (see $OUT/logs/$t.log)"; continue; fi
    ok=1
    for b in $BODIES; do
      got=$(curl -s -o /dev/null -w '%{http_code}/%{size_download}' "http://127.0.0.1:${PORT[$t]}$(path_of "$b")")
      want=200/$([ "$b" = small ] && echo 100 || echo 16384)
      [ "$got" = "$want" ] || { echo "  $t $(path_of "$b") gave $got, want $want: skipped"; ok=0; }
    done
    [ $ok = 1 ] && ready+=("$t")
  done
  for b in $BODIES; do for t in "${ready[@]}"; do measure "$mode" "$t" "$b" 0 "$WARMUP" "$lcpu"; done; done
  # interleaved: repeat 1 of every cell, then repeat 2, ... so drifting load hits every target alike
  for rep in $(seq "$REPEATS"); do
    for b in $BODIES; do for t in "${ready[@]}"; do measure "$mode" "$t" "$b" "$rep" "$DURATION" "$lcpu"; done; done
  done
  if [ "$mode" = "${MODES%% *}" ] && [ "$RSS_CONNS" -gt 0 ]; then
    echo "== resident memory after wrk -t1 -c$RSS_CONNS -d$RSS_DURATION on /16k"
    for t in "${ready[@]}"; do
      [ "$t" = direct ] && continue
      log=$OUT/logs/wrk-rss-$t.txt
      if [ -n "$lcpu" ]; then taskset -c "$lcpu" wrk -t1 -c"$RSS_CONNS" -d"$RSS_DURATION" "http://127.0.0.1:${PORT[$t]}/16k" > "$log" 2>&1
      else wrk -t1 -c"$RSS_CONNS" -d"$RSS_DURATION" "http://127.0.0.1:${PORT[$t]}/16k" > "$log" 2>&1; fi
      err=$(awk '/Socket errors/ { gsub(/,/, ""); e += $4 + $6 + $8 + $10 } /Non-2xx/ { e += $NF } END { print e + 0 }' "$log")
      printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$(tree_kb "${PID_OF[$t]}" VmRSS)" "$(tree_kb "${PID_OF[$t]}" VmHWM)" \
        "$(awk '/ requests in /{print $1}' "$log")" "$err" | tee -a "$OUT/rss.tsv" | awk -F'\t' '{printf "  %-18s RSS %6.1f MiB  peak %6.1f MiB  (%s requests, %s errors)\n", $1, $2/1024, $3/1024, $4, $5}'
    done
  fi
  cleanup; PID_OF=()
done

echo
python3 "$here/peers-table.py" "$RESULTS" "$OUT/rss.tsv" | tee "$OUT/summary.md"
echo
echo "raw: $RESULTS  logs: $OUT/logs  configs: $OUT/conf"
