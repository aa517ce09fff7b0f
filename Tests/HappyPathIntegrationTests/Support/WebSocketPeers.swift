import Foundation

/// Raw RFC 6455 peers in Python (no package needed), for the tunnel tests.
enum WebSocketPeers {
    /// An upstream: `python3 -c server [CERT KEY]` prints its port, then
    /// answers upgrades: `.../echo` echoes every frame and answers a close
    /// with a close; `.../close` sends a text frame and a close, then
    /// closes; `.../refuse` answers 403 with a JSON body; a request without
    /// `Upgrade: websocket` gets `200 plain PATH upgrade=VALUE`. Its 101
    /// carries `X-Seen-Forwarded-For` (what the proxy sent) and the first
    /// subprotocol the client offered; `.../badaccept` answers a 101 whose
    /// `Sec-WebSocket-Accept` does not answer the key.
    static let server = #"""
import asyncio, base64, hashlib, struct, sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

async def read_frame(r):
    b0, b1 = await r.readexactly(2)
    n = b1 & 0x7F
    if n == 126: n = struct.unpack("!H", await r.readexactly(2))[0]
    elif n == 127: n = struct.unpack("!Q", await r.readexactly(8))[0]
    mask = await r.readexactly(4) if b1 & 0x80 else None
    data = await r.readexactly(n)
    if mask: data = bytes(b ^ mask[i % 4] for i, b in enumerate(data)) if n < 4096 else unmask(data, mask)
    return b0 & 0x0F, data

def unmask(data, mask):
    m = int.from_bytes((mask * (len(data) // 4 + 1))[:len(data)], "big")
    return (int.from_bytes(data, "big") ^ m).to_bytes(len(data), "big")

def frame(op, data):
    n = len(data)
    if n < 126: h = struct.pack("!BB", 0x80 | op, n)
    elif n < 65536: h = struct.pack("!BBH", 0x80 | op, 126, n)
    else: h = struct.pack("!BBQ", 0x80 | op, 127, n)
    return h + data

async def handle(r, w):
    try:
        head = await r.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        path = lines[0].split()[1]
        fields = {}
        for l in lines[1:]:
            if ":" in l:
                k, v = l.split(":", 1)
                fields[k.strip().lower()] = v.strip()
        if "websocket" not in fields.get("upgrade", "").lower():
            body = ("plain " + path + " upgrade=" + fields.get("upgrade", "-")).encode()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await w.drain(); w.close(); return
        if path.endswith("/refuse"):
            body = b'{"error":"no sockets for you"}'
            w.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await w.drain(); w.close(); return
        accept = base64.b64encode(hashlib.sha1(fields["sec-websocket-key"].encode() + GUID).digest())
        if path.endswith("/badaccept"): accept = base64.b64encode(b"not the answer to the key!")
        extra = b"X-Seen-Forwarded-For: " + fields.get("x-forwarded-for", "-").encode() + b"\r\n"
        if "sec-websocket-protocol" in fields:
            extra += b"Sec-WebSocket-Protocol: " + fields["sec-websocket-protocol"].split(",")[0].strip().encode() + b"\r\n"
        w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n" + extra + b"\r\n")
        if path.endswith("/close"):
            w.write(frame(1, b"bye") + frame(8, struct.pack("!H", 1000)))
            await w.drain(); w.close(); return
        if path.endswith("/halfclose"):
            # Sends a text frame and ends its side, then reads to the end: prints what came after its end.
            w.write(frame(1, b"bye")); await w.drain(); w.write_eof()
            got = 0
            try:
                while True:
                    op, data = await read_frame(r); got += len(data)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            print("halfclose got", got, flush=True); w.close(); return
        if path.endswith("/deaf"):
            # Reads nothing after its 101: what the client sends waits.
            await w.drain(); await asyncio.sleep(3600); return
        while True:
            op, data = await read_frame(r)
            if op == 8:
                w.write(frame(8, data)); await w.drain(); w.close(); return
            w.write(frame(op, data))
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        w.close()

async def main():
    ctx = None
    if len(sys.argv) > 2:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[1], sys.argv[2])
    s = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 20, backlog=1024, ssl=ctx)
    print(s.sockets[0].getsockname()[1], flush=True)
    await s.serve_forever()

asyncio.run(main())
"""#

    /// A client: `python3 -c client PORT PATH MODE [N] [CAFILE|-|ADMINPORT]`.
    /// Modes: `echo` (N random bytes each way in 64 KiB frames, then a
    /// close), `close` (the upstream closes), `hangup` (close the socket
    /// after the 101), `many` (N tunnels, then idle until closed; the 5th
    /// argument is the admin port). A non-101 answer prints its status and body as JSON.
    static let client = #"""
import asyncio, base64, hashlib, json, os, socket, ssl, struct, sys, threading, urllib.request

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
port, path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
arg = int(sys.argv[4]) if len(sys.argv) > 4 else 0
cafile = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None

def upgrade_request(key):
    return (b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + b"\r\n\r\n")

def accept_of(key):
    return base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()

def frame(op, data):
    mask = os.urandom(4)
    n = len(data)
    if n < 126: h = struct.pack("!BB", 0x80 | op, 0x80 | n)
    elif n < 65536: h = struct.pack("!BBH", 0x80 | op, 0x80 | 126, n)
    else: h = struct.pack("!BBQ", 0x80 | op, 0x80 | 127, n)
    m = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return h + mask + ((int.from_bytes(data, "big") ^ m).to_bytes(n, "big") if n else b"")

class Reader:
    def __init__(self, s): self.s, self.buf = s, b""
    def exactly(self, n):
        while len(self.buf) < n:
            c = self.s.recv(1 << 16)
            if not c: raise EOFError
            self.buf += c
        out, self.buf = self.buf[:n], self.buf[n:]
        return out
    def head(self):
        while b"\r\n\r\n" not in self.buf:
            c = self.s.recv(4096)
            if not c: raise EOFError
            self.buf += c
        h, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return h.decode()
    def frame(self):
        b0, b1 = self.exactly(2)
        n = b1 & 0x7F
        if n == 126: n = struct.unpack("!H", self.exactly(2))[0]
        elif n == 127: n = struct.unpack("!Q", self.exactly(8))[0]
        return b0 & 0x0F, self.exactly(n)
    def eof(self):
        try:
            return self.buf == b"" and self.s.recv(1) == b""
        except (ConnectionError, ssl.SSLError):
            return True

def field(head, name):
    for line in head.split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == name: return v.strip()
    return "-"

async def many(n, admin):
    async def one():
        r, w = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16))
        w.write(upgrade_request(key))
        head = (await r.readuntil(b"\r\n\r\n")).decode()
        assert head.split()[1] == "101" and accept_of(key) in head, head
        return r, w
    tunnels = []
    for i in range(0, n, 50):
        tunnels += await asyncio.gather(*[one() for _ in range(min(50, n - i))])
    def gauge():
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin).read().decode()
        for line in text.splitlines():
            if line.startswith("happypath_tunnels_open "): return float(line.split()[1])
        return -1
    print("open", gauge(), flush=True)
    # Each still works: one small message each way.
    for r, w in tunnels:
        w.write(frame(1, b"ping"))
    echoed = 0
    for r, w in tunnels:
        b = await r.readexactly(6)
        if b[2:] == b"ping": echoed += 1
    print("echoed", echoed, flush=True)
    # Then nothing: the idle timeout closes every one.
    closed = 0
    for r, w in tunnels:
        try:
            if await asyncio.wait_for(r.read(1), 30) == b"": closed += 1
        except (ConnectionError, asyncio.TimeoutError):
            pass
    print("idle-closed", closed, flush=True)

if mode == "many":
    asyncio.run(many(arg, int(sys.argv[5])))
    sys.exit(0)

s = socket.create_connection(("127.0.0.1", port))
if cafile:
    s = ssl.create_default_context(cafile=cafile).wrap_socket(s, server_hostname="localhost")
key = base64.b64encode(os.urandom(16))
s.sendall(upgrade_request(key))
r = Reader(s)
head = r.head()
status = head.split()[1]
if status != "101":
    print(json.dumps({"status": int(status), "body": r.buf.decode(errors="replace"), "upgrade": field(head, "upgrade")}))
    sys.exit(0)
assert field(head, "sec-websocket-accept") == accept_of(key), head
print("xff", field(head, "x-seen-forwarded-for"))
if mode == "close":
    op, data = r.frame(); assert op == 1 and data == b"bye", (op, data)
    op, data = r.frame(); assert op == 8, op
    print("closed-by-upstream", r.eof())
elif mode == "hangup":
    s.close()
    print("hung-up")
else:
    payload = os.urandom(arg)
    chunk = 64 * 1024
    got = []
    def read():
        n = 0
        while n < arg:
            op, data = r.frame()
            got.append(data); n += len(data)
    t = threading.Thread(target=read); t.start()
    for i in range(0, arg, chunk):
        s.sendall(frame(2, payload[i:i + chunk]))
    t.join()
    same = b"".join(got) == payload
    s.sendall(frame(8, struct.pack("!H", 1000)))
    op, data = r.frame()
    print("echo", same, "close", op == 8, "eof", r.eof())
"""#
}
