import Foundation
import HappyPathCore
import Testing

/// Issue 20, part 1: hedged requests through the real proxy, against
/// scripted upstreams on loopback: one endpoint that never answers (or
/// answers late), one that answers at once.
@Suite("hedging") struct HedgingTests {
    /// One worker (the harness's `workers`, which wins over the file's), so
    /// the first request's first try goes to the first endpoint and round
    /// robin alternates from there.
    /// `budget` is added to `retry:`; by default one that lets every request
    /// be hedged (these tests send one or a few).
    static func config(_ endpoints: [Int], hedge: String = "{ after: 50ms }", budget: String = roomyBudget) -> String {
        """
        listen: 127.0.0.1:0
        workers: 1
        admin: { listen: 127.0.0.1:0 }
        defaults:
          reachability: { park_for: 0s }
          retry: { attempts: 3, per_try_timeout: 5s\(budget) }
        upstreams:
          u:
            endpoints: [\(endpoints.map { "http://127.0.0.1:\($0)" }.joined(separator: ", "))]
        routes:
          - match: { path_prefix: / }
            upstream: u
            timeout: 10s
            hedge: \(hedge)
        """
    }

    /// A budget that lets every request of these tests be hedged (a hedge
    /// spends from `ratio` only: docs/retry.md, "What it costs the upstream").
    static let roomyBudget = ", budget: { ratio: 1 }"

    /// Every GET is answered by the fast endpoint in well under the slow
    /// one's time; each try sent to the slow one is cancelled (its
    /// connection closed) once the hedge won, and counted as lost.
    @Test func aHedgeToTheOtherEndpointWinsAndTheSlowTryIsCancelled() throws {
        let slow = ScriptedUpstream(response: "HOLD").started()
        let fast = ScriptedUpstream(response: http(200, "fast")).started()
        let h = try ProxyHarness(Self.config([slow.port, fast.port]), workers: 1)
        defer { h.stop(); slow.stop(); fast.stop() }
        for i in 0..<4 {
            let start = ContinuousClock.now
            let r = try HTTP.request(port: h.port, "/item/\(i)", timeout: 10)
            #expect(r.status == 200)
            #expect(r.text == "fast")
            #expect(seconds(since: start) < 1.0)
        }
        // Round robin: the first try of requests 0 and 2 went to the slow
        // endpoint, and a hedge to the fast one answered them.
        #expect(slow.appRequests.count == 2)
        #expect(fast.appRequests.count == 4)
        #expect(eventually(5) { slow.held.withLock { $0 } == 2 })
        let admin = AdminProbe(port: h.adminPort)
        #expect(eventually(5) { (try? admin.metric("happypath_hedges_total{route=\"/\",outcome=\"won\"}")) == 2 })
        // A hedged answer says how many tries went out.
        slow.requests.withLock { $0.removeAll() }
        let r = try HTTP.request(port: h.port, "/item/again", timeout: 10)
        #expect(r.status == 200)
        #expect(r.header("X-Happypath-Attempts") == (slow.appRequests.count == 1 ? "2" : "1"))
    }

    /// A POST without an Idempotency-Key is never hedged: the upstream sees
    /// exactly one, however slow it is; with a key it may be.
    @Test func aPostWithoutAnIdempotencyKeyGoesOutOnce() throws {
        let slow = ScriptedUpstream(response: "DELAY:300\n" + http(201, "made")).started()
        let other = ScriptedUpstream(response: "DELAY:300\n" + http(201, "made")).started()
        let h = try ProxyHarness(Self.config([slow.port, other.port]), workers: 1)
        defer { h.stop(); slow.stop(); other.stop() }
        let r = try HTTP.request(port: h.port, "POST", "/orders", body: Array("{}".utf8), timeout: 10)
        #expect(r.status == 201)
        #expect(slow.appRequests.count + other.appRequests.count == 1)
        let keyed = try HTTP.request(
            port: h.port, "POST", "/orders", headers: [("Idempotency-Key", "k-1")], body: Array("{}".utf8), timeout: 10)
        #expect(keyed.status == 201)
        #expect(slow.appRequests.count + other.appRequests.count == 3)  // the keyed one was hedged
    }

    /// An empty `Idempotency-Key` (or one of blanks) is not a key: a POST
    /// with it reaches a slow upstream exactly once (never hedged), and an
    /// upstream's 503 to it is the client's answer (never retried).
    @Test(arguments: ["", " \t "]) func aPostWithAnEmptyIdempotencyKeyGoesOutOnce(key: String) throws {
        let slow = ScriptedUpstream(response: "DELAY:300\n" + http(201, "made")).started()
        let other = ScriptedUpstream(response: "DELAY:300\n" + http(201, "made")).started()
        let h = try ProxyHarness(Self.config([slow.port, other.port]), workers: 1)
        defer { h.stop(); slow.stop(); other.stop() }
        let r = try HTTP.request(
            port: h.port, "POST", "/orders", headers: [("Idempotency-Key", key)], body: Array("{}".utf8), timeout: 10)
        #expect(r.status == 201)
        #expect(r.header("X-Happypath-Attempts") == "1")
        #expect(slow.appRequests.count + other.appRequests.count == 1)

        let busy = ScriptedUpstream(response: http(503, "busy")).started()
        let busyToo = ScriptedUpstream(response: http(503, "busy")).started()
        let b = try ProxyHarness(Self.config([busy.port, busyToo.port]), workers: 1)
        defer { b.stop(); busy.stop(); busyToo.stop() }
        let refused = try HTTP.request(
            port: b.port, "POST", "/orders", headers: [("Idempotency-Key", key)], body: Array("{}".utf8), timeout: 10)
        #expect(refused.status == 503)
        #expect(refused.header("X-Happypath-Attempts") == "1")
        #expect(busy.appRequests.count + busyToo.appRequests.count == 1)
    }

    /// What hedging costs a slow upstream at a modest rate, with the default
    /// budget (ratio 0.2, min_per_second 10): half the answers take 300 ms,
    /// so half the requests are due a hedge (two, with max_extra 2), but
    /// hedges spend only the ratio, never the floor: the upstream receives
    /// at most N × (1 + 0.2) tries (docs/retry.md, "What it costs the
    /// upstream"; no try fails here, so no retry spends the floor). Without
    /// that it received every hedge (about 2× N).
    @Test func hedgesAddAtMostTheBudgetsRatioToASlowUpstream() throws {
        func halfSlow() -> ScriptedUpstream {
            let seen = Locked(0)
            return ScriptedUpstream(answering: { _ in
                let n = seen.withLock { count in
                    count += 1
                    return count
                }
                return (n % 2 == 1 ? "DELAY:300\n" : "") + http(200, "ok")
            }).started()
        }
        let a = halfSlow()
        let b = halfSlow()
        let h = try ProxyHarness(
            Self.config([a.port, b.port], hedge: "{ after: 50ms, max_extra: 2 }", budget: ""), workers: 1)
        defer { h.stop(); a.stop(); b.stop() }
        let n = 20
        // One client, back to back: 5 to 10 requests a second, all within the budget's 10 s window.
        let start = ContinuousClock.now
        for i in 0..<n { #expect(try HTTP.request(port: h.port, "/r/\(i)", timeout: 10).status == 200) }
        #expect(seconds(since: start) < 9)
        // Every hedge sent is counted (won or lost) once its try is over.
        let admin = AdminProbe(port: h.adminPort)
        func hedgesSent() -> Int {
            let won = (try? admin.metric("happypath_hedges_total{route=\"/\",outcome=\"won\"}")) ?? 0
            let lost = (try? admin.metric("happypath_hedges_total{route=\"/\",outcome=\"lost\"}")) ?? 0
            return Int(won + lost)
        }
        let received = { a.appRequests.count + b.appRequests.count }
        #expect(eventually(5) { received() == n + hedgesSent() })
        let bound = n + Int(0.2 * Double(n))
        #expect(received() <= bound, "the upstream received \(received()) tries for \(n) requests (bound \(bound))")
        #expect(hedgesSent() >= 1)  // hedging still works within the ratio
    }

    /// A retry budget with nothing left means no hedge: the slow try is
    /// waited for, and the skipped hedge is counted.
    @Test func aSpentBudgetStopsHedging() throws {
        let slow = ScriptedUpstream(response: "DELAY:300\n" + http(200, "slow")).started()
        let fast = ScriptedUpstream(response: http(200, "fast")).started()
        let h = try ProxyHarness(
            Self.config([slow.port, fast.port], budget: ", budget: { ratio: 0, min_per_second: 0 }"), workers: 1)
        defer { h.stop(); slow.stop(); fast.stop() }
        let r = try HTTP.request(port: h.port, "/a", timeout: 10)
        #expect(r.text == "slow")
        #expect(fast.appRequests.count == 0)
        let admin = AdminProbe(port: h.adminPort)
        #expect(eventually(5) { (try? admin.metric("happypath_hedges_total{route=\"/\",outcome=\"skipped\"}")) == 1 })
    }

    /// The first try fails (a 503) while the hedge is out: the request is
    /// not over; the hedge's answer is the client's, and both tries are
    /// counted.
    @Test func aFailureBesideTheHedgeDoesNotEndTheRequest() throws {
        let failing = ScriptedUpstream(response: "DELAY:150\n" + http(503, "busy")).started()
        let late = ScriptedUpstream(response: "DELAY:400\n" + http(200, "late but fine")).started()
        let h = try ProxyHarness(
            Self.config([failing.port, late.port]).replacingOccurrences(of: "attempts: 3", with: "attempts: 2"), workers: 1)
        defer { h.stop(); failing.stop(); late.stop() }
        let r = try HTTP.request(port: h.port, "/b", timeout: 10)
        #expect(r.status == 200)
        #expect(r.text == "late but fine")
        #expect(r.header("X-Happypath-Attempts") == "2")
        #expect(failing.appRequests.count == 1)
        #expect(late.appRequests.count == 1)
    }

    /// `after: p95`: once the route has seen enough quick tries, a slow one
    /// is hedged after about their 95th percentile (clamped to `min`), not
    /// after `max`.
    @Test func p95FollowsWhatTheRouteSees() throws {
        let a = ScriptedUpstream(answering: { head in
            head.hasPrefix("GET /slow") ? "HOLD" : http(200, "a")
        }).started()
        let b = ScriptedUpstream(response: http(200, "b")).started()
        let h = try ProxyHarness(
            Self.config([a.port, b.port], hedge: "{ after: p95, min: 20ms, max: 3s }"), workers: 1)
        defer { h.stop(); a.stop(); b.stop() }
        for i in 0..<30 { #expect(try HTTP.request(port: h.port, "/quick/\(i)").status == 200) }
        // Round robin is back at `a`: the first try holds, the hedge to `b` answers.
        let start = ContinuousClock.now
        let r = try HTTP.request(port: h.port, "/slow", timeout: 10)
        #expect(r.text == "b")
        #expect(r.header("X-Happypath-Attempts") == "2")
        #expect(seconds(since: start) < 1.5)  // max (3 s) would have been waited without enough tries seen
    }

    /// Every try fails: the problem lists the hedge's failure with the others.
    @Test func whenEveryTryFailsTheProblemCountsTheHedge() throws {
        let a = ScriptedUpstream(response: "DELAY:100\n" + http(503, "busy")).started()
        let b = ScriptedUpstream(response: "DELAY:100\n" + http(503, "busy")).started()
        let h = try ProxyHarness(
            Self.config([a.port, b.port]).replacingOccurrences(of: "attempts: 3", with: "attempts: 2"), workers: 1)
        defer { h.stop(); a.stop(); b.stop() }
        let r = try HTTP.request(port: h.port, "/c", timeout: 10)
        #expect(r.status == 503)
        #expect(r.json["attempts"] as? Int == 2, "\(r.text)")
        #expect((r.json["detail"] as? String)?.contains("2 attempts failed: 503, 503") == true, "\(r.text)")
    }
}
