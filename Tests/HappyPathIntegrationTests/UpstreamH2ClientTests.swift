import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// gRPC through the proxy's own HTTP/2 client (`protocol: h2`,
/// issue 46): real grpcio clients and servers, the proxy in between on
/// loopback, upstream connections counted with `ss`.
@Suite(.serialized) struct UpstreamH2ClientTests {
    /// Sockets to `port` on this machine in any state (established, TIME-WAIT …), from `ss`.
    static func socketsTo(port: Int) throws -> [String] {
        let r = try runProcess("/usr/bin/ss", ["-Htan", "( dport = :\(port) )"], timeout: 10)
        return r.out.split(separator: "\n").map(String.init)
    }

    static let routes = "  - { match: { path_prefix: / }, upstream: g, upstream_errors: pass }"

    /// 8 grpcio channels, 250 unary calls each (or the second argument), one at a time per channel.
    static let load = """
        import grpc, sys, threading, json
        from concurrent import futures
        target, ok, bad = sys.argv[1], [0], []
        lock = threading.Lock()
        per = int(sys.argv[2]) if len(sys.argv) > 2 else 250
        def channel(n):
            ch = grpc.insecure_channel(target)
            call = ch.unary_unary("/t.S/U")
            for i in range(per):
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

    @Test(.disabled(if: OverloadAttackTests.plainOnce, "grpcio load: run by the address sanitizer's pass")) func twoThousandCallsShareAHandfulOfConnections() throws {
        try PythonGRPC.withServer(GRPCPassThroughTests.server) { python, port in
            // Sockets to this port from before the proxy (another test's, when
            // the port was someone else's a minute ago) are not the proxy's.
            let before = Set(try Self.socketsTo(port: port))
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }
            let result = try PythonGRPC.run(Self.load, arguments: ["127.0.0.1:\(h.port)"], timeout: 120)
            #expect(result["ok"] as? Int == 2000, "\(result)")
            // Every socket the proxy opened to the upstream, whatever its state
            // now (libcurl's h2c leaves one in TIME-WAIT per call): at most one
            // per worker (2) and one for the health checks (the admin loop's own).
            let sockets = try Self.socketsTo(port: port).filter { !before.contains($0) }
            #expect(sockets.count >= 1 && sockets.count <= 3, "\(sockets.count) sockets to the upstream: \(sockets.prefix(5))")
            #expect(sockets.allSatisfy { $0.hasPrefix("ESTAB") }, "\(sockets.prefix(5))")
        }
    }





    /// A grpcio server whose `/t.S/Flood` streams 256 KiB messages without
    /// end (printing `flood N` at each call's first), and `/t.S/U` echoes.
    static let floodServer = """
        import grpc, sys, threading
        from concurrent import futures
        def unary(req, ctx): return b"echo:" + req
        started, lock = [0], threading.Lock()  # the pool's threads would lose counts and mix their lines
        def flood(req, ctx):
            with lock:
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
            // Sockets to this port before the proxy's: another test may have used the port number minutes ago
            // and left its connections in TIME-WAIT (load tests make thousands).
            let before = Set(try Self.socketsTo(port: port))
            let h = try ProxyHarness(
                """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                upstreams:
                  g:
                    endpoints: [http://127.0.0.1:\(port)]
                    protocol: h2
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
            #expect(
                waitUntil("every flood call started at the server") {
                    serverLines.withLock { $0.contains("flood 20") }
                }, "\(serverLines.withLock { $0 }) \(clientLines.withLock { $0 })")
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
            let sockets = try Self.socketsTo(port: port).filter { !before.contains($0) }
            #expect(sockets.count <= 2 && sockets.allSatisfy { $0.hasPrefix("ESTAB") }, "\(sockets)")
        }
    }


    /// A grpcio server that drains every connection older than 50 ms
    /// (GOAWAY, then the calls in flight finish): 1,000 unary calls through
    /// the proxy all succeed, on a new connection after each GOAWAY. (The
    /// age is short enough that even a fast build, which sends the 1,000 in
    /// half a second, meets several drains.)
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "grpcio load: run by the address sanitizer's pass")) func goawaysMidLoadLoseNoCall() throws {
        let server = GRPCPassThroughTests.server.replacingOccurrences(
            of: "s = grpc.server(futures.ThreadPoolExecutor(4), options=opts)",
            with: """
                s = grpc.server(futures.ThreadPoolExecutor(4), options=opts + [("grpc.max_connection_age_ms", 50), ("grpc.max_connection_age_grace_ms", 5000)])
                """)
        #expect(server != GRPCPassThroughTests.server)
        try PythonGRPC.withServer(server) { python, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }
            let result = try PythonGRPC.run(Self.load, arguments: ["127.0.0.1:\(h.port)", "125"], timeout: 120)
            #expect(result["ok"] as? Int == 1000, "\(result)")
            let admin = AdminProbe(port: h.adminPort)
            #expect(try admin.metric(#"happypath_upstream_h2_goaways_total{upstream="g"}"#) >= 2)
            #expect(try admin.metric(#"happypath_upstream_h2_connections_opened_total{upstream="g"}"#) >= 3)
        }
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


    /// A PING before every call (`pingAfterSilence` 0, harsher than the 10 s
    /// default) against grpcio, whose servers answer pings they find too
    /// frequent with GOAWAY ENHANCE_YOUR_CALM "too_many_pings": each PING
    /// is followed by a call, so 20 calls one after another draw none.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "grpcio load: run by the address sanitizer's pass")) func pingsBeforeCallsDrawNoGoawayFromGRPC() throws {
        try PythonGRPC.withServer(GRPCPassThroughTests.server) { python, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
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
