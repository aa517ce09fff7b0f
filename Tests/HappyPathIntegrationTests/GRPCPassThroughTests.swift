import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// gRPC calls from a real grpcio client through the proxy (h2c) to a real
/// grpcio server behind `protocol: h2` (issue 34's pass-through, first
/// part): what HTTP/2 at both ends already carries. Services are generic
/// handlers, so no code is generated.
@Suite(.serialized) struct GRPCPassThroughTests {
    /// A grpcio server: `/t.S/U` echoes with trailing metadata, `/t.S/SS`
    /// streams three messages, `/t.S/F` fails NOT_FOUND with a message,
    /// `/t.S/Big` echoes a large message. Prints its port.
    static let server = """
        import grpc
        from concurrent import futures
        def unary(req, ctx):
            ctx.set_trailing_metadata((("x-trailer", "t1"), ("x-bin-bin", b"\\\\x00\\\\xff")))
            return b"echo:" + req
        def stream(req, ctx):
            for i in range(3): yield b"part%d" % i
        def fail(req, ctx): ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        def big(req, ctx): return req
        def gather(it, ctx): return b",".join(it)
        def chat(it, ctx):
            for m in it: yield b"re:" + m
        handlers = {"/t.S/U": grpc.unary_unary_rpc_method_handler(unary),
                    "/t.S/CS": grpc.stream_unary_rpc_method_handler(gather),
                    "/t.S/Chat": grpc.stream_stream_rpc_method_handler(chat),
                    "/t.S/SS": grpc.unary_stream_rpc_method_handler(stream),
                    "/t.S/F": grpc.unary_unary_rpc_method_handler(fail),
                    "/t.S/Big": grpc.unary_unary_rpc_method_handler(big)}
        class H(grpc.GenericRpcHandler):
            def service(self, d): return handlers.get(d.method)
        opts = [("grpc.max_receive_message_length", 16 << 20), ("grpc.max_send_message_length", 16 << 20)]
        s = grpc.server(futures.ThreadPoolExecutor(4), options=opts); s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True); s.wait_for_termination()
        """

    /// The calls, each outcome a line.
    static let client = """
        import grpc, sys
        opts = [("grpc.max_receive_message_length", 16 << 20), ("grpc.max_send_message_length", 16 << 20)]
        ch = grpc.insecure_channel(sys.argv[1], options=opts)
        r, call = ch.unary_unary("/t.S/U").with_call(b"hi", metadata=(("x-meta", "m1"),), timeout=10)
        md = dict(call.trailing_metadata())
        print("unary", r.decode(), md.get("x-trailer"), md.get("x-bin-bin") == b"\\\\x00\\\\xff")
        print("stream", ",".join(m.decode() for m in ch.unary_stream("/t.S/SS")(b"x", timeout=10)))
        try: ch.unary_unary("/t.S/F")(b"x", timeout=10)
        except grpc.RpcError as e: print("fail", e.code().name, e.details())
        payload = bytes(range(256)) * (5 * 4096)
        print("big", ch.unary_unary("/t.S/Big")(payload, timeout=20) == payload, len(payload))
        """

    @Test func unaryStreamingErrorsAndLargeMessagesPassThrough() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { python, port in
            let h = try PythonGRPC.proxy(
                port: port, limits: "{ max_request_body: 16MiB }",
                routes: "  - { match: { path_prefix: / }, upstream: g, upstream_errors: pass }")
            defer { h.stop() }
            let r = try runProcess(python, ["-c", Self.client, "127.0.0.1:\(h.port)"], timeout: 60)
            #expect(r.status == 0, "\(r.err)")
            let lines = r.out.split(separator: "\n").map(String.init)
            // The message, trailing metadata (text and -bin) relayed as trailers.
            #expect(lines.contains("unary echo:hi t1 True"), "\(r.out) \(r.err)")
            #expect(lines.contains("stream part0,part1,part2"), "\(r.out)")
            // A trailers-only error reaches the client as one: code and message intact.
            #expect(lines.contains("fail NOT_FOUND no such thing"), "\(r.out)")
            // 5 MiB each way.
            #expect(lines.contains("big True 5242880"), "\(r.out)")
        }
    }

    /// Client-streaming and bidirectional calls, the client's next message
    /// sent only once the server answered its last: without request bodies
    /// that stream (the proxy waiting for the client's END_STREAM), the
    /// bidirectional call could not progress past its first message.
    static let streamingClient = """
        import grpc, sys, queue
        ch = grpc.insecure_channel(sys.argv[1])
        print("cs", ch.stream_unary("/t.S/CS")(iter([b"a", b"b", b"c"]), timeout=10).decode(), flush=True)
        answers = queue.Queue()
        def messages():
            yield b"m0"
            for i in (1, 2):
                answers.get(timeout=10)  # the answer to the last message came back first
                yield b"m%d" % i
        replies = []
        for r in ch.stream_stream("/t.S/Chat")(messages(), timeout=20):
            replies.append(r.decode()); answers.put(r)
        print("chat", ",".join(replies), flush=True)
        """

    @Test func clientStreamingAndBidirectionalCallsStreamBothWays() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { python, port in
            let h = try PythonGRPC.proxy(
                port: port, routes: "  - { match: { path_prefix: / }, upstream: g, upstream_errors: pass }")
            defer { h.stop() }
            let r = try runProcess(python, ["-c", Self.streamingClient, "127.0.0.1:\(h.port)"], timeout: 60)
            #expect(r.status == 0, "\(r.err)")
            #expect(r.out.split(separator: "\n").map(String.init) == ["cs a,b,c", "chat re:m0,re:m1,re:m2"], "\(r.err)")
        }
    }

    /// A client's `TE` naming `trailers` is what makes the proxy send its
    /// own `TE: trailers` upstream (gRPC servers refuse calls without it).
    @Test(arguments: [
        ("trailers", true), ("Trailers", true), (" trailers ", true), ("gzip, trailers", true), ("trailers,deflate", true),
        ("gzip", false), ("trailersx", false), ("", false), (",,", false), ("trailers;q=0.5", false),
    ])
    func teNamesTrailers(_ value: String, _ expected: Bool) {
        #expect(Array(value.utf8).withUnsafeBytes { ForwardedRequest.namesTrailers($0) } == expected)
    }
}
