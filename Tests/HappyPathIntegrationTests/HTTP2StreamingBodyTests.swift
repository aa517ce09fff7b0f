import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// HTTP/2 request bodies stream to the upstream as the client sends them
/// (issue 33): the upstream has the first bytes before the client sends the
/// rest, a client whose upstream does not read stops at its window, a retry
/// sends the whole body again while it is kept (and there is no retry once
/// it is not), a body past the limit mid-way is a 413, a client's reset ends
/// the upstream's request, and a gRPC bidirectional call (the client's next
/// message waits for the server's answer to the last) completes.
/// Real Python `h2` clients over raw sockets, real HTTP/1.1 and HTTP/2
/// upstreams in Python; marker files in a folder of the test's own carry
/// "the upstream has the first bytes" and "read now" between them.
@Suite(.serialized) struct HTTP2StreamingBodyTests {
    /// Upstreams: `h1` (raw HTTP/1.1, a thread per connection) or `h2`
    /// (h2c, Python `h2`). Each request prints `req KEY`; its first body
    /// bytes touch `DIR/KEY.first` and print `first KEY` (its head: `DIR/KEY.req`, `req KEY`); its end prints
    /// `done KEY TOTAL` and answers JSON `{total, sha, te, cl}`. Query:
    /// `key=K`; `wait=F`: read nothing until `DIR/F` exists (h1);
    /// `cut=N`: the first request with this key is cut once N bytes arrived
    /// (h1). A request cut by the proxy prints `eof KEY` (h1).
    static let upstream = #"""
        import socket, threading, sys, os, time, hashlib, json
        d, kind = sys.argv[1], sys.argv[2]
        cuts = {}
        lock = threading.Lock()
        said = threading.Lock()
        def say(*words):
            # One line at a time: threads printing at once would interleave their words.
            with said: print(*words, flush=True)
        def query(target):
            path, _, q = target.partition("?")
            return dict(p.split("=", 1) for p in q.split("&") if "=" in p)
        def touch(key, what="first"):
            open(os.path.join(d, key + "." + what), "w").close()
            say(what, key)
        class Cut(Exception): pass
        def h1(c):
            f = c.makefile("rb")
            while True:
                line = f.readline()
                if not line: return
                method, target, _ = line.decode().split(" ", 2)
                headers = {}
                while True:
                    h = f.readline()
                    if h in (b"\r\n", b"\n", b""): break
                    k, v = h.decode().split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                q = query(target); key = q.get("key", "x")
                touch(key, "req")
                st = {"h": hashlib.sha256(), "n": 0}
                def got(b):
                    if not b: return
                    if st["n"] == 0: touch(key)
                    st["h"].update(b); st["n"] += len(b)
                    if "cut" in q and st["n"] >= int(q["cut"]):
                        with lock:
                            n = cuts.get(key, 0); cuts[key] = n + 1
                        if n == 0: raise Cut()
                if "wait" in q:
                    while not os.path.exists(os.path.join(d, q["wait"])): time.sleep(0.01)
                try:
                    if headers.get("transfer-encoding") == "chunked":
                        while True:
                            size_line = f.readline()
                            if not size_line: raise EOFError()
                            size = int(size_line.split(b";")[0], 16)
                            if size == 0:
                                while f.readline() not in (b"\r\n", b"\n", b""): pass
                                break
                            left = size
                            while left:
                                b = f.read1(min(left, 65536))
                                if not b: raise EOFError()
                                got(b); left -= len(b)
                            f.readline()
                    else:
                        left = int(headers.get("content-length", "0"))
                        while left:
                            b = f.read1(min(left, 65536))
                            if not b: raise EOFError()
                            got(b); left -= len(b)
                except Cut:
                    c.shutdown(socket.SHUT_RDWR); c.close(); return
                except (EOFError, ConnectionError):
                    say("eof", key); return
                body = json.dumps({"total": st["n"], "sha": st["h"].hexdigest(),
                    "te": headers.get("transfer-encoding"), "cl": headers.get("content-length")}).encode()
                say("done", key, st["n"])
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        def h2c(c):
            import h2.connection, h2.config, h2.events
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
            conn.initiate_connection(); c.sendall(conn.data_to_send())
            st = {}
            while True:
                data = c.recv(65536)
                if not data: return
                for e in conn.receive_data(data):
                    if isinstance(e, h2.events.RequestReceived):
                        hd = dict((k.decode(), v.decode()) for k, v in e.headers)
                        key = query(hd[":path"]).get("key", "x")
                        touch(key, "req")
                        st[e.stream_id] = {"key": key, "h": hashlib.sha256(), "n": 0, "cl": hd.get("content-length")}
                    elif isinstance(e, h2.events.DataReceived):
                        s = st[e.stream_id]
                        if e.data and s["n"] == 0: touch(s["key"])
                        s["h"].update(e.data); s["n"] += len(e.data)
                        conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                    elif isinstance(e, h2.events.StreamEnded):
                        s = st.pop(e.stream_id)
                        say("done", s["key"], s["n"])
                        body = json.dumps({"total": s["n"], "sha": s["h"].hexdigest(), "te": None, "cl": s["cl"]}).encode()
                        conn.send_headers(e.stream_id, [(":status", "200"), ("content-type", "application/json"),
                            ("content-length", str(len(body)))])
                        conn.send_data(e.stream_id, body, end_stream=True)
                out = conn.data_to_send()
                if out: c.sendall(out)
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0)); srv.listen(64)
        print(srv.getsockname()[1], flush=True)
        while True:
            c, _ = srv.accept()
            threading.Thread(target=h1 if kind == "h1" else h2c, args=(c,), daemon=True).start()
        """#

    /// The client: `PORT DIR MODE`; each outcome a line.
    static let client = #"""
        import socket, sys, os, time, json, hashlib
        import h2.connection, h2.config, h2.events, h2.exceptions
        port, d, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames would wait on the peer's delayed ACK
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        c.initiate_connection(); s.sendall(c.data_to_send())
        events = []
        def flush():
            out = c.data_to_send()
            if out: s.sendall(out)
        def receive(timeout):
            s.settimeout(timeout)
            data = s.recv(65536)
            if not data: raise EOFError()
            for e in c.receive_data(data):
                events.append(e)
                if isinstance(e, h2.events.DataReceived):
                    c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            flush()
        def ended(sid):
            return any(isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == sid for e in events)
        def answer(sid):
            while not ended(sid): receive(30)
            status, body = None, b""
            for e in events:
                if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid: status = dict(e.headers)[":status"]
                if isinstance(e, h2.events.DataReceived) and e.stream_id == sid: body += e.data
            return status, body
        def wait_file(name, timeout=10):
            end = time.time() + timeout
            while time.time() < end:
                if os.path.exists(os.path.join(d, name)): return True
                time.sleep(0.01)
            return False
        def open_stream(path, method="POST", extra=(), end=False):
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, [(":method", method), (":scheme", "http"), (":authority", "x"), (":path", path)] + list(extra),
                           end_stream=end)
            flush()
            return sid
        def send(sid, data, end=False, blocked_after=None):
            # As the windows allow; returns the bytes sent before a quiet
            # `blocked_after` seconds with a closed window, or None.
            i = 0
            while i < len(data):
                if ended(sid): return None  # answered (and reset) before the end: stop sending
                n = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, len(data) - i)
                if n == 0:
                    try: receive(blocked_after or 30)
                    except socket.timeout:
                        if blocked_after: return i
                        raise
                    continue
                c.send_data(sid, data[i:i + n]); i += n; flush()
            if end and not ended(sid): c.end_stream(sid); flush()
            return None
        def summary(status, body):
            if status != "200": return "%s -" % status
            j = json.loads(body)
            return "%s %d %s te=%s cl=%s" % (status, j["total"], j["sha"][:16], j["te"], j["cl"])
        def sha(b): return hashlib.sha256(b).hexdigest()[:16]

        if mode == "order":
            for key, extra in (("chunk", ()), ("len", (("content-length", "10"),))):
                sid = open_stream("/up?key=" + key, extra=extra)
                send(sid, b"part1")
                seen = wait_file(key + ".first")
                send(sid, b"part2", end=True)
                print("order", key, seen, summary(*answer(sid)), sha(b"part1part2"), flush=True)
        elif mode == "get":
            # END_STREAM on the HEADERS: no body, so none goes upstream (no length, no chunks).
            sid = open_stream("/up?key=get", method="GET", end=True)
            print("get", summary(*answer(sid)), flush=True)
            # A body that came whole with its head is read whole: sent with its length.
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/up?key=whole1")])
            c.send_data(sid, b"0123456789", end_stream=True)
            flush()
            print("whole1", summary(*answer(sid)), flush=True)
        elif mode == "late":
            # Nothing of the body yet when the try starts: its first read waits.
            sid = open_stream("/up?key=late")
            seen = wait_file("late.req")
            send(sid, b"late body", end=True)
            print("late", seen, summary(*answer(sid)), flush=True)
        elif mode == "push":
            body = bytes(range(256)) * (32 * 4096)  # 32 MiB
            sid = open_stream("/up?key=push&wait=go")
            sent = send(sid, body, blocked_after=2)
            print("blocked", sent is not None and sent < len(body), os.path.exists(os.path.join(d, "push.first")), flush=True)
            open(os.path.join(d, "go"), "w").close()
            send(sid, body[sent or 0:] if sent is not None else b"", end=True)
            print("push", summary(*answer(sid)), sha(body), flush=True)
        elif mode in ("retry", "noretry"):
            body = bytes(range(256)) * 4096  # 1 MiB
            key = mode
            sid = open_stream("/up?key=%s&cut=%s" % (key, "200000" if mode == "retry" else "600000"), method="PUT")
            send(sid, body, end=True)
            print(mode, summary(*answer(sid)), sha(body), flush=True)
        elif mode == "whole":
            body = bytes(range(256)) * (2 * 4096)  # 2 MiB
            sid = open_stream("/up?key=whole")
            send(sid, body, end=True)
            print("whole", summary(*answer(sid)), sha(body), flush=True)
        elif mode == "toolarge":
            body = bytes(range(256)) * (8 * 4096)  # 2 MiB, no content-length
            sid = open_stream("/up?key=big")
            send(sid, body, end=True)
            status, _ = answer(sid)
            print("toolarge", status, flush=True)
        elif mode == "reset":
            sid = open_stream("/up?key=gone")
            send(sid, b"x" * 100000)
            wait_file("gone.first")
            c.reset_stream(sid); flush()
            sid = open_stream("/up?key=after")
            send(sid, b"after", end=True)
            print("after", summary(*answer(sid)), flush=True)
        """#

    struct Run {
        let dir: URL
        let lines: Locked<[String]>
        let server: Process
        let port: Int

        init(kind: String) throws {
            dir = FileManager.default.temporaryDirectory.appendingPathComponent("h2-stream-\(UUID())")
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            lines = Locked([])
            (server, port) = try startPythonServer(
                python: try PythonH2.python(), HTTP2StreamingBodyTests.upstream, arguments: [dir.path, kind], lines: lines,
                what: "the \(kind) upstream")
        }

        func client(_ proxyPort: Int, _ mode: String) throws -> [String] {
            let r = try runProcess(try PythonH2.python(), ["-c", HTTP2StreamingBodyTests.client, "\(proxyPort)", dir.path, mode], timeout: 90)
            #expect(r.status == 0, "\(r.err)")
            return r.out.split(separator: "\n").map(String.init)
        }

        func upstreamSaid(_ line: String) -> Int { lines.withLock { $0.filter { $0 == line }.count } }

        func stop() {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
            try? FileManager.default.removeItem(at: dir)
        }
    }

    static func proxy(_ port: Int, protocol: String = "http1", limits: String = "") throws -> ProxyHarness {
        try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { max_request_body: 64MiB\(limits) }
            upstreams:
              u: { endpoints: [http://127.0.0.1:\(port)], protocol: \(`protocol`) }
            routes:
              - match: { path_prefix: / }
                upstream: u
                timeout: 60s
                retry: { attempts: 2, per_try_timeout: 30s, backoff: { base: 10ms, max: 10ms } }
            """)
    }

    @Test(arguments: ["h1", "h2"]) func theUpstreamHasTheFirstBytesBeforeTheClientSendsTheRest(kind: String) throws {
        let run = try Run(kind: kind)
        defer { run.stop() }
        let h = try Self.proxy(run.port, protocol: kind == "h1" ? "http1" : "h2")
        defer { h.stop() }
        let out = try run.client(h.port, "order")
        let sha = out.first.map { String($0.split(separator: " ").last ?? "") } ?? "?"
        // Without a length the HTTP/1.1 upstream gets it chunked; with one, that length.
        let chunked = kind == "h1" ? "te=chunked cl=None" : "te=None cl=None"
        #expect(out.count == 2)
        #expect(out.first == "order chunk True 200 10 \(sha) \(chunked) \(sha)", "\(out)")
        #expect(out.last == "order len True 200 10 \(sha) te=None cl=10 \(sha)", "\(out)")
        let get = try run.client(h.port, "get")
        #expect(get.first?.hasPrefix("get 200 0 ") == true && get.first?.hasSuffix(" te=None cl=None") == true, "\(get)")
        #expect(get.last?.hasPrefix("whole1 200 10 ") == true && get.last?.hasSuffix(" te=None cl=10") == true, "\(get)")
        let late = try run.client(h.port, "late")
        #expect(late.first?.hasPrefix("late True 200 9 ") == true, "\(late)")
        // 2 MiB, paused and resumed many times on its way (each take is at most one window).
        let whole = try run.client(h.port, "whole")
        let wholeSHA = whole.last.map { String($0.split(separator: " ").last ?? "") } ?? "?"
        #expect(whole == ["whole 200 \(2 << 20) \(wholeSHA) \(chunked) \(wholeSHA)"])
    }

    /// The client's `retry` mode: its 1 MiB PUT, cut by the upstream once,
    /// reaches it whole on the second try.
    static func expectRetriedWhole(_ run: Run, proxy h: ProxyHarness, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let out = try run.client(h.port, "retry")
        let sha = out.last.map { String($0.split(separator: " ").last ?? "") } ?? "?"
        // The retry streams the body again, or, if the client finished meanwhile, sends it whole with its length.
        #expect(
            out == ["retry 200 \(1 << 20) \(sha) te=chunked cl=None \(sha)"]
                || out == ["retry 200 \(1 << 20) \(sha) te=None cl=\(1 << 20) \(sha)"], "\(out)",
            sourceLocation: sourceLocation)
        #expect(run.upstreamSaid("req retry") == 2, sourceLocation: sourceLocation)
    }

    @Test func aClientWhoseUpstreamDoesNotReadStopsAtItsWindow() throws {
        let run = try Run(kind: "h1")
        defer { run.stop() }
        let h = try Self.proxy(run.port)
        defer { h.stop() }
        let out = try run.client(h.port, "push")
        // Blocked short of 32 MiB while the upstream had read nothing; then all of it arrives intact.
        #expect(out.first == "blocked True False", "\(out)")
        let sha = out.last.map { String($0.split(separator: " ").last ?? "") } ?? "?"
        #expect(out.last == "push 200 \(32 << 20) \(sha) te=chunked cl=None \(sha)", "\(out)")
    }

    @Test func aRetrySendsTheWholeBodyAgainWhileItIsKept() throws {
        let run = try Run(kind: "h1")
        defer { run.stop() }
        let h = try Self.proxy(run.port)
        defer { h.stop() }
        try Self.expectRetriedWhole(run, proxy: h)
    }

    /// The replay copy of a 1 MiB streamed body past `body_in_memory`
    /// goes to a spool file: through a memory budget of 256 KiB (which
    /// could not keep it) the body is still sent again whole after its
    /// first try is cut, and the spool share is given back.
    @Test func aRetrySendsTheBodyAgainFromItsSpoolFile() throws {
        let run = try Run(kind: "h1")
        defer { run.stop() }
        let h = try Self.proxy(run.port, limits: ", max_buffered_bytes: 256KiB")
        defer { h.stop() }
        try Self.expectRetriedWhole(run, proxy: h)
        let admin = AdminProbe(port: h.adminPort)
        #expect(waitUntil("the spool and the bodies given back") {
            let m = try admin.metrics()
            return m["happypath_spool_bytes"] == 0 && m["happypath_memory_bytes{pool=\"request_bodies\"}"] == 0
        })
    }

    @Test func pastTheBudgetTheBodyStillStreamsButIsNotRetried() throws {
        let run = try Run(kind: "h1")
        defer { run.stop() }
        // Neither memory (a client's share: 32 KiB) nor the spool (64 KiB) can keep it.
        let h = try Self.proxy(run.port, limits: ", max_buffered_bytes: 256KiB, max_spooled_bytes: 512KiB, read_ahead: 0")
        defer { h.stop() }
        let whole = try run.client(h.port, "whole")
        let sha = whole.last.map { String($0.split(separator: " ").last ?? "") } ?? "?"
        // 2 MiB through a budget of 256 KiB (read whole, it would be a 503).
        #expect(whole == ["whole 200 \(2 << 20) \(sha) te=chunked cl=None \(sha)"])
        let cut = try run.client(h.port, "noretry")
        #expect(cut.first?.hasPrefix("noretry 50") == true, "\(cut)")
        #expect(run.upstreamSaid("req noretry") == 1)
    }

    @Test func aBodyPastTheLimitMidWayIsA413() throws {
        let run = try Run(kind: "h1")
        defer { run.stop() }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { max_request_body: 1MiB }
            upstreams:
              u: { endpoints: [http://127.0.0.1:\(run.port)] }
            routes:
              - match: { path_prefix: / }
                upstream: u
            """)
        defer { h.stop() }
        #expect(try run.client(h.port, "toolarge") == ["toolarge 413"])
        #expect(run.upstreamSaid("done big 0") == 0)
    }

    @Test func aClientResetEndsTheUpstreamRequest() throws {
        let run = try Run(kind: "h1")
        defer { run.stop() }
        let h = try Self.proxy(run.port)
        defer { h.stop() }
        let out = try run.client(h.port, "reset")
        #expect(out.first?.hasPrefix("after 200 5 ") == true, "\(out)")
        #expect(waitUntil("the upstream's request is cut") { run.upstreamSaid("eof gone") >= 1 }, "\(run.lines.withLock { $0 })")
        #expect(run.upstreamSaid("req gone") == 1, "\(run.lines.withLock { $0 })")
        #expect(run.lines.withLock { $0.contains { $0.hasPrefix("done gone") } } == false)
    }
}
