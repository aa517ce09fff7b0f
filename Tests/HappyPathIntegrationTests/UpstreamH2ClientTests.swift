import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// gRPC through the proxy's own HTTP/2 client (`h2_client: nghttp2`,
/// issue 46): real grpcio clients and servers, the proxy in between on
/// loopback, upstream connections counted with `ss`.
@Suite(.serialized) struct UpstreamH2ClientTests {
    /// Sockets to `port` on this machine in any state (established, TIME-WAIT …), from `ss`.
    static func socketsTo(port: Int) throws -> [String] {
        let r = try runProcess("/usr/bin/ss", ["-Htan", "( dport = :\(port) )"], timeout: 10)
        return r.out.split(separator: "\n").map(String.init)
    }

    static let routes = "  - { match: { path_prefix: / }, upstream: g, upstream_errors: pass }"

    @Test func unaryStreamingErrorsAndLargeMessagesPassThrough() throws {
        try PythonGRPC.withServer(GRPCPassThroughTests.server) { python, port in
            let h = try PythonGRPC.proxy(
                port: port, upstream: ", h2_client: nghttp2", limits: "{ max_request_body: 16MiB }", routes: Self.routes)
            defer { h.stop() }
            let r = try runProcess(python, ["-c", GRPCPassThroughTests.client, "127.0.0.1:\(h.port)"], timeout: 60)
            #expect(r.status == 0, "\(r.err)")
            let lines = r.out.split(separator: "\n").map(String.init)
            #expect(lines.contains("unary echo:hi t1 True"), "\(r.out) \(r.err)")
            #expect(lines.contains("stream part0,part1,part2"), "\(r.out)")
            #expect(lines.contains("fail NOT_FOUND no such thing"), "\(r.out)")
            #expect(lines.contains("big True 5242880"), "\(r.out)")
        }
    }

    /// 8 grpcio channels, 250 unary calls each, 4 at a time per channel.
    static let load = """
        import grpc, sys, threading, json
        from concurrent import futures
        target, ok, bad = sys.argv[1], [0], []
        lock = threading.Lock()
        def channel(n):
            ch = grpc.insecure_channel(target)
            call = ch.unary_unary("/t.S/U")
            for i in range(250):
                try:
                    r = call(b"c%d-%d" % (n, i), timeout=20)
                    with lock:
                        if r == b"echo:c%d-%d" % (n, i): ok[0] += 1
                        else: bad.append(repr(r))
                except grpc.RpcError as e:
                    with lock: bad.append(e.code().name + " " + str(e.details()))
        with futures.ThreadPoolExecutor(8) as ex: list(ex.map(channel, range(8)))
        print(json.dumps({"ok": ok[0], "bad": bad[:5]}))
        """

    @Test func twoThousandCallsShareAHandfulOfConnections() throws {
        try PythonGRPC.withServer(GRPCPassThroughTests.server) { python, port in
            let h = try PythonGRPC.proxy(port: port, upstream: ", h2_client: nghttp2", routes: Self.routes)
            defer { h.stop() }
            let result = try PythonGRPC.run(Self.load, arguments: ["127.0.0.1:\(h.port)"], timeout: 120)
            #expect(result["ok"] as? Int == 2000, "\(result)")
            // Every socket the proxy opened to the upstream, whatever its state
            // now (libcurl's h2c leaves one in TIME-WAIT per call): at most one
            // per worker (2) and one for the health checks (the admin loop's own).
            let sockets = try Self.socketsTo(port: port)
            #expect(sockets.count >= 1 && sockets.count <= 3, "\(sockets.count) sockets to the upstream: \(sockets.prefix(5))")
            #expect(sockets.allSatisfy { $0.hasPrefix("ESTAB") }, "\(sockets.prefix(5))")
        }
    }

    func field(_ request: [String: Any], _ name: String) -> String? {
        (request["fields"] as? [[String]])?.first { $0.first == name }?.last
    }

    /// The Python h2 upstream (`H2Upstream`) sees every request, one after
    /// another and at once, as streams of one connection (one worker).
    @Test func requestsOneAfterAnotherAndAtOnceAreStreamsOfOneConnection() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy("http://127.0.0.1:\(up.plainPort)", extra: "h2_client: nghttp2")
        defer { h.stop() }
        let get = try HTTP.request(port: h.port, "/one/get?q=1", headers: [("X-Tenant", "blue")])
        #expect(get.status == 200)
        #expect(get.header("X-Upstream") == "h2")
        #expect(get.json["path"] as? String == "/one/get?q=1")
        let post = try HTTP.request(port: h.port, "POST", "/one/post", body: Array(repeating: 0x61, count: 3000))
        #expect(post.status == 200)
        #expect(post.json["body_bytes"] as? Int == 3000)
        #expect(
            UpstreamHTTP2Tests.statusesAtOnce(port: h.port, (0..<4).map { "/one/at-once-\($0)?delay=300" })
                == [200, 200, 200, 200])
        let seen = up.requests(to: "/one/", atLeast: 6)
        try #require(seen.count == 6)
        #expect(seen.allSatisfy { $0["reached"] as? String == "h2c" })
        #expect(field(seen[0], "x-tenant") == "blue")
        #expect(field(seen[0], ":authority") == "127.0.0.1:\(up.plainPort)")
        #expect(field(seen[1], "content-length") == "3000")
        let connections = Set(seen.compactMap { $0["conn"] as? Int })
        #expect(connections.count == 1, "\(seen.map { ($0["conn"] ?? "-", $0["stream"] ?? "-") })")
        #expect(Set(seen.compactMap { $0["stream"] as? Int }).count == 6)
    }

    /// Trailers after a body without content-length reach an HTTP/1.1
    /// client that asked for them, in the last chunk.
    @Test func trailersReachAClientThatAsksForThem() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy("http://127.0.0.1:\(up.plainPort)", extra: "h2_client: nghttp2")
        defer { h.stop() }
        let asked = try HTTP.request(port: h.port, "/t/asked?trailers=1", headers: [("TE", "trailers")])
        #expect(asked.status == 200)
        #expect(asked.json["path"] as? String == "/t/asked?trailers=1")
        #expect(asked.trailers.map { "\($0.name.lowercased())=\($0.value)" } == ["grpc-status=0", "x-checksum=c0ffee"])
    }

    /// Nothing listens: the try fails as libcurl's does (a connect
    /// failure, the same answer), never a hang.
    @Test func anUpstreamThatIsNotThereFailsAsWithLibcurl() throws {
        var answers: [String] = []
        for client in ["libcurl", "nghttp2"] {
            let h = try UpstreamHTTP2Tests.proxy("http://127.0.0.1:9", extra: "h2_client: \(client)")
            defer { h.stop() }
            let r = try HTTP.request(port: h.port, "/x")
            answers.append("\(r.status) \(r.json["code"] ?? "-") \(r.json["attempts"] ?? "-")")
        }
        #expect(answers[0] == answers[1], "\(answers)")
        #expect(answers[1].hasPrefix("502") || answers[1].hasPrefix("503"), "\(answers)")
    }

    /// A grpcio server whose `/t.S/Flood` streams 256 KiB messages without
    /// end (printing `flood N` at each call's first), and `/t.S/U` echoes.
    static let floodServer = """
        import grpc, sys
        from concurrent import futures
        def unary(req, ctx): return b"echo:" + req
        started = [0]
        def flood(req, ctx):
            started[0] += 1
            print("flood", started[0], flush=True)
            while ctx.is_active(): yield b"x" * (256 << 10)
        handlers = {"/t.S/U": grpc.unary_unary_rpc_method_handler(unary),
                    "/t.S/Flood": grpc.unary_stream_rpc_method_handler(flood)}
        class H(grpc.GenericRpcHandler):
            def service(self, d): return handlers.get(d.method)
        s = grpc.server(futures.ThreadPoolExecutor(32)); s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True); s.wait_for_termination()
        """

    /// A raw HTTP/2 client that opens 20 `/t.S/Flood` calls with every
    /// stream window shut (SETTINGS_INITIAL_WINDOW_SIZE 0), prints `heads N`
    /// once their heads came, and holds them until killed.
    static let stalledClient = PythonH2.rawFrames + #"""
        import sys, time
        from hyperframe.frame import SettingsFrame
        c = H2(int(sys.argv[1]))
        c.send(SettingsFrame(0, settings={4: 0}).serialize())
        for i in range(20):
            sid = 1 + 2 * i
            c.send(c.headers([(":method", "POST"), (":scheme", "http"), (":authority", "p"), (":path", "/t.S/Flood"),
                              ("content-type", "application/grpc"), ("te", "trailers")], sid=sid),
                   c.data(b"\x00\x00\x00\x00\x00", end=True, sid=sid))
        heads = set()
        for f in c.frames:
            if isinstance(f, HeadersFrame): heads.add(f.stream_id)
            if len(heads) == 20: break
        print("heads", len(heads), flush=True)
        time.sleep(120)
        """#

    /// Twenty server-streaming calls whose client reads nothing hold only
    /// their stream windows (20 × 64 KiB, past the 1 MiB connection window:
    /// that one is given back as DATA arrives): new unary calls on the same
    /// upstream connection (one worker) are answered at once, and the
    /// upstream stays reachable for its health checks throughout.
    @Test func stalledStreamsNeverStallNewCallsOrTheHealthChecks() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.floodServer, lines: serverLines) { python, port in
            let h = try ProxyHarness(
                """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                upstreams:
                  g:
                    endpoints: [http://127.0.0.1:\(port)]
                    protocol: h2
                    h2_client: nghttp2
                    health_check: { interval: 100ms, timeout: 1s, unhealthy_after: 2 }
                routes:
                  - { match: { path_prefix: / }, upstream: g, timeout: 300s, grpc: {}, retry: { attempts: 1, per_try_timeout: 300s } }
                """, workers: 1)
            defer { h.stop() }
            let clientLines = Locked<[String]>([])
            let (stalled, heads) = try startPythonScript(
                python: try PythonH2.python(), Self.stalledClient, arguments: ["\(h.port)"], lines: clientLines)
            defer {
                kill(stalled.processIdentifier, SIGKILL)
                stalled.waitUntilExit()
            }
            #expect(heads == "heads 20")
            #expect(waitUntil("every flood call started at the server") {
                serverLines.withLock { $0.contains("flood 20") }
            })
            let calls = try PythonGRPC.run(
                """
                import grpc, json, sys, time
                ch = grpc.insecure_channel(sys.argv[1]); call = ch.unary_unary("/t.S/U")
                ok, slowest = 0, 0.0
                for i in range(50):
                    t = time.monotonic()
                    try:
                        if call(b"n%d" % i, timeout=2) == b"echo:n%d" % i: ok += 1
                    except grpc.RpcError as e: print(e.code().name, file=sys.stderr)
                    slowest = max(slowest, time.monotonic() - t)
                print(json.dumps({"ok": ok, "slowest": slowest}))
                """, arguments: ["127.0.0.1:\(h.port)"], timeout: 120)
            #expect(calls["ok"] as? Int == 50, "\(calls)")
            #expect((calls["slowest"] as? Double ?? 99) < 1, "\(calls)")
            let admin = AdminProbe(port: h.adminPort)
            #expect(try admin.upstream("g")["reachable"] as? Bool == true)
            // One connection for the worker's calls, stalled or not, and one for the health checks.
            let sockets = try Self.socketsTo(port: port)
            #expect(sockets.count <= 2 && sockets.allSatisfy { $0.hasPrefix("ESTAB") }, "\(sockets)")
        }
    }

    /// A stream the upstream refuses (RST_STREAM REFUSED_STREAM) was never
    /// processed: the POST is sent again on another stream inside the
    /// transport, without a retry (`attempts: 1`) or the retry budget,
    /// and answered; counted in `happypath_upstream_h2_streams_replayed_total`.
    @Test func aRefusedStreamOfAPostIsSentAgainWithoutARetry() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", extra: "h2_client: nghttp2",
            defaults: "{ retry: { attempts: 1 }, reachability: { park_for: 0s } }")
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "POST", "/r/post?refuse=2&key=a", body: Array(repeating: 0x62, count: 5000))
        #expect(r.status == 200, "\(r.text)")
        #expect(r.json["body_bytes"] as? Int == 5000)
        #expect(r.header("X-Happypath-Attempts") == nil || r.header("X-Happypath-Attempts") == "1")
        let seen = up.requests(to: "/r/", atLeast: 3)
        #expect(seen.count == 3, "two refused, one answered")
        #expect(seen.allSatisfy { $0["body_bytes"] as? Int == 5000 }, "the whole body each time")
        let admin = AdminProbe(port: h.adminPort)
        #expect(try admin.metric(#"happypath_upstream_h2_streams_replayed_total{upstream="u"}"#) == 2)
        #expect(try admin.metric(#"happypath_upstream_h2_connections{upstream="u"}"#) >= 1)
        // The same on /admin/state and the status page.
        let h2 = try admin.upstream("u")["h2"] as? [String: Any] ?? [:]
        #expect(h2["streams_replayed"] as? Int == 2, "\(h2)")
        #expect((h2["connections"] as? Int ?? 0) >= 1 && (h2["connections_opened"] as? Int ?? 0) >= 1, "\(h2)")
        let page = try HTTP.request(port: h.adminPort, "/status").text
        #expect(page.contains("2 streams sent again after a refusal"), "the status page's HTTP/2 line")
        // Refused three times: a failure as for a request that never left.
        let refused = try HTTP.request(port: h.port, "POST", "/r/again?refuse=3&key=b", body: [0x63])
        #expect(refused.status == 503 || refused.status == 502, "\(refused.status) \(refused.text)")
        #expect(up.requests(to: "/r/again", atLeast: 3).count == 3)
    }

    /// A grpcio server that drains every connection older than 200 ms
    /// (GOAWAY, then the calls in flight finish): 2,000 unary calls through
    /// the proxy all succeed, on a new connection after each GOAWAY.
    @Test func goawaysMidLoadLoseNoCall() throws {
        let server = GRPCPassThroughTests.server.replacingOccurrences(
            of: "s = grpc.server(futures.ThreadPoolExecutor(4), options=opts)",
            with: """
                s = grpc.server(futures.ThreadPoolExecutor(4), options=opts + [("grpc.max_connection_age_ms", 200), ("grpc.max_connection_age_grace_ms", 5000)])
                """)
        #expect(server != GRPCPassThroughTests.server)
        try PythonGRPC.withServer(server) { python, port in
            let h = try PythonGRPC.proxy(port: port, upstream: ", h2_client: nghttp2", routes: Self.routes)
            defer { h.stop() }
            let result = try PythonGRPC.run(Self.load, arguments: ["127.0.0.1:\(h.port)"], timeout: 120)
            #expect(result["ok"] as? Int == 2000, "\(result)")
            let admin = AdminProbe(port: h.adminPort)
            #expect(try admin.metric(#"happypath_upstream_h2_goaways_total{upstream="g"}"#) >= 2)
            #expect(try admin.metric(#"happypath_upstream_h2_connections_opened_total{upstream="g"}"#) >= 3)
        }
    }

    /// An upstream silent for `limits.client_timeout` (1 s) is cut as
    /// libcurl's stall check cuts it: the same answer on both clients,
    /// long before the route's 5 s.
    @Test func aSilentUpstreamIsCutAfterTheIdleTimeoutAsWithLibcurl() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        var answers: [String] = []
        for client in ["libcurl", "nghttp2"] {
            let h = try UpstreamHTTP2Tests.proxy(
                "http://127.0.0.1:\(up.plainPort)", extra: "h2_client: \(client)",
                defaults: "{ retry: { attempts: 1, per_try_timeout: 5s }, reachability: { park_for: 0s } }",
                limits: "{ client_timeout: 1s }")
            defer { h.stop() }
            let started = Date()
            let r = try HTTP.request(port: h.port, "/idle/\(client)?delay=4000", timeout: 10)
            let elapsed = Date().timeIntervalSince(started)
            answers.append("\(r.status) \(r.json["code"] ?? "-")")
            #expect(elapsed >= 0.9 && elapsed < 3, "\(client): \(elapsed) s")
        }
        #expect(answers[0] == answers[1], "\(answers)")
        #expect(answers[1].hasPrefix("504"), "\(answers)")
    }

    /// A whole answer that comes before the request's body went, then
    /// RST_STREAM NO_ERROR (RFC 9113 section 8.1: "stop sending"): the
    /// answer is complete, not a reset stream.
    @Test func anAnswerBeforeTheBodyThenNoErrorIsComplete() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", extra: "h2_client: nghttp2",
            defaults: "{ retry: { attempts: 1 }, reachability: { park_for: 0s } }")
        defer { h.stop() }
        let r = try HTTP.request(
            port: h.port, "POST", "/early?early=1", body: Array(repeating: 0x65, count: 3 << 20), timeout: 10)
        #expect(r.status == 413, "\(r.status) \(r.text)")
        #expect(r.json["detail"] as? String == "The upstream answered 413.", "the upstream's answer, not a failure")
    }

    /// Sets the workers' `pingAfterSilence` and waits until each has it.
    static func pingAfterSilence(_ d: Duration, on h: ProxyHarness, workers: Int) {
        let applied = Locked(0)
        for w in 0..<workers {
            h.proxy.onWorker(w) { worker in
                worker.transports.h2.pingAfterSilence = d
                applied.withLock { $0 += 1 }
            }
        }
        _ = waitUntil("every worker has the new pingAfterSilence") { applied.withLock { $0 } == workers }
    }

    /// A connection whose server died behind an open socket: before the
    /// next request goes on it (silent past `pingAfterSilence`, 0 here), a
    /// PING; no ACK within `connect_timeout` (1 s) closes it, and the
    /// request goes on a new connection and is answered, never lost on the
    /// dead one (a POST too).
    @Test func aDeadConnectionIsFoundByAPingBeforeARequestGoesOnIt() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", extra: "h2_client: nghttp2",
            defaults: "{ retry: { attempts: 1 }, reachability: { park_for: 0s } }")
        defer { h.stop() }
        Self.pingAfterSilence(.zero, on: h, workers: 1)
        let first = try HTTP.request(port: h.port, "/dead/first?mute=1")
        #expect(first.status == 200)
        let started = Date()
        let post = try HTTP.request(port: h.port, "POST", "/dead/after", body: Array("once".utf8), timeout: 10)
        let elapsed = Date().timeIntervalSince(started)
        #expect(post.status == 200, "\(post.status) \(post.text)")
        #expect(elapsed >= 0.8 && elapsed < 4, "\(elapsed) s: the PING's deadline, then a new connection")
        #expect(post.json["conn"] as? Int != first.json["conn"] as? Int, "answered on another connection")
        let seen = up.requests(to: "/dead/after", atLeast: 1)
        #expect(seen.count == 1, "the POST reached the upstream once")
        let admin = AdminProbe(port: h.adminPort)
        #expect(try admin.metric(#"happypath_upstream_h2_connections_opened_total{upstream="u"}"#) >= 2)
    }

    /// A PING before every call (`pingAfterSilence` 0, harsher than the 10 s
    /// default) against grpcio, whose servers answer pings they find too
    /// frequent with GOAWAY ENHANCE_YOUR_CALM "too_many_pings": each PING
    /// is followed by a call, so 20 calls one after another draw none.
    @Test func pingsBeforeCallsDrawNoGoawayFromGRPC() throws {
        try PythonGRPC.withServer(GRPCPassThroughTests.server) { python, port in
            let h = try PythonGRPC.proxy(port: port, upstream: ", h2_client: nghttp2", routes: Self.routes)
            defer { h.stop() }
            Self.pingAfterSilence(.zero, on: h, workers: 2)
            let result = try PythonGRPC.run(
                """
                import grpc, json, sys, time
                ch = grpc.insecure_channel(sys.argv[1]); call = ch.unary_unary("/t.S/U"); ok = 0
                for i in range(20):
                    if call(b"p%d" % i, timeout=5) == b"echo:p%d" % i: ok += 1
                    time.sleep(0.05)
                print(json.dumps({"ok": ok}))
                """, arguments: ["127.0.0.1:\(h.port)"], timeout: 60)
            #expect(result["ok"] as? Int == 20, "\(result)")
            let admin = AdminProbe(port: h.adminPort)
            #expect(try admin.metric(#"happypath_upstream_h2_goaways_total{upstream="g"}"#) == 0)
            #expect(try admin.metric(#"happypath_upstream_h2_connections_opened_total{upstream="g"}"#) <= 3)
        }
    }
}
