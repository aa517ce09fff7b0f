import Foundation
import HappyPathCore
import Testing

/// Every byte the proxy counts for a request is given back however the
/// request ends: answered, parked then failed, reset by its client, timed
/// out. The count (`buffered_bytes` on `/admin/state`) returns to zero
/// after each, with nothing in flight or parked.
@Suite(.serialized) struct MemoryAccountingTests {
    /// An upstream nobody listens on (a port bound, then closed), so every
    /// try is refused and parked.
    static func unreachableYAML(port: Int, h2: Bool) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        upstreams:
          gone:
            endpoints: [http://127.0.0.1:\(port)]
            protocol: \(h2 ? "h2" : "http1")
            reachability: { park_for: 300ms }
            health_check: { interval: 100ms, timeout: 100ms }
        routes:
          - match: { path_prefix: / }
            upstream: gone
        """
    }

    func state(_ h: ProxyHarness) throws -> [String: Any] {
        try HTTP.request(port: h.adminPort, "/admin/state").json
    }

    /// 40 HTTP/2 POSTs whose bodies stream (the head first, the body after
    /// it, 27 KiB), to an upstream that refuses every connection: each is
    /// parked, then answered 503 UPSTREAM_UNREACHABLE, and every byte kept
    /// for their replays is given back.
    @Test(arguments: [false, true])
    func streamedBodiesParkedThenFailedGiveEveryByteBack(grpc: Bool) throws {
        let closed = NginxUpstream.freePort()
        let h = try ProxyHarness(Self.unreachableYAML(port: closed, h2: grpc), workers: 2)
        defer { h.stop() }
        let r = try runProcess(try PythonH2.python(), ["-c", Self.client, "\(h.port)", "40", "27195", grpc ? "grpc" : "plain"], timeout: 90)
        let statuses = r.out.split(separator: "\n").last.map(String.init) ?? ""
        // A gRPC call's error is a status in a 200 (Trailers-Only) answer.
        #expect(statuses == (grpc ? #"{"200": 40}"# : #"{"503": 40}"#), "\(r.out) \(r.err)")
        let settled = try eventually {
            let s = try state(h)
            return s["buffered_bytes"] as? Int == 0 && s["parked"] as? Int == 0 && s["in_flight"] as? Int == 0
        }
        #expect(settled, "\((try? state(h)) ?? [:])")
    }

    /// `count` streams on one connection, each: HEADERS, then (a moment
    /// later, so the body streams) `size` bytes of DATA, 4 KiB every 50 ms
    /// (so that some arrives after the answer), and END_STREAM.
    /// Prints the statuses, as JSON, last.
    static let client = #"""
        import socket, sys, time, json
        import h2.connection, h2.config, h2.events
        port, count, size, grpc = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "grpc"
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        c.initiate_connection(); s.sendall(c.data_to_send())
        statuses, ended, pending = {}, set(), {}
        def pump(timeout):
            s.settimeout(timeout)
            try:
                data = s.recv(65536)
            except socket.timeout:
                return
            if not data: raise EOFError()
            for e in c.receive_data(data):
                if isinstance(e, h2.events.ResponseReceived):
                    statuses[e.stream_id] = dict(e.headers)[":status"]
                if isinstance(e, h2.events.DataReceived):
                    c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                if isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended.add(e.stream_id)
            s.sendall(c.data_to_send())
        for i in range(count):
            sid = c.get_next_available_stream_id()
            head = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/echo")]
            head += [("content-type", "application/grpc"), ("te", "trailers")] if grpc else [("content-type", "application/octet-stream")]
            c.send_headers(sid, head)
            pending[sid] = bytes([i % 251]) * size
        s.sendall(c.data_to_send())
        time.sleep(0.05)
        began = time.time()
        while (pending or len(ended) < count) and time.time() - began < 60:
            for sid in list(pending):
                if sid in ended:
                    del pending[sid]; continue
                n = min(c.local_flow_control_window(sid), 4096, len(pending[sid]))
                if n > 0:
                    c.send_data(sid, pending[sid][:n]); pending[sid] = pending[sid][n:]
                if not pending[sid]:
                    c.end_stream(sid); del pending[sid]
            s.sendall(c.data_to_send())
            pump(0.05)
        out = {}
        for st in statuses.values(): out[st] = out.get(st, 0) + 1
        print(json.dumps(out))
        """#
}

/// A streamed HTTP/2 body is kept for a replay only where its route could
/// send it again once it began: a retry (`retry.attempts` above 1) or a
/// replay after a token refresh. Elsewhere nothing is kept: the count
/// stays at zero while the body passes.
@Suite(.serialized) struct StreamedBodyKeepingTests {
    static func yaml(attempts: Int) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        upstreams:
          demo: { endpoints: [{{DEMO}}] }
        routes:
          - match: { path_prefix: / }
            upstream: demo
            retry: { attempts: \(attempts) }
        """
    }

    /// (retry.attempts, whether the bytes the proxy took are kept and counted).
    @Test(arguments: [(1, false), (3, true)])
    func keptOnlyWhereItCouldBeSentAgain(attempts: Int, kept: Bool) throws {
        let h = try ProxyHarness(Self.yaml(attempts: attempts), workers: 1)
        defer { h.stop() }
        let go = FileManager.default.temporaryDirectory.appendingPathComponent("hp-body-\(UUID())")
        defer { try? FileManager.default.removeItem(at: go) }
        let lines = Locked<[String]>([])
        let client = try startPythonScript(
            python: try PythonH2.python(), Self.client, arguments: ["\(h.port)", go.path], lines: lines)
        defer { if client.process.isRunning { client.process.terminate() } }
        #expect(waitUntil("the proxy took the first 48 KiB") { lines.withLock { $0.contains("taken") } })
        let held = try HTTP.request(port: h.adminPort, "/admin/state").json["buffered_bytes"] as? Int ?? -1
        #expect(kept ? held >= 32 * 1024 : held == 0, "attempts \(attempts): \(held) bytes kept")
        FileManager.default.createFile(atPath: go.path, contents: nil)
        #expect(waitUntil("the answer") { lines.withLock { $0.contains { $0.hasPrefix("status") } } })
        #expect(lines.withLock { $0.contains("status 200 65536") }, "\(lines.withLock { $0 })")
        #expect(try eventually { try HTTP.request(port: h.adminPort, "/admin/state").json["buffered_bytes"] as? Int == 0 })
    }

    /// POST /echo: HEADERS, 48 KiB of DATA, "taken" once the proxy gave at
    /// least 32 KiB of window back, then (when the file `argv[2]` exists) 16 KiB more and
    /// END_STREAM; prints the status and the body length /echo reports.
    static let client = #"""
        import socket, sys, os, time, json
        import h2.connection, h2.config, h2.events
        port, go = int(sys.argv[1]), sys.argv[2]
        print("started", flush=True)
        s = socket.create_connection(("127.0.0.1", port))
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        c.initiate_connection(); s.sendall(c.data_to_send())
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/echo")])
        s.sendall(c.data_to_send())
        time.sleep(0.05)
        for _ in range(3): c.send_data(sid, b"a" * 16384)
        s.sendall(c.data_to_send())
        returned, status, body, said = 0, None, b"", False
        s.settimeout(0.05)
        while True:
            try:
                data = s.recv(65536)
            except socket.timeout:
                data = None
            if data == b"": break
            for e in c.receive_data(data or b""):
                if isinstance(e, h2.events.WindowUpdated) and e.stream_id == sid: returned += e.delta
                if isinstance(e, h2.events.ResponseReceived): status = dict(e.headers)[":status"]
                if isinstance(e, h2.events.DataReceived):
                    body += e.data; c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                if isinstance(e, h2.events.StreamEnded):
                    print("status %s %s" % (status, json.loads(body).get("body_bytes")), flush=True); sys.exit(0)
            s.sendall(c.data_to_send())
            if returned >= 32768 and not said:
                print("taken", flush=True); said = True
            if said and os.path.exists(go):
                c.send_data(sid, b"a" * 16384, end_stream=True)
                s.sendall(c.data_to_send()); go = "/nonexistent-" + go
        """#
}
