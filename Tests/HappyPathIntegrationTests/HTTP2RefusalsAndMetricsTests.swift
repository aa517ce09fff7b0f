import Foundation
import HappyPathCore
import HappyPathIO
import Testing

@testable import HappyPathServer

/// The proxy's side of HTTP/2 (docs/http2.md): a refused stream gets the
/// problem an HTTP/1.1 request refused by the same rule gets, and the
/// connection and stream events the driver reports become metrics. The
/// delegate methods are called here as the driver calls them, on a
/// worker's loop, with requests on a `RecordingStream`; one test goes
/// through the driver with real clients (HTTP2EdgeTests has the rest).
@Suite struct HTTP2RefusalsAndMetricsTests {
    static let limits = HTTPServerLimits(maxHeaderBytes: 8192, maxBodyBytes: 4 << 20, timeout: .seconds(5))

    // MARK: - The problem (pure)

    /// A rule HTTP/1.1 has too: HTTP/1.1's problem (code, status, title,
    /// Retry-After, the limit in a 413/431/408's detail), but for the detail
    /// worded for `:authority` and `:path`.
    @Test(arguments: HTTP1Refusal.allCases)
    func anHTTP1RuleGetsHTTP1sProblemWithHTTP2sWording(_ reason: HTTP1Refusal) {
        let refusal = HTTP2RequestRefusal.http1(reason)
        let http1 = ProblemResponder.problem(for: reason, requestID: "r1", limits: Self.limits)
        let http2 = ProblemResponder.problem(for: refusal, requestID: "r1", limits: Self.limits)
        #expect(http2.status == refusal.status)
        #expect(http2.status == reason.status)
        var expected = http1
        if refusal.detail != reason.detail { expected.detail = refusal.detail }
        #expect(http2 == expected)
    }

    @Test func theHostRulesNameAuthority() {
        for reason in [HTTP1Refusal.missingHost, .invalidHost] {
            let problem = ProblemResponder.problem(for: .http1(reason), requestID: "r1", limits: Self.limits)
            #expect(problem.detail?.contains(":authority") == true, "\(reason): \(problem.detail ?? "")")
        }
        let target = ProblemResponder.problem(for: .http1(.badTarget), requestID: "r1", limits: Self.limits)
        #expect(target.detail?.contains(":path") == true)
        // The limits are named as on HTTP/1.1.
        let large = ProblemResponder.problem(for: .http1(.headTooLarge), requestID: "r1", limits: Self.limits)
        #expect(large.detail == "The request head is larger than 8192 bytes (limits.max_header_bytes).")
        #expect(large.code == "HEADERS_TOO_LARGE" && large.status == 431)
    }

    @Test(arguments: HTTP2Malformation.allCases)
    func aRuleOnlyHTTP2HasIsABadRequest(_ rule: HTTP2Malformation) {
        let problem = ProblemResponder.problem(for: .malformed(rule), requestID: "r1", limits: Self.limits)
        #expect(problem == Problem(.badRequest, requestID: "r1", detail: rule.detail))
        #expect(problem.status == HTTP2RequestRefusal.malformed(rule).status)
    }

    // MARK: - The delegate, on a worker

    /// What a stream was answered.
    struct Answer: Sendable {
        var status: Int
        var fields: [String: String]
        var body: [String: String]
    }

    /// Worker `worker` answers a request on a `RecordingStream` by `body`
    /// (one of its delegate methods), on its loop, as the driver would ask it.
    static func answer(
        _ h: ProxyHarness, worker: Int = 0, protocolName: StaticString = "HTTP/2",
        _ body: @escaping @Sendable (ProxyWorker, HTTPRequest) -> Void
    ) throws -> Answer {
        let answer = Locked<Answer?>(nil)
        h.proxy.onWorker(worker) { w in
            let stream = RecordingStream()
            stream.protocolName = protocolName
            let request = HTTPRequest(stream: stream)
            stream.carried = request
            body(w, request)
            guard let whole = stream.calls.last, whole.hasPrefix("whole ") else { return }
            let status = Int(whole.split(separator: " ")[1]) ?? 0
            let json = (try? JSONSerialization.jsonObject(with: Data(stream.wholeBody.utf8))) as? [String: Any] ?? [:]
            answer.withLock {
                $0 = Answer(
                    status: status, fields: Dictionary(stream.staged.map { ($0.name, $0.value) }) { a, _ in a },
                    body: json.compactMapValues { ($0 as? String) ?? ($0 as? Int).map(String.init) })
            }
        }
        guard waitUntil("the stream's answer", { answer.withLock { $0 != nil } }), let a = answer.withLock({ $0 }) else {
            throw TestError("no answer")
        }
        return a
    }

    @Test func aMalformedRequestIsAnsweredWithProblemJSONOnItsStreamAndCounted() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let a = try Self.answer(h) { $0.reject($1, refusal: .malformed(.badScheme)) }
        #expect(a.status == 400)
        #expect(a.fields["Content-Type"] == "application/problem+json")
        #expect(a.fields["Cache-Control"] == "no-store")
        #expect(a.body["code"] == "BAD_REQUEST")
        #expect(a.body["status"] == "400")
        #expect(a.body["detail"] == "The :scheme is neither http nor https.")
        #expect(a.fields["X-Request-Id"] == a.body["request_id"])
        let admin = AdminProbe(port: h.adminPort)
        #expect(try admin.metric(#"happypath_requests_refused_total{reason="bad_scheme",status="400"}"#) == 1)
    }

    /// `.http1(r)` on a stream is `reject(_:reason: r)` but for its detail:
    /// same status, code and headers, and the same series.
    @Test func anHTTP1RuleOnAStreamIsHTTP1sRefusal() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let http2 = try Self.answer(h) { $0.reject($1, refusal: .http1(.missingHost)) }
        let http1 = try Self.answer(h, protocolName: "HTTP/1.1") { $0.reject($1, reason: .missingHost) }
        #expect(http2.status == 400 && http1.status == 400)
        #expect(Set(http2.fields.keys) == Set(http1.fields.keys))
        var same = http2.body
        same["detail"] = http1.body["detail"]
        same["request_id"] = http1.body["request_id"]
        #expect(same == http1.body)
        #expect(http2.body["detail"] == HTTP2RequestRefusal.http1(.missingHost).detail)
        #expect(http1.body["detail"] == HTTP1Refusal.missingHost.detail)
        // And a real HTTP/1.1 request without Host counts in the same series.
        _ = try EdgeHardeningTests.raw(h.port, "GET / HTTP/1.1\r\n\r\n")
        let admin = AdminProbe(port: h.adminPort)
        #expect(
            waitUntil("three refusals counted") {
                try admin.metric(#"happypath_requests_refused_total{reason="missing_host",status="400"}"#) == 3
            })
    }

    /// The body-size rule keeps its 413 and its limit on a stream.
    @Test func aBodyOverTheLimitIs413WithTheLimit() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let a = try Self.answer(h) { $0.reject($1, refusal: .http1(.bodyTooLarge)) }
        #expect(a.status == 413)
        #expect(a.body["code"] == "PAYLOAD_TOO_LARGE")
        #expect(a.body["detail"] == "The request body is larger than 4194304 bytes (limits.max_request_body).")
    }

    /// The events of two connections on two workers, as the driver reports
    /// them: the gauges are the process's, the counters add up.
    @Test func connectionAndStreamEventsBecomeMetrics() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let done = Locked(0)
        h.proxy.onWorker(0) { w in
            w.http2ConnectionOpened(tls: true)
            w.http2ConnectionOpened(tls: false)
            w.http2ConnectionOpened(tls: false)
            for _ in 0..<3 { w.http2StreamOpened() }
            w.http2StreamClosed()
            w.http2StreamReset(byClient: true, code: .cancel)
            w.http2StreamReset(byClient: true, code: .cancel)
            w.http2StreamReset(byClient: false, code: .refusedStream)
            w.http2GoawayReceived(code: .noError)
            w.http2ConnectionClosed(reason: .rapidReset, sentGoaway: true)
            w.http2ConnectionClosed(reason: .flood(.settings), sentGoaway: true)
            // Closed without our GOAWAY (the client went): no GOAWAY counted.
            w.http2ConnectionClosed(reason: .clientClosed, sentGoaway: false)
            done.withLock { $0 += 1 }
        }
        h.proxy.onWorker(1) { w in
            w.http2ConnectionOpened(tls: false)
            w.http2StreamOpened()
            w.http2StreamReset(byClient: true, code: .cancel)
            done.withLock { $0 += 1 }
        }
        #expect(waitUntil("both workers ran") { done.withLock { $0 } == 2 })
        let m = try AdminProbe(port: h.adminPort).metrics()
        #expect(m["happypath_http2_connections"] == 1)
        #expect(m[#"happypath_http2_connections_total{tls="true"}"#] == 1)
        #expect(m[#"happypath_http2_connections_total{tls="false"}"#] == 3)
        #expect(m["happypath_http2_streams_open"] == 3)
        #expect(m["happypath_http2_streams_total"] == 4)
        #expect(m[#"happypath_http2_resets_total{side="client",code="cancel"}"#] == 3)
        #expect(m[#"happypath_http2_resets_total{side="proxy",code="refused_stream"}"#] == 1)
        #expect(m[#"happypath_http2_goaways_total{side="received",reason="no_error"}"#] == 1)
        #expect(m[#"happypath_http2_goaways_total{side="sent",reason="rapid_reset"}"#] == 1)
        #expect(m[#"happypath_http2_goaways_total{side="sent",reason="flood_settings"}"#] == 1)
        #expect(m[#"happypath_http2_goaways_total{side="sent",reason="client"}"#] == nil)
    }

    // MARK: - With a real client

    /// nghttp and curl over h2c, through the driver: the access log says `HTTP/2`, a
    /// refused stream gets its problem and is counted, and the gauges come
    /// back to 0 once the client has gone.
    @Test func overH2cTheAccessLogSaysHTTP2AndTheMetricsCount() throws {
        let capture = AccessLogTests.Capture()
        let h = try ProxyHarness(
            HTTP2EdgeTests.yaml(), accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink))
        defer { h.stop() }
        let base = "http://127.0.0.1:\(h.port)"
        // Two streams on one connection (nghttp: curl 7.88.1 cannot reuse an h2c connection).
        let two = try runProcess(
            "/usr/bin/nghttp", ["-n", "-H", "x-request-id: h2-log", base + "/ok", base + "/ok?2"], timeout: 20)
        #expect(two.status == 0, "\(two.out) \(two.err)")
        #expect(waitUntil("two access-log lines") { capture.lines.count == 2 })
        for line in capture.lines {
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            #expect(object?["protocol"] as? String == "HTTP/2", "\(line)")
            #expect(object?["request_id"] as? String == "h2-log")
        }
        // A path above the root: HTTP/1.1's rule, on its stream.
        let refused = try runProcess(
            "/usr/bin/curl",
            ["-sS", "--max-time", "15", "--http2-prior-knowledge", "--path-as-is", base + "/../x", "-w", "\n%{http_code}"],
            timeout: 20)
        #expect(refused.out.hasSuffix("\n400"), "\(refused.out) \(refused.err)")
        #expect(refused.out.contains(#""code":"BAD_REQUEST""#), "\(refused.out)")
        let admin = AdminProbe(port: h.adminPort)
        #expect(
            waitUntil("both connections closed and counted") {
                let m = try admin.metrics()
                return m["happypath_http2_connections"] == 0 && m["happypath_http2_streams_open"] == 0
                    && m[#"happypath_http2_connections_total{tls="false"}"#] == 2
            })
        let m = try admin.metrics()
        #expect(m["happypath_http2_streams_total"] == 3)
        #expect(m[#"happypath_requests_refused_total{reason="path_above_root",status="400"}"#] == 1)
        #expect(capture.lines.count == 2, "a refused stream has no access-log line, as on HTTP/1.1")
    }

    /// A proxy that never spoke HTTP/2 shows its gauges at 0 and no counter.
    @Test func noHTTP2NoCounters() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        _ = try HTTP.request(port: h.port, "/ok")
        let m = try AdminProbe(port: h.adminPort).metrics()
        #expect(m["happypath_http2_connections"] == 0)
        #expect(m["happypath_http2_streams_open"] == 0)
        #expect(!m.keys.contains { $0.hasPrefix("happypath_http2_") && $0.contains("_total") })
    }
}
