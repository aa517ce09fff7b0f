import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathServer
import Testing

/// HTTP/2 from real clients (curl, nghttp, h2load from Debian's
/// nghttp2-client) to the real proxy on loopback, in front of the demo
/// upstream, which speaks HTTP/1.1 (docs/http2.md).
@Suite(.serialized) struct HTTP2EdgeTests {
    static func yaml(http2: String = "", limits: String = "{ max_header_bytes: 8KiB, client_timeout: 5s }") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: \(limits)
        \(http2)
        upstreams:
          demo: { endpoints: [{{DEMO}}] }
        routes:
          - match: { path_prefix: / }
            upstream: demo
        """
    }

    func curl(_ arguments: [String], timeout: Double = 20) throws -> (status: Int32, out: String, err: String) {
        try runProcess("/usr/bin/curl", ["-sS", "--max-time", "15"] + arguments, timeout: timeout)
    }

    @Test func curlSpeaksH2cByPriorKnowledgeBesideHTTP11OnOnePort() throws {
        let h = try ProxyHarness(Self.yaml())
        defer { h.stop() }
        let base = "http://127.0.0.1:\(h.port)"
        let h2 = try curl(["--http2-prior-knowledge", base + "/ok", "-w", "\n%{http_version} %{http_code}"])
        #expect(h2.status == 0, "\(h2.err)")
        #expect(h2.out.hasSuffix("\n2 200"), "\(h2.out)")
        #expect(h2.out.contains(#"{"ok":true}"#))
        let h1 = try curl([base + "/ok", "-w", "\n%{http_version} %{http_code}"])
        #expect(h1.out.hasSuffix("\n1.1 200"), "\(h1.out)")
        // The upstream gets an HTTP/1.1 request with a Host from :authority.
        let echo = try curl(["--http2-prior-knowledge", base + "/echo?x=1"])
        #expect(echo.out.contains(#"["Host","127.0.0.1:\#(h.demo.port)"]"#) || echo.out.contains(#""Host""#), "\(echo.out)")
        #expect(echo.out.contains(#""target":"/echo?x=1""#), "\(echo.out)")
        #expect(echo.out.contains(#"["X-Forwarded-Host","127.0.0.1:\#(h.port)"]"#), "\(echo.out)")
    }

    @Test func bodiesLargerThanEveryWindowPassBothWaysIntact() throws {
        let h = try ProxyHarness(Self.yaml(limits: "{ max_request_body: 8MiB, client_timeout: 5s }"))
        defer { h.stop() }
        let base = "http://127.0.0.1:\(h.port)"
        // 3 MB up: 48 stream windows of 64 KiB, three connection windows.
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("h2-up-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        var bytes = [UInt8](repeating: 0, count: 3_000_000)
        for i in bytes.indices { bytes[i] = UInt8(truncatingIfNeeded: i &* 2_654_435_761 >> 13) }
        FileManager.default.createFile(atPath: file, contents: Data(bytes))
        let sum = try runProcess("/usr/bin/md5sum", [file]).out.prefix(32)
        let up = try runProcess(
            "/bin/sh", ["-c", "curl -sS --http2-prior-knowledge --data-binary @\(file) \(base)/echo/raw | md5sum"], timeout: 30)
        #expect(up.out.prefix(32) == sum, "\(up.err)")
        // 20 MB down through a 64 KiB stream window.
        let down = try runProcess(
            "/bin/sh",
            ["-c", "curl -sS --http2-prior-knowledge '\(base)/bytes?n=20000000' | wc -c"], timeout: 30)
        #expect(down.out.trimmingCharacters(in: .whitespacesAndNewlines) == "20000000", "\(down.err)")
    }

    /// A 1 MiB body budget, a route under `/held` that reads bodies whole
    /// (its rate limit holds the head), and one that lets them stream;
    /// `bodyInMemory` adds to `limits`.
    static func heldYAML(bodyInMemory: String) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { max_request_body: 8MiB, max_buffered_bytes: 1MiB, client_timeout: 5s\(bodyInMemory) }
        upstreams:
          demo: { endpoints: [{{DEMO}}] }
        routes:
          - match: { path_prefix: /held }
            upstream: demo
            strip_prefix: /held
            rate_limit: { rate: 1000/s }
          - match: { path_prefix: / }
            upstream: demo
        """
    }

    /// A body read whole (a route with a rate limit holds the head, then
    /// reads the body before the exchange) counts against the budget as it
    /// arrives; the same body on a route that lets it stream goes through
    /// (it is not kept past the budget: docs/http2.md). Bodies stay in
    /// memory here (`body_in_memory` at `max_request_body`); the next test
    /// spools one.
    @Test func bodiesCountAgainstTheBufferedBytesLimitAndAnswersCarryADate() throws {
        let h = try ProxyHarness(Self.heldYAML(bodyInMemory: ", body_in_memory: 8MiB"))
        defer { h.stop() }
        let base = "http://127.0.0.1:\(h.port)"
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("h2-budget-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        FileManager.default.createFile(atPath: file, contents: Data(count: 3_000_000))
        let streamed = try runProcess(
            "/bin/sh", ["-c", "curl -sS --http2-prior-knowledge --data-binary @\(file) \(base)/echo/raw | wc -c"], timeout: 30)
        #expect(streamed.out.trimmingCharacters(in: .whitespacesAndNewlines) == "3000000", "\(streamed.err)")
        // nghttp: curl 7.88 may report the RST_STREAM NO_ERROR that follows
        // an early answer (RFC 9113 section 8.1) as an error and drop the answer.
        let r = try runProcess("/usr/bin/nghttp", ["-v", "-d", file, base + "/held/echo"], timeout: 20)
        #expect(r.out.contains(":status: 503"), "\(r.out.suffix(3000))")
        #expect(r.out.contains("OVERLOADED"), "\(r.out.suffix(3000))")
        // The proxy's own answer carries a Date, as on HTTP/1.1.
        #expect(r.out.contains("date: "), "\(r.out.suffix(3000))")
        // The rest of the request is stopped with NO_ERROR after the answer.
        #expect(r.out.contains("error_code=NO_ERROR"), "\(r.out.suffix(3000))")
        // The budget is whole again: a body that fits goes through.
        let small = try curl(["--http2-prior-knowledge", "--data-binary", "0123456789", base + "/echo", "-w", " %{http_code}"])
        #expect(small.out.hasSuffix(" 200"), "\(small.out)")
        #expect(eventually { (try? HTTP.request(port: h.adminPort, "/metrics").text.contains("happypath_buffered_body_bytes 0")) == true })
    }

    /// The same held body past `limits.body_in_memory` (64 KiB): read into
    /// a spool file instead of memory, so the 1 MiB budget does not refuse
    /// it, and sent whole.
    @Test func aHeldBodyPastBodyInMemoryIsSpooledNotRefused() throws {
        let h = try ProxyHarness(Self.heldYAML(bodyInMemory: ""))
        defer { h.stop() }
        let bytes = (0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("h2-spool-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        FileManager.default.createFile(atPath: file, contents: Data(bytes))
        let r = try runProcess(
            "/usr/bin/curl", ["-sS", "--http2-prior-knowledge", "--data-binary", "@\(file)", "http://127.0.0.1:\(h.port)/held/echo"],
            timeout: 30)
        let json = (try? JSONSerialization.jsonObject(with: Data(r.out.utf8)) as? [String: Any]) ?? [:]
        #expect(json["body_bytes"] as? Int == bytes.count, "\(r.out) \(r.err)")
        #expect(json["body_fnv1a64"] as? String == fnv1a(bytes))
    }

    @Test func manyStreamsOnFewConnectionsAreAllAnswered() throws {
        let h = try ProxyHarness(Self.yaml())
        defer { h.stop() }
        let r = try runProcess(
            "/usr/bin/h2load", ["-n", "400", "-c", "2", "-m", "50", "http://127.0.0.1:\(h.port)/ok"], timeout: 60)
        #expect(r.status == 0, "\(r.err)")
        #expect(r.out.contains("400 succeeded, 0 failed"), "\(r.out)")
        #expect(r.out.contains("status codes: 400 2xx"), "\(r.out)")
        // nghttp, with its own framing (SETTINGS, PRIORITY off), one stream.
        let n = try runProcess("/usr/bin/nghttp", ["-nv", "http://127.0.0.1:\(h.port)/status/201"], timeout: 20)
        #expect(n.out.contains(":status: 201"), "\(n.out)")
    }

    @Test func aHeadOverTheLimitIsRefusedOnItsStreamAndTheConnectionGoesOn() throws {
        let h = try ProxyHarness(Self.yaml())
        defer { h.stop() }
        let big = String(repeating: "a", count: 9000)
        let base = "http://127.0.0.1:\(h.port)"
        let r = try curl(["--http2-prior-knowledge", "-H", "x-big: \(big)", base + "/ok", "-w", " %{http_code}"])
        #expect(r.out.contains("HEADERS_TOO_LARGE"), "\(r.out) \(r.err)")
        #expect(r.out.hasSuffix(" 431"), "\(r.out)")
        // Two streams on one connection (nghttp; curl 7.88 cannot reuse an h2c
        // connection): each refused on its own, the connection not ended.
        let n = try runProcess("/usr/bin/nghttp", ["-nv", "-H", "x-big: \(big)", base + "/ok", base + "/status/202"], timeout: 20)
        #expect(n.out.components(separatedBy: ":status: 431").count == 3, "\(n.out.suffix(2000))")
        #expect(!n.out.contains("recv GOAWAY"), "\(n.out.suffix(2000))")
    }

    @Test func http2FalseLeavesTheListenerHTTP11Only() throws {
        let h = try ProxyHarness(Self.yaml(http2: "http2: false"))
        defer { h.stop() }
        let r = try curl(["--http2-prior-knowledge", "http://127.0.0.1:\(h.port)/ok", "-w", " %{http_version}"])
        #expect(!r.out.hasSuffix(" 2"), "\(r.out)")
        #expect(r.status != 0 || !r.out.contains(#"{"ok":true}"#))
        let h1 = try curl(["http://127.0.0.1:\(h.port)/ok", "-w", " %{http_code}"])
        #expect(h1.out.hasSuffix(" 200"))
    }

    @Test func tlsListenersOfferH2ByALPNBeforeHTTP11() throws {
        let certs = try TestCertificates()
        let api = try certs.make("api", names: ["localhost"])
        let h = try ProxyHarness(
            """
            listen:
              - { address: 127.0.0.1:0, tls: { certificates: [ { cert: \(api.cert), key: \(api.key) } ] } }
              - { address: 127.0.0.1:0, http2: false, tls: { certificates: [ { cert: \(api.cert), key: \(api.key) } ] } }
              - { address: 127.0.0.1:0, tls: { certificates: [ { cert: \(api.cert), key: \(api.key) } ], alpn: [http/1.1] } }
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              demo: { endpoints: [{{DEMO}}] }
            routes:
              - match: { path_prefix: / }
                upstream: demo
            """)
        defer { h.stop() }
        let ports = h.proxy.ports
        func get(_ port: Int, _ flags: [String]) throws -> String {
            let r = try curl(
                flags + ["--cacert", api.cert, "https://localhost:\(port)/ok", "-w", " %{http_version} %{http_code}"])
            #expect(r.status == 0, "\(r.err)")
            return r.out
        }
        #expect(try get(ports[0], ["--http2"]).hasSuffix(" 2 200"))
        #expect(try get(ports[0], ["--http1.1"]).hasSuffix(" 1.1 200"))
        // Off on the listener, or left out of its alpn: HTTP/1.1.
        #expect(try get(ports[1], ["--http2"]).hasSuffix(" 1.1 200"))
        #expect(try get(ports[2], ["--http2"]).hasSuffix(" 1.1 200"))
        // httpx (PyPI), HTTP/2 by ALPN, two requests on one connection.
        let httpx = try runProcess(
            try PythonH2.python(),
            [
                "-c",
                """
                import httpx, ssl, sys
                with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=sys.argv[1])) as c:
                    a, b = c.get(sys.argv[2] + "/ok"), c.post(sys.argv[2] + "/echo", content=b"x" * 100000)
                    print(a.http_version, a.status_code, a.json()["ok"], b.http_version, b.json()["body_bytes"])
                """, api.cert, "https://localhost:\(ports[0])",
            ], timeout: 60)
        #expect(httpx.out.trimmingCharacters(in: .whitespacesAndNewlines) == "HTTP/2 200 True HTTP/2 100000", "\(httpx.err)")
        // Streams over TLS: a body both ways, and many streams at once.
        let r = try runProcess(
            "/usr/bin/h2load", ["-n", "200", "-c", "2", "-m", "20", "https://localhost:\(ports[0])/ok"], timeout: 60)
        #expect(r.out.contains("200 succeeded, 0 failed"), "\(r.out)")
        #expect(r.out.contains("h2"), "\(r.out)")
    }

    /// SIGTERM's drain (5 s), on a thread of its own: true once it returned.
    static func drainInBackground(_ h: ProxyHarness) -> Locked<Bool> {
        let proxy = h.proxy
        let drained = Locked(false)
        Thread {
            proxy.drain(timeout: .seconds(5))
            drained.withLock { $0 = true }
        }.start()
        return drained
    }

    @Test func drainSendsGoawayAndTheStreamInFlightFinishes() throws {
        let h = try ProxyHarness(Self.yaml())
        let admin = AdminProbe(port: h.adminPort)
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("h2-drain-\(UUID())")
        defer { try? FileManager.default.removeItem(at: out) }
        FileManager.default.createFile(atPath: out.path, contents: nil)
        let client = Process()
        client.executableURL = URL(fileURLWithPath: "/usr/bin/nghttp")
        client.arguments = ["-v", "http://127.0.0.1:\(h.port)/slow?ms=1000"]
        client.standardOutput = try FileHandle(forWritingTo: out)
        try client.run()
        defer { if client.isRunning { client.terminate() } }
        waitUntil("the slow request in flight") { try admin.inFlight() == 1 }
        let drained = Self.drainInBackground(h)
        #expect(waitUntil("nghttp to end") { !client.isRunning })
        let text = (try? String(contentsOf: out, encoding: .utf8)) ?? ""
        // GOAWAY NO_ERROR naming stream 13 (nghttp's first request stream), then the answer.
        #expect(text.contains("recv GOAWAY frame"), "\(text.suffix(2000))")
        #expect(text.contains("last_stream_id=13, error_code=NO_ERROR"), "\(text.suffix(2000))")
        #expect(text.contains(":status: 200"), "\(text.suffix(2000))")
        #expect(text.contains("delayed_ms"), "\(text.suffix(2000))")
        #expect(waitUntil("drain() to return") { drained.withLock { $0 } })
        h.stop()
    }

    /// A Python `h2` client on one connection: a GET, then (once `gate`
    /// exists) another on the same connection; prints each stream's outcome.
    static let twoRequests = """
        import os, socket, sys, time
        import h2.config, h2.connection, h2.events
        port, first, second, gate = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
        s = socket.create_connection(("127.0.0.1", port)); s.settimeout(10)
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection(); s.sendall(c.data_to_send())
        def get(sid, path):
            c.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "t")], end_stream=True)
            s.sendall(c.data_to_send())
        def wait(sid):
            status = None
            while True:
                data = s.recv(65536)
                if not data: return "closed"
                for e in c.receive_data(data):
                    if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid: status = dict(e.headers)[b":status"].decode()
                    if isinstance(e, h2.events.StreamEnded) and e.stream_id == sid: return status
                    if isinstance(e, h2.events.StreamReset) and e.stream_id == sid: return "reset %d" % e.error_code
                    if isinstance(e, h2.events.ConnectionTerminated): print("goaway", e.error_code, e.last_stream_id, flush=True)
                s.sendall(c.data_to_send())
        get(1, first)
        print("ready", flush=True)
        print("first", wait(1), flush=True)
        while not os.path.exists(gate): time.sleep(0.01)
        get(3, second)
        try: print("second", wait(3), flush=True)
        except socket.timeout: print("second none", flush=True)
        """

    @Test func aReloadKeepsHTTP2ConnectionsAndUpgradeH2cIsIgnored() throws {
        let h = try ProxyHarness(Self.yaml())
        defer { h.stop() }
        let gate = FileManager.default.temporaryDirectory.appendingPathComponent("h2-gate-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: gate) }
        let lines = Locked<[String]>([])
        let (client, first) = try startPythonScript(
            python: try PythonH2.python(), Self.twoRequests, arguments: ["\(h.port)", "/ok", "/status/201", gate],
            lines: lines)
        defer { if client.isRunning { client.terminate() } }
        #expect(first == "ready")
        #expect(waitUntil("the first answer") { lines.withLock { $0.contains("first 200") } })
        let next = try ConfigLoader.parse(
            Self.yaml().replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(h.demo.port)")
                .replacingOccurrences(of: "upstream: demo", with: "upstream: demo\n    timeout: 7s"), file: "t.yaml")
        #expect(h.proxy.reload(next).isEmpty)
        FileManager.default.createFile(atPath: gate, contents: nil)
        #expect(waitUntil("the second answer, on the same connection") { lines.withLock { $0.contains("second 201") } })
        #expect(!lines.withLock { $0.contains { $0.hasPrefix("goaway") } })
        // `Upgrade: h2c` on HTTP/1.1 is ignored: served as HTTP/1.1, the field not forwarded.
        let upgrade = try curl(["--http2", "http://127.0.0.1:\(h.port)/echo", "-w", " %{http_version}"])
        #expect(upgrade.out.hasSuffix(" 1.1"), "\(upgrade.out)")
        #expect(!upgrade.out.lowercased().contains("h2c") && !upgrade.out.contains("HTTP2-Settings"), "\(upgrade.out)")
    }

    /// Raw frames (hyperframe, hpack): stream 1 for `path`; at our GOAWAY,
    /// stream 3 is opened; prints the GOAWAY, stream 1's status and end, and
    /// what became of stream 3. (h2's client state machine stops at a GOAWAY.)
    static let pastTheGoaway = """
        import socket, sys
        import hpack
        from hyperframe.frame import Frame, SettingsFrame, HeadersFrame, DataFrame, GoAwayFrame, RstStreamFrame
        port, path = int(sys.argv[1]), sys.argv[2]
        s = socket.create_connection(("127.0.0.1", port)); s.settimeout(5)
        enc, dec = hpack.Encoder(), hpack.Decoder()
        def headers(sid, p):
            f = HeadersFrame(sid)
            f.data = enc.encode([(":method", "GET"), (":path", p), (":scheme", "http"), (":authority", "t")])
            f.flags.add("END_HEADERS"); f.flags.add("END_STREAM")
            return f.serialize()
        s.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + SettingsFrame(0).serialize() + headers(1, path))
        print("ready", flush=True)
        buf = b""
        def frames():
            global buf
            while True:
                while len(buf) >= 9:
                    f, n = Frame.parse_frame_header(memoryview(buf[:9]))
                    if len(buf) < 9 + n: break
                    f.parse_body(memoryview(buf[9:9 + n])); buf = buf[9 + n:]
                    yield f
                try: data = s.recv(65536)
                except (socket.timeout, ConnectionError): return
                if not data: return
                buf += data
        second = "none"
        for f in frames():
            if isinstance(f, SettingsFrame) and "ACK" not in f.flags: s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
            elif isinstance(f, GoAwayFrame):
                print("goaway", f.error_code, f.last_stream_id, flush=True)
                try: s.sendall(headers(3, "/status/201"))
                except OSError: pass
            elif isinstance(f, HeadersFrame):
                status = dict(dec.decode(f.data)).get(":status")
                if f.stream_id == 1: print("first", status, flush=True)
                else: second = "served " + status
            elif isinstance(f, DataFrame) and f.stream_id == 1 and "END_STREAM" in f.flags: print("first ended", flush=True)
            elif isinstance(f, RstStreamFrame) and f.stream_id == 3: second = "reset %d" % f.error_code
        print("second", second, flush=True)
        """

    @Test func afterTheDrainsGoawayNewStreamsAreNotServed() throws {
        let h = try ProxyHarness(Self.yaml())
        let lines = Locked<[String]>([])
        let (client, first) = try startPythonScript(
            python: try PythonH2.python(), Self.pastTheGoaway, arguments: ["\(h.port)", "/slow?ms=800"], lines: lines)
        defer { if client.isRunning { client.terminate() } }
        #expect(first == "ready")
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("the slow request in flight") { try admin.inFlight() == 1 }
        let drained = Self.drainInBackground(h)
        #expect(waitUntil("the client's last line") { lines.withLock { $0.contains { $0.hasPrefix("second") } } })
        let seen = lines.withLock { $0 }
        // GOAWAY NO_ERROR naming stream 1; stream 1 answered in full; stream 3 never served.
        #expect(seen.contains("goaway 0 1"), "\(seen)")
        #expect(seen.contains("first 200") && seen.contains("first ended"), "\(seen)")
        #expect(!seen.contains { $0.hasPrefix("second served") }, "\(seen)")
        #expect(waitUntil("drain() to return") { drained.withLock { $0 } })
        h.stop()
    }

    @Test func http2SettingsAreReadAndChecked() throws {
        let good = try ConfigLoader.parse(
            Self.yaml(http2: "http2: { max_concurrent_streams: 7, initial_stream_window: 128KiB }").replacingOccurrences(
                of: "{{DEMO}}", with: "http://127.0.0.1:1"), file: "t.yaml")
        #expect(good.http2?.maxConcurrentStreams == 7)
        #expect(good.http2?.initialStreamWindow == 128 * 1024)
        #expect(good.http2?.initialConnectionWindow == 1024 * 1024)
        let perListener = try ConfigLoader.parse(
            """
            listen:
              - { address: 127.0.0.1:0, http2: false }
              - { address: 127.0.0.1:0, http2: { max_concurrent_streams: 3 } }
              - 127.0.0.1:0
            http2: { max_concurrent_streams: 9 }
            upstreams: { u: { endpoints: [http://127.0.0.1:1] } }
            routes: [ { match: { path_prefix: / }, upstream: u } ]
            """, file: "t.yaml")
        #expect(perListener.listeners.map { perListener.http2(for: $0)?.maxConcurrentStreams } == [nil, 3, 9])
        for (bad, message) in [
            ("http2: { max_concurrent_streams: 0 }", "http2.max_concurrent_streams must be between 1 and 1000"),
            ("http2: { initial_stream_window: 1KiB }", "http2.initial_stream_window must be between 64KiB"),
            ("http2: { initial_stream_window: 4MiB }", "must be at least initial_stream_window"),
            ("http2: { max_streams: 5 }", "max_streams"),
        ] {
            #expect(throws: (any Error).self) {
                try ConfigLoader.parse(Self.yaml(http2: bad).replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:1"), file: "t.yaml")
            }
            do {
                _ = try ConfigLoader.parse(
                    Self.yaml(http2: bad).replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:1"), file: "t.yaml")
            } catch {
                #expect("\(error)".contains(message), "\(error)")
            }
        }
    }
}
