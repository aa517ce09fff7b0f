import Foundation
import HappyPathDemo
import HappyPathServer
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Retry, breaker, parking and replay against real upstreams on loopback.
@Suite("resilience") struct ResilienceTests {
    @Test func twoServerErrorsThenSuccessGivesTheClient200() throws {
        let (h, up) = try ProxyHarness.scripted([http(503, "a"), http(503, "b"), http(200, "finally")])
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status == 200)
        #expect(r.text == "finally")
        #expect(r.header("X-Happypath-Attempts") == "3")
        #expect(up.appRequests.count == 3)
    }

    @Test func exhaustedRetriesGiveUpstreamUnavailableWithRetryAfter() throws {
        let (h, up) = try ProxyHarness.scripted([http(503, "{}", headers: ["Retry-After: 0"])])
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status == 503)
        #expect(r.json["code"] as? String == "UPSTREAM_UNAVAILABLE")
        #expect(r.json["detail"] as? String == "3 attempts failed: 503, 503, 503")
        #expect(r.json["attempts"] as? Int == 3)
        #expect(r.json["retry_after_s"] as? Int == 0)
        #expect(r.header("Retry-After") == "0")
        #expect(up.appRequests.count == 3)
    }

    @Test func postWithoutIdempotencyKeyIsNotRetried() throws {
        let (h, up) = try ProxyHarness.scripted([http(503), http(200, "ok")])
        let r = try HTTP.request(port: h.port, "POST", "/orders", body: Array("pay once".utf8))
        #expect(r.status == 503)
        #expect(r.json["code"] as? String == "UPSTREAM_UNAVAILABLE")
        #expect(r.json["attempts"] as? Int == 1)
        #expect(up.appRequests.count == 1)
    }

    @Test func postWithIdempotencyKeyIsRetriedWithTheSameBody() throws {
        let (h, up) = try ProxyHarness.scripted([http(503), http(201, "created")])
        let body = randomBytes(100_000)
        let r = try HTTP.request(port: h.port, "POST", "/orders", headers: [("Idempotency-Key", "k-1")], body: body)
        #expect(r.status == 201)
        let seen = up.appRequests
        #expect(seen.count == 2)
        #expect(seen.allSatisfy { $0.body == body })
    }

    /// A dropped connection, or a head cut short after its status line:
    /// nothing reached the client yet, so either is an ordinary failed try.
    @Test(arguments: ["DROP", "HTTP/1.1 200 OK\r\nX-Partial: "])
    func aFirstTryThatBreaksBeforeItsHeadEndsIsRetried(firstAnswer: String) throws {
        let (h, _) = try ProxyHarness.scripted([firstAnswer, http(200, "second")])
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status == 200)
        #expect(r.text == "second")
        #expect(r.header("X-Happypath-Attempts") == "2")
    }

    @Test func slowFirstTryIsCutByPerTryTimeout() throws {
        let (h, _) = try ProxyHarness.scripted(
            ["DELAY:1500\n" + http(200, "slow"), http(200, "fast")],
            defaults: "{ retry: { per_try_timeout: 200ms }, reachability: { park_for: 0s } }")
        let started = ContinuousClock.now
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status == 200)
        #expect(r.text == "fast")
        // A bound on time, so not exact: uncut, the first try alone takes
        // 1.5 s; cut, about 0.2 s plus the second try. 1.4 leaves a loaded
        // machine room without letting an uncut try pass.
        #expect(seconds(since: started) < 1.4, "the 1.5s first try must have been cut")
    }

    @Test func retryAfterDelaysTheNextTry() throws {
        let (h, _) = try ProxyHarness.scripted([http(503, headers: ["Retry-After: 1"]), http(200, "ok")])
        let started = ContinuousClock.now
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status == 200)
        // A bound on time: Retry-After: 1 holds the second try back 1 s, less
        // 50 ms of slack (libevent arms a timer from its loop's cached time,
        // which may lag a little); nothing bounds it from above but the
        // machine's load.
        #expect(seconds(since: started) >= 0.95)
    }

    @Test func deadlineGivesUpstreamTimeoutOnTime() throws {
        let (h, _) = try ProxyHarness.scripted(["DELAY:3000\n" + http(200)], routeTimeout: "400ms")
        let started = ContinuousClock.now
        let r = try HTTP.request(port: h.port, "/x")
        let elapsed = seconds(since: started)
        #expect(r.json["code"] as? String == "UPSTREAM_TIMEOUT")
        // Bounds on time around the 400 ms deadline: not before it (less
        // 50 ms of slack: libevent arms a timer from its loop's cached time),
        // and long before the 3 s answer (with room for a loaded machine).
        #expect(elapsed >= 0.35)
        #expect(elapsed < 1.5)
    }

    @Test func openBreakerKeepsRequestsAwayFromTheUpstream() throws {
        let (h, up) = try ProxyHarness.scripted(
            [http(500)],
            defaults: """
                { retry: { on: [500], attempts: 1 }, circuit_breaker: { consecutive_failures: 2, open_for: 1s, while_open: fail }, reachability: { park_for: 0s } }
                """)
        for _ in 0..<2 { #expect(try HTTP.request(port: h.port, "/x").status == 503) }
        let before = up.appRequests.count
        #expect(before == 2)
        for _ in 0..<5 {
            let r = try HTTP.request(port: h.port, "/x")
            #expect(r.json["code"] as? String == "CIRCUIT_OPEN")
            #expect(r.header("Retry-After") == "1")
        }
        #expect(up.appRequests.count == before)
        // open_for (1 s) is over by the proxy's own clock.
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("open_for to run out") {
            let breaker = try admin.upstream("u")["circuit_breaker"] as? [String: Any]
            return breaker?["state"] as? String == "open" && (breaker?["open_for_s"] as? Double).map { $0 <= 0 } == true
        }
        _ = try HTTP.request(port: h.port, "/x")  // the half-open probe
        #expect(up.appRequests.count == before + 1)
    }

    @Test func whileOpenParkHoldsCommandsAndReplaysThemAfterTheProbe() throws {
        let (h, up) = try ProxyHarness.scripted(
            [http(500), http(500), http(200, "back")],
            defaults: """
                { retry: { on: [500], attempts: 1 }, circuit_breaker: { consecutive_failures: 2, open_for: 500ms, while_open: park }, reachability: { park_for: 5s } }
                """)
        for _ in 0..<2 { #expect(try HTTP.request(port: h.port, "/x").status == 503) }
        let clients = try (0..<5).map { _ in try TestConnection(port: h.port) }
        for c in clients { try c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n") }
        var ok = 0
        for c in clients where try c.readResponse().text == "back" { ok += 1 }
        #expect(ok == 5)
        #expect(up.appRequests.count == 7)  // nothing reached it while open; one probe, then four replays
    }

    @Test func parkedRequestsAreReplayedWhenTheUpstreamComesUp() throws {
        let late = RefusingPort()
        let port = late.port
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults:
              timeout: 8s
              reachability: { park_for: 6s }
              health_check: { interval: 100ms, timeout: 200ms }
            upstreams:
              late: { endpoints: [http://127.0.0.1:\(port)] }
            routes:
              - { match: { path_prefix: / }, upstream: late }
            """)
        let clients = try (0..<10).map { i -> TestConnection in
            let c = try TestConnection(port: h.port, timeout: 10)
            try c.send("GET /echo?i=\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            return c
        }
        waitUntil("all ten requests parked") { try AdminProbe(port: h.adminPort).parked() == 10 }
        // The upstream comes up on the very port that refused until now; it
        // echoes each request's target, as the demo's /echo does.
        let up = ScriptedUpstream(comingUpOn: late) { head in
            let target = head.split(separator: " ").dropFirst().first.map(String.init) ?? ""
            return http(200, #"{"target":"\#(target)"}"#, headers: ["Content-Type: application/json"])
        }.started()
        h.scripted.append(up)
        var ok = 0
        for (i, c) in clients.enumerated() {
            let r = try c.readResponse()
            if r.status == 200, r.json["target"] as? String == "/echo?i=\(i)" { ok += 1 }
        }
        #expect(ok == 10)
        #expect(up.appRequests.count == 10)
    }

    @Test func pastParkForTheClientGetsUpstreamUnreachable() throws {
        let down = RefusingPort()
        let h = try ProxyHarness(
            ProxyHarness.single(upstream: down.url, defaults: "{ reachability: { park_for: 300ms } }"), holding: [down])
        let started = ContinuousClock.now
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.json["code"] as? String == "UPSTREAM_UNREACHABLE")
        #expect(r.status == 503)
        // A bound on time: parked for the 300 ms of park_for before the
        // answer (less 50 ms of slack: libevent arms a timer from its loop's
        // cached time).
        #expect(seconds(since: started) >= 0.25)
    }

    @Test func oneInFourFailingStillAllSucceed() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults:
              timeout: 60s
              retry: { attempts: 12, honor_retry_after: false, backoff: { base: 1ms, max: 5ms }, budget: { ratio: 1.0, min_per_second: 1000 } }
              circuit_breaker: { consecutive_failures: 1000, minimum_requests: 100000 }
            upstreams: { demo: { endpoints: [{{DEMO}}] } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """)
        // The demo's 503 carries Retry-After: 1; honoring it would make a
        // request that fails five times in a row outlive a 10 s deadline on
        // a slow (sanitized) build. The backoff alone is what this tests.
        // Twelve tries: all failing has a chance of 200 × 0.25^12 ≈ 1e-5.
        let clients = try (0..<200).map { _ in try TestConnection(port: h.port, timeout: 60) }
        for c in clients { try c.send("GET /flaky?fail=0.25&status=503 HTTP/1.1\r\nHost: x\r\n\r\n") }
        var ok = 0
        var others: [String] = []
        for c in clients {
            let r = try c.readResponse()
            if r.status == 200 { ok += 1 } else { others.append("\(r.status) \(r.json["code"] ?? "") \(r.json["detail"] ?? "")") }
        }
        #expect(ok == 200, "not 200: \(others)")
    }

    @Test func retriesStopAtTheBudgetDuringAnOutage() throws {
        let (h, up) = try ProxyHarness.scripted(
            [http(503)],
            defaults: """
                { retry: { attempts: 3, backoff: { base: 1ms, max: 2ms }, budget: { ratio: 0.1, min_per_second: 0 } }, circuit_breaker: { consecutive_failures: 100000, minimum_requests: 100000 }, reachability: { park_for: 0s } }
                """)
        for _ in 0..<40 { _ = try HTTP.request(port: h.port, "/x") }
        let hits = up.appRequests.count
        // 40 first tries and 10% of them as retries (the budget), not 40 × 3.
        // One at a time, the budget (retries + 1 <= 0.1 × requests in its
        // 10 s window) allows a retry at the 10th, 20th, 30th and 40th
        // request, and never a second one for the same request: 44 exactly
        // (the 40 requests take well under the window).
        #expect(hits == 44)
        #expect(try AdminProbe(port: h.adminPort).metric("happypath_retries_total{upstream=\"u\"}") == 4)
    }
}

@Suite("limits and ejection") struct ConcurrencyAndEjectionTests {
    @Test func overTheConcurrencyLimitAndQueueTheClientGetsOverloaded() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams: { demo: { endpoints: [{{DEMO}}], max_connections: 1 } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """, workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        let clients = try (0..<3).map { _ in try TestConnection(port: h.port) }
        for (i, c) in clients.enumerated() {
            try c.send("GET /slow?ms=400 HTTP/1.1\r\nHost: x\r\n\r\n")
            // In this order: the first in flight, the second queued behind it.
            if i < 2 { waitUntil("request \(i + 1) in the proxy") { try admin.inFlight() == i + 1 } }
        }
        let statuses = try clients.map { try $0.readResponse() }
        #expect(statuses[0].status == 200)  // in flight
        #expect(statuses[1].status == 200)  // queued, then sent
        #expect(statuses[2].status == 503)
        #expect(statuses[2].json["code"] as? String == "OVERLOADED")
        #expect(statuses[2].header("Retry-After") == "1")
    }

    @Test func failingEndpointIsEjectedAndTheOtherServes() throws {
        let bad = ScriptedUpstream(responses: [http(500)]).started()
        let good = ScriptedUpstream(responses: [http(200, "good")]).started()
        defer {
            bad.stop()
            good.stop()
        }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults:
              retry: { on: [500], attempts: 2, backoff: { base: 1ms, max: 1ms }, budget: { ratio: 1.0, min_per_second: 100 } }
              circuit_breaker: { consecutive_failures: 1000, minimum_requests: 100000 }
            upstreams:
              pair: { endpoints: [http://127.0.0.1:\(bad.port), http://127.0.0.1:\(good.port)] }
            routes: [ { match: { path_prefix: / }, upstream: pair } ]
            """, workers: 1)
        var ok = 0
        for _ in 0..<40 where try HTTP.request(port: h.port, "/x").text == "good" { ok += 1 }
        #expect(ok == 40)
        // Without ejection about half of the 40 first tries would go to the bad endpoint.
        // One worker, so round robin is exact: requests 1, 3, 5, 7 and 9 try
        // the bad endpoint first (and its retry the good one); its fifth
        // failure in a row ejects it for 10 s, longer than the test.
        #expect(bad.appRequests.count == 5)
    }

    /// `outlier_detection` sets the threshold: two failed tries in a row
    /// eject the endpoint, for `base_ejection`.
    @Test func outlierDetectionEjectsAfterItsConsecutiveFailures() throws {
        let bad = ScriptedUpstream(responses: [http(500)]).started()
        let good = ScriptedUpstream(responses: [http(200, "good")]).started()
        defer {
            bad.stop()
            good.stop()
        }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults:
              retry: { on: [500], attempts: 2, backoff: { base: 1ms, max: 1ms }, budget: { ratio: 1.0, min_per_second: 100 } }
              circuit_breaker: { consecutive_failures: 1000, minimum_requests: 100000 }
            upstreams:
              pair:
                endpoints: [http://127.0.0.1:\(bad.port), http://127.0.0.1:\(good.port)]
                outlier_detection: { consecutive_failures: 2, base_ejection: 1m, max_ejected_percent: 50 }
            routes: [ { match: { path_prefix: / }, upstream: pair } ]
            """, workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        func ejected() throws -> [Bool] {
            (try admin.upstream("pair")["endpoints"] as? [[String: Any]] ?? []).map { $0["ejected"] as? Bool ?? false }
        }
        // One worker, so round robin is exact: request 1 tries the bad
        // endpoint first (its retry the good one), request 2 the good one,
        // request 3 the bad one again: its second failure in a row ejects it.
        for i in 1...2 {
            #expect(try HTTP.request(port: h.port, "/x").text == "good")
            #expect(try ejected() == [false, false], "after request \(i)")
        }
        #expect(try HTTP.request(port: h.port, "/x").text == "good")
        #expect(bad.appRequests.count == 2)
        #expect(try ejected() == [true, false])
        for _ in 0..<10 { #expect(try HTTP.request(port: h.port, "/x").text == "good") }
        #expect(bad.appRequests.count == 2)
    }
}

@Suite("parking lot") struct ParkingLotTests {
    func harness() throws -> ProxyHarness {
        let down = RefusingPort()
        return try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { max_parked: 1 }
            defaults: { reachability: { park_for: 600ms } }
            upstreams: { down: { endpoints: [\(down.url)] } }
            routes: [ { match: { path_prefix: / }, upstream: down } ]
            """, workers: 1, holding: [down])
    }

    @Test func overMaxParkedTheClientGetsOverloaded() throws {
        let h = try harness()
        let admin = AdminProbe(port: h.adminPort)
        let first = try TestConnection(port: h.port)
        try first.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        waitUntil("the first request parked") { try admin.parked() == 1 }
        let second = try HTTP.request(port: h.port, "/b")
        #expect(second.json["code"] as? String == "OVERLOADED")
        #expect(try first.readResponse().json["code"] as? String == "UPSTREAM_UNREACHABLE")
    }

    @Test func aClientThatHangsUpLeavesTheLot() throws {
        let h = try harness()
        let admin = AdminProbe(port: h.adminPort)
        do {
            let gone = try TestConnection(port: h.port)
            try gone.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            waitUntil("the request parked") { try admin.parked() == 1 }
        }  // closed while parked
        // It leaves the lot as a client that went away (not as one whose
        // park_for ran out, which would free the place too).
        waitUntil("the hung-up request to finish") {
            try admin.metric(#"happypath_requests_total{route="/",code="CLIENT_CLOSED"}"#) == 1
        }
        #expect(try admin.parked() == 0)
        #expect(try admin.metric(#"happypath_requests_total{route="/",code="UPSTREAM_UNREACHABLE"}"#) == 0)
        // Its place is free again: this one is parked (and times out), not refused.
        let r = try HTTP.request(port: h.port, "/b")
        #expect(r.json["code"] as? String == "UPSTREAM_UNREACHABLE")
    }
}
