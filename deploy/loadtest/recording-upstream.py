#!/usr/bin/env python3
"""A recording upstream for the deliver-later scenario (deliver-later.py).

    recording-upstream.py PORT RECORD_FILE

Answers 200 to every POST and records one line per arrival:
`idempotency-key request-id body-sha1 path` (appended to RECORD_FILE and kept
in memory). GET /healthz answers 200 (the proxy's health checks), GET /_stats
answers {"received": N, "unique_keys": M}, GET /_records the lines so far.
HTTP/1.1 keep-alive, one thread per connection. Standard library only."""
import hashlib, json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, record_path = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
lines, keys = [], set()
record_file = open(record_path, "a", buffering=1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key") or "-"
        rid = self.headers.get("X-Request-Id") or "-"
        line = f"{key} {rid} {hashlib.sha1(body).hexdigest()[:16]} {self.path}"
        with lock:  # recorded before the answer: a delivery marked delivered has arrived
            lines.append(line)
            keys.add(key)
            record_file.write(line + "\n")
        self.reply(200, b"ok\n")

    do_PUT = do_POST

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, b"ok\n")
        elif self.path == "/_stats":
            with lock:
                stats = {"received": len(lines), "unique_keys": len(keys)}
            self.reply(200, json.dumps(stats).encode(), "application/json")
        elif self.path == "/_records":
            with lock:
                text = "".join(l + "\n" for l in lines)
            self.reply(200, text.encode())
        else:
            self.reply(404, b"not found\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True


server = Server(("127.0.0.1", port), Handler)
print(f"recording upstream listening on 127.0.0.1:{port}", flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
