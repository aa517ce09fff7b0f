import Foundation
import HappyPathCore
import Testing

/// `limits.max_buffered_per_client`: one client (its address) holds at most
/// its share of the memory for request bodies; past it only its own new
/// bodies are refused (503 OVERLOADED naming its share), and another client
/// is served as before. Two clients: 127.0.0.1 and 127.0.0.2. (Bodies stay
/// in memory here, `body_in_memory` at `max_request_body`.)
@Suite(.serialized) struct ClientShareTests {
    static let yaml = """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { max_buffered_bytes: 8MiB, max_buffered_per_client: 2MiB, body_in_memory: 10MiB }
        upstreams:
          demo: { endpoints: ["{{DEMO}}"] }
        routes:
          - match: { path_prefix: / }
            upstream: demo
        """

    func buffered(_ h: ProxyHarness) throws -> Int {
        try HTTP.request(port: h.adminPort, "/admin/state").json["buffered_bytes"] as? Int ?? -1
    }

    /// Client A holds three 700 KiB uploads (its head and half of each body
    /// sent, the rest held back): 2.1 MiB would pass its 2 MiB share, so its
    /// third is refused, naming the share, while client B's small POST and
    /// two bodies of A's size go through. Every byte comes back.
    @Test func oneClientsUploadsPastItsShareNeverFailAnother() throws {
        let h = try ProxyHarness(Self.yaml, workers: 2)
        defer { h.stop() }
        let size = 700 * 1024
        let body = [UInt8](repeating: 0x61, count: size)
        func start(_ source: String) throws -> TestConnection {
            let c = try TestConnection(port: h.port, source: source)
            try c.send(Array("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(size)\r\n\r\n".utf8) + body.prefix(size / 2))
            return c
        }
        let a1 = try start("127.0.0.1")
        let a2 = try start("127.0.0.1")
        #expect(try eventually { try buffered(h) == 2 * size })
        let a3 = try start("127.0.0.1")
        let refused = try a3.readResponse()
        #expect(refused.status == 503)
        #expect(refused.json["code"] as? String == "OVERLOADED")
        #expect(refused.header("Retry-After") == "1")
        #expect((refused.json["detail"] as? String)?.contains("limits.max_buffered_per_client") == true, "\(refused.json)")

        // B, meanwhile: a small POST and two bodies of A's size, all served.
        #expect(try HTTP.request(port: h.port, "POST", "/echo", body: Array("hello".utf8), source: "127.0.0.2").status == 200)
        let b = try (0..<2).map { _ in try start("127.0.0.2") }
        #expect(try eventually { try buffered(h) == 4 * size })
        for c in b + [a1, a2] {
            try c.send(Array(body.suffix(size - size / 2)))
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.json["body_bytes"] as? Int == size)
        }
        #expect(try eventually { try buffered(h) == 0 })
        // A's share is free again.
        #expect(try HTTP.request(port: h.port, "POST", "/echo", body: body).status == 200)
    }

    /// Over HTTP/2 a body larger than a read streams to its upstream (docs/http2.md):
    /// past its client's share it is not refused but no longer kept for a
    /// replay, so it holds at most a window. Four 700 KiB uploads on one
    /// connection (the fourth past the 2 MiB share) are all answered whole,
    /// another client's upload too, and every byte comes back.
    @Test func anHTTP2ClientPastItsShareStreamsOnUnkept() throws {
        let h = try ProxyHarness(Self.yaml, workers: 1)
        defer { h.stop() }
        let r = try runProcess(try PythonH2.python(), ["-c", Self.uploads, "\(h.port)", "127.0.0.1", "4", "\(700 * 1024)"], timeout: 60)
        #expect(r.out.contains(#"{"200": 4}"#), "\(r.out) \(r.err)")
        let other = try runProcess(try PythonH2.python(), ["-c", Self.uploads, "\(h.port)", "127.0.0.2", "1", "5"], timeout: 60)
        #expect(other.out.contains(#"{"200": 1}"#), "\(other.out) \(other.err)")
        #expect(try eventually { try buffered(h) == 0 })
    }

    /// `count` POSTs of `size` bytes on one connection from `source`: every
    /// head first (no END_STREAM), then each body's first byte, held until
    /// all heads are in, then the rest; prints the statuses as JSON.
    static let uploads = #"""
        import socket, sys, json, time
        import h2.connection, h2.config, h2.events
        port, source, count, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        s = socket.socket(); s.bind((source, 0)); s.connect(("127.0.0.1", port))
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        c.initiate_connection()
        c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        s.sendall(c.data_to_send())
        statuses, ended, left = {}, set(), {}
        for i in range(count):
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/echo"),
                                 ("content-length", str(size))])
            left[sid] = size
        s.sendall(c.data_to_send())
        began = time.time()
        while len(ended) < count and time.time() - began < 30:
            for sid in list(left):
                if sid in ended: del left[sid]; continue
                n = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, left[sid])
                if n > 0:
                    left[sid] -= n
                    c.send_data(sid, b"a" * n, end_stream=left[sid] == 0)
                if left[sid] == 0: del left[sid]
            s.sendall(c.data_to_send())
            s.settimeout(0.05)
            try:
                data = s.recv(1 << 16)
            except socket.timeout:
                continue
            if not data: break
            for e in c.receive_data(data):
                if isinstance(e, h2.events.ResponseReceived): statuses[e.stream_id] = dict(e.headers)[":status"]
                if isinstance(e, h2.events.DataReceived): c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                if isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)): ended.add(e.stream_id)
            s.sendall(c.data_to_send())
        out = {}
        for v in statuses.values(): out[v] = out.get(v, 0) + 1
        print(json.dumps(out))
        """#
}
