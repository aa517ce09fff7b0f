#!/usr/bin/env python3
"""Hostile clients beside the soak's normal traffic, for SECONDS, against the
proxy at HOST:PORT, all on the /hostile/ route (whose answers the soak's
verdict leaves out: they are these clients' own):

  - slow readers: each asks for an 8 MB answer and reads it at 64 KiB/s,
    then asks again;
  - stalled HTTP/2 streams: each connection opens 50 streams with every
    stream window shut (SETTINGS_INITIAL_WINDOW_SIZE 0), asking for 512 KiB
    each, and never reads them (the proxy resets them after client_timeout);
    it opens more as they are reset or end (an outage's error answers), so
    50 stay open;
  - abandoned uploads: each sends the head and 1 MiB of a 4 MiB body, then
    nothing (the proxy answers 408 after client_timeout), then starts over.

Each kind keeps the same number of clients open for the whole run, so what
the proxy holds for them stays level; a client whose connection fails
(an outage, a reset) starts over after a short pause. Plain sockets and
hand-made HTTP/2 frames: no package beyond the standard library.

  hostile.py HOST PORT SECONDS [SLOW STALLED UPLOADS]   (defaults 4 2 4)
"""
import socket
import struct
import sys
import threading
import time

host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
counts = [int(x) for x in sys.argv[4:7]] or [4, 2, 4]
slow_n, stalled_n, upload_n = (counts + [4, 2, 4][len(counts):])[:3]
deadline = time.monotonic() + seconds
done = {"slow_bytes": 0, "slow_answers": 0, "streams": 0, "resets": 0, "uploads": 0}
lock = threading.Lock()


def count(key, n=1):
    with lock:
        done[key] += n


def connect(timeout=60):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return s


def slow_reader():
    while time.monotonic() < deadline:
        try:
            s = connect()
            s.sendall(b"GET /hostile/bytes?n=8000000 HTTP/1.1\r\nHost: soak\r\n\r\n")
            got = 0
            while time.monotonic() < deadline:
                chunk = s.recv(8192)
                if not chunk:
                    break
                got += len(chunk)
                count("slow_bytes", len(chunk))
                if got >= 8000000:
                    count("slow_answers")
                    break
                time.sleep(8192 / (64 * 1024))
            s.close()
        except OSError:
            time.sleep(0.5)


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(index, value):
    """An HPACK field with an indexed name, its value literal, not indexed."""
    v = value.encode()
    return bytes([index]) + bytes([len(v)]) + v  # index < 16, value < 127 bytes


def headers_block(path):
    # :method GET (2), :scheme http (6), then :path and :authority literal.
    return bytes([0x82, 0x86]) + literal(4, path) + literal(1, "soak")


def stalled_streams():
    while time.monotonic() < deadline:
        try:
            s = connect()
            s.settimeout(1)
            settings = struct.pack(">HI", 4, 0) + struct.pack(">HI", 3, 100)  # window 0, 100 streams
            out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, settings)
            next_id = 1
            open_streams = set()
            buf = b""

            def open_more():
                nonlocal next_id, out
                while len(open_streams) < 50 and next_id < 2**31 - 2:
                    block = headers_block("/hostile/bytes?n=524288")
                    out += frame(1, 0x4 | 0x1, next_id, block)  # END_HEADERS | END_STREAM
                    open_streams.add(next_id)
                    count("streams")
                    next_id += 2

            open_more()
            while time.monotonic() < deadline:
                if out:
                    s.sendall(out)
                    out = b""
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    length = int.from_bytes(buf[0:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    payload = buf[9:9 + length]
                    buf = buf[9 + length:]
                    if kind == 4 and not flags & 1:
                        out += frame(4, 1, 0)  # SETTINGS ack
                    elif kind == 6 and not flags & 1:
                        out += frame(6, 1, 0, payload)  # PING ack
                    elif kind == 3 and sid in open_streams:  # RST_STREAM
                        open_streams.discard(sid)
                        count("resets")
                    elif kind in (0, 1) and flags & 1 and sid in open_streams:  # ended (an error answer)
                        open_streams.discard(sid)
                    elif kind == 7:  # GOAWAY
                        raise OSError("goaway")
                open_more()
            s.close()
        except OSError:
            time.sleep(0.5)


def abandoned_upload():
    while time.monotonic() < deadline:
        try:
            s = connect()
            s.sendall(b"POST /hostile/echo HTTP/1.1\r\nHost: soak\r\nContent-Length: 4194304\r\n\r\n")
            s.sendall(b"x" * (1 << 20))
            count("uploads")
            s.settimeout(1)
            while time.monotonic() < deadline:
                try:
                    if not s.recv(65536):
                        break
                except socket.timeout:
                    continue
            s.close()
        except OSError:
            time.sleep(0.5)


threads = [threading.Thread(target=f, daemon=True)
           for f, n in ((slow_reader, slow_n), (stalled_streams, stalled_n), (abandoned_upload, upload_n))
           for _ in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join(max(0.0, deadline - time.monotonic()) + 5)
print("HOSTILE_JSON " + ",".join(f"{k}={v}" for k, v in done.items()), flush=True)
