import Foundation
import HappyPathCore
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Python with the HTTP/2 packages from PyPI (`h2`, `hyperframe`, `hpack`,
/// `httpx[http2]`), in a virtual environment of its own made once under
/// ~/.cache: for HTTP/2 peers of the proxy, upstreams (`H2Upstream`) and
/// clients alike.
enum PythonH2 {
    static let packages = ["h2", "hyperframe", "hpack", "httpx[http2]"]

    /// The virtual environment's python, made (with `packages`) if missing.
    static func python() throws -> String {
        try pythonVenv(
            "happypath-h2-venv", packages: packages, imports: "import h2.config, h2.connection, hyperframe.frame, hpack, httpx")
    }
}

extension PythonH2 {
    /// Python that speaks raw HTTP/2 frames (hyperframe, hpack: neither
    /// checks what it is given), put before a test's own script:
    /// `H2(port)` connects with the preface and SETTINGS; `headers` and
    /// `data` make frames, `send` sends them; `frames` is one generator per
    /// connection over every frame the proxy sends (SETTINGS acknowledged),
    /// ending when the connection ends or is quiet for 10 s; `ping` returns
    /// once the proxy has read all sent before it; `outcome(sid)` is the
    /// stream's `status NNN`, `reset CODE`, the connection's `goaway CODE`,
    /// or `none`.
    static let rawFrames = #"""
        import socket
        import hpack
        from hyperframe.frame import Frame, SettingsFrame, HeadersFrame, DataFrame, RstStreamFrame, PingFrame, GoAwayFrame

        class H2:
            def __init__(self, port):
                self.s = socket.create_connection(("127.0.0.1", port)); self.s.settimeout(10)
                self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.enc, self.dec = hpack.Encoder(), hpack.Decoder()
                self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
                self.frames = self._frames()
            def headers(self, fields, end=False, sid=1):
                f = HeadersFrame(sid); f.data = self.enc.encode(fields); f.flags.add("END_HEADERS")
                if end: f.flags.add("END_STREAM")
                return f.serialize()
            def data(self, payload, end=False, sid=1):
                f = DataFrame(sid); f.data = payload
                if end: f.flags.add("END_STREAM")
                return f.serialize()
            def send(self, *frames): self.s.sendall(b"".join(frames))
            def _frames(self):
                buf = b""
                while True:
                    while len(buf) >= 9:
                        f, n = Frame.parse_frame_header(memoryview(buf[:9]))
                        if len(buf) < 9 + n: break
                        f.parse_body(memoryview(buf[9:9 + n])); buf = buf[9 + n:]
                        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                            self.s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                        yield f
                    try: chunk = self.s.recv(65536)
                    except (socket.timeout, ConnectionError): return
                    if not chunk: return
                    buf += chunk
            def fields(self, f): return dict(self.dec.decode(f.data))
            def ping(self):
                self.s.sendall(PingFrame(0, opaque_data=b"happy123").serialize())
                for f in self.frames:
                    if isinstance(f, PingFrame) and "ACK" in f.flags: return
            def outcomes(self, names):
                # `names`: stream id -> name. Each stream's `status NNN` or `reset CODE`, and the GOAWAY code (or None).
                done, goaway = {}, None
                for f in self.frames:
                    if isinstance(f, GoAwayFrame): goaway = f.error_code
                    if f.stream_id not in names or f.stream_id in done: continue
                    if isinstance(f, HeadersFrame):
                        status = self.fields(f).get(":status", "")
                        if status: done[f.stream_id] = "status " + status
                    elif isinstance(f, RstStreamFrame): done[f.stream_id] = "reset %d" % f.error_code
                    if len(done) == len(names): break
                return done, goaway
            def outcome(self, sid=1):
                for f in self.frames:
                    if isinstance(f, HeadersFrame) and f.stream_id == sid:
                        status = self.fields(f).get(":status")
                        if status and not status.startswith("1"): return "status " + status
                    elif isinstance(f, RstStreamFrame) and f.stream_id == sid: return "reset %d" % f.error_code
                    elif isinstance(f, GoAwayFrame): return "goaway %d" % f.error_code
                return "none"

        """#

    /// Runs `rawFrames` and `script` with `arguments`; each line of its
    /// output `NAME WHAT…` as NAME → WHAT (the first of a name kept).
    static func runRawFrames(_ script: String, _ arguments: [String], timeout: Double = 120) throws
        -> (lines: [String: String], out: String)
    {
        let r = try runProcess(try python(), ["-c", rawFrames + script] + arguments, timeout: timeout)
        #expect(r.status == 0, "\(r.err)")
        let lines = Dictionary(
            r.out.split(separator: "\n").map { line in
                let words = line.split(separator: " ", maxSplits: 1).map(String.init)
                return (words[0], words.count > 1 ? words[1] : "")
            }, uniquingKeysWith: { a, _ in a })
        return (lines, r.out)
    }
}

/// Runs `script` (with `arguments`) under `python`, its output read line
/// by line: the first line comes back (a script prints what the test needs
/// to reach it, such as its ports), every later one goes to `lines`.
func startPythonScript(
    python: String, _ script: String, arguments: [String] = [], lines: Locked<[String]>
) throws -> (process: Process, firstLine: String) {
    let process = Process()
    let output = Pipe()
    process.executableURL = URL(fileURLWithPath: python)
    process.arguments = ["-u", "-c", script] + arguments
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    try process.run()
    var received = Data()
    while !received.contains(UInt8(ascii: "\n")) {
        let chunk = output.fileHandleForReading.availableData
        guard !chunk.isEmpty else { break }
        received.append(chunk)
    }
    guard let nl = received.firstIndex(of: UInt8(ascii: "\n")) else {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        throw TestError("the Python script printed nothing")
    }
    let first = String(decoding: received[..<nl], as: UTF8.self)
    collectLines(from: output.fileHandleForReading, after: Data(received[(nl + 1)...]), into: lines)
    return (process, first)
}

/// Reads `handle` to its end on a thread of its own, each whole line (after
/// `rest`, what was read already) appended to `lines` as it comes.
func collectLines(from handle: FileHandle, after rest: Data = Data(), into lines: Locked<[String]>) {
    Thread.detachNewThread {
        var pending = rest
        while true {
            while let nl = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let one = String(decoding: pending[pending.startIndex..<nl], as: UTF8.self)
                pending.removeSubrange(pending.startIndex...nl)
                lines.withLock { $0.append(one) }
            }
            let chunk = handle.availableData
            if chunk.isEmpty { return }
            pending.append(chunk)
        }
    }
}

/// An HTTP/2-only upstream (Python `h2`): h2c with prior knowledge on one
/// port, TLS with ALPN `h2` (and nothing else) on another. Each request is
/// printed (and collected in `requests`): its connection's number, its
/// stream id, how the connection was reached (`h2c`, or the ALPN protocol),
/// method, path and fields. The query steers the answer:
/// - `status=NNN` (default 200);
/// - `fail=N&key=K`: the first N requests with key K get 503, later ones the status;
/// - `mute=1`: answered, then the connection reads and answers nothing more
///   (a server dead behind a socket that stays open);
/// - `early=1`: a whole 413 at the request's head, before its body, then
///   RST_STREAM NO_ERROR (the body is not needed);
/// - `refuse=N&key=K`: the first N requests with key K get RST_STREAM
///   REFUSED_STREAM (not processed), later ones the answer;
/// - `delay=MS`: the answer waits that long (streams overlap on a connection);
/// - `trailers=1`: no `content-length`, then trailers `grpc-status: 0` and
///   `x-checksum: c0ffee` after the body;
/// - `size=N`: a body of N bytes of `x`, sent as the flow-control windows allow.
/// The body is JSON: `conn`, `stream`, `path`, `method`, `body_bytes`.
final class H2Upstream: @unchecked Sendable {
    let process: Process
    let plainPort: Int
    let tlsPort: Int
    private let lines = Locked<[String]>([])

    static let script = #"""
import asyncio, itertools, json, ssl, sys
from urllib.parse import urlsplit, parse_qs
import h2.config, h2.connection, h2.events

numbers = itertools.count(1)
failures = {}

class Connection(asyncio.Protocol):
    def connection_made(self, transport):
        self.number = next(numbers)
        self.transport = transport
        tls = transport.get_extra_info("ssl_object")
        self.reached = tls.selected_alpn_protocol() if tls else "h2c"
        peer = tls.getpeercert() if tls else None
        self.client = dict(x[0] for x in peer["subject"]).get("commonName") if peer else None
        self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.streams = {}
        self.window = asyncio.Event()
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.transport.write(data)

    def data_received(self, data):
        if getattr(self, "muted", False): return  # a dead server behind a live socket
        try:
            events = self.conn.receive_data(data)
        except Exception as e:
            print(json.dumps({"error": str(e), "conn": self.number}), flush=True)
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.streams[event.stream_id] = (event.headers, bytearray())
                if "early=1" in dict(event.headers).get(":path", ""):
                    # A whole answer before the request's body, then RST_STREAM NO_ERROR (RFC 9113 section 8.1).
                    self.conn.send_headers(event.stream_id, [(":status", "413"), ("content-length", "5")])
                    self.conn.send_data(event.stream_id, b"early", end_stream=True)
                    self.conn.reset_stream(event.stream_id, error_code=0)
                    del self.streams[event.stream_id]
            elif isinstance(event, h2.events.DataReceived):
                if event.stream_id not in self.streams: continue
                self.streams[event.stream_id][1].extend(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                if event.stream_id in self.streams: asyncio.ensure_future(self.answer(event.stream_id))
            elif isinstance(event, (h2.events.WindowUpdated, h2.events.StreamReset)):
                self.window.set()
        self.flush()

    async def answer(self, stream):
        headers, body = self.streams.pop(stream)
        fields = dict(headers)
        path = fields.get(":path", "/")
        query = {k: v[0] for k, v in parse_qs(urlsplit(path).query).items()}
        print(json.dumps({
            "conn": self.number, "stream": stream, "reached": self.reached, "client": self.client, "method": fields.get(":method"),
            "path": path, "fields": [[k, v] for k, v in headers], "body_bytes": len(body),
        }), flush=True)
        if "refuse" in query:
            key = "refuse:" + query.get("key", "")
            failures[key] = failures.get(key, 0) + 1
            if failures[key] <= int(query["refuse"]):
                self.conn.reset_stream(stream, error_code=7)  # REFUSED_STREAM: not processed
                self.flush()
                return
        if "delay" in query:
            await asyncio.sleep(int(query["delay"]) / 1000)
        status = query.get("status", "200")
        if "fail" in query:
            key = query.get("key", "")
            failures[key] = failures.get(key, 0) + 1
            if failures[key] <= int(query["fail"]):
                status = "503"
        out = json.dumps({
            "conn": self.number, "stream": stream, "path": path, "method": fields.get(":method"), "body_bytes": len(body),
        }).encode()
        trailers = query.get("trailers") == "1"
        head = [(":status", status), ("content-type", "application/json"), ("x-upstream", "h2")]
        if not trailers:
            head.append(("content-length", str(len(out))))
        if "size" in query:
            await self.send_large(stream, head, int(query["size"]))
            return
        self.conn.send_headers(stream, head)
        self.conn.send_data(stream, out, end_stream=not trailers)
        if trailers:
            self.conn.send_headers(stream, [("grpc-status", "0"), ("x-checksum", "c0ffee")], end_stream=True)
        self.flush()
        if query.get("mute") == "1": self.muted = True

    async def send_large(self, stream, head, size):
        # As the windows allow: the client's pace reaches this server.
        self.conn.send_headers(stream, [(":status", "200"), ("content-length", str(size))])
        self.flush()
        sent = 0
        while sent < size:
            try:
                room = min(self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size, size - sent)
            except Exception:
                return  # the stream was reset
            if room <= 0:
                self.window.clear()
                await self.window.wait()
                continue
            self.conn.send_data(stream, b"x" * room, end_stream=sent + room == size)
            sent += room
            self.flush()

async def main():
    loop = asyncio.get_running_loop()
    plain = await loop.create_server(Connection, "127.0.0.1", 0)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[1], sys.argv[2])
    context.set_alpn_protocols(sys.argv[4].split(",") if len(sys.argv) > 4 else ["h2"])
    if len(sys.argv) > 3 and sys.argv[3] != "-":
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(sys.argv[3])
    secure = await loop.create_server(Connection, "127.0.0.1", 0, ssl=context)
    print(plain.sockets[0].getsockname()[1], secure.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""#

    /// `certificate`: the TLS port's (its CA is itself: `TestCertificates`).
    /// `clientCA`: the TLS port requires a client certificate signed by it
    /// (each request's `client` is its common name). `alpn`: what the TLS
    /// port agrees to (only `h2` by default).
    init(certificate: TestCertificates.Pair, clientCA: String? = nil, alpn: [String] = ["h2"]) throws {
        let (process, first) = try startPythonScript(
            python: try PythonH2.python(), Self.script,
            arguments: [certificate.cert, certificate.key, clientCA ?? "-", alpn.joined(separator: ",")], lines: lines)
        let ports = first.split(separator: " ").compactMap { Int($0) }
        guard ports.count == 2 else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw TestError("the HTTP/2 upstream did not start: '\(first)'")
        }
        self.process = process
        plainPort = ports[0]
        tlsPort = ports[1]
    }

    deinit {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// Every request received so far, decoded (one JSON object each).
    var requests: [[String: Any]] {
        lines.withLock { $0 }.compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
    }

    /// The requests whose path starts with `prefix`.
    func requests(to prefix: String) -> [[String: Any]] {
        requests.filter { ($0["path"] as? String)?.hasPrefix(prefix) == true }
    }

    /// The same, once at least `count` of them arrived (each is printed
    /// before it is answered, but read here on a thread of its own).
    func requests(to prefix: String, atLeast count: Int) -> [[String: Any]] {
        waitUntil("\(count) request(s) to \(prefix) at the HTTP/2 upstream") { requests(to: prefix).count >= count }
        return requests(to: prefix)
    }
}
