import Foundation
import HappyPathCore
import HappyPathServer
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 49: WebSocket over HTTP/2 (RFC 8441). A client on an HTTP/2
/// connection opens a WebSocket on a stream with an extended CONNECT; the
/// proxy makes it an HTTP/1.1 upgrade to the upstream (its own key, the
/// upstream's accept checked) and carries the stream's DATA both ways with
/// HTTP/2 flow control. Clients: Python `h2` (flow control, extended
/// CONNECT) and raw frames; the upstream: `WebSocketPeers.server`.
@Suite(.serialized) struct HTTP2WebSocketTests {
    /// `PORT PATH MODE [N]`: one extended CONNECT on an h2c connection.
    /// Prints `settings ENABLE_CONNECT_PROTOCOL`, `status NNN`, the answer's
    /// fields (`field NAME VALUE`), then by mode: `echo` sends N bytes in
    /// masked 64 KiB binary frames and a close, and prints `echoed BYTES SAME`
    /// and `closed CODE`; `close` prints `text TEXT` and `closed CODE`. Then
    /// `ended` when the proxy's END_STREAM came, `reset CODE` if the stream was reset.
    static let client = #"""
        import os, socket, struct, sys
        import h2.config, h2.connection, h2.events, h2.exceptions, h2.settings

        port, path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        s = socket.create_connection(("127.0.0.1", port)); s.settimeout(20)
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        c.initiate_connection(); s.sendall(c.data_to_send())
        events, buf = [], b""

        def pump():
            data = s.recv(1 << 20)
            if not data: raise EOFError()
            for e in c.receive_data(data):
                if isinstance(e, h2.events.DataReceived):
                    c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                events.append(e)
            s.sendall(c.data_to_send())

        def wait(kind):
            while True:
                for i, e in enumerate(events):
                    if isinstance(e, kind): return events.pop(i)
                pump()

        wait(h2.events.RemoteSettingsChanged)
        print("settings", c.remote_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL, 0), flush=True)
        c.send_headers(1, [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"), (":path", path),
                           (":authority", "127.0.0.1"), ("sec-websocket-version", "13"), ("sec-websocket-protocol", "chat.v2, chat.v1")])
        s.sendall(c.data_to_send())
        r = wait(h2.events.ResponseReceived)
        fields = dict(r.headers)
        print("status", fields[":status"], flush=True)
        for k, v in r.headers:
            if not k.startswith(":"): print("field", k, v, flush=True)

        def frame(op, data):
            mask = os.urandom(4)
            m = bytes(b ^ mask[i % 4] for i, b in enumerate(data)) if len(data) < 4096 else \
                (int.from_bytes(data, "big") ^ int.from_bytes((mask * (len(data) // 4 + 1))[:len(data)], "big")).to_bytes(len(data), "big")
            k = len(data)
            h = struct.pack("!BB", 0x80 | op, 0x80 | k) if k < 126 else struct.pack("!BBH", 0x80 | op, 0xFE, k) if k < 65536 else struct.pack("!BBQ", 0x80 | op, 0xFF, k)
            return h + mask + m

        def send(data):
            # Within the stream's and the connection's windows: wait for WINDOW_UPDATEs.
            while data:
                room = min(c.local_flow_control_window(1), c.max_outbound_frame_size)
                if room <= 0:
                    pump(); continue
                c.send_data(1, data[:room]); data = data[room:]
                s.sendall(c.data_to_send())

        got = b""
        def frames():
            global got
            while True:
                while len(got) >= 2:
                    b0, b1 = got[0], got[1]; k = b1 & 0x7F; at = 2
                    if k == 126: k, at = struct.unpack("!H", got[2:4])[0], 4
                    elif k == 127: k, at = struct.unpack("!Q", got[2:10])[0], 10
                    if len(got) < at + k: break
                    payload = got[at:at + k]; got = got[at + k:]
                    yield b0 & 0x0F, payload
                e = wait(h2.events.DataReceived) if not any(isinstance(x, h2.events.DataReceived) for x in events) else None
                if e is None:
                    for i, x in enumerate(events):
                        if isinstance(x, h2.events.DataReceived): e = events.pop(i); break
                got += e.data

        reader = frames()
        if mode == "echo":
            sent = os.urandom(n)
            for i in range(0, n, 65536): send(frame(2, sent[i:i + 65536]))
            back = b""
            while len(back) < n:
                op, payload = next(reader); back += payload
            print("echoed", len(back), back == sent, flush=True)
            send(frame(8, struct.pack("!H", 1000)))
            op, payload = next(reader)
            print("closed", struct.unpack("!H", payload[:2])[0] if op == 8 else "op%d" % op, flush=True)
        elif mode == "close":
            op, payload = next(reader); print("text", payload.decode(), flush=True)
            op, payload = next(reader); print("closed", struct.unpack("!H", payload[:2])[0] if op == 8 else "op%d" % op, flush=True)
        elif mode == "none":
            sys.exit(0)
        elif mode == "halfclose":
            op, payload = next(reader); print("text", payload.decode(), flush=True)
            wait(h2.events.StreamEnded); print("ended", flush=True)
            # The last bytes and the end in one DATA frame, after the proxy's END_STREAM.
            c.send_data(1, frame(2, b"z" * 1000), end_stream=True); s.sendall(c.data_to_send())
            c.ping(b"happy123"); s.sendall(c.data_to_send())
            wait(h2.events.PingAckReceived); print("sent-last", flush=True)
            sys.exit(0)
        elif mode == "reset":
            send(frame(1, b"one")); op, payload = next(reader); print("echo", payload.decode(), flush=True)
            c.reset_stream(1, 8); s.sendall(c.data_to_send()); print("sent-reset", flush=True)
            sys.stdin.readline(); sys.exit(0)
        elif mode == "idle":
            print("open", flush=True)
            try:
                while True:
                    for e in events:
                        if isinstance(e, h2.events.StreamReset): print("reset", e.error_code, flush=True); sys.exit(0)
                        if isinstance(e, h2.events.ConnectionTerminated): print("goaway", e.error_code, flush=True)
                    events.clear(); pump()
            except Exception:
                # The connection ended (after a GOAWAY, h2 takes no more of its frames).
                print("eof", flush=True); sys.exit(0)
        elif mode == "stall":
            # Sends echoed frames and reads nothing (no window given back): how far does it get?
            import time
            sent, chunk, pending, blocked = 0, frame(2, os.urandom(16384)), b"", None
            s.settimeout(0.2)
            while sent < n:
                room = min(c.local_flow_control_window(1), c.max_outbound_frame_size)
                if room > 0:
                    pending = pending or chunk
                    c.send_data(1, pending[:room]); s.sendall(c.data_to_send())
                    sent += min(room, len(pending)); pending = pending[room:]; blocked = None; continue
                blocked = blocked or time.time()
                if time.time() - blocked > 3: break
                try:
                    data = s.recv(1 << 16)
                    if not data: break
                    for e in c.receive_data(data): pass   # window updates only: DATA is never acknowledged
                    s.sendall(c.data_to_send())
                except socket.timeout: pass
            print("sent", sent, flush=True)
            sys.stdin.readline(); sys.exit(0)
        try:
            while True:
                for e in events:
                    if isinstance(e, h2.events.StreamReset): print("reset", e.error_code, flush=True); sys.exit(0)
                    if isinstance(e, h2.events.StreamEnded):
                        print("ended", flush=True)
                        try: c.end_stream(1); s.sendall(c.data_to_send())
                        except h2.exceptions.StreamClosedError: print("closed-by-proxy", flush=True); sys.exit(0)
                        # The stream closes on both ends with no reset: a PING answers after it.
                        c.ping(b"happy123"); s.sendall(c.data_to_send())
                        while True:
                            for x in events:
                                if isinstance(x, h2.events.StreamReset): print("reset", x.error_code, flush=True); sys.exit(0)
                                if isinstance(x, h2.events.PingAckReceived): print("clean", flush=True); sys.exit(0)
                            events.clear(); pump()
                events.clear()
                pump()
        except (EOFError, socket.timeout):
            print("eof", flush=True)
        """#

    static func yaml(upstream: Int, routes: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          ws: { endpoints: [http://127.0.0.1:\(upstream)] }
        routes:
        \(routes)  - { match: { path_prefix: /plain/ }, upstream: ws }
          - { match: { path_prefix: / }, upstream: ws, upgrades: [websocket] }
        """
    }

    /// The client kept running (`reset`, `stall` wait for a line on stdin; `idle` for the stream's end).
    final class Running {
        let process = Process()
        let input = Pipe()
        let lines = Locked<[String]>([])

        init(_ port: Int, _ path: String, _ mode: String, _ n: Int = 0) throws {
            process.executableURL = URL(fileURLWithPath: try PythonH2.python())
            process.arguments = ["-u", "-c", HTTP2WebSocketTests.client, "\(port)", path, mode, "\(n)"]
            process.standardInput = input
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
            collectLines(from: output.fileHandleForReading, into: lines)
        }

        func saw(_ prefix: String) -> Bool { lines.withLock { $0.contains { $0.hasPrefix(prefix) } } }

        deinit {
            try? input.fileHandleForWriting.write(contentsOf: Data("\n".utf8))
            let deadline = Date().addingTimeInterval(5)
            while process.isRunning, Date() < deadline { usleep(20_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
    }

    /// An upstream whose `Sec-WebSocket-Accept` does not answer the proxy's
    /// key did not take the handshake: the client gets 502, no tunnel.
    @Test func aWrongAcceptIsABadGateway() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let lines = try run(h.port, "/chat/badaccept", "none")
        #expect(lines.contains("status 502"), "\(lines)")
        #expect(try AdminProbe(port: h.adminPort).metric("happypath_tunnels_open") == 0)
    }

    /// The upstream ends its side first; the client's last bytes, sent with
    /// its own END_STREAM in one DATA frame (the stream closes as it comes),
    /// still reach the upstream, then the end.
    @Test func theClientsLastBytesAfterTheUpstreamEndedStillArrive() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let lines = try run(h.port, "/chat/halfclose", "halfclose")
        #expect(lines.contains("text bye") && lines.contains("ended") && lines.contains("sent-last"), "\(lines)")
        #expect(waitUntil("the upstream read to its end") { up.said.withLock { $0 }.contains { $0.hasPrefix("halfclose got") } })
        #expect(up.said.withLock { $0 }.contains("halfclose got 1000"), "\(up.said.withLock { $0 })")
    }

    /// A client's reset of the stream closes the upstream's connection: the tunnel is over.
    @Test func aClientResetClosesTheTunnel() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let client = try Running(h.port, "/chat/echo", "reset")
        #expect(waitUntil("the echo, then the reset") { client.saw("sent-reset") }, "\(client.lines.withLock { $0 })")
        #expect(client.saw("echo one"))
        let admin = AdminProbe(port: h.adminPort)
        #expect(waitUntil("the tunnel closed") {
            let m = try admin.metrics()
            return m["happypath_tunnels_open"] == 0 && (m[#"happypath_tunnels_total{upstream="ws",reason="client_closed"}"#] ?? 0)
                + (m[#"happypath_tunnels_total{upstream="ws",reason="error"}"#] ?? 0) == 1
        })
    }

    /// A client that sends and never reads: the echo toward it stops at its
    /// window, the proxy stops reading the upstream, the upstream stops
    /// reading, and the proxy stops giving the client window: it is held
    /// back, and what the proxy holds for the tunnel stays within its bound.
    @Test func aClientThatNeverReadsIsHeldBackByFlowControl() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let client = try Running(h.port, "/chat/echo", "stall", 256 << 20)
        #expect(waitUntil("the client is held back", timeout: 60) { client.saw("sent ") }, "\(client.lines.withLock { $0 })")
        let sent = client.lines.withLock { $0 }.first { $0.hasPrefix("sent ") }.flatMap { Int($0.dropFirst(5)) } ?? 0
        // Windows, the tunnel's queues (256 KiB each way) and the kernel's socket buffers on loopback: far below 256 MiB.
        #expect(sent > 0 && sent < 64 << 20, "sent \(sent)")
        let m = try AdminProbe(port: h.adminPort).metrics()
        #expect((m[#"happypath_memory_bytes{pool="tunnels"}"#] ?? 0) <= Double(256 * 1024 + 32 * 1024), "\(m)")
        #expect(m["happypath_tunnels_open"] == 1, "\(m.filter { $0.key.contains("tunnel") || $0.key.contains("reset") })")
    }

    /// A drain (GOAWAY) lets an open tunnel run until `drain_timeout`, then closes it.
    @Test func aDrainLetsTheTunnelRunUntilItsTimeout() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let client = try Running(h.port, "/chat/echo", "idle")
        #expect(waitUntil("the tunnel is open") { client.saw("open") })
        let admin = AdminProbe(port: h.adminPort)
        #expect(waitUntil("the tunnel is counted") { try admin.metric("happypath_tunnels_open") == 1 })
        let started = ContinuousClock.now
        h.proxy.drain(timeout: .milliseconds(400))
        #expect(seconds(since: started) >= 0.35, "the drain waited for the tunnel until its timeout")
        #expect(waitUntil("the client saw its stream end") { client.saw("reset") || client.saw("eof") },
            "\(client.lines.withLock { $0 })")
        #expect(client.saw("goaway 0"), "\(client.lines.withLock { $0 })")
    }

    func run(_ port: Int, _ path: String, _ mode: String, _ n: Int = 0) throws -> [String] {
        let r = try runProcess(try PythonH2.python(), ["-c", Self.client, "\(port)", path, mode, "\(n)"], timeout: 60)
        #expect(r.status == 0, "\(r.err)")
        return r.out.split(separator: "\n").map(String.init)
    }

    @Test func aMegabyteEachWayAndTheCloseHandshakeOverOneStream() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let lines = try run(h.port, "/chat/echo", "echo", 1 << 20)
        #expect(lines.contains("settings 1"), "SETTINGS_ENABLE_CONNECT_PROTOCOL: \(lines)")
        #expect(lines.contains("status 200"), "\(lines)")
        // The handshake's accept answered the proxy's key; the client, which sent none, gets none.
        #expect(!lines.contains { $0.hasPrefix("field sec-websocket-accept") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("field x-seen-forwarded-for 127.0.0.1") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("field x-request-id ") }, "\(lines)")
        // The subprotocol the upstream chose comes back.
        #expect(lines.contains("field sec-websocket-protocol chat.v2"), "\(lines)")
        #expect(lines.contains("echoed 1048576 True"), "\(lines)")
        #expect(lines.contains("closed 1000"), "\(lines)")
        // The upstream closed after the close: END_STREAM, then both ends closed with no reset.
        #expect(lines.contains("ended") && lines.contains("clean"), "\(lines)")
        let admin = AdminProbe(port: h.adminPort)
        #expect(waitUntil("the tunnel is counted closed") { try admin.metric("happypath_tunnels_open") == 0 })
        let scrape = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(scrape.contains(#"happypath_tunnels_total{upstream="ws",reason="upstream_closed"} 1"#), "\(scrape)")
    }

    @Test func theUpstreamClosingFirstEndsTheStream() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let lines = try run(h.port, "/chat/close", "close")
        #expect(lines.contains("text bye"), "\(lines)")
        #expect(lines.contains("closed 1000"), "\(lines)")
        #expect(lines.contains("ended"), "\(lines)")
    }

    /// After `PythonH2.rawFrames`; `PORT`: extended CONNECTs the proxy
    /// refuses, each on its own stream of one connection; a line per stream.
    static let refusals = #"""
        import sys
        port = int(sys.argv[1])
        c = H2(port)
        def connect(path, protocol=None, method="CONNECT"):
            fields = [(":method", method)] + ([(":protocol", protocol)] if protocol else []) + [(":scheme", "http"), (":path", path), (":authority", "t")]
            return [(k.encode(), v.encode()) for k, v in fields]
        cases = [("unknown", connect("/chat/x", "chat")), ("no_upgrades", connect("/plain/x", "websocket")),
                 ("no_protocol", [(b":method", b"CONNECT"), (b":authority", b"t:443")]),
                 ("get_with_protocol", connect("/chat/x", "websocket", "GET"))]
        for i, (name, fields) in enumerate(cases): c.send(c.headers(fields, sid=2 * i + 1))
        names = {2 * i + 1: name for i, (name, _) in enumerate(cases)}
        done, _ = c.outcomes(names)
        for sid, name in names.items(): print(name, done.get(sid, "none"), flush=True)
        """#

    /// An extended CONNECT with an unknown or missing `:protocol`, or to a
    /// route without `upgrades`: refused on its stream, the connection goes on.
    @Test func unknownOrMissingProtocolsAreRefused() throws {
        let up = try WebSocketTests.Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: up.port), holding: [up])
        defer { h.stop() }
        let (out, printed) = try PythonH2.runRawFrames(Self.refusals, ["\(h.port)"], timeout: 60)
        #expect(out["unknown"] == "status 501", "\(printed)")
        #expect(out["no_upgrades"] == "status 501", "\(printed)")
        let noProtocol = out["no_protocol"] ?? "none"
        #expect(noProtocol == "reset 1" || noProtocol.hasPrefix("status 4") || noProtocol == "status 501", "\(printed)")
        let getWithProtocol = out["get_with_protocol"] ?? "none"
        #expect(getWithProtocol == "reset 1" || getWithProtocol == "status 400", "\(printed)")
        // The proxy goes on: a WebSocket opens after them.
        let lines = try run(h.port, "/chat/echo", "echo", 1000)
        #expect(lines.contains("echoed 1000 True"), "\(lines)")
    }
}
