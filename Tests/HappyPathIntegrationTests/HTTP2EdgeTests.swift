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

    @Test func bodiesCountAgainstTheBufferedBytesLimitAndAnswersCarryADate() throws {
        let h = try ProxyHarness(Self.yaml(limits: "{ max_request_body: 8MiB, max_buffered_bytes: 1MiB, client_timeout: 5s }"))
        defer { h.stop() }
        let base = "http://127.0.0.1:\(h.port)"
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("h2-budget-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        FileManager.default.createFile(atPath: file, contents: Data(count: 3_000_000))
        // nghttp: curl 7.88 may report the RST_STREAM NO_ERROR that follows
        // an early answer (RFC 9113 section 8.1) as an error and drop the answer.
        let r = try runProcess("/usr/bin/nghttp", ["-v", "-d", file, base + "/echo"], timeout: 20)
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
        // Streams over TLS: a body both ways, and many streams at once.
        let r = try runProcess(
            "/usr/bin/h2load", ["-n", "200", "-c", "2", "-m", "20", "https://localhost:\(ports[0])/ok"], timeout: 60)
        #expect(r.out.contains("200 succeeded, 0 failed"), "\(r.out)")
        #expect(r.out.contains("h2"), "\(r.out)")
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
        let proxy = h.proxy
        let drained = Locked(false)
        let t = Thread {
            proxy.drain(timeout: .seconds(5))
            drained.withLock { $0 = true }
        }
        t.start()
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
