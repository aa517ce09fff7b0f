# Sourced (not run) by the load-test, soak and bench scripts:
#   . "$HERE/lib.sh"   (deploy/loadtest/*.sh)
#   . "$HERE/../loadtest/lib.sh"   (deploy/soak/run.sh, deploy/bench/*.sh)
# What they all did, once. Messages go to stderr. Works with and without
# `set -e`: need and need_binary exit 2 (something to install or build),
# wait_http exits 1 (the run failed), poll returns 1 when it gives up, the
# rest return 0.
#
#   need TOOL [PACKAGE]   exit 2 unless TOOL is on PATH, naming the Debian
#                         package that has it (default: TOOL)
#   need_binary debug|release [PATH]
#                         BIN = PATH, else $HAPPYPATH_BIN, else this checkout's
#                         .build/debug|release/happypath; exit 2 unless executable
#   free_ports N          N loopback ports free a moment ago (bound together,
#                         so all different, then released): a run never meets
#                         another run, or a leftover process, on a fixed port
#   start_bg CMD...       CMD in the background, remembered for cleanup; the
#                         caller redirects (start_bg x >log 2>&1) and reads $!
#   stop PID [SIGNAL]     SIGNAL (default TERM) to a process started here, and
#                         wait for it
#   cleanup               the EXIT trap (sourcing sets it): every process
#                         start_bg started that is still this shell's child
#                         gets SIGTERM, 5 s to exit, then SIGKILL. Only those:
#                         a PID the kernel gave to someone else since is left
#                         alone. peers.sh also calls it between two modes.
#   poll SECONDS CMD...   run CMD every 0.1 s until it succeeds (0), at least
#                         SECONDS s (1 if it never did)
#   wait_http PID WHAT URL [LOG]
#                         wait up to 10 s for URL to answer 2xx from the
#                         process PID just started; exit 1 naming WHAT (and
#                         LOG, where its output goes) if it never does, or if
#                         PID exits first, or is gone once URL answers (its
#                         port was taken: whoever holds it answered)

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "missing $1: apt-get install -y ${2:-$1}" >&2; exit 2; }
}

need_binary() {
  local build="swift build"; [ "$1" = release ] && build="swift build -c release"
  BIN=${2:-${HAPPYPATH_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.build/$1/happypath}}
  [ -x "$BIN" ] || { echo "no happypath binary at $BIN ($build, or set HAPPYPATH_BIN)" >&2; exit 2; }
}

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

PIDS=()
start_bg() { "$@" & PIDS+=($!); }

stop() { kill -s "${2:-TERM}" "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# Every command here succeeds or is guarded: under `set -e` a failure in an
# EXIT trap would end it early and replace the script's exit status.
cleanup() {
  local p stat ppid mine=()
  for p in ${PIDS[@]+"${PIDS[@]}"}; do
    stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    read -r _ ppid _ <<<"${stat##*) }"
    if [ "$ppid" = "$$" ]; then mine+=("$p"); fi
  done
  PIDS=()
  [ ${#mine[@]} -gt 0 ] || return 0
  kill "${mine[@]}" 2>/dev/null || true
  poll 5 _gone "${mine[@]}" || kill -s KILL "${mine[@]}" 2>/dev/null || true
  wait "${mine[@]}" 2>/dev/null || true
}
trap cleanup EXIT
_gone() { local p; for p in "$@"; do ! kill -0 "$p" 2>/dev/null || return 1; done; }

poll() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -le "$end" ] || return 1
    sleep 0.1
  done
}

wait_http() {
  local pid=$1 what=$2 url=$3 log=${4:+ (its log: $4)}
  poll 10 _answered_or_gone "$pid" "$url" || { echo "$what (pid $pid) did not answer $url within 10 s$log" >&2; exit 1; }
  kill -0 "$pid" 2>/dev/null || { echo "$what (pid $pid) exited at start: is its port taken?$log" >&2; exit 1; }
}
_answered_or_gone() { ! kill -0 "$1" 2>/dev/null || curl -sf --max-time 2 -o /dev/null "$2"; }
