import Foundation
import HappyPathCore
import HappyPathIO
import Logging
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 34, wired in: a gRPC call that the proxy answers itself gets a
/// gRPC status (Trailers-Only), never problem+json, and real grpcio clients
/// decode its rich details with `rpc_status.from_call`; an upstream's own
/// gRPC error passes unchanged; the access log and `/metrics` carry
/// `grpc_status`.
@Suite(.serialized) struct GRPCProxyErrorTests {
    /// Every access-log line the proxy wrote, parsed.
    final class Capture: Sendable {
        let batches = Locked<[String]>([])
        var sink: @Sendable (UnsafeRawBufferPointer) -> Void {
            { bytes in self.batches.withLock { $0.append(String(decoding: bytes, as: UTF8.self)) } }
        }
        var lines: [[String: Any]] {
            batches.withLock { $0 }.joined().split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
            }
        }
        var settings: AccessLogSettings { AccessLogSettings(level: .info, format: .json, sink: sink) }
    }

    /// The proxy on loopback with its admin listener, and `upstreams:` and `routes:` as given.
    static func proxy(_ config: String, accessLog: AccessLogSettings? = nil, holding: [AnyObject] = []) throws
        -> ProxyHarness
    {
        try ProxyHarness(
            "listen: 127.0.0.1:0\nadmin: { listen: 127.0.0.1:0 }\n" + config, accessLog: accessLog, holding: holding)
    }

    /// The calls' results by index (each carries its own `index`).
    static func byIndex(_ results: [[String: Any]]) -> [Int: [String: Any]] {
        Dictionary(uniqueKeysWithValues: results.compactMap { r in (r["index"] as? Int).map { ($0, r) } })
    }

    /// The value of one series in the scrape (0 when absent).
    static func metric(_ text: String, _ series: String) -> Double {
        for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.split(separator: " ").last ?? "") ?? 0
        }
        return 0
    }

    // MARK: - The proxy's own statuses

    @Test func theProxysOwnFailuresReachAGrpcioClientAsGRPCStatuses() throws {
        let own = GRPCStatusDetails(
            code: .notFound, message: "no such thing",
            errorInfo: .init(reason: "SERVER_OWN", domain: "test.upstream", metadata: [("k", "v")]))
        let upstream = try ReplayingH2Server([
            // 0: an HTTP error without grpc-status: a proxy-side failure, answered by the table.
            ("503", [HTTPField(name: "content-type", value: "text/plain")]),
            // 1: the upstream's own gRPC error, details and all: passed unchanged.
            (
                "200",
                [
                    HTTPField(name: "content-type", value: "application/grpc"), HTTPField(name: "grpc-status", value: "5"),
                    HTTPField(name: "grpc-message", value: "no such thing"),
                    HTTPField(name: "grpc-status-details-bin", value: own.fieldValue),
                ]
            ),
            // 2: an HTTP error that carries grpc-status: the upstream's words, as they came.
            (
                "503",
                [
                    HTTPField(name: "content-type", value: "application/grpc"), HTTPField(name: "grpc-status", value: "14"),
                    HTTPField(name: "grpc-message", value: "busy"),
                ]
            ),
            // 3: OK, Trailers-Only.
            (
                "200",
                [HTTPField(name: "content-type", value: "application/grpc"), HTTPField(name: "grpc-status", value: "0")]
            ),
        ])
        let down = RefusingPort()
        let capture = Capture()
        let h = try Self.proxy(
            """
            upstreams:
              replay: { endpoints: [http://127.0.0.1:\(upstream.port)], protocol: h2 }
              down:
                endpoints: [http://127.0.0.1:\(down.port)]
                protocol: h2
                connect_timeout: 200ms
                reachability: { park_for: 0s }
            routes:
              - { match: { path_prefix: /happypath.Test/ }, upstream: replay, grpc: {} }
              - { match: { path_prefix: /down.S/ }, upstream: down, grpc: {} }
              - match: { path_prefix: /limited.S/ }
                upstream: replay
                grpc: {}
                rate_limit: { rate: 1/m, burst: 1, over_limit: reject }
            """, accessLog: capture.settings, holding: [down])
        defer { h.stop() }
        let results = Self.byIndex(
            try GRPCErrorModelTests.call(
                port: h.port,
                [
                    ["index": 0], ["index": 1], ["index": 2], ["index": 3, "path": "/down.S/M"],
                    ["index": 4, "path": "/nowhere.S/M"], ["index": 5, "path": "/limited.S/3"],
                    ["index": 6, "path": "/limited.S/3"],
                ]))
        try #require(results.count == 7, "\(results)")

        // The upstream's 503 without grpc-status: UNAVAILABLE, in the proxy's words.
        #expect(results[0]?["grpc_status"] as? String == "UNAVAILABLE", "\(results[0] ?? [:])")
        #expect(results[0]?["reason"] as? String == "UPSTREAM_UNAVAILABLE", "\(results[0] ?? [:])")
        #expect(results[0]?["domain"] as? String == "happypath")
        // The upstream's own error: its code, message and details, untouched.
        #expect(results[1]?["grpc_status"] as? String == "NOT_FOUND", "\(results[1] ?? [:])")
        #expect(results[1]?["details"] as? String == "no such thing")
        #expect(results[1]?["reason"] as? String == "SERVER_OWN" && results[1]?["domain"] as? String == "test.upstream")
        #expect(results[1]?["metadata"] as? [String: String] == ["k": "v"])
        // An HTTP 503 carrying grpc-status passes as it came (upstream_errors is not pass here).
        #expect(results[2]?["grpc_status"] as? String == "UNAVAILABLE", "\(results[2] ?? [:])")
        #expect(results[2]?["details"] as? String == "busy")
        #expect(results[2]?["reason"] == nil, "not re-wrapped: \(results[2] ?? [:])")
        // Unreachable: UNAVAILABLE with ErrorInfo naming why and where.
        let unreachable = try #require(results[3])
        #expect(unreachable["grpc_status"] as? String == "UNAVAILABLE", "\(unreachable)")
        #expect(unreachable["from_call_error"] == nil, "\(unreachable)")
        #expect(unreachable["reason"] as? String == "UPSTREAM_UNREACHABLE", "\(unreachable)")
        let metadata = unreachable["metadata"] as? [String: String] ?? [:]
        #expect(metadata["upstream"] == "down" && metadata["request_id"]?.isEmpty == false, "\(metadata)")
        // A refused connection is safe to retry, POST or not: the tries it took, and what to do.
        #expect((Int(metadata["attempts"] ?? "") ?? 0) >= 1, "\(metadata)")
        #expect(metadata["recovery_suggestion"]?.isEmpty == false, "\(metadata)")
        // No route: the method is not implemented here.
        #expect(results[4]?["grpc_status"] as? String == "UNIMPLEMENTED", "\(results[4] ?? [:])")
        #expect(results[4]?["reason"] as? String == "NO_ROUTE", "\(results[4] ?? [:])")

        // Over the route's rate limit, refused at the head: RESOURCE_EXHAUSTED, with when to come back.
        #expect(results[5]?["grpc_status"] as? String == "OK", "\(results[5] ?? [:])")
        let limited = try #require(results[6])
        #expect(limited["grpc_status"] as? String == "RESOURCE_EXHAUSTED", "\(limited)")
        #expect(limited["reason"] as? String == "RATE_LIMITED", "\(limited)")
        #expect((limited["retry_delay"] as? [Int])?.first ?? 0 > 0, "\(limited)")

        // The access log: one line per call that reached an upstream's exchange, with the status its client read.
        #expect(waitUntil("five access-log lines") { capture.lines.count >= 5 })
        let statuses = capture.lines.compactMap { $0["grpc_status"] as? String }.sorted()
        #expect(statuses == ["0", "14", "14", "14", "5"], "\(capture.lines)")
        // /metrics: by route and grpc_status.
        let scrape = String(decoding: try HTTP.request(port: h.adminPort, "/metrics").body, as: UTF8.self)
        let replayUnavailable = #"happypath_grpc_requests_total{route="/happypath.Test/",grpc_status="14"}"#
        #expect(Self.metric(scrape, replayUnavailable) == 2, "\(scrape)")
        #expect(Self.metric(scrape, #"happypath_grpc_requests_total{route="/happypath.Test/",grpc_status="5"}"#) == 1)
        #expect(Self.metric(scrape, #"happypath_grpc_requests_total{route="/down.S/",grpc_status="14"}"#) == 1)
    }

    /// gRPC runs over HTTP/2 only: the same content type over HTTP/1.1 is
    /// an ordinary request, answered problem+json.
    @Test func aGRPCContentTypeOverHTTP1GetsProblemJSON() throws {
        let h = try Self.proxy(
            """
            upstreams:
              demo: { endpoints: ["{{DEMO}}"] }
            routes:
              - { match: { path_prefix: /api/ }, upstream: demo }
            """)
        defer { h.stop() }
        let r = try HTTP.request(
            port: h.port, "POST", "/nowhere.S/M", headers: [("Content-Type", "application/grpc")], body: [0, 0, 0, 0, 0])
        #expect(r.status == 404)
        #expect(r.header("Content-Type") == "application/problem+json")
    }

    /// A stream the HTTP/2 edge refuses before routing: a gRPC call gets
    /// its status there too, as one block (a head with no body, then the end).
    @Test(arguments: [
        ("HTTP/2" as StaticString, "application/grpc", true), ("HTTP/2", "application/grpc+proto", true),
        ("HTTP/2", "application/json", false), ("HTTP/1.1", "application/grpc", false),
    ])
    func aRefusedStreamOfAGRPCCallGetsAGRPCStatus(protocolName: StaticString, contentType: String, grpc: Bool) throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let seen = Locked<(calls: [String], staged: [String: String])?>(nil)
        h.proxy.onWorker { w in
            let stream = RecordingStream()
            stream.protocolName = protocolName
            stream.fields.append(("content-type", contentType))
            let request = HTTPRequest(stream: stream)
            stream.carried = request
            w.reject(request, refusal: .malformed(.connectionSpecificField))
            let staged = Dictionary(stream.staged.map { ($0.name.lowercased(), $0.value) }, uniquingKeysWith: { a, _ in a })
            seen.withLock { $0 = (stream.calls, staged) }
        }
        #expect(waitUntil("the refusal answered") { seen.withLock { $0 != nil } })
        let (calls, staged) = try #require(seen.withLock { $0 })
        if grpc {
            // 400 BAD_REQUEST is INTERNAL by gRPC's table; HTTP 200, no body, no problem+json.
            #expect(calls.contains("head 200 -") && calls.last == "end" && !calls.contains { $0.hasPrefix("body") }, "\(calls)")
            #expect(staged["grpc-status"] == "13" && staged["content-type"] == "application/grpc", "\(staged)")
            #expect(staged["grpc-status-details-bin"]?.isEmpty == false)
        } else {
            #expect(calls.contains { $0.hasPrefix("whole 400") }, "\(calls)")
            #expect(staged["content-type"] == "application/problem+json", "\(staged)")
        }
    }

    // MARK: - Against a grpcio server

    /// `/t.S/U` answers, `/t.S/Slow` outlasts the route's timeout, `/t.S/F`
    /// fails NOT_FOUND with rich details of its own. Prints its port.
    static let server = #"""
        import grpc, time
        from concurrent import futures
        from grpc_status import rpc_status
        from google.rpc import status_pb2, error_details_pb2
        from google.protobuf import any_pb2
        def unary(req, ctx): return b"ok"
        def slow(req, ctx):
            time.sleep(3)
            return b"late"
        def fail(req, ctx):
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.ErrorInfo(reason="NO_SUCH_THING", domain="test.upstream"))
            ctx.abort_with_status(rpc_status.to_status(status_pb2.Status(code=5, message="no such thing", details=[detail])))
        handlers = {"/t.S/U": grpc.unary_unary_rpc_method_handler(unary),
                    "/t.S/Slow": grpc.unary_unary_rpc_method_handler(slow),
                    "/t.S/F": grpc.unary_unary_rpc_method_handler(fail)}
        class H(grpc.GenericRpcHandler):
            def service(self, d): return handlers.get(d.method)
        s = grpc.server(futures.ThreadPoolExecutor(4)); s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True); s.wait_for_termination()
        """#

    @Test func aRouteTimeoutIsDeadlineExceededAndTheServersOwnErrorPasses() throws {
        let python = try PythonGRPC.python()
        let (server, port) = try startPythonServer(
            python: python, Self.server, lines: Locked<[String]>([]), what: "the grpcio server")
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        let capture = Capture()
        let h = try Self.proxy(
            """
            upstreams:
              g: { endpoints: [http://127.0.0.1:\(port)], protocol: h2 }
            routes:
              - { match: { path_prefix: /t.S/Slow }, upstream: g, timeout: 300ms, grpc: {} }
              - { match: { path_prefix: /t.S/ }, upstream: g, grpc: { idempotent: true } }
            """, accessLog: capture.settings)
        defer { h.stop() }
        let results = Self.byIndex(
            try GRPCErrorModelTests.call(
                port: h.port,
                [["index": 0, "path": "/t.S/U"], ["index": 1, "path": "/t.S/Slow"], ["index": 2, "path": "/t.S/F"]]))
        try #require(results.count == 3, "\(results)")
        #expect(results[0]?["grpc_status"] as? String == "OK", "\(results[0] ?? [:])")
        // The route's timeout, in gRPC's words, before the client's own 10 s deadline. The try
        // carried the 300 ms left as its grpc-timeout, so grpcio may give up at the same moment as
        // the proxy: either DEADLINE_EXCEEDED reaches the client, the proxy's (with its ErrorInfo)
        // or grpcio's own (passed unchanged).
        let late = try #require(results[1])
        #expect(late["grpc_status"] as? String == "DEADLINE_EXCEEDED", "\(late)")
        let proxys = late["reason"] as? String == "UPSTREAM_TIMEOUT" && (late["details"] as? String)?.contains("300ms") == true
        let grpcios = late["reason"] == nil && late["details"] as? String == "Deadline Exceeded"
        #expect(proxys || grpcios, "\(late)")
        // grpcio's own NOT_FOUND: code, message and details as the server wrote them.
        let failed = try #require(results[2])
        #expect(failed["grpc_status"] as? String == "NOT_FOUND" && failed["details"] as? String == "no such thing", "\(failed)")
        #expect(failed["reason"] as? String == "NO_SUCH_THING" && failed["domain"] as? String == "test.upstream", "\(failed)")

        #expect(waitUntil("three access-log lines") { capture.lines.count >= 3 })
        let byRoute = capture.lines.map { "\($0["route"] ?? "") \($0["grpc_status"] ?? "-") \($0["status"] ?? "")" }.sorted()
        #expect(byRoute == ["/t.S/ 0 200", "/t.S/ 5 200", "/t.S/Slow 4 200"], "\(capture.lines)")
    }

    // MARK: - grpc-timeout

    /// What the exchange reads of a call's head: the first `content-type`
    /// and the first `grpc-timeout` decide; a malformed timeout is none.
    @Test(arguments: [
        ([("content-type", "application/grpc"), ("grpc-timeout", "250m")], true, Duration?.some(.milliseconds(250))),
        ([("grpc-timeout", "2S"), ("content-type", "application/grpc+proto")], true, .seconds(2)),
        ([("content-type", "application/grpc"), ("grpc-timeout", "-1S")], true, nil),
        ([("content-type", "application/grpc"), ("grpc-timeout", "123456789m")], true, nil),
        ([("content-type", "application/grpc"), ("grpc-timeout", "1S"), ("grpc-timeout", "9S")], true, .seconds(1)),
        ([("content-type", "application/json"), ("grpc-timeout", "1S")], false, nil),
        ([("content-type", "application/json"), ("content-type", "application/grpc")], false, nil),
        ([("grpc-timeout", "1S")], false, nil),
    ])
    func theCallsHeadIsReadOnce(fields: [(String, String)], call: Bool, timeout: Duration?) {
        let (stream, request) = RecordingStream.carrying()
        stream.protocolName = "HTTP/2"
        stream.fields = fields
        let head = request.grpcCall(protocolName: "HTTP/2")
        #expect((head != nil) == call)
        #expect(head?.timeout == timeout)
        // Over HTTP/1.1 nothing is looked at.
        #expect(request.grpcCall(protocolName: "HTTP/1.1") == nil)
    }

    /// Raw gRPC calls over h2c (httpx), each with the `grpc-timeout` given
    /// and no deadline of the client's own, so what answers is the proxy:
    /// per call, its status, `grpc-status`, `grpc-message` and seconds taken.
    static let rawCalls = #"""
        import httpx, json, sys, time
        port, calls = sys.argv[1], json.loads(sys.argv[2])
        out = []
        with httpx.Client(http1=False, http2=True, timeout=30) as c:
            for path, timeout in calls:
                headers = {"content-type": "application/grpc", "te": "trailers"}
                if timeout: headers["grpc-timeout"] = timeout
                started = time.monotonic()
                r = c.post("http://127.0.0.1:%s%s" % (port, path), headers=headers, content=b"\0\0\0\0\0")
                out.append([r.status_code, r.headers.get("grpc-status"), r.headers.get("grpc-message"),
                            time.monotonic() - started, len(r.content)])
        print(json.dumps({"calls": out}))
        """#

    /// `rawCalls` through the proxy at `port`: per call, `[status,
    /// grpc-status, grpc-message, seconds, body bytes]`.
    static func rawCallResults(port: Int, _ calls: [[String]]) throws -> [[Any]] {
        let json = String(decoding: try JSONSerialization.data(withJSONObject: calls), as: UTF8.self)
        let r = try runProcess(try PythonH2.python(), ["-c", rawCalls, String(port), json], timeout: 60)
        try #require(r.status == 0, "\(r.err)")
        let last = r.out.split(separator: "\n").last.map(String.init) ?? ""
        let object = try JSONSerialization.jsonObject(with: Data(last.utf8)) as? [String: Any]
        return try #require(object?["calls"] as? [[Any]], "\(r.out)")
    }

    /// The upstream is `H2Upstream`, which answers after `delay` whatever
    /// the call's `grpc-timeout` says (a grpcio server would answer
    /// DEADLINE_EXCEEDED itself at the same moment as the proxy, since each
    /// try carries the time left as its own `grpc-timeout`).
    @Test func aClientsGrpcTimeoutIsTheDeadlineWhenItIsTheSooner() throws {
        let certificates = try TestCertificates()
        let upstream = try H2Upstream(certificate: try certificates.make("h2-upstream", names: ["localhost"]))
        let h = try Self.proxy(
            """
            upstreams:
              g: { endpoints: [http://127.0.0.1:\(upstream.plainPort)], protocol: h2 }
            routes:
              - { match: { path_prefix: /t.S/ }, upstream: g, timeout: 1500ms, grpc: {} }
            """)
        defer { h.stop() }
        let calls = [
            ["/t.S/Slow?delay=3000&n=1", "300m"], ["/t.S/Past?n=2", "0n"], ["/t.S/Slow?delay=3000&n=3", "20S"],
            ["/t.S/U?n=4", "junk"], ["/t.S/U?n=5", ""],
        ]
        let results = try Self.rawCallResults(port: h.port, calls)
        try #require(results.count == calls.count, "\(results)")
        func row(_ i: Int) -> (status: Int?, grpc: String?, message: String, seconds: Double, bytes: Int?) {
            let x = results[i]
            return (x[0] as? Int, x[1] as? String, x[2] as? String ?? "", x[3] as? Double ?? -1, x[4] as? Int)
        }
        // 300 ms asked, 1.5 s allowed by the route, 3 s needed: the client's deadline, well before the route's.
        let short = row(0)
        #expect(short.status == 200 && short.grpc == "4", "\(short)")
        #expect(short.message.contains("grpc-timeout of 300ms"), "\(short)")
        #expect(short.seconds >= 0.25 && short.seconds < 1.4, "\(short)")
        // A deadline already past: answered with no try sent.
        let past = row(1)
        #expect(past.grpc == "4" && past.message.contains("grpc-timeout of 0ms"), "\(past)")
        #expect(upstream.requests(to: "/t.S/Past").isEmpty)
        // 20 s asked: the route's 1.5 s is the sooner.
        let long = row(2)
        #expect(long.grpc == "4" && long.message.contains("route's timeout of 1.5s"), "\(long)")
        #expect(long.seconds >= 1.4, "\(long)")
        // A malformed grpc-timeout is no deadline and no refusal: the call goes upstream.
        #expect(row(3).status == 200 && row(3).grpc == nil && (row(3).bytes ?? 0) > 0, "\(row(3))")
        #expect(row(4).status == 200 && row(4).grpc == nil && (row(4).bytes ?? 0) > 0, "\(row(4))")
        // Each try carries the time its call has left as its own grpc-timeout (here the route's 1.5 s,
        // less what passed), in place of the client's field, malformed or missing.
        for n in [4, 5] {
            let sent = upstream.requests(to: "/t.S/U?n=\(n)", atLeast: 1).first?["fields"] as? [[String]] ?? []
            let timeouts = sent.filter { $0.first == "grpc-timeout" }.compactMap { $0.last }
            #expect(timeouts.count == 1, "\(sent)")
            let left = timeouts.first.flatMap { GRPCTimeout.parse($0) }
            #expect(left.map { $0 > .milliseconds(1000) && $0 <= .milliseconds(1500) } == true, "\(timeouts)")
        }
    }

    /// A call parked for an unreachable upstream whose own `grpc-timeout`
    /// passes first gets DEADLINE_EXCEEDED, what any gRPC server says at
    /// its deadline (issue 45); one bounded by the route's `park_for` keeps
    /// UNAVAILABLE.
    @Test func aCallWhoseDeadlinePassesWhileParkedIsDeadlineExceeded() throws {
        let down = RefusingPort()
        let h = try Self.proxy(
            """
            upstreams:
              down:
                endpoints: [http://127.0.0.1:\(down.port)]
                protocol: h2
                connect_timeout: 200ms
                reachability: { park_for: 10s }
              brief:
                endpoints: [http://127.0.0.1:\(down.port)]
                protocol: h2
                connect_timeout: 200ms
                reachability: { park_for: 300ms }
            routes:
              - { match: { path_prefix: /t.S/ }, upstream: down, timeout: 20s, grpc: {} }
              - { match: { path_prefix: /b.S/ }, upstream: brief, timeout: 20s, grpc: {} }
            """, holding: [down])
        defer { h.stop() }
        let calls = [["/t.S/M", "500m"], ["/b.S/M", "20S"]]
        let results = try Self.rawCallResults(port: h.port, calls)
        try #require(results.count == 2, "\(results)")
        let parked = results[0]
        #expect(parked[0] as? Int == 200 && parked[1] as? String == "4", "\(parked)")
        let message = parked[2] as? String ?? ""
        #expect(message.contains("grpc-timeout of 500ms") && message.contains("could not be reached"), "\(message)")
        #expect((parked[3] as? Double ?? 0) >= 0.45, "\(parked)")
        // park_for ran out before the call's 20 s: the upstream is unreachable, as before.
        let brief = results[1]
        #expect(brief[1] as? String == "14", "\(brief)")
        #expect((brief[2] as? String ?? "").contains("could not be reached"), "\(brief)")
    }
}
