import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `retry.on` with gRPC status names (issue 34, gRFC A6), with a real
/// grpcio client and server: an UNAVAILABLE that the route names is retried
/// though every call is a POST, a NOT_FOUND is not, a call whose answer has
/// begun (a message relayed) is never retried, and a status the route does
/// not name passes as it came.
@Suite(.serialized) struct GRPCRetryTests {
    /// Prints `hit METHOD KEY` for every call (key: the `k` metadata).
    /// `/t.R/Flaky` fails UNAVAILABLE the first time per key, then answers;
    /// `/t.R/Gone` fails NOT_FOUND; `/t.R/Half` streams one message, then
    /// fails UNAVAILABLE; `/t.R/Busy` fails RESOURCE_EXHAUSTED the first time;
    /// `/t.R/Slow` answers after 3 s the first time per key, at once after.
    static let server = """
        import grpc, threading, time
        from concurrent import futures
        seen = {}
        lock = threading.Lock()
        def hit(ctx, name):
            k = dict(ctx.invocation_metadata()).get("k", "-")
            with lock:  # the print too: two threads' words would interleave
                n = seen.get((name, k), 0); seen[(name, k)] = n + 1
                print("hit", name, k, flush=True)
            return n
        def flaky(req, ctx):
            if hit(ctx, "Flaky") == 0: ctx.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            return b"ok:" + req
        def gone(req, ctx):
            hit(ctx, "Gone"); ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        def half(req, ctx):
            hit(ctx, "Half"); yield b"first"; ctx.abort(grpc.StatusCode.UNAVAILABLE, "went away")
        def slow(req, ctx):
            if hit(ctx, "Slow") == 0: time.sleep(3)
            return b"ok"
        def busy(req, ctx):
            if hit(ctx, "Busy") == 0: ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
            return b"ok"
        handlers = {"/t.R/Flaky": grpc.unary_unary_rpc_method_handler(flaky),
                    "/t.R/Gone": grpc.unary_unary_rpc_method_handler(gone),
                    "/t.R/Half": grpc.unary_stream_rpc_method_handler(half),
                    "/t.R/Busy": grpc.unary_unary_rpc_method_handler(busy),
                    "/t.R/Slow": grpc.unary_unary_rpc_method_handler(slow)}
        class H(grpc.GenericRpcHandler):
            def service(self, d): return handlers.get(d.method)
        s = grpc.server(futures.ThreadPoolExecutor(4)); s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True); s.wait_for_termination()
        """

    static let client = """
        import grpc, sys
        ch = grpc.insecure_channel(sys.argv[1])
        def call(kind, method, key):
            try:
                if kind == "stream":
                    got = [m.decode() for m in ch.unary_stream(method)(b"x", metadata=(("k", key),), timeout=10)]
                    return "ok " + ",".join(got)
                return "ok " + ch.unary_unary(method)(b"x", metadata=(("k", key),), timeout=10).decode()
            except grpc.RpcError as e:
                return "%s %s" % (e.code().name, e.details())
        print("flaky", call("unary", "/t.R/Flaky", "a"), flush=True)
        print("gone", call("unary", "/t.R/Gone", "b"), flush=True)
        print("busy", call("unary", "/t.R/Busy", "c"), flush=True)
        got = []
        try:
            for m in ch.unary_stream("/t.R/Half")(b"x", metadata=(("k", "d"),), timeout=10): got.append(m.decode())
            print("half ok", ",".join(got), flush=True)
        except grpc.RpcError as e:
            print("half", ",".join(got), e.code().name, e.details(), flush=True)
        """

    @Test func unavailableIsRetriedNotFoundIsNotAndAStartedAnswerNever() throws {
        let lines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: lines) { python, port in
            let h = try PythonGRPC.proxy(
                port: port,
                routes: """
                      - match: { path_prefix: / }
                        upstream: g
                        grpc: {}
                        retry: { attempts: 3, on: [unavailable], backoff: { base: 10ms, max: 10ms } }
                    """)
            defer { h.stop() }
            let r = try runProcess(python, ["-c", Self.client, "127.0.0.1:\(h.port)"], timeout: 60)
            #expect(r.status == 0, "\(r.err)")
            let out = r.out.split(separator: "\n").map(String.init)
            func hits(_ method: String, _ key: String) -> Int { lines.withLock { $0.filter { $0 == "hit \(method) \(key)" }.count } }
            // UNAVAILABLE, named by retry.on: tried again, and the client sees only the success.
            #expect(out.contains("flaky ok ok:x"), "\(out)")
            #expect(hits("Flaky", "a") == 2)
            // NOT_FOUND: passed as the upstream gave it, once.
            #expect(out.contains("gone NOT_FOUND no such thing"), "\(out)")
            #expect(hits("Gone", "b") == 1)
            // RESOURCE_EXHAUSTED is not named by this route: passed as it came, not retried.
            #expect(out.contains("busy RESOURCE_EXHAUSTED slow down"), "\(out)")
            #expect(hits("Busy", "c") == 1)
            // A message was relayed before the UNAVAILABLE: the call is committed, never retried (gRFC A6).
            #expect(out.contains("half first UNAVAILABLE went away"), "\(out)")
            #expect(hits("Half", "d") == 1)
        }
    }

    static let hedgingClient = """
        import grpc, sys, time
        ch = grpc.insecure_channel(sys.argv[1])
        for path in ("/idem/t.R/Slow", "/plain/t.R/Slow"):
            started = time.monotonic()
            r = ch.unary_unary(path)(b"x", metadata=(("k", path),), timeout=10)
            print(path, r.decode(), "fast" if time.monotonic() - started < 2 else "slow", flush=True)
        """

    /// `grpc: { idempotent: true }` lets a route hedge its calls (and send
    /// them again after a reset or a timeout); without it a call is a POST
    /// the proxy sends once.
    @Test func anIdempotentGRPCRouteHedgesAndAnotherDoesNot() throws {
        let lines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: lines) { python, port in
            // A budget that lets every call here be hedged (a hedge spends the ratio only).
            let h = try PythonGRPC.proxy(
                port: port, upstream: ", retry: { budget: { ratio: 1 } }",
                routes: """
                      - match: { path_prefix: /idem/ }
                        upstream: g
                        strip_prefix: /idem
                        grpc: { idempotent: true }
                        retry: { per_try_timeout: 5s }
                        hedge: { after: 100ms }
                      - match: { path_prefix: /plain/ }
                        upstream: g
                        strip_prefix: /plain
                        grpc: {}
                        retry: { per_try_timeout: 5s }
                        hedge: { after: 100ms }
                    """)
            defer { h.stop() }
            let r = try runProcess(python, ["-c", Self.hedgingClient, "127.0.0.1:\(h.port)"], timeout: 60)
            #expect(r.status == 0, "\(r.err)")
            let out = r.out.split(separator: "\n").map(String.init)
            func hits(_ key: String) -> Int { lines.withLock { $0.filter { $0 == "hit Slow \(key)" }.count } }
            #expect(out.first == "/idem/t.R/Slow ok fast", "\(out)")
            #expect(hits("/idem/t.R/Slow") == 2)
            #expect(out.last == "/plain/t.R/Slow ok slow", "\(out)")
            #expect(hits("/plain/t.R/Slow") == 1)
        }
    }
}
