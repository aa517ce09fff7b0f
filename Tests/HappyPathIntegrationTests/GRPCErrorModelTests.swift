import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 34, the proxy's own errors in gRPC's error model: what
/// `GRPCErrorResponse` writes is read by real gRPC. Google's protobuf
/// classes decode `grpc-status-details-bin`; a real grpcio client, answered
/// with exactly those fields by an HTTP/2 server that only replays them,
/// decodes the status, `grpc-message` and the rich details with
/// `grpc_status.rpc_status.from_call`. The same client checks gRPC's
/// HTTP-to-gRPC table and the `grpc-timeout` it sends against ours; a
/// grpcio server's own error fields are the ones we write, and ours read them.
/// (Nothing here goes through the proxy: gRPC pass-through is not built yet.)
@Suite("gRPC error model") struct GRPCErrorModelTests {
    static let problems: [(Problem, Duration?)] = [
        (
            Problem(
                .circuitOpen, requestID: "req-7", detail: "orders failed 5 times", attempts: 3, upstream: "orders",
                retryAfterSeconds: 7), nil
        ),
        (Problem(.rateLimited, requestID: "req-8", retryAfterSeconds: 1), .milliseconds(1500)),
        (Problem(.forbidden, requestID: "req-9"), nil),
        (
            Problem(
                .badGateway, requestID: "req-10", detail: "réponse invalide — 日本語, 100% 👍\ttab", attempts: 1,
                upstream: "bücher"), nil
        ),
        (Problem(.upstreamTimeout, requestID: "req-11", detail: String(repeating: "é", count: 3000)), nil),
    ]

    static let decodeDetails =
        PythonGRPC.richStatus + #"""
            import base64, json, sys
            from google.rpc import status_pb2
            statuses = [status_pb2.Status.FromString(base64.b64decode(v + "=" * (-len(v) % 4))) for v in sys.argv[1:]]
            print(json.dumps({"statuses": [rich(status) for status in statuses]}))
            """#

    @Test func googlesProtobufClassesDecodeTheDetails() throws {
        let answers = Self.problems.map { GRPCErrorResponse($0.0, retryDelay: $0.1) }
        let decoded = try PythonGRPC.run(Self.decodeDetails, arguments: answers.map(\.details.fieldValue))
        let statuses = try #require(decoded["statuses"] as? [[String: Any]])
        try #require(statuses.count == answers.count)
        for (answer, status) in zip(answers, statuses) {
            Self.expect(status, equals: answer)
        }
        // The waits as written: 7 s from Retry-After; 1.5 s given; none when not retryable or not known.
        #expect(statuses[0]["retry_delay"] as? [Int] == [7, 0])
        #expect(statuses[1]["retry_delay"] as? [Int] == [1, 500_000_000])
        #expect(statuses[2]["retry_delay"] == nil && statuses[4]["retry_delay"] == nil)
        #expect(statuses[2]["types"] as? [String] == ["type.googleapis.com/google.rpc.ErrorInfo"])
    }

    /// The fields Python decoded equal the ones the answer holds.
    static func expect(
        _ decoded: [String: Any], equals answer: GRPCErrorResponse, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let details = answer.details
        #expect(decoded["code"] as? Int == answer.status.rawValue, sourceLocation: sourceLocation)
        #expect(decoded["message"] as? String == details.message, sourceLocation: sourceLocation)
        #expect(decoded["reason"] as? String == details.errorInfo?.reason, sourceLocation: sourceLocation)
        #expect(decoded["domain"] as? String == "happypath", sourceLocation: sourceLocation)
        let metadata = Dictionary(uniqueKeysWithValues: (details.errorInfo?.metadata ?? []).map { ($0.key, $0.value) })
        #expect(decoded["metadata"] as? [String: String] == metadata, sourceLocation: sourceLocation)
        if let delay = details.retryDelay {
            let (seconds, attoseconds) = delay.components
            let expected = [Int(seconds), Int(attoseconds / 1_000_000_000)]
            #expect(decoded["retry_delay"] as? [Int] == expected, sourceLocation: sourceLocation)
        } else {
            #expect(decoded["retry_delay"] == nil, sourceLocation: sourceLocation)
        }
    }

    // MARK: - A real gRPC client

    static let client =
        PythonGRPC.richStatus + #"""
            import grpc, json, sys
            from grpc_status import rpc_status
            port, calls = sys.argv[1], json.loads(sys.argv[2])
            out = []
            with grpc.insecure_channel("127.0.0.1:" + port) as channel:
                for call in calls:
                    result = {"index": call["index"]}
                    try:
                        path = call.get("path", "/happypath.Test/%d" % call["index"])
                        channel.unary_unary(path)(b"", timeout=call.get("timeout", 10))
                        result["grpc_status"] = "OK"
                    except grpc.RpcError as e:
                        try:
                            status = rpc_status.from_call(e)  # None without grpc-status-details-bin
                        except ValueError as error:  # the details disagree with grpc-status or grpc-message
                            result["from_call_error"], status = str(error), None
                        if status is not None:
                            result.update(rich(status))
                        result["grpc_status"], result["details"] = e.code().name, e.details()
                    out.append(result)
            print(json.dumps({"calls": out}))
            """#

    static func call(port: Int, _ calls: [[String: Any]]) throws -> [[String: Any]] {
        let json = String(decoding: try JSONSerialization.data(withJSONObject: calls), as: UTF8.self)
        let result = try PythonGRPC.run(Self.client, arguments: [String(port), json], timeout: 60)
        return try #require(result["calls"] as? [[String: Any]])
    }

    @Test func aGrpcioClientDecodesTheProxysAnswer() throws {
        let answers = Self.problems.map { GRPCErrorResponse($0.0, retryDelay: $0.1) }
        let server = try ReplayingH2Server(answers.map { (String($0.httpStatus), $0.fields) })
        let results = try Self.call(port: server.port, answers.indices.map { ["index": $0] })
        try #require(results.count == answers.count)
        for (answer, result) in zip(answers, results) {
            #expect(result["grpc_status"] as? String == answer.status.name)
            #expect(result["from_call_error"] == nil, "\(result)")
            // grpc-message, percent-decoded by gRPC itself, is the text; the details say the same.
            #expect(result["details"] as? String == answer.message.prefixAsSent)
            Self.expect(result, equals: answer)
        }
        #expect(results[3]["details"] as? String == "The service sent an invalid response: réponse invalide — 日本語, 100% 👍\ttab")
        #expect((results[3]["metadata"] as? [String: String])?["upstream"] == "bücher")
        // The long one was cut, at a character, on both sides alike.
        #expect((results[4]["details"] as? String)?.hasSuffix("é") == true)
        #expect(((results[4]["details"] as? String)?.count ?? .max) < 3000)
    }

    @Test func anHTTPStatusWithoutGrpcStatusIsWhatGRPCsClientMakesOfIt() throws {
        // Not 431: the table says INTERNAL (and so do we), grpcio 1.85's C core says UNKNOWN (docs/grpc.md).
        let statuses = [400, 401, 403, 404, 429, 502, 503, 504, 500, 501, 418, 302]
        let server = try ReplayingH2Server(statuses.map { (String($0), [HTTPField(name: "content-type", value: "text/plain")]) })
        let results = try Self.call(port: server.port, statuses.indices.map { ["index": $0] })
        try #require(results.count == statuses.count)
        for (status, result) in zip(statuses, results) {
            #expect(result["grpc_status"] as? String == GRPCStatus(httpStatus: status).name, "HTTP \(status)")
        }
    }

    @Test func theGrpcTimeoutAClientSendsIsReadAsItsDeadline() throws {
        let answer = GRPCErrorResponse(Problem(.upstreamUnavailable, requestID: "t"))
        let server = try ReplayingH2Server([(String(answer.httpStatus), answer.fields)])
        let results = try Self.call(port: server.port, [["index": 0, "timeout": 1.5], ["index": 0, "timeout": 0.25]])
        #expect(results.map { $0["grpc_status"] as? String } == ["UNAVAILABLE", "UNAVAILABLE"])
        let sent = server.requests(atLeast: 2).compactMap { $0.first { $0[0] == "grpc-timeout" }?[1] }
        try #require(sent.count == 2, "each call carries grpc-timeout")
        let deadlines = sent.map { GRPCTimeout.parse($0) }
        #expect(deadlines.allSatisfy { $0 != nil }, "\(sent)")
        // What is left of the client's deadline when the field was written
        // (gRPC's C core rounds it up to its unit: 0.25 s goes as `251m`).
        #expect(deadlines[0].map { $0 > .seconds(1) && $0 <= .milliseconds(1510) } == true, "\(sent)")
        #expect(deadlines[1].map { $0 > .milliseconds(100) && $0 <= .milliseconds(260) } == true, "\(sent)")
    }

    // MARK: - What real gRPC writes, read by ours

    /// A grpcio server whose one method fails with RESOURCE_EXHAUSTED, the
    /// message given, and rich details (ErrorInfo with one metadata entry,
    /// RetryInfo of 2.5 s) through `rpc_status.to_status`.
    static let failingServer = #"""
        import grpc, sys
        from concurrent import futures
        from grpc_status import rpc_status
        from google.rpc import status_pb2, error_details_pb2
        from google.protobuf import any_pb2, duration_pb2
        message = sys.argv[1]

        def fail(request, context):
            info, retry = any_pb2.Any(), any_pb2.Any()
            info.Pack(error_details_pb2.ErrorInfo(reason="RATE_LIMITED", domain="happypath", metadata={"request_id": "r-1"}))
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2, nanos=500000000)))
            context.abort_with_status(rpc_status.to_status(status_pb2.Status(code=8, message=message, details=[info, retry])))

        handler = grpc.method_handlers_generic_handler("happypath.Test", {"Fail": grpc.unary_unary_rpc_method_handler(fail)})
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        print(port, flush=True)
        server.wait_for_termination()
        """#

    /// A raw HTTP/2 client (Python `h2`): one gRPC call with an empty
    /// message; prints every response field, headers and trailers, as sent.
    static let rawCall = #"""
        import json, socket, sys
        import h2.config, h2.connection, h2.events
        sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", sys.argv[2]), (":authority", "127.0.0.1"),
                              ("content-type", "application/grpc"), ("te", "trailers")])
        conn.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
        sock.sendall(conn.data_to_send())
        fields, ended = [], False
        while not ended:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields += [[k, v] for k, v in event.headers]
                ended = ended or isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset))
            sock.sendall(conn.data_to_send())
        print(json.dumps(fields))
        """#

    @Test func whatGRPCWritesIsWhatWeWriteAndReadsBack() throws {
        let message = "Trop de requêtes — 日本語 100% 👍"
        let lines = Locked<[String]>([])
        let (process, port) = try startPythonServer(
            python: try PythonGRPC.python(), Self.failingServer, arguments: [message], lines: lines,
            what: "the grpcio server")
        defer {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        let call = try runProcess(try PythonH2.python(), ["-c", Self.rawCall, String(port), "/happypath.Test/Fail"])
        try #require(call.status == 0, "\(call.err)")
        let fields = try #require(try JSONSerialization.jsonObject(with: Data(call.out.utf8)) as? [[String]])
        func field(_ name: String) -> String? { fields.first { $0[0] == name }?[1] }
        #expect(field("grpc-status").flatMap { GRPCStatus(fieldValue: $0) } == .resourceExhausted)
        // gRPC's percent-encoding, read by ours, and ours written the same way.
        let sentMessage = try #require(field("grpc-message"))
        #expect(GRPCMessage.decode(sentMessage) == message)
        #expect(GRPCMessage.encode(message) == sentMessage)
        // grpcio sends -bin fields unpadded too; the bytes are the ones we write for the same status.
        let details = try #require(field("grpc-status-details-bin"))
        #expect(!details.contains("="))
        let ours = GRPCStatusDetails(
            code: .resourceExhausted, message: message,
            errorInfo: .init(reason: "RATE_LIMITED", metadata: [("request_id", "r-1")]), retryDelay: .milliseconds(2500))
        #expect(details == ours.fieldValue)
    }
}

extension String {
    /// The text as `grpc-message` carries it: cut as `GRPCErrorResponse` cuts it.
    fileprivate var prefixAsSent: String {
        GRPCMessage.decode(GRPCMessage.encode(self, limit: GRPCErrorResponse.messageLimit))
    }
}

/// An HTTP/2 server (Python `h2`, h2c with prior knowledge) that answers the
/// call to `/<service>/<n>` with answer n as it is given: `:status` and the
/// fields, in one HEADERS frame that ends the stream (a Trailers-Only
/// response when the status is 200). Each request's fields are printed.
final class ReplayingH2Server: @unchecked Sendable {
    let process: Process
    let port: Int
    private let lines = Locked<[String]>([])

    static let script = #"""
        import asyncio, json, sys
        import h2.config, h2.connection, h2.events

        answers = json.loads(sys.argv[1])

        class Connection(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport
                self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
                self.conn.initiate_connection()
                self.heads = {}
                self.transport.write(self.conn.data_to_send())

            def data_received(self, data):
                try:
                    events = self.conn.receive_data(data)
                except Exception:
                    self.transport.close()
                    return
                for event in events:
                    if isinstance(event, h2.events.RequestReceived):
                        self.heads[event.stream_id] = event.headers
                    elif isinstance(event, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        headers = self.heads.pop(event.stream_id)
                        print(json.dumps([[k, v] for k, v in headers]), flush=True)
                        status, fields = answers[int(dict(headers)[":path"].rsplit("/", 1)[1])]
                        self.conn.send_headers(event.stream_id, [(":status", status)] + [tuple(f) for f in fields], end_stream=True)
                data = self.conn.data_to_send()
                if data:
                    self.transport.write(data)

        async def main():
            server = await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", 0)
            print(server.sockets[0].getsockname()[1], flush=True)
            await asyncio.Event().wait()

        asyncio.run(main())
        """#

    init(_ answers: [(status: String, fields: [HTTPField])]) throws {
        let json = answers.map { [$0.status, $0.fields.map { [$0.name, $0.value] }] as [Any] }
        let argument = String(decoding: try JSONSerialization.data(withJSONObject: json), as: UTF8.self)
        (process, port) = try startPythonServer(
            python: try PythonH2.python(), Self.script, arguments: [argument], lines: lines,
            what: "the replaying HTTP/2 server")
    }

    deinit {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// Each request's fields (name, value), once at least `count` arrived.
    func requests(atLeast count: Int) -> [[[String]]] {
        waitUntil("\(count) request(s) at the replaying HTTP/2 server") { lines.withLock { $0.count } >= count }
        return lines.withLock { $0 }.compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [[String]]
        }
    }
}
