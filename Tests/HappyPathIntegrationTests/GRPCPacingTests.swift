import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Pacing on gRPC (issue 34): an upstream's RESOURCE_EXHAUSTED whose
/// `grpc-status-details-bin` carries a `google.rpc.RetryInfo` pauses its
/// upstream (or its client) when `pacing.on` names `resource-exhausted`,
/// with a real grpcio server that aborts with rich details and a real
/// grpcio client.
@Suite(.serialized) struct GRPCPacingTests {
    /// `/t.P/Quota` fails RESOURCE_EXHAUSTED with RetryInfo 1 s the first
    /// time per key (a Trailers-Only answer), then answers; `/t.P/Stream`
    /// sends one message, then fails RESOURCE_EXHAUSTED with RetryInfo 30 s
    /// (the status in the trailers); `/t.P/Echo` answers.
    static let server = """
        from grpc_status import rpc_status
        from google.rpc import code_pb2, error_details_pb2, status_pb2
        from google.protobuf import any_pb2, duration_pb2
        def exhausted(ctx, seconds):
            retry = any_pb2.Any()
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds)))
            ctx.abort_with_status(rpc_status.to_status(
                status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="quota", details=[retry])))
        def quota(req, ctx):
            if hit(ctx, "Quota") == 0: exhausted(ctx, 1)
            return b"ok"
        def stream(req, ctx):
            hit(ctx, "Stream"); yield b"first"; exhausted(ctx, 30)
        def echo(req, ctx):
            hit(ctx, "Echo"); return b"echo"
        serve({"/t.P/Quota": grpc.unary_unary_rpc_method_handler(quota),
               "/t.P/Stream": grpc.unary_stream_rpc_method_handler(stream),
               "/t.P/Echo": grpc.unary_unary_rpc_method_handler(echo)})
        """

    /// `python client.py ADDRESS KIND PATH KEY`: prints the outcome (with
    /// the ErrorInfo reason and RetryInfo seconds of its details), then
    /// the seconds the call took.
    static let client =
        PythonGRPC.richStatus + """
            import grpc, sys, time
            from grpc_status import rpc_status
            ch = grpc.insecure_channel(sys.argv[1])
            kind, path, key = sys.argv[2:5]
            started = time.monotonic()
            try:
                if kind == "stream":
                    out = "ok " + ",".join(m.decode() for m in ch.unary_stream(path)(b"x", metadata=(("k", key),), timeout=20))
                else:
                    out = "ok " + ch.unary_unary(path)(b"x", metadata=(("k", key),), timeout=20).decode()
            except grpc.RpcError as e:
                out = "%s %s" % (e.code().name, e.details())
                status = rpc_status.from_call(e)
                details = rich(status) if status else {}
                if "reason" in details: out += " reason=" + details["reason"]
                if "retry_delay" in details: out += " retry=%d" % details["retry_delay"][0]
            print(out)
            print("took %.3f" % (time.monotonic() - started))
            """

    static func call(_ port: Int, _ kind: String, _ path: String, _ key: String) throws -> (String, Double) {
        let r = try runProcess(try PythonGRPC.python(), ["-c", Self.client, "127.0.0.1:\(port)", kind, path, key], timeout: 60)
        let lines = r.out.split(separator: "\n").map(String.init)
        let took = lines.last.flatMap { Double($0.dropFirst("took ".count)) } ?? -1
        return (lines.first ?? "(no output) \(r.err)", took)
    }

    /// The proxy in front of the server: its upstream `g` with `pacing`,
    /// one route to it, with `route` added to the route's mapping.
    static func proxy(_ port: Int, pacing: String, route: String = "") throws -> ProxyHarness {
        try PythonGRPC.proxy(
            port: port, upstream: ", pacing: \(pacing)",
            routes: "  - { match: { path_prefix: / }, upstream: g, grpc: {}\(route) }")
    }

    /// Calls of `method` with key `key` the server printed (`hit`).
    static func hits(_ lines: Locked<[String]>, _ method: String, _ key: String) -> Int {
        lines.withLock { $0.filter { $0 == "hit \(method) \(key)" }.count }
    }

    /// The status in the trailers, after a message: the call is the
    /// client's as the upstream gave it, and the upstream is paused
    /// (`scope_429: upstream`): the next call, to another method, is
    /// answered by the proxy at once (`while_paused: fail`) as a 429 pause
    /// is, RESOURCE_EXHAUSTED, and never reaches the upstream. An upstream
    /// whose `pacing.on` does not name `resource-exhausted` is not paused.
    @Test func aResourceExhaustedWithRetryInfoPausesTheUpstream() throws {
        let lines = Locked<[String]>([])
        try PythonGRPC.withServer(PythonGRPC.serverKit + Self.server, lines: lines) { _, port in
            // Without resource-exhausted in pacing.on: passed, and nothing paused.
            let plain = try Self.proxy(port, pacing: "{ on: [429, 503], scope_429: upstream, while_paused: fail }")
            defer { plain.stop() }
            let (passed, _) = try Self.call(plain.port, "stream", "/t.P/Stream", "p")
            #expect(passed == "RESOURCE_EXHAUSTED quota retry=30", "\(passed)")
            let (passedNext, _) = try Self.call(plain.port, "unary", "/t.P/Echo", "p2")
            #expect(passedNext == "ok echo", "\(passedNext)")
            #expect(Self.hits(lines, "Echo", "p2") == 1)
            try Self.pausesTheUpstream(port: port, lines: lines)
        }
    }

    static func pausesTheUpstream(port: Int, lines: Locked<[String]>) throws {
        let h = try Self.proxy(port, pacing: "{ on: [503, resource-exhausted], scope_429: upstream, while_paused: fail }")
        defer { h.stop() }

        // The upstream's own error, details and all, reaches its client unchanged.
        let (first, _) = try Self.call(h.port, "stream", "/t.P/Stream", "a")
        #expect(first == "RESOURCE_EXHAUSTED quota retry=30", "\(first)")
        let state = try HTTP.request(port: h.adminPort, "/admin/state").text
        #expect(state.contains("\"paused_until\":\""), "\(state)")
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        let paused = metrics.split(separator: "\n").first {
            $0.hasPrefix("happypath_upstream_paused_seconds{upstream=\"g\",scope=\"upstream\"}")
        }
        let seconds = paused.flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
        #expect((25...30).contains(seconds), "\(paused ?? "no gauge")")

        // The next call is the proxy's to answer: the pause's own RESOURCE_EXHAUSTED, with its wait.
        let (next, took) = try Self.call(h.port, "unary", "/t.P/Echo", "b")
        #expect(next.hasPrefix("RESOURCE_EXHAUSTED "), "\(next)")
        #expect(next.contains("reason=RATE_LIMITED"), "\(next)")
        let wait = next.split(separator: " ").first { $0.hasPrefix("retry=") }.flatMap { Int($0.dropFirst("retry=".count)) }
        #expect((25...30).contains(wait ?? 0), "\(next)")
        #expect(took < 5)
        #expect(Self.hits(lines, "Echo", "b") == 0)
        #expect(Self.hits(lines, "Stream", "a") == 1)
    }

    /// `scope_429: client` (the default): one client's RESOURCE_EXHAUSTED
    /// pauses that client only. The route's rate limit is keyed by the
    /// `k` metadata, so `k` is who a client is; client `a` is paused, and
    /// client `b`'s call, to the same upstream at the same moment, goes.
    @Test func aClientsResourceExhaustedPausesThatClientAlone() throws {
        let lines = Locked<[String]>([])
        try PythonGRPC.withServer(PythonGRPC.serverKit + Self.server, lines: lines) { _, port in
            let h = try Self.proxy(
                port, pacing: "{ on: [resource-exhausted], while_paused: fail }",
                route: ", rate_limit: { rate: 1000/s, key: \"header:k\" }")
            defer { h.stop() }
            let (first, _) = try Self.call(h.port, "stream", "/t.P/Stream", "a")
            #expect(first == "RESOURCE_EXHAUSTED quota retry=30", "\(first)")
            let (other, _) = try Self.call(h.port, "unary", "/t.P/Echo", "b")
            #expect(other == "ok echo", "\(other)")
            #expect(Self.hits(lines, "Echo", "b") == 1)
            let (again, _) = try Self.call(h.port, "unary", "/t.P/Echo", "a")
            #expect(again.hasPrefix("RESOURCE_EXHAUSTED ") && again.contains("reason=RATE_LIMITED"), "\(again)")
            #expect(Self.hits(lines, "Echo", "a") == 0)
        }
    }

    /// A Trailers-Only RESOURCE_EXHAUSTED that the route retries
    /// (`retry.on: [resource-exhausted]`) pauses its client (`scope_429:
    /// client`, the default) for the RetryInfo's second; the retry waits for
    /// the pause (`while_paused: wait`), then reaches the upstream, and the
    /// client sees only the answer.
    @Test func aHeldResourceExhaustedIsRetriedAfterThePause() throws {
        let lines = Locked<[String]>([])
        try PythonGRPC.withServer(PythonGRPC.serverKit + Self.server, lines: lines) { _, port in
            let h = try Self.proxy(
                port, pacing: "{ on: [resource-exhausted] }",
                route: ", retry: { attempts: 2, on: [resource-exhausted], backoff: { base: 10ms, max: 10ms } }")
            defer { h.stop() }
            try Self.retriedAfterThePause(h, lines: lines)
        }
    }

    static func retriedAfterThePause(_ h: ProxyHarness, lines: Locked<[String]>) throws {
        let (out, took) = try Self.call(h.port, "unary", "/t.P/Quota", "c")
        #expect(out == "ok ok", "\(out)")
        #expect(Self.hits(lines, "Quota", "c") == 2)
        // The retry waited for the pause (1 s), not the 10 ms backoff.
        #expect(took >= 0.9, "took \(took)")
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(metrics.contains("happypath_upstream_paused_seconds{upstream=\"g\",scope=\"client\"} 0"), "\(metrics)")
        // The breaker did not count the pause's answer as a failure.
        let state = try HTTP.request(port: h.adminPort, "/admin/state").text
        #expect(state.contains("\"circuit_breaker\":{\"state\":\"closed\"}"), "\(state)")
    }
}
