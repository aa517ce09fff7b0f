import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

/// Issue 50: coalescing with everything around it: deadlines and
/// handovers, an outage with parked requests, HTTP/2 clients beside
/// HTTP/1.1 ones, a client that never reads, no-store and Set-Cookie,
/// hedges, serve-stale, several workers, HEAD.
extension CoalescingTests {
    /// The leader's try outlives the route's 2 s: the next follower with
    /// time left leads a fast try, and nobody waits past its own deadline.
    @Test func aLeaderThatTimesOutHandsOverWithoutAnyoneWaitingPastItsDeadline() throws {
        let up = ScriptedUpstream(responses: ["DELAY:5000\n" + http(200, "slow"), http(200, "fast")]).started()
        let h = try ProxyHarness(Self.config(up.port, timeout: "2s"), workers: 1)
        defer { h.stop(); up.stop() }
        let start = ContinuousClock.now
        let leader = try Self.send(h.port, 1)[0]
        #expect(waitUntil("the leader's try reached the upstream") { Self.tries(up).count == 1 })
        // Followers come over the next second, as a herd's do; each has its own 2 s.
        var clients: [(TestConnection, ContinuousClock.Instant)] = []
        Thread.sleep(forTimeInterval: 0.3)
        for i in 0..<20 {
            clients.append((try Self.send(h.port, 1)[0], ContinuousClock.now))
            if i % 4 == 3 { Thread.sleep(forTimeInterval: 0.1) }
        }
        let first = try leader.readResponse()
        #expect(first.status == 504, "the leader's own deadline: \(first.text)")
        for (i, (c, sent)) in clients.enumerated() {
            let r = try c.readResponse()
            let waited = ContinuousClock.now - sent
            #expect(r.status == 200 && r.text == "fast", "follower \(i): \(r.status) \(r.text)")
            #expect(waited < .milliseconds(2600), "follower \(i) waited \(waited), past its own 2 s deadline")
        }
        #expect(Self.tries(up).count == 2, "\(Self.tries(up).count) upstream requests")
        #expect(ContinuousClock.now - start < .seconds(5))
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(metrics.contains("happypath_coalesce_handovers_total{route=\"/\"} 1"), "\(metrics)")
    }

    /// Requests that arrive while the upstream is down: each group's leader
    /// parks, its followers wait with it; when the upstream is back it gets
    /// one request per key. With max_followers 9, a key's 40 requests make
    /// groups of 10: four requests.
    @Test(arguments: [(nil as Int?, 1), (9, 4)])
    func parkedRequestsReachTheUpstreamAsOneRequestPerKey(maxFollowers: Int?, perKey: Int) throws {
        let late = RefusingPort()
        let coalesce = maxFollowers.map { "coalesce: { max_followers: \($0) }" } ?? "coalesce: true"
        let h = try ProxyHarness(
            Self.config(
                late.port, route: coalesce, timeout: "20s",
                defaults: "{ reachability: { park_for: 15s }, health_check: { interval: 100ms, timeout: 200ms } }"),
            workers: 1)
        defer { h.stop() }
        var clients: [(TestConnection, Int)] = []
        for i in 0..<200 { clients.append((try Self.send(h.port, 1, target: "/r/\(i % 5)")[0], i % 5)) }
        #expect(waitUntil("the leaders parked") { try AdminProbe(port: h.adminPort).parked() == 5 * perKey })
        let up = ScriptedUpstream(comingUpOn: late) { head in
            let target = head.split(separator: " ").dropFirst().first.map(String.init) ?? ""
            return http(200, "answer for \(target)")
        }.started()
        h.scripted.append(up)
        for (c, key) in clients {
            let r = try c.readResponse()
            #expect(r.status == 200 && r.text == "answer for /r/\(key)", "\(r.status) \(r.text)")
        }
        let targets = up.appRequests.map { $0.head.split(separator: " ")[1] }
        #expect(targets.count == 5 * perKey, "\(targets)")
        #expect(Set(targets).count == 5)
    }

    /// HTTP/2 streams and HTTP/1.1 requests for the same resource read the same key.
    @Test func http2AndHTTP1ClientsShareOneTry() throws {
        let up = ScriptedUpstream(response: "DELAY:2000\n" + http(200, "the catalog")).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let script = """
            import asyncio, sys, httpx
            async def main():
                async with httpx.AsyncClient(http1=False, http2=True, timeout=20) as c:
                    rs = await asyncio.gather(*[c.get(sys.argv[1], headers={"host": "shop.example"}) for _ in range(100)])
                    for r in rs: print(r.http_version, r.status_code, r.text)
            asyncio.run(main())
            """
        let result = Locked<(status: Int32, out: String, err: String)?>(nil)
        let done = Locked(false)
        let python = try PythonH2.python()
        let url = "http://127.0.0.1:\(h.port)/items/1"
        Thread.detachNewThread {
            let r = try? runProcess(python, ["-c", script, url], timeout: 60)
            result.withLock { $0 = r }
            done.withLock { $0 = true }
        }
        #expect(waitUntil("the HTTP/2 client's first request reached the upstream") { Self.tries(up).count >= 1 })
        let answers = try Self.send(h.port, 100).map { try $0.readResponse() }
        #expect(waitUntil("the HTTP/2 client is done", timeout: 30) { done.withLock { $0 } })
        let out = result.withLock { $0 }
        let lines = out?.out.split(separator: "\n") ?? []
        #expect(lines.count == 100 && lines.allSatisfy { $0 == "HTTP/2 200 the catalog" }, "\(out?.err ?? "no output")")
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "the catalog" })
        #expect(Self.tries(up).count == 1, "\(Self.tries(up).count) upstream requests")
        // httpx opens each stream's window as it opens it: no flood (docs/http2.md).
        let m = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(!m.contains("happypath_http2_goaways_total{side=\"sent\""))
    }

    /// `no-store`: the followers are released to their own tries, and the
    /// key goes alone at once for a while; `Set-Cookie` releases them too.
    @Test(arguments: ["Cache-Control: no-store", "Set-Cookie: session=leader"])
    func anAnswerNotToShareReleasesTheFollowers(field: String) throws {
        let up = ScriptedUpstream(response: "DELAY:500\n" + http(200, "mine", headers: [field])).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let answers = try Self.send(h.port, 20).map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "mine" })
        #expect(Self.tries(up).count == 20, "each went on its own try")
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        let reason = field.hasPrefix("Set-Cookie") ? "set_cookie" : "no_store"
        #expect(metrics.contains("happypath_coalesce_alone_total{route=\"/\",reason=\"\(reason)\"} 19"), "\(metrics)")
        #expect(!metrics.contains("happypath_coalesced_requests_total{route=\"/\"}"))
        if reason == "no_store" {
            // The next wave goes alone at once: no follower waits for a head.
            let second = try Self.send(h.port, 10).map { try $0.readResponse() }
            #expect(second.allSatisfy { $0.status == 200 })
            #expect(Self.tries(up).count == 30)
            let again = try HTTP.request(port: h.adminPort, "/metrics").text
            #expect(again.contains("happypath_coalesce_alone_total{route=\"/\",reason=\"no_store\"} 29"), "\(again)")
        }
    }

    /// A client that never reads: cut once it is too far behind the others,
    /// who get every byte of the answer from one upstream request.
    @Test func aClientThatNeverReadsIsCutAndTheOthersGetEveryByte() throws {
        let body = String(repeating: "0123456789abcdef", count: (4 << 20) / 16)  // 4 MiB
        // Of unknown length (to the close): a length above read_ahead would not be shared at all.
        let up = ScriptedUpstream(response: "DELAY:500\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body).started()
        let h = try ProxyHarness(
            Self.config(up.port) + "\nlimits: { read_ahead: 256KiB, connection_buffer: 64KiB }", workers: 1)
        defer { h.stop(); up.stop() }
        let stalled = try TestConnection(port: h.port, timeout: 15, receiveBuffer: 4096)
        try stalled.send("GET /items/1 HTTP/1.1\r\nHost: shop.example\r\n\r\n")
        let readers = try Self.send(h.port, 5)
        for (i, c) in readers.enumerated() {
            let r = try c.readResponse()
            #expect(r.status == 200 && r.body.count == body.utf8.count, "reader \(i) got \(r.body.count) bytes")
        }
        #expect(Self.tries(up).count == 1)
        #expect(
            waitUntil("the reader that never reads is cut") {
                try HTTP.request(port: h.adminPort, "/metrics").text.contains("happypath_coalesce_cut_total{route=\"/\"} 1")
            })
        #expect(stalled.bytesUntilClosed() != nil, "its connection is closed, its answer cut short")
    }

    /// The leader's first try hangs; its hedge answers, for everyone.
    @Test func aLeadersHedgeServesItsFollowers() throws {
        let slow = ScriptedUpstream(response: "HOLD").started()
        let fast = ScriptedUpstream(response: "DELAY:300\n" + http(200, "from the hedge")).started()
        let h = try ProxyHarness(
            Self.config(
                slow.port, route: "coalesce: true\n    hedge: { after: 100ms }",
                defaults: "{ reachability: { park_for: 0s }, retry: { attempts: 3, budget: { ratio: 1 } } }",
                endpoints: [fast.port]), workers: 1)
        defer { h.stop(); slow.stop(); fast.stop() }
        let answers = try Self.send(h.port, 50).map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "from the hedge" })
        #expect(slow.appRequests.count + fast.appRequests.count == 2, "\(slow.appRequests.count) + \(fast.appRequests.count)")
    }

    /// The retries are spent on 503s: every member gets the kept answer,
    /// each from its own lookup, and the upstream sees `attempts` tries, not
    /// 50 × `attempts`.
    @Test func serveStaleAppliesToTheWholeGroup() throws {
        let up = ScriptedUpstream(responses: [http(200, "kept", headers: ["Cache-Control: max-age=60"]), "DELAY:500\n" + http(503)]).started()
        let h = try ProxyHarness(
            Self.config(
                up.port, route: "coalesce: true\n    fallback: { serve_stale: 10m }",
                defaults: "{ reachability: { park_for: 0s }, retry: { attempts: 2, backoff: { base: 10ms, max: 10ms } } }"),
            workers: 1)
        defer { h.stop(); up.stop() }
        #expect(try Self.send(h.port, 1)[0].readResponse().text == "kept")
        FallbackTests.settled(h)
        let answers = try Self.send(h.port, 50).map { try $0.readResponse() }
        for r in answers {
            #expect(r.status == 200 && r.text == "kept" && r.header("X-Happypath-Fallback") == "stale; reason=5xx", "\(r.text)")
        }
        #expect(Set(answers.compactMap { $0.header("X-Request-Id") }).count == 50)
        #expect(Self.tries(up).count == 1 + 2, "\(Self.tries(up).count) upstream requests")
    }

    /// Four workers: at most one try per key on each.
    @Test func fourWorkersMakeAtMostFourRequests() throws {
        let up = ScriptedUpstream(response: "DELAY:1000\n" + http(200, "the catalog")).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 4)
        defer { h.stop(); up.stop() }
        let answers = try Self.send(h.port, 200).map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "the catalog" })
        #expect((1...4).contains(Self.tries(up).count), "\(Self.tries(up).count) upstream requests")
    }

    /// HEAD and GET are groups of their own; a HEAD's followers get its head, no body.
    @Test func headRequestsShareAmongThemselves() throws {
        let up = ScriptedUpstream(answering: { head in
            "DELAY:500\n" + (head.hasPrefix("HEAD") ? "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n" : http(200, "the catalog"))
        }).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let heads = try (0..<10).map { _ -> TestConnection in
            let c = try TestConnection(port: h.port, timeout: 15)
            try c.send("HEAD /items/1 HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            return c
        }
        let gets = try Self.send(h.port, 10)
        for c in heads {
            let r = try c.readResponse(forHead: true)
            #expect(r.status == 200 && r.header("Content-Length") == "11" && r.body.isEmpty)
        }
        #expect(try gets.map { try $0.readResponse() }.allSatisfy { $0.text == "the catalog" })
        #expect(Self.tries(up).count == 2)
    }

    /// The leader's client leaves in the middle of a slow answer: the try
    /// goes on, and the followers get every byte.
    @Test func aLeaderWhoseClientLeavesMidAnswerDisturbsNobody() throws {
        let body = String(repeating: "x", count: 2 << 20)
        let up = ScriptedUpstream(response: "DELAY:500\n" + http(200, body)).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let leader = try TestConnection(port: h.port, timeout: 15, receiveBuffer: 4096)
        try leader.send("GET /items/1 HTTP/1.1\r\nHost: shop.example\r\n\r\n")
        #expect(waitUntil("the leader's try reached the upstream") { Self.tries(up).count == 1 })
        let followers = try Self.send(h.port, 10)
        // The leader reads a little of the answer, then hangs up.
        var first = [UInt8](repeating: 0, count: 1024)
        _ = recv(leader.fd, &first, first.count, 0)
        shutdown(leader.fd, Int32(SHUT_RDWR))
        for c in followers {
            let r = try c.readResponse()
            #expect(r.status == 200 && r.body.count == body.utf8.count)
        }
        #expect(Self.tries(up).count == 1)
    }
}

extension CoalescingTests {
    /// A held error answer that sets a cookie (a load balancer's session)
    /// is not every follower's: each goes on its own try.
    @Test func aHeldErrorThatSetsACookieIsNotShared() throws {
        let up = ScriptedUpstream(response: "DELAY:500\n" + http(403, "no", headers: ["Set-Cookie: lb=one-client"])).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let answers = try Self.send(h.port, 20).map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 403 })
        #expect(Self.tries(up).count == 20, "\(Self.tries(up).count) upstream requests")
    }

    /// A held error answer without one is everyone's: one try.
    @Test func aHeldErrorIsSharedAsEachFollowersOwnProblem() throws {
        let up = ScriptedUpstream(response: "DELAY:500\n" + http(404, "gone")).started()
        let h = try ProxyHarness(Self.config(up.port), workers: 1)
        defer { h.stop(); up.stop() }
        let answers = try Self.send(h.port, 20).map { try $0.readResponse() }
        #expect(answers.allSatisfy { $0.status == 404 && ($0.json["code"] as? String) == "NOT_FOUND" })
        let ids = answers.map { $0.json["request_id"] as? String }
        #expect(Set(ids.compactMap { $0 }).count == 20)
        #expect(zip(answers, ids).allSatisfy { $0.header("X-Request-Id") == $1 }, "each problem names its own request")
        #expect(answers.allSatisfy { $0.header("X-Happypath-Attempts") == "1" })
        #expect(Self.tries(up).count == 1)
    }

    /// Clients from ten addresses, each with its own rate-limit bucket:
    /// each answer carries its own RateLimit fields, once.
    @Test func eachFollowerGetsItsOwnRateLimitFieldsOnly() throws {
        let up = ScriptedUpstream(response: "DELAY:500\n" + http(200, "the catalog")).started()
        let h = try ProxyHarness(
            Self.config(up.port, route: "coalesce: true\n    rate_limit: { rate: 100/s, burst: 100 }"), workers: 1)
        defer { h.stop(); up.stop() }
        let clients = try (1...10).map { i -> TestConnection in
            let c = try TestConnection(port: h.port, timeout: 15, source: "127.0.0.\(i)")
            try c.send("GET /items/1 HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            return c
        }
        for c in clients {
            let r = try c.readResponse()
            #expect(r.status == 200 && r.text == "the catalog")
            #expect(r.headers.filter { $0.name.lowercased() == "ratelimit" }.count == 1, "\(r.headers)")
            #expect(r.headers.filter { $0.name.lowercased() == "ratelimit-policy" }.count == 1)
        }
        #expect(Self.tries(up).count == 1)
    }
}

extension CoalescingTests {
    /// Each follower writes its own line, naming its leader; the leader's
    /// line counts its followers.
    @Test func eachFollowerLogsItsOwnLineNamingItsLeader() throws {
        let capture = AccessLogTests.Capture()
        let up = ScriptedUpstream(response: "DELAY:500\n" + http(200, "the catalog")).started()
        let h = try ProxyHarness(
            Self.config(up.port), workers: 1, accessLog: AccessLogSettings(level: .info, format: .json, sink: capture.sink))
        defer { h.stop(); up.stop() }
        let answers = try Self.send(h.port, 10).map { try $0.readResponse() }
        #expect(waitUntil("ten lines") { capture.lines.count == 10 })
        let lines = capture.lines.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        let leader = lines.filter { $0["followers"] as? Int == 9 }
        #expect(leader.count == 1 && leader[0]["attempts"] as? Int == 1 && leader[0]["coalesced"] == nil)
        let leaderID = leader.first?["request_id"] as? String
        let followers = lines.filter { $0["coalesced"] != nil }
        #expect(followers.count == 9)
        #expect(followers.allSatisfy { $0["coalesced"] as? String == leaderID && $0["attempts"] as? Int == 0 }, "\(capture.lines)")
        #expect(followers.allSatisfy { $0["status"] as? Int == 200 && $0["bytes"] as? Int == 11 })
        #expect(Set(lines.compactMap { $0["request_id"] as? String }) == Set(answers.compactMap { $0.header("X-Request-Id") }))
    }
}

extension CoalescingTests {
    /// The proxy stops while a group waits, and while another streams to a
    /// member that never reads: every member's connection ends, and nothing
    /// of the groups outlives the proxy (the AddressSanitizer pass checks
    /// for leaks at exit).
    @Test func aStopWithGroupsInFlightEndsEveryMember() throws {
        let body = String(repeating: "y", count: 4 << 20)
        let up = ScriptedUpstream(answering: { head in
            head.contains("/slow") ? "DELAY:10000\n" + http(200, "late") : "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
        }).started()
        let h = try ProxyHarness(Self.config(up.port, timeout: "30s"), workers: 1)
        defer { up.stop() }
        let waiting = try Self.send(h.port, 5, target: "/slow")
        let stalled = try (0..<3).map { _ -> TestConnection in
            let c = try TestConnection(port: h.port, timeout: 15, receiveBuffer: 4096)
            try c.send("GET /big HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            return c
        }
        #expect(waitUntil("both tries reached the upstream") { Self.tries(up).count == 2 })
        h.stop()
        for c in waiting + stalled { #expect(c.bytesUntilClosed() != nil, "the connection ended") }
    }
}
