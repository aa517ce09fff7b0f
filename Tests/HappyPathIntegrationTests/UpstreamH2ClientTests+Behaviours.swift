import Foundation
import HappyPathConfig
import HappyPathCore
import Testing

@testable import HappyPathServer

/// The proxy's own HTTP/2 client (`protocol: h2`, issue 46) against
/// the Python h2 upstream (`H2Upstream`), one behaviour each: streams of one
/// connection, trailers, refused streams, idle cuts, early answers, a dead
/// connection. In `UpstreamH2ClientTests`' serialized suite: side by side
/// with it, a loaded run's timing tests elsewhere suffered. The thread
/// sanitizer's pass runs `aRefusedStreamOfAPostIsSentAgainWithoutARetry`
/// (admin scrapes beside the workers' pools); the rest once, in the
/// address sanitizer's pass.
extension UpstreamH2ClientTests {
    /// The Python h2 upstream (`H2Upstream`) sees every request, one after
    /// another and at once, as streams of one connection (one worker).
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func requestsOneAfterAnotherAndAtOnceAreStreamsOfOneConnection() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy("http://127.0.0.1:\(up.plainPort)", extra: "")
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
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func trailersReachAClientThatAsksForThem() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy("http://127.0.0.1:\(up.plainPort)", extra: "")
        defer { h.stop() }
        let asked = try HTTP.request(port: h.port, "/t/asked?trailers=1", headers: [("TE", "trailers")])
        #expect(asked.status == 200)
        #expect(asked.json["path"] as? String == "/t/asked?trailers=1")
        #expect(asked.trailers.map { "\($0.name.lowercased())=\($0.value)" } == ["grpc-status=0", "x-checksum=c0ffee"])
    }
    /// Nothing listens: the try fails as an HTTP/1.1 one on libcurl does
    /// (a connect failure, the same answer), never a hang.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func anUpstreamThatIsNotThereFailsAsOverHTTP1() throws {
        var answers: [String] = []
        for version in ["http1", "h2"] {
            let h = try ProxyHarness(UpstreamHTTP2Tests.yaml("http://127.0.0.1:9", protocol: version), workers: 1)
            defer { h.stop() }
            let r = try HTTP.request(port: h.port, "/x")
            answers.append("\(r.status) \(r.json["code"] ?? "-") \(r.json["attempts"] ?? "-")")
        }
        #expect(answers[0] == answers[1], "\(answers)")
        #expect(answers[1].hasPrefix("502") || answers[1].hasPrefix("503"), "\(answers)")
    }
    /// A stream the upstream refuses (RST_STREAM REFUSED_STREAM) was never
    /// processed: the POST is sent again on another stream inside the
    /// transport, without a retry (`attempts: 1`) or the retry budget,
    /// and answered; counted in `happypath_upstream_h2_streams_replayed_total`.
    @Test func aRefusedStreamOfAPostIsSentAgainWithoutARetry() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", extra: "",
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
    /// An upstream silent for `limits.client_timeout` (1 s) is cut as
    /// libcurl's stall check cuts an HTTP/1.1 one: 504, long before the
    /// route's 5 s.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func aSilentUpstreamIsCutAfterTheIdleTimeout() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        var answers: [String] = []
        for client in ["nghttp2"] {
            let h = try UpstreamHTTP2Tests.proxy(
                "http://127.0.0.1:\(up.plainPort)", extra: "",
                defaults: "{ retry: { attempts: 1, per_try_timeout: 5s }, reachability: { park_for: 0s } }",
                limits: "{ client_timeout: 1s }")
            defer { h.stop() }
            let started = Date()
            let r = try HTTP.request(port: h.port, "/idle/\(client)?delay=4000", timeout: 10)
            let elapsed = Date().timeIntervalSince(started)
            answers.append("\(r.status) \(r.json["code"] ?? "-")")
            #expect(elapsed >= 0.9 && elapsed < 3, "\(client): \(elapsed) s")
        }
        #expect(answers.count == 1 && answers[0].hasPrefix("504"), "\(answers)")
    }
    /// A whole answer that comes before the request's body went, then
    /// RST_STREAM NO_ERROR (RFC 9113 section 8.1: "stop sending"): the
    /// answer is complete, not a reset stream.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func anAnswerBeforeTheBodyThenNoErrorIsComplete() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", extra: "",
            defaults: "{ retry: { attempts: 1 }, reachability: { park_for: 0s } }")
        defer { h.stop() }
        let r = try HTTP.request(
            port: h.port, "POST", "/early?early=1", body: Array(repeating: 0x65, count: 3 << 20), timeout: 10)
        #expect(r.status == 413, "\(r.status) \(r.text)")
        #expect(r.json["detail"] as? String == "The upstream answered 413.", "the upstream's answer, not a failure")
    }
    /// A connection whose server died behind an open socket: before the
    /// next request goes on it (silent past `pingAfterSilence`, 0 here), a
    /// PING; no ACK within `connect_timeout` (1 s) closes it, and the
    /// request goes on a new connection and is answered, never lost on the
    /// dead one (a POST too).
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func aDeadConnectionIsFoundByAPingBeforeARequestGoesOnIt() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", extra: "",
            defaults: "{ retry: { attempts: 1 }, reachability: { park_for: 0s } }")
        defer { h.stop() }
        UpstreamH2ClientTests.pingAfterSilence(.zero, on: h, workers: 1)
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
    func field(_ request: [String: Any], _ name: String) -> String? {
        (request["fields"] as? [[String]])?.first { $0.first == name }?.last
    }
}

extension UpstreamH2ClientTests {
    /// A slow client's stream holds at most its 64 KiB window of the
    /// answer, counted in `happypath_memory_bytes{pool="upstream_h2"}`
    /// while it lasts; the whole body arrives once the client reads, and
    /// the pool is back to zero.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func aSlowClientsHeldBytesAreCountedWithinItsWindow() throws {
        let (up, _, _) = try UpstreamHTTP2Tests.upstream()
        // Nothing read ahead: the stream itself waits for the client.
        let h = try UpstreamHTTP2Tests.proxy(
            "http://127.0.0.1:\(up.plainPort)", limits: "{ client_timeout: 10s, read_ahead: 0 }")
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let pool = #"happypath_memory_bytes{pool="upstream_h2"}"#
        #expect(try admin.metric(pool) == 0)
        let size = 8_000_000
        let c = try TestConnection(port: h.port, timeout: 20, receiveBuffer: 16 * 1024)
        try c.send("GET /held?size=\(size) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(waitUntil("the stream to hold bytes for the client") { try admin.metric(pool) > 0 })
        #expect(try admin.metric(pool) <= 64 * 1024)
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.body.count == size)
        #expect(waitUntil("the held bytes to go") { try admin.metric(pool) == 0 })
    }
}
