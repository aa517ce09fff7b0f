import Foundation
import HappyPathCore
import HappyPathDemo
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 19, part 1: rate limits per route, through the real proxy on
/// loopback. Rates are chosen so that no token comes back during a test
/// (`1/m`), which makes the counts exact, or so that the queue's spacing
/// is the thing measured.
@Suite("rate limits") struct RateLimitTests {
    static func config(upstream: Int, limit: String, top: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        \(top)
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          u: { endpoints: [http://127.0.0.1:\(upstream)] }
        routes:
          - match: { path_prefix: /limited/ }
            upstream: u
            timeout: 10s
            rate_limit: \(limit)
          - match: { path_prefix: / }
            upstream: u
        """
    }

    /// `n` requests at once, each on its own connection; their answers in no particular order.
    static func concurrent(_ n: Int, port: Int, _ target: String, headers: [(String, String)] = []) -> [TestResponse?] {
        // Threads of their own: a dispatch pool would run only as many as there are cores.
        let results = Locked<[TestResponse?]>(Array(repeating: nil, count: n))
        let group = DispatchGroup()
        for i in 0..<n {
            group.enter()
            Thread {
                let r = try? HTTP.request(port: port, target, headers: headers, timeout: 15)
                results.withLock { $0[i] = r }
                group.leave()
            }.start()
        }
        group.wait()
        return results.withLock { $0 }
    }

    @Test func aRejectRoutePassesItsBurstAndRefusesTheRestWithWhenToComeBack() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port, limit: "{ rate: 1/m, burst: 3, key: route }"))
        defer { h.stop(); upstream.stop() }
        var passed: [TestResponse] = []
        var refused: [TestResponse] = []
        for _ in 0..<10 {
            let r = try HTTP.request(port: h.port, "/limited/x")
            if r.status == 200 { passed.append(r) } else { refused.append(r) }
        }
        #expect(passed.count == 3)
        // What is left, and when the bucket is full again (one token a minute).
        #expect(
            passed.map { $0.header("RateLimit") ?? "" } == [
                "\"default\";r=2;t=60", "\"default\";r=1;t=120", "\"default\";r=0;t=180",
            ])
        #expect(passed.allSatisfy { $0.header("RateLimit-Policy") == "\"default\";q=1;w=60" })
        #expect(refused.count == 7)
        for r in refused {
            #expect(r.status == 429)
            #expect(r.json["code"] as? String == "RATE_LIMITED")
            #expect(r.json["retryable"] as? Bool == true)
            let retryAfter = Int(r.header("Retry-After") ?? "") ?? 0
            #expect((59...60).contains(retryAfter), "Retry-After \(retryAfter)")
            #expect(r.header("RateLimit")?.hasPrefix("\"default\";r=0;") == true)
        }
        #expect(upstream.appRequests.count == 3)
        // The unlimited route is not counted.
        #expect(try HTTP.request(port: h.port, "/other").status == 200)
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(metrics.contains("happypath_rate_limited_total{route=\"/limited/\",outcome=\"rejected\"} 7"), "\(metrics)")
        #expect(metrics.contains("# HELP happypath_rate_limited_total"))
        let state = try HTTP.request(port: h.adminPort, "/admin/state").text
        #expect(state.contains("\"rate_limits\":[{\"route\":\"/limited/\",\"keys\":1,\"queued\":0}]"), "\(state)")
    }

    @Test func eachKeyHasItsOwnBucketAndAMissingHeaderFallsBackToTheAddress() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port, limit: "{ rate: 1/m, burst: 1, key: \"header:X-Api-Key\" }"))
        defer { h.stop(); upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: [("X-Api-Key", "alice")]).status == 200)
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: [("X-Api-Key", "alice")]).status == 429)
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: [("X-Api-Key", "bob")]).status == 200)
        #expect(try HTTP.request(port: h.port, "/limited/a").status == 200)
        #expect(try HTTP.request(port: h.port, "/limited/a").status == 429)
    }

    /// Without trusted_proxies a client's own X-Forwarded-For changes
    /// nothing: it cannot step out of its bucket by naming another address.
    @Test func aSpoofedForwardedForDoesNotEscapeTheLimit() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port, limit: "{ rate: 1/m, burst: 1 }"))
        defer { h.stop(); upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/limited/a").status == 200)
        for fake in ["1.2.3.4", "5.6.7.8, 9.9.9.9", "unknown"] {
            #expect(try HTTP.request(port: h.port, "/limited/a", headers: [("X-Forwarded-For", fake)]).status == 429)
        }
    }

    /// Behind a trusted proxy, the rightmost hop it did not add is the client.
    @Test func behindATrustedProxyTheForwardedClientIsTheKey() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(
            Self.config(upstream: upstream.port, limit: "{ rate: 1/m, burst: 1 }", top: "trusted_proxies: [127.0.0.0/8]"))
        defer { h.stop(); upstream.stop() }
        let first = [("X-Forwarded-For", "203.0.113.1")]
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: first).status == 200)
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: first).status == 429)
        // The same client claiming to be another one, in front of the trusted hop: still itself.
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: [("X-Forwarded-For", "6.6.6.6, 203.0.113.1")]).status == 429)
        #expect(try HTTP.request(port: h.port, "/limited/a", headers: [("X-Forwarded-For", "203.0.113.2")]).status == 200)
    }

    /// `queue`: every request is answered 200, the upstream sees them spaced
    /// by the rate, never faster.
    @Test func aQueueRouteSpacesRequestsInsteadOfRefusingThem() throws {
        let arrivals = Locked<[Date]>([])
        let upstream = ScriptedUpstream(comingUpOnFreshPort: { _ in
            arrivals.withLock { $0.append(Date()) }
            return http(200, "ok")
        }).started()
        let h = try ProxyHarness(
            Self.config(upstream: upstream.port, limit: "{ rate: 20/s, burst: 1, key: route, over_limit: queue, max_wait: 5s }"))
        defer { h.stop(); upstream.stop() }
        let answers = Self.concurrent(10, port: h.port, "/limited/q")
        #expect(answers.allSatisfy { $0?.status == 200 }, "\(answers.map { $0?.status })")
        let times = arrivals.withLock { $0 }.sorted()
        #expect(times.count == 10)
        // Ten requests at 20/s with a burst of 1: at least 9 × 50 ms from first to last.
        if let first = times.first, let last = times.last { #expect(last.timeIntervalSince(first) >= 0.4) }
        // How many waited depends on how the ten arrived (a slow machine may
        // spread them over more than a token's time); each one that waited
        // is counted once, in the counter and in the histogram.
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        func value(_ series: String) -> Int? {
            metrics.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Int(Double($0.split(separator: " ").last!) ?? -1) }
        }
        let queued = value("happypath_rate_limited_total{route=\"/limited/\",outcome=\"queued\"}")
        #expect((1...9).contains(queued ?? 0), "\(metrics)")
        #expect(value("happypath_rate_limit_queue_wait_seconds_count{route=\"/limited/\"}") == queued)
        #expect(metrics.contains("happypath_rate_limit_queue_depth{route=\"/limited/\"} 0"))
    }

    /// Past `max_queue` (or `max_wait`) a queue route refuses like a reject
    /// route. (A token a second: the two that wait are still waiting when
    /// the other three arrive, however slowly the six are started.)
    @Test func aFullQueueRefuses() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(
            Self.config(
                upstream: upstream.port,
                limit: "{ rate: 1/s, burst: 1, key: route, over_limit: queue, max_wait: 5s, max_queue: 2 }"))
        defer { h.stop(); upstream.stop() }
        let answers = Self.concurrent(6, port: h.port, "/limited/q").compactMap { $0?.status }.sorted()
        #expect(answers == [200, 200, 200, 429, 429, 429])
    }

    /// Issue 30: a `header:` key is the client's to choose, up to
    /// `limits.max_header_bytes`. Kept whole, 6,000 distinct 32 KiB API keys
    /// took about 210 MB; a long key is kept as its digest, so 2,000 of
    /// them (64 MB of keys) leave the proxy's resident memory nearly where
    /// it was, and each still has a bucket of its own.
    @Test func manyDistinctLongKeysKeepTheKeyStorageBounded() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                workers: 1
                admin: { listen: 127.0.0.1:0 }
                upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
                routes:
                  - match: { path_prefix: / }
                    upstream: demo
                    rate_limit: { rate: 1/m, burst: 1, key: "header:X-Api-Key" }
                """, logLevel: nil)
        let port = try #require(serve.listeningPort())
        let admin = AdminProbe(port: try #require(serve.adminPort()))
        let filler = String(repeating: "k", count: 32 * 1024 - 16)
        let client = try TestConnection(port: port)
        /// `count` requests with keys `first...`, one connection kept alive; their statuses.
        func send(keys first: Int, count: Int) throws -> [Int] {
            var statuses: [Int] = []
            for i in first..<(first + count) {
                try client.send("GET /ok HTTP/1.1\r\nHost: x\r\nX-Api-Key: \(i)-\(filler)\r\n\r\n")
                statuses.append(try client.readResponse().status)
            }
            return statuses
        }
        func keys() throws -> Int {
            let limits = try admin.state()["rate_limits"] as? [[String: Any]] ?? []
            return limits.first?["keys"] as? Int ?? -1
        }
        func residentBytes() -> Int {
            let status = readSmallFile("/proc/\(serve.pid)/status") ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
        }
        // Warm up (the connection's buffers, the allocator's arenas), then measure.
        #expect(try send(keys: 0, count: 200).allSatisfy { $0 == 200 })
        #expect(try keys() == 200)
        let before = residentBytes()
        #expect(try send(keys: 200, count: 2000).allSatisfy { $0 == 200 }, "each new key has a full bucket")
        #expect(try keys() == 2200)
        let grown = residentBytes() - before
        // Not exact (the allocator keeps what it likes): kept whole, the
        // 2,000 keys alone are 64 MiB; kept as digests, a few hundred KiB.
        #expect(grown < 16 * 1024 * 1024, "resident memory grew by \(grown / 1024) KiB")
        // A long key maps to the same bucket every time: its one token is spent.
        #expect(try send(keys: 1234, count: 1) == [429])
        #expect(try send(keys: 0, count: 1) == [429])
    }

    /// A client that goes away while queued leaves the queue at once: it is
    /// never sent, and its token goes to the next in line.
    @Test func aClientThatLeavesTheQueueIsNeverSent() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let h = try ProxyHarness(
            Self.config(upstream: upstream.port, limit: "{ rate: 12/m, burst: 1, key: route, over_limit: queue, max_wait: 8s }"))
        defer { h.stop(); upstream.stop() }
        #expect(try HTTP.request(port: h.port, "/limited/first").status == 200)
        do {
            let c = try TestConnection(port: h.port)
            try c.send("GET /limited/leaves HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(eventually { (try? HTTP.request(port: h.adminPort, "/admin/state").text.contains("\"queued\":1")) == true })
        }  // the connection closes here
        #expect(eventually { (try? HTTP.request(port: h.adminPort, "/admin/state").text.contains("\"queued\":0")) == true })
        #expect(upstream.appRequests.count == 1)
    }

    /// SIGTERM while a client waits in a queue longer than the drain: when
    /// `drain_timeout` ends it gets its 503 (the proxy is shutting down),
    /// like every other request still in flight, not a closed connection.
    @Test func aRequestQueuedWhenTheDrainEndsGetsItsServiceUnavailable() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        defer { upstream.stop() }
        let serve = try ServeProcess(
            config: Self.config(
                upstream: upstream.port, limit: "{ rate: 12/m, burst: 1, key: route, over_limit: queue, max_wait: 8s }",
                top: "drain_timeout: 200ms"),
            logLevel: "info")
        guard let port = serve.listeningPort(), let adminPort = serve.adminPort() else { return }
        #expect(try HTTP.request(port: port, "/limited/first").status == 200)
        let waiting = try TestConnection(port: port)
        try waiting.send("GET /limited/waits HTTP/1.1\r\nHost: x\r\n\r\n")
        guard
            waitUntil("the request waits in the queue", {
                try HTTP.request(port: adminPort, "/admin/state").text.contains("\"queued\":1")
            })
        else { return }
        serve.signal(SIGTERM)
        let answer = try waiting.readResponse()
        #expect(answer.status == 503)
        #expect(answer.json["code"] as? String == "UPSTREAM_UNAVAILABLE")
        #expect(answer.json["detail"] as? String == "The proxy is shutting down; try again.")
        #expect(answer.header("Retry-After") == "1")
        #expect(serve.waitForExit())
        #expect(serve.process.terminationStatus == 0)
        #expect(upstream.appRequests.count == 1, "the queued request was never sent")
    }
}
