import Foundation
import HappyPathCore
import Testing

/// Issue 50: concurrent identical reads share one upstream try, never
/// across users. Real clients on real sockets, a real (scripted) upstream
/// that counts what reaches it; one worker, so that every request meets
/// the same table (docs/coalescing.md: one try per key per worker).
@Suite("coalescing") struct CoalescingTests {
    static func config(
        _ upstream: Int, route: String = "coalesce: true", timeout: String = "5s",
        defaults: String = "{ reachability: { park_for: 0s }, retry: { attempts: 1 } }", endpoints: [Int] = []
    ) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: \(defaults)
        upstreams:
          u: { endpoints: [\(([upstream] + endpoints).map { "http://127.0.0.1:\($0)" }.joined(separator: ", "))] }
        routes:
          - match: { path_prefix: / }
            upstream: u
            timeout: \(timeout)
            \(route)
        """
    }

    /// `count` clients, each on its own connection, each sending its GET
    /// at once (`headers(i)` for the i-th); the answers are read after.
    static func send(
        _ port: Int, _ count: Int, target: String = "/items/1", headers: (Int) -> [(String, String)] = { _ in [] }
    ) throws -> [TestConnection] {
        try (0..<count).map { i in
            let c = try TestConnection(port: port, timeout: 15)
            var head = "GET \(target) HTTP/1.1\r\nHost: shop.example\r\n"
            for (name, value) in headers(i) { head += "\(name): \(value)\r\n" }
            try c.send(head + "\r\n")
            return c
        }
    }

    /// The upstream's requests, health checks aside.
    static func tries(_ up: ScriptedUpstream) -> [String] { up.appRequests.map(\.head) }

    @Test func twoHundredIdenticalGetsMakeOneUpstreamRequestAndTwoHundredIdenticalAnswers() throws {
        let up = ScriptedUpstream(response: "DELAY:1000\n" + http(200, "the catalog", headers: ["ETag: \"v1\""])).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let clients = try Self.send(h.port, 200)
        let answers = try clients.map { try $0.readResponse() }
        #expect(Self.tries(up).count == 1, "\(Self.tries(up).count) upstream requests")
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "the catalog" && $0.header("ETag") == "\"v1\"" })
        let ids = Set(answers.compactMap { $0.header("X-Request-Id") })
        #expect(ids.count == 200, "every answer has its own X-Request-Id")
        #expect(answers.allSatisfy { $0.header("X-Happypath-Attempts") == "1" })
        var metrics = ""
        #expect(
            waitUntil("the group's size is observed") {
                metrics = try HTTP.request(port: h.adminPort, "/metrics").text
                return metrics.contains("happypath_coalesce_group_size_count{route=\"/\"} 1")
            })
        #expect(metrics.contains("happypath_coalesced_requests_total{route=\"/\"} 199"))
        #expect(metrics.contains("happypath_coalesce_group_size_sum{route=\"/\"} 200.0"))
        #expect(metrics.contains("happypath_coalesce_group_size_bucket{route=\"/\",le=\"100.0\"} 0"))
        #expect(metrics.contains("happypath_coalesce_group_size_bucket{route=\"/\",le=\"1000.0\"} 1"))
        // The route's line on the status page.
        let page = try HTTP.request(port: h.adminPort, "/status").text
        #expect(page.contains("<td data-k=\"r-coalesced\">199 of 200 (99.5%)</td>"), "\(page)")
    }

    @Test func aRouteWithoutCoalesceSendsEveryRequest() throws {
        let up = ScriptedUpstream(response: "DELAY:300\n" + http(200, "the catalog")).started()
        let h = try ProxyHarness(Self.config(up.port, route: ""), workers: 1)
        defer { h.stop(); up.stop() }
        let answers = try Self.send(h.port, 20).map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 200 })
        #expect(Self.tries(up).count == 20)
    }

    /// Four users, fifty requests each: four upstream requests, and each
    /// user gets the answer made for its own credential.
    @Test func fourCredentialsMakeFourRequestsAndNobodyGetsAnothersAnswer() throws {
        let up = ScriptedUpstream(answering: { head in
            let auth = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("authorization:") } ?? "none"
            return "DELAY:1000\n" + http(200, "for " + auth.dropFirst(15).trimmingCharacters(in: .whitespaces))
        }).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let clients = try Self.send(h.port, 200) { [("Authorization", "Bearer user-\($0 % 4)")] }
        let answers = try clients.map { try $0.readResponse() }
        #expect(Self.tries(up).count == 4, "\(Self.tries(up).count) upstream requests")
        for (i, answer) in answers.enumerated() {
            #expect(answer.status == 200 && answer.text == "for Bearer user-\(i % 4)", "client \(i): \(answer.text)")
        }
    }

    /// `Vary: Accept-Language`: the English leader's answer goes to the
    /// English followers only; the German ones share one try of their own.
    @Test func aVaryAnswerSplitsTheGroupByThatField() throws {
        let up = ScriptedUpstream(answering: { head in
            let german = head.lowercased().contains("accept-language: de")
            return "DELAY:1000\n" + http(200, german ? "Katalog" : "catalog", headers: ["Vary: Accept-Language"])
        }).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let clients = try Self.send(h.port, 200) { [("Accept-Language", $0 % 2 == 0 ? "en" : "de")] }
        let answers = try clients.map { try $0.readResponse() }
        let languages = Self.tries(up).map { $0.split(separator: "\r\n").first { $0.hasPrefix("Accept-Language") } ?? "none" }
        #expect(languages.sorted() == ["Accept-Language: de", "Accept-Language: en"], "\(languages)")
        for (i, answer) in answers.enumerated() {
            #expect(answer.status == 200 && answer.text == (i % 2 == 0 ? "catalog" : "Katalog"), "client \(i): \(answer.text)")
        }
    }

    /// The leader's client leaves before the answer: the next follower
    /// leads a new try at once, and everyone else gets its answer.
    @Test func aLeaderWhoseClientLeavesHandsOver() throws {
        let up = ScriptedUpstream(response: "DELAY:1000\n" + http(200, "the catalog")).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let leader = try Self.send(h.port, 1)
        #expect(waitUntil("the leader's try reached the upstream") { Self.tries(up).count == 1 })
        let followers = try Self.send(h.port, 50)
        shutdown(leader[0].fd, Int32(SHUT_RDWR))
        let answers = try followers.map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "the catalog" })
        #expect(Self.tries(up).count == 2, "\(Self.tries(up).count) upstream requests")
    }

    /// Followers that hang up while they wait disturb nobody.
    @Test func followersThatLeaveDisturbNobody() throws {
        let up = ScriptedUpstream(response: "DELAY:1000\n" + http(200, String(repeating: "x", count: 100_000))).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let clients = try Self.send(h.port, 50)
        for c in clients[10..<20] { shutdown(c.fd, Int32(SHUT_RDWR)) }
        for (i, c) in clients.enumerated() where !(10..<20).contains(i) {
            let answer = try c.readResponse()
            #expect(answer.status == 200 && answer.body.count == 100_000, "client \(i)")
        }
        #expect(Self.tries(up).count == 1)
    }
}
