# Sourced by the load-test and soak scripts: free_ports N prints N loopback
# ports that were free a moment ago (bound together, so all different, then
# released), so a run never meets another run, or a leftover process, on a
# fixed port. alive PID WHAT fails the run if a process it started is gone
# (a port taken after all: its health check would have been answered by
# whoever holds it).
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
alive() { kill -0 "$1" 2>/dev/null || { echo "$2 (pid $1) exited at start: is its port taken?"; exit 1; }; }
