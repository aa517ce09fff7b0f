import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// OpenTelemetry traces end to end: the real proxy exporting over OTLP/HTTP
/// to a real receiver that decodes the protobuf with `opentelemetry-proto`,
/// and a real upstream that records the `traceparent` it received.
@Suite("Tracing", .serialized)
struct TracingEndToEndTests {
    static let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    static let unavailable = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"

    /// `storage`: the later route's store (default a fresh file in /tmp, never the shared default path).
    static func yaml(
        otlp: String, upstream: Int, ratio: Double,
        storage: String = NSTemporaryDirectory() + "hp-tracing-\(UUID().uuidString).db"
    ) -> String {
        """
        storage: { path: \(storage) }
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        tracing: { otlp_endpoint: \(otlp), sample_ratio: \(ratio), service_name: checkout-gateway }
        upstreams:
          api:
            endpoints: [http://127.0.0.1:\(upstream)]
            retry: { attempts: 2, backoff: { base: 1ms, max: 1ms }, honor_retry_after: false }
        routes:
          - { match: { path_prefix: /api/ }, upstream: api, strip_prefix: /api }
          - { match: { path_prefix: /later/ }, upstream: api, strip_prefix: /later, delivery: { mode: later } }
        """
    }

    static func traceparent(of head: String) -> String? {
        DeliverLaterTests.fields(head)["traceparent"]
    }

    /// A request that came with a sampled `traceparent`: its server span
    /// joins the client's trace as a child of the client's span, each try
    /// is a client span under it, and the upstream received the same trace
    /// with the proxy's span as its parent.
    @Test func aSampledRequestIsAServerSpanWithAClientSpanPerTry() throws {
        let receiver = try OTLPReceiver()
        let upstream = ScriptedUpstream(responses: [Self.unavailable, Self.ok]).started()
        let h = try ProxyHarness(Self.yaml(otlp: receiver.url, upstream: upstream.port, ratio: 0), holding: [upstream])
        defer { h.stop() }
        let clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
        let clientSpan = "00f067aa0ba902b7"
        let r = try HTTP.request(port: h.port, "/api/orders", headers: [("traceparent", "00-\(clientTrace)-\(clientSpan)-01")])
        #expect(r.status == 200)
        guard waitUntil("three spans received", { receiver.spans.count >= 3 }) else { return }
        let spans = receiver.spans
        let server = try #require(spans.first { $0["kind"] as? Int == 2 })
        let tries = spans.filter { $0["kind"] as? Int == 3 }
        #expect(server["trace_id"] as? String == clientTrace)
        #expect(server["parent_id"] as? String == clientSpan, "a child of the client's span")
        #expect(server["service"] as? String == "checkout-gateway" && server["scope"] as? String == "happypath")
        #expect(server["content_type"] as? String == "application/x-protobuf")
        #expect(server["name"] as? String == "GET /api/")
        let attributes = server["attributes"] as? [String: Any] ?? [:]
        #expect(attributes["http.route"] as? String == "/api/" && attributes["http.request.method"] as? String == "GET")
        #expect(attributes["http.response.status_code"] as? Int == 200 && attributes["happypath.code"] as? String == "OK")
        #expect(attributes["happypath.attempts"] as? Int == 2 && attributes["happypath.upstream"] as? String == "api")
        #expect(server["status"] as? Int == 0, "not an error")
        let serverSpan = try #require(server["span_id"] as? String)
        #expect(tries.count == 2)
        #expect(tries.allSatisfy { $0["trace_id"] as? String == clientTrace && $0["parent_id"] as? String == serverSpan })
        let outcomes = tries.map { (($0["attributes"] as? [String: Any])?["happypath.try.outcome"] as? String) ?? "" }
        #expect(outcomes.sorted() == ["server_error", "success"])
        let first = try #require(tries.first { (($0["attributes"] as? [String: Any])?["happypath.attempt"] as? Int) == 1 })
        #expect((first["attributes"] as? [String: Any])?["http.response.status_code"] as? Int == 503)
        #expect(first["status"] as? Int == 2, "the failed try is an error")
        #expect(tries.allSatisfy { ($0["start"] as? Int ?? 0) >= (server["start"] as? Int ?? .max) })
        // The upstream joined the same trace, under the proxy's span, on both tries.
        let received = upstream.appRequests.compactMap { Self.traceparent(of: $0.head) }
        #expect(received == Array(repeating: "00-\(clientTrace)-\(serverSpan)-01", count: 2), "\(received)")
        // What the exporter sent is counted.
        let admin = AdminProbe(port: h.adminPort)
        #expect(waitUntil("counted", { try admin.metric("happypath_trace_spans_exported_total") >= 3 }))
    }

    /// Parent-based sampling: with `sample_ratio: 0`, a request without a
    /// `traceparent`, and one whose `traceparent` says not sampled, are not
    /// traced, and the latter's `traceparent` goes upstream as it came.
    @Test func unsampledRequestsAreNotTracedAndTheirTraceparentPassesThrough() throws {
        let receiver = try OTLPReceiver()
        let upstream = ScriptedUpstream(responses: [Self.ok]).started()
        let h = try ProxyHarness(Self.yaml(otlp: receiver.url, upstream: upstream.port, ratio: 0), holding: [upstream])
        defer { h.stop() }
        let notSampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        _ = try HTTP.request(port: h.port, "/api/a")
        _ = try HTTP.request(port: h.port, "/api/b", headers: [("traceparent", notSampled)])
        // A sampled one after them: once its spans arrive, the others would have too.
        _ = try HTTP.request(port: h.port, "/api/c", headers: [("traceparent", "00-11111111111111111111111111111111-2222222222222222-01")])
        guard waitUntil("the sampled request's spans", { receiver.spans.count >= 2 }) else { return }
        #expect(receiver.spans.allSatisfy { $0["trace_id"] as? String == "11111111111111111111111111111111" })
        let received = upstream.appRequests.compactMap { Self.traceparent(of: $0.head) }
        #expect(received.count == 3)
        #expect(received[1] == notSampled, "not sampled: passed on unchanged")
        #expect(TraceContext.parse(received[0]) != nil, "a request without one still gets one")
    }

    /// With `sample_ratio: 1`, a request without a `traceparent` starts a
    /// trace (a root span); a deliver-later round is a trace of its own,
    /// linked to the request that was accepted.
    @Test func aNewTraceIsARootAndADeliveryRoundLinksToTheAcceptedRequest() throws {
        let receiver = try OTLPReceiver()
        let upstream = ScriptedUpstream(responses: [Self.ok]).started()
        let directory = NSTemporaryDirectory() + "happypath-tracing-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let yaml = Self.yaml(otlp: receiver.url, upstream: upstream.port, ratio: 1, storage: "\(directory)/d.db")
        let h = try ProxyHarness(yaml, holding: [upstream])
        defer { h.stop() }
        _ = try HTTP.request(port: h.port, "/api/root")
        let accepted = try HTTP.request(port: h.port, "POST", "/later/hook", body: Array("{}".utf8))
        #expect(accepted.status == 202)
        guard waitUntil("the round's spans", { receiver.spans.filter { ($0["links"] as? [Any])?.isEmpty == false }.count >= 1 })
        else { return }
        let spans = receiver.spans
        let root = try #require(spans.first { $0["name"] as? String == "GET /api/" })
        #expect(root["parent_id"] as? String == "", "a root span")
        let accept = try #require(spans.first { ($0["attributes"] as? [String: Any])?["happypath.code"] as? String == "DELIVER_LATER" })
        let round = try #require(spans.first { ($0["links"] as? [[String]])?.isEmpty == false && $0["kind"] as? Int == 2 })
        let link = try #require((round["links"] as? [[String]])?.first)
        #expect(link == [accept["trace_id"] as? String ?? "", accept["span_id"] as? String ?? ""], "linked to the accepted request")
        #expect(round["trace_id"] as? String != accept["trace_id"] as? String, "a trace of its own")
        // The round went upstream in its own trace, under its own span.
        let sent = upstream.appRequests.last.flatMap { Self.traceparent(of: $0.head) }
        #expect(sent == "00-\(round["trace_id"] as? String ?? "")-\(round["span_id"] as? String ?? "")-01")
    }

    /// A collector that takes the connection and never answers: SIGTERM
    /// still ends the process within the exporter's flush budget (2 s) and
    /// the drain, far inside Kubernetes' 30 s grace, and the spans it could
    /// not send are counted in the log line it leaves.
    @Test func aSilentCollectorDoesNotHoldUpTheStop() throws {
        let collector = SilentListener()
        let upstream = ScriptedUpstream(response: Self.ok).started()
        defer { upstream.stop() }
        let serve = try ServeProcess(
            config: Self.yaml(otlp: "http://127.0.0.1:\(collector.port)/v1/traces", upstream: upstream.port, ratio: 1),
            logLevel: "info")
        guard let port = serve.listeningPort() else { return }
        // Three batches' worth of spans (two per request) at least: one export
        // hangs on the collector while the others wait their turn.
        for _ in 0..<700 { _ = try HTTP.request(port: port, "/api/x") }
        guard waitUntil("the exporter connected to the collector", { collector.connections() >= 1 }) else { return }
        let start = ContinuousClock.now
        serve.signal(SIGTERM)
        let exited = serve.waitForExit(timeout: 10)
        let took = seconds(since: start)
        #expect(took < 5, "SIGTERM to exit: \(took) s")
        guard exited else { return }
        #expect(serve.process.terminationStatus == 0)
        let line = serve.errors.split(separator: "\n").first { $0.contains("spans were not exported") }
        let object = line.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        let dropped = Int(object?["dropped"] as? String ?? "") ?? (object?["dropped"] as? Int ?? 0)
        #expect(dropped >= 1000, "\(line ?? "no line")")
    }
}

/// A loopback socket that listens and never accepts: the kernel completes
/// each connection and takes what is sent, and nothing ever answers.
final class SilentListener {
    let port: Int
    private let fd: Int32

    init() {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        precondition(fd >= 0, "socket: errno \(errno)")
        port = bindLoopback(fd)
        precondition(port > 0 && listen(fd, 64) == 0, "bind, listen: errno \(errno)")
    }

    /// Connections the kernel completed and holds for an accept that never comes.
    func connections() -> Int {
        // /proc/net/tcp: local address and port in hex, state 01 (ESTABLISHED).
        let hexPort = String(format: ":%04X", port)
        let table = readSmallFile("/proc/net/tcp") ?? ""
        return table.split(separator: "\n").filter { line in
            let fields = line.split(separator: " ")
            return fields.count > 3 && fields[1].hasSuffix(hexPort) && fields[3] == "01"
        }.count
    }

    deinit { close(fd) }
}
