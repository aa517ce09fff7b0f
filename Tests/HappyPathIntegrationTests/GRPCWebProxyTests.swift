import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 49: gRPC-Web calls, byte for byte, from HTTP/1.1 (raw sockets) and
/// HTTP/2 (curl) clients through the proxy to a real grpcio server behind
/// `protocol: h2`: both framing modes, the trailer frame, Trailers-Only
/// answers, the proxy's own errors, and malformed bodies.
@Suite(.serialized) struct GRPCWebProxyTests {
    /// `/t.S/U` echoes with trailing metadata, `/t.S/SS` streams three
    /// messages, `/t.S/F` fails NOT_FOUND, `/t.S/Slow` answers after 3 s;
    /// every call the server takes is printed (`called /t.S/U`).
    static let server = """
        import grpc, time
        from concurrent import futures
        def unary(req, ctx):
            print("called /t.S/U", flush=True)
            ctx.set_trailing_metadata((("x-trailer", "t1"),))
            return b"echo:" + req
        def stream(req, ctx):
            for i in range(3): yield b"part%d" % i
        def fail(req, ctx): ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        flaky = {"n": 0}
        def flake(req, ctx):
            flaky["n"] += 1
            print("called /t.S/Flaky", flaky["n"], flush=True)
            if flaky["n"] % 2: ctx.abort(grpc.StatusCode.UNAVAILABLE, "try again")
            return b"steady:" + req
        def slow(req, ctx):
            time.sleep(3)
            return b"late"
        handlers = {"/t.S/U": grpc.unary_unary_rpc_method_handler(unary),
                    "/lim.S/U": grpc.unary_unary_rpc_method_handler(unary),
                    "/t.S/SS": grpc.unary_stream_rpc_method_handler(stream),
                    "/t.S/F": grpc.unary_unary_rpc_method_handler(fail),
                    "/t.S/Slow": grpc.unary_unary_rpc_method_handler(slow),
                    "/r.S/Flaky": grpc.unary_unary_rpc_method_handler(flake)}
        class H(grpc.GenericRpcHandler):
            def service(self, d): return handlers.get(d.method)
        s = grpc.server(futures.ThreadPoolExecutor(4)); s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True); s.wait_for_termination()
        """

    static let routes = """
          - match: { path_prefix: /lim.S/ }
            upstream: g
            grpc: {}
            rate_limit: { rate: 1/m, burst: 1, over_limit: reject }
          - { match: { path_prefix: /r.S/ }, upstream: g, grpc: {}, retry: { attempts: 3, on: [unavailable] } }
          - { match: { path_prefix: /t.S/ }, upstream: g, grpc: {} }
        """

    /// A gRPC frame: flag 0, the length, the message.
    static func frame(_ message: [UInt8]) -> [UInt8] {
        let n = UInt32(message.count)
        return [0, UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)] + message
    }

    /// A gRPC-Web answer's body as frames: (flag, payload); nil if it is not whole frames.
    static func frames(_ body: [UInt8]) -> [(flag: UInt8, payload: [UInt8])]? {
        var out: [(UInt8, [UInt8])] = []
        var at = 0
        while at < body.count {
            guard body.count - at >= 5 else { return nil }
            let n = body[(at + 1)...(at + 4)].reduce(0) { $0 << 8 | Int($1) }
            guard body.count - at - 5 >= n else { return nil }
            out.append((body[at], Array(body[(at + 5)..<(at + 5 + n)])))
            at += 5 + n
        }
        return out
    }

    /// A text-mode answer's body, decoded (padding may end any piece).
    static func decodeText(_ body: [UInt8]) -> [UInt8]? {
        var decoder = GRPCWebTextDecoder()
        var out: [UInt8] = []
        guard decoder.feed(body, into: &out) == nil, decoder.finish() == nil else { return nil }
        return out
    }

    /// The trailer frame's block as `name: value` lines.
    static func trailerLines(_ payload: [UInt8]) -> [String] {
        String(decoding: payload, as: UTF8.self).split(separator: "\r\n").map(String.init)
    }

    static func post(
        _ port: Int, _ path: String, type: String, body: [UInt8], extra: [(String, String)] = []
    ) throws -> TestResponse {
        try HTTP.request(
            port: port, "POST", path, headers: [("Content-Type", type), ("X-Grpc-Web", "1")] + extra, body: body, timeout: 15)
    }

    @Test func binaryAndTextModesOverHTTP1() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { _, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }

            // Binary: the message, then the trailer frame with the status and the trailing metadata.
            let unary = try Self.post(h.port, "/t.S/U", type: "application/grpc-web+proto", body: Self.frame(Array("hi".utf8)))
            #expect(unary.status == 200)
            #expect(unary.header("Content-Type") == "application/grpc-web+proto")
            #expect(unary.header("grpc-status") == nil, "the status is in the body, not the head")
            #expect(unary.trailers.isEmpty)
            let frames = try #require(Self.frames(unary.body), "\(unary.body)")
            #expect(frames.count == 2)
            #expect(frames.first?.flag == 0 && frames.first?.payload == Array("echo:hi".utf8))
            #expect(frames.last?.flag == 0x80)
            let trailers = Self.trailerLines(frames.last?.payload ?? [])
            #expect(trailers.contains("grpc-status: 0"), "\(trailers)")
            #expect(trailers.contains("x-trailer: t1"), "\(trailers)")
            // The upstream took it as gRPC (grpcio refuses any other content type).
            #expect(waitUntil("the server saw the call") { serverLines.withLock { $0 }.contains("called /t.S/U") })

            // Text: base64 both ways, the trailer frame too.
            let text = try Self.post(
                h.port, "/t.S/U", type: "application/grpc-web-text", body: GRPCWeb.base64(Self.frame(Array("yo".utf8))))
            #expect(text.status == 200)
            #expect(text.header("Content-Type") == "application/grpc-web-text")
            let decoded = try #require(Self.decodeText(text.body), "\(text.text)")
            let textFrames = try #require(Self.frames(decoded))
            #expect(textFrames.map(\.flag) == [0, 0x80])
            #expect(textFrames.first?.payload == Array("echo:yo".utf8))
            let textTrailers = Self.trailerLines(textFrames.last?.payload ?? [])
            #expect(textTrailers.contains("grpc-status: 0"), "\(textTrailers)")

            // Server streaming in text mode: three messages, then the status.
            let streamed = try Self.post(
                h.port, "/t.S/SS", type: "application/grpc-web-text+proto", body: GRPCWeb.base64(Self.frame([])))
            #expect(streamed.header("Content-Type") == "application/grpc-web-text+proto")
            let parts = try #require(Self.decodeText(streamed.body).flatMap(Self.frames), "\(streamed.text)")
            #expect(parts.map(\.flag) == [0, 0, 0, 0x80])
            #expect(parts.prefix(3).map { String(decoding: $0.payload, as: UTF8.self) } == ["part0", "part1", "part2"])

            // The upstream's own error, Trailers-Only: the status in the head, no body.
            let failed = try Self.post(h.port, "/t.S/F", type: "application/grpc-web", body: Self.frame([]))
            #expect(failed.status == 200)
            #expect(failed.header("Content-Type") == "application/grpc-web")
            #expect(failed.header("grpc-status") == "5")
            #expect(failed.header("grpc-message") == "no such thing")
            #expect(failed.body.isEmpty)
        }
    }

    /// The proxy's own errors reach a gRPC-Web client as its own status,
    /// in the head (Trailers-Only), with the same `google.rpc.Status`; a
    /// client's `grpc-timeout` is the call's deadline.
    @Test func theProxysOwnErrorsAndDeadlines() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { _, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }
            let first = try Self.post(h.port, "/lim.S/U", type: "application/grpc-web", body: Self.frame(Array("a".utf8)))
            #expect(first.status == 200)
            #expect(Self.frames(first.body)?.first?.payload == Array("echo:a".utf8))
            // Over the rate limit: RESOURCE_EXHAUSTED, with RetryInfo, as gRPC-Web.
            let limited = try Self.post(h.port, "/lim.S/U", type: "application/grpc-web-text", body: GRPCWeb.base64(Self.frame([])))
            #expect(limited.status == 200)
            #expect(limited.header("Content-Type") == "application/grpc-web-text")
            #expect(limited.header("grpc-status") == "8", "\(limited.headers)")
            let details = try #require(limited.header("grpc-status-details-bin"))
            let delay = details.utf8.withContiguousStorageIfAvailable {
                GRPCStatusDetails.retryDelay(fieldValue: UnsafeRawBufferPointer($0), max: .seconds(3600))
            }
            #expect((delay ?? nil).map { $0 > .zero } == true, "\(details)")
            // The client's grpc-timeout: DEADLINE_EXCEEDED from the proxy, long before the server's 3 s.
            let started = ContinuousClock.now
            let late = try Self.post(
                h.port, "/t.S/Slow", type: "application/grpc-web", body: Self.frame([]), extra: [("grpc-timeout", "300m")])
            #expect(late.header("grpc-status") == "4", "\(late.headers)")
            #expect(ContinuousClock.now - started < .seconds(2.5))
        }
    }

    /// `retry.on` names a gRPC status: a gRPC-Web call that gets it (in a
    /// Trailers-Only answer) is sent again, and its client sees only the
    /// answer that worked.
    @Test func aGRPCStatusTheRouteRetriesIsRetried() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { _, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }
            let r = try Self.post(h.port, "/r.S/Flaky", type: "application/grpc-web-text", body: GRPCWeb.base64(Self.frame(Array("x".utf8))))
            #expect(r.header("x-happypath-attempts") == "2", "\(r.headers)")
            let frames = try #require(Self.decodeText(r.body).flatMap(Self.frames), "\(r.text)")
            #expect(frames.first?.payload == Array("steady:x".utf8))
            let trailers = Self.trailerLines(frames.last?.payload ?? [])
            #expect(trailers.contains("grpc-status: 0"), "\(trailers)")
            // The server's lines come on their own pipe: waited for, not read at once.
            #expect(waitUntil("the server's two calls") {
                serverLines.withLock { $0 }.filter { $0.hasPrefix("called /t.S/Flaky") }.count == 2
            })
        }
    }

    /// A body that is not base64, or not whole frames, is refused by the
    /// proxy as INTERNAL (gRPC's word for a 400); the upstream never sees it.
    @Test(arguments: [
        ("application/grpc-web-text", Array("AAAA!AAA".utf8)),
        ("application/grpc-web-text", Array("AAAAAA".utf8)),
        ("application/grpc-web-text", GRPCWeb.base64([0, 0, 0, 0, 100, 1, 2])),
        ("application/grpc-web", [0, 0, 0, 0, 100, 1, 2]),
        ("application/grpc-web", [0x80, 0, 0, 0, 0]),
        ("application/grpc-web", [0, 0, 0]),
    ] as [(String, [UInt8])])
    func aMalformedBodyIsInternal(type: String, body: [UInt8]) throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { _, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }
            let r = try Self.post(h.port, "/t.S/U", type: type, body: body)
            #expect(r.status == 200)
            #expect(r.header("grpc-status") == "13", "\(r.headers)")
            #expect(r.header("Content-Type") == type)
            // The proxy's words (percent-encoded), not the server's.
            #expect(r.header("grpc-message")?.contains("gRPC-Web") == true, "\(r.headers)")
            // The proxy goes on: a good call after it.
            let ok = try Self.post(h.port, "/t.S/U", type: "application/grpc-web", body: Self.frame(Array("z".utf8)))
            #expect(Self.frames(ok.body)?.first?.payload == Array("echo:z".utf8))
            #expect(waitUntil("the good call reached the server") { serverLines.withLock { $0 }.contains { $0.hasPrefix("called") } })
            #expect(serverLines.withLock { $0 }.filter { $0.hasPrefix("called") }.count == 1)
        }
    }

    /// Over HTTP/2 (h2c, curl): the same translation.
    @Test func overHTTP2() throws {
        let serverLines = Locked<[String]>([])
        try PythonGRPC.withServer(Self.server, lines: serverLines) { _, port in
            let h = try PythonGRPC.proxy(port: port, routes: Self.routes)
            defer { h.stop() }
            let dir = FileManager.default.temporaryDirectory
            let input = dir.appendingPathComponent("grpcweb-in-\(UUID())")
            let output = dir.appendingPathComponent("grpcweb-out-\(UUID())")
            defer {
                try? FileManager.default.removeItem(at: input)
                try? FileManager.default.removeItem(at: output)
            }
            try Data(GRPCWeb.base64(Self.frame(Array("h2".utf8)))).write(to: input)
            let r = try runProcess(
                "/usr/bin/curl",
                ["-sS", "--max-time", "10", "--http2-prior-knowledge", "-D", "-", "-o", output.path,
                 "-H", "Content-Type: application/grpc-web-text", "--data-binary", "@\(input.path)",
                 "http://127.0.0.1:\(h.port)/t.S/U"], timeout: 20)
            #expect(r.out.hasPrefix("HTTP/2 200"), "\(r.out) \(r.err)")
            #expect(r.out.lowercased().contains("content-type: application/grpc-web-text"), "\(r.out)")
            let body = try [UInt8](Data(contentsOf: output))
            let frames = try #require(Self.decodeText(body).flatMap(Self.frames), "\(body)")
            #expect(frames.map(\.flag) == [0, 0x80])
            #expect(frames.first?.payload == Array("echo:h2".utf8))
            let trailers = Self.trailerLines(frames.last?.payload ?? [])
            #expect(trailers.contains("grpc-status: 0"), "\(trailers)")
        }
    }

    /// An HTTP/2 server (Python `h2`) whose answer is cut by a reset after
    /// its first DATA frame: `/c.S/whole` sends one whole message first,
    /// `/c.S/half` half of one.
    static let cuttingServer = #"""
        import asyncio
        import h2.config, h2.connection, h2.events, h2.errors

        class Connection(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport
                self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
                self.conn.initiate_connection()
                self.paths = {}
                self.transport.write(self.conn.data_to_send())

            def data_received(self, data):
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        self.paths[event.stream_id] = dict(event.headers)[":path"]
                    elif isinstance(event, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        sid = event.stream_id
                        body = b"\x00\x00\x00\x00\x03one" if self.paths[sid].endswith("whole") else b"\x00\x00\x00\x00\x0aone"
                        self.conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
                        self.conn.send_data(sid, body)
                        self.transport.write(self.conn.data_to_send())
                        asyncio.get_running_loop().call_later(0.2, self.cut, sid)
                self.transport.write(self.conn.data_to_send())

            def cut(self, sid):
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
                self.transport.write(self.conn.data_to_send())

        async def main():
            server = await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", 0)
            print(server.sockets[0].getsockname()[1], flush=True)
            await asyncio.Event().wait()

        asyncio.run(main())
        """#

    /// An answer cut short between two messages ends with the proxy's
    /// status in a trailer frame (UNAVAILABLE); cut inside a message, the
    /// connection is cut (a frame there would be read as the message's bytes).
    @Test func anAnswerCutBetweenMessagesEndsWithTheProxysStatus() throws {
        let (server, port) = try startPythonServer(
            python: try PythonH2.python(), Self.cuttingServer, lines: Locked([]), what: "the cutting HTTP/2 server")
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        let h = try PythonGRPC.proxy(port: port, routes: "  - { match: { path_prefix: /c.S/ }, upstream: g, grpc: {} }")
        defer { h.stop() }
        for mode in ["application/grpc-web", "application/grpc-web-text"] {
            let text = mode.hasSuffix("text")
            let body = text ? GRPCWeb.base64(Self.frame([])) : Self.frame([])
            let whole = try Self.post(h.port, "/c.S/whole", type: mode, body: body)
            #expect(whole.status == 200)
            let frames = try #require(Self.frames(text ? Self.decodeText(whole.body) ?? [] : whole.body), "\(whole.text)")
            #expect(frames.map(\.flag) == [0, 0x80], "\(mode)")
            #expect(frames.first?.payload == Array("one".utf8))
            let trailers = Self.trailerLines(frames.last?.payload ?? [])
            #expect(trailers.contains("grpc-status: 14"), "\(trailers)")
            #expect(trailers.contains { $0.hasPrefix("grpc-status-details-bin: ") }, "\(trailers)")
            // Inside a message: no answer a client could take for whole.
            #expect(throws: (any Error).self, "\(mode)") { try Self.post(h.port, "/c.S/half", type: mode, body: body) }
        }
    }
}
