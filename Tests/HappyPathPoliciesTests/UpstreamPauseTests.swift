import HappyPathCore
import Testing

@testable import HappyPathPolicies

@Suite struct UpstreamPauseTests {
    static let t0 = Instant(nanoseconds: 5_000_000_000)
    /// `scope_429: upstream`: a 429 pauses the whole upstream, as a 503
    /// does (the tests of the pause's own mechanics, from before issue 31).
    static let upstreamWide = {
        var c = PacingConfiguration()
        c.scope429 = .upstream
        return c
    }()

    @Test func aStatusInOnWithAWaitPausesTheUpstreamForThatLong() {
        var p = UpstreamPause(Self.upstreamWide)
        do {
            let result = p.answered(status: 429, wait: .seconds(2), at: Self.t0)
            #expect(result == .paused(until: Self.t0 + .seconds(2)))
        }
        #expect(p.cause == 429)
        #expect(p.remaining(at: Self.t0 + .seconds(1)) == .seconds(1))
        #expect(p.remaining(at: Self.t0 + .seconds(2)) == nil)
        do {
            let result = p.end(at: Self.t0 + .seconds(1))
            #expect(result == false)
        }
        do {
            let result = p.end(at: Self.t0 + .seconds(2))
            #expect(result == true)
        }
        do {
            let result = p.end(at: Self.t0 + .seconds(3))
            #expect(result == false)
        }
    }

    @Test(arguments: [
        (500, Duration?.some(.seconds(2))),  // not in `on`
        (429, nil),  // no wait given
        (503, .zero),
    ])
    func otherAnswersDoNotPause(status: Int, wait: Duration?) {
        var p = UpstreamPause(PacingConfiguration())
        let change = p.answered(status: status, wait: wait, at: Self.t0)
        #expect(change == .none)
        #expect(p.remaining(at: Self.t0) == nil)
    }

    /// A gRPC call's RESOURCE_EXHAUSTED with RetryInfo: a pause only with
    /// `resource-exhausted` in `on`, and then whom a 429 pauses, as a 429.
    @Test func aResourceExhaustedPausesAsA429WhenOnNamesIt() {
        var off = UpstreamPause(PacingConfiguration())
        #expect(off.answeredResourceExhausted(wait: .seconds(2), client: "a", at: Self.t0) == .none)
        var config = PacingConfiguration()
        config.on = [503]  // no 429: resource-exhausted is its own entry
        config.onResourceExhausted = true
        var perClient = UpstreamPause(config)
        #expect(perClient.answered(status: 429, wait: .seconds(2), client: "a", at: Self.t0) == .none)
        #expect(
            perClient.answeredResourceExhausted(wait: .seconds(2), client: "a", at: Self.t0)
                == .paused(until: Self.t0 + .seconds(2), client: "a"))
        #expect(perClient.pause(for: "a", at: Self.t0)?.cause == 429)
        #expect(perClient.pause(for: "b", at: Self.t0) == nil)
        #expect(perClient.answeredResourceExhausted(wait: nil, client: "b", at: Self.t0) == .none)
        #expect(perClient.answeredResourceExhausted(wait: .zero, client: "b", at: Self.t0) == .none)
        config.scope429 = .upstream
        config.maxPause = .seconds(5)
        var everyone = UpstreamPause(config)
        #expect(everyone.answeredResourceExhausted(wait: .seconds(30), at: Self.t0) == .paused(until: Self.t0 + .seconds(5)))
        #expect(everyone.cause == 429)
        #expect(everyone.pause(for: "b", at: Self.t0)?.left == .seconds(5))
    }

    @Test func neverLongerThanMaxPause() {
        var c = PacingConfiguration()
        c.maxPause = .seconds(10)
        var p = UpstreamPause(c)
        do {
            let result = p.answered(status: 503, wait: .seconds(3600), at: Self.t0)
            #expect(result == .paused(until: Self.t0 + .seconds(10)))
        }
    }

    @Test func aLongerWaitExtendsAShorterOneDoesNot() {
        var p = UpstreamPause(Self.upstreamWide)
        _ = p.answered(status: 429, wait: .seconds(2), at: Self.t0)
        do {
            let result = p.answered(status: 429, wait: .seconds(1), at: Self.t0)
            #expect(result == .none)
        }
        do {
            let result = p.answered(status: 503, wait: .seconds(5), at: Self.t0)
            #expect(result == .extended(until: Self.t0 + .seconds(5)))
        }
        #expect(p.cause == 503)
    }

    @Test func aReloadEndsItEarly() {
        var p = UpstreamPause(Self.upstreamWide)
        _ = p.answered(status: 429, wait: .seconds(30), at: Self.t0)
        do {
            let result = p.end(at: Self.t0, early: true)
            #expect(result)
        }
        #expect(p.remaining(at: Self.t0) == nil)
    }

    // MARK: - Scope (issue 31): a 429 is about one client

    @Test func a429PausesOnlyTheClientThatGotItAndA503PausesEveryone() {
        var p = UpstreamPause(PacingConfiguration())
        let change = p.answered(status: 429, wait: .seconds(999_999), client: "mallory", at: Self.t0)
        // Capped by max_pause (60 s) like any pause.
        #expect(change == .paused(until: Self.t0 + .seconds(60), client: "mallory"))
        #expect(p.pause(for: "mallory", at: Self.t0 + .seconds(1))?.cause == 429)
        #expect(p.pause(for: "mallory", at: Self.t0 + .seconds(1))?.left == .seconds(59))
        #expect(p.pause(for: "alice", at: Self.t0 + .seconds(1)) == nil)
        #expect(p.remaining(at: Self.t0) == nil)  // the upstream itself is not paused
        #expect(p.pausedClients(at: Self.t0) == 1)
        #expect(p.pause(for: "mallory", at: Self.t0 + .seconds(60)) == nil)

        let outage = p.answered(status: 503, wait: .seconds(5), client: "alice", at: Self.t0)
        #expect(outage == .paused(until: Self.t0 + .seconds(5)))
        #expect(p.pause(for: "alice", at: Self.t0)?.cause == 503)
        #expect(p.pause(for: "bob", at: Self.t0)?.left == .seconds(5))
        // Mallory's own pause is the longer one: it holds her.
        #expect(p.pause(for: "mallory", at: Self.t0)?.cause == 429)
        #expect(p.pause(for: "mallory", at: Self.t0)?.left == .seconds(60))
    }

    @Test func oneClientsAnswersNeverExtendAnothersPause() {
        var c = PacingConfiguration()
        c.maxPause = .seconds(100)
        var p = UpstreamPause(c)
        _ = p.answered(status: 429, wait: .seconds(10), client: "a", at: Self.t0)
        let b = p.answered(status: 429, wait: .seconds(90), client: "b", at: Self.t0 + .seconds(1))
        #expect(b == .paused(until: Self.t0 + .seconds(91), client: "b"))
        #expect(p.pause(for: "a", at: Self.t0 + .seconds(10)) == nil)
        #expect(p.pause(for: "b", at: Self.t0 + .seconds(10))?.left == .seconds(81))
        // A's own longer wait extends A's pause; a shorter one does not shorten it.
        let longer = p.answered(status: 429, wait: .seconds(20), client: "a", at: Self.t0 + .seconds(5))
        #expect(longer == .extended(until: Self.t0 + .seconds(25), client: "a"))
        let shorter = p.answered(status: 429, wait: .seconds(1), client: "a", at: Self.t0 + .seconds(6))
        #expect(shorter == .none)
    }

    @Test func scope429UpstreamPausesEveryoneAsBefore() {
        var c = PacingConfiguration()
        c.scope429 = .upstream
        var p = UpstreamPause(c)
        let change = p.answered(status: 429, wait: .seconds(2), client: "mallory", at: Self.t0)
        #expect(change == .paused(until: Self.t0 + .seconds(2)))
        #expect(p.pause(for: "alice", at: Self.t0)?.cause == 429)
        #expect(p.pausedClients(at: Self.t0) == 0)
    }

    @Test func aStaleAnswerDoesNotReviveAPauseEndedEarly() {
        var c = PacingConfiguration()
        c.scope429 = .upstream
        var p = UpstreamPause(c)
        _ = p.answered(status: 429, wait: .seconds(30), client: "a", sentAt: Self.t0, at: Self.t0)
        _ = p.answered(status: 429, wait: .seconds(30), client: "b", sentAt: Self.t0, at: Self.t0)
        let ended = p.end(at: Self.t0 + .seconds(1), early: true)
        #expect(ended)
        // An answer to a request that arrived before the reload: ignored.
        let stale = p.answered(status: 429, wait: .seconds(30), client: "b", sentAt: Self.t0, at: Self.t0 + .seconds(2))
        #expect(stale == .none)
        #expect(p.remaining(at: Self.t0 + .seconds(2)) == nil)
        // One that arrived after it is news.
        let fresh = p.answered(
            status: 429, wait: .seconds(3), client: "b", sentAt: Self.t0 + .seconds(2), at: Self.t0 + .seconds(3))
        #expect(fresh == .paused(until: Self.t0 + .seconds(6)))
    }

    @Test func anEarlyEndEndsEveryClientsPauseToo() {
        var p = UpstreamPause(PacingConfiguration())
        _ = p.answered(status: 429, wait: .seconds(30), client: "a", sentAt: Self.t0, at: Self.t0)
        let ended = p.end(at: Self.t0 + .seconds(1), early: true)
        #expect(ended == false)  // the upstream itself was not paused
        #expect(p.pause(for: "a", at: Self.t0 + .seconds(1)) == nil)
        let stale = p.answered(status: 429, wait: .seconds(30), client: "a", sentAt: Self.t0, at: Self.t0 + .seconds(2))
        #expect(stale == .none)
    }

    @Test func clientPausesAreBoundedExpiredOnesGoFirst() {
        var c = PacingConfiguration()
        c.maxClients = 3
        var p = UpstreamPause(c)
        _ = p.answered(status: 429, wait: .seconds(1), client: "old", at: Self.t0)
        _ = p.answered(status: 429, wait: .seconds(50), client: "k1", at: Self.t0)
        _ = p.answered(status: 429, wait: .seconds(40), client: "k2", at: Self.t0)
        // "old" has expired: it makes room, the live ones stay.
        _ = p.answered(status: 429, wait: .seconds(30), client: "k3", at: Self.t0 + .seconds(2))
        #expect(p.clients.count == 3)
        #expect(p.clients["old"] == nil)
        #expect(p.pause(for: "k1", at: Self.t0 + .seconds(2)) != nil)
        // A thousand rotated keys later, still three kept; the pauses ending
        // soonest made room each time.
        for i in 0..<1000 {
            _ = p.answered(status: 429, wait: .seconds(60), client: "rotated\(i)", at: Self.t0 + .seconds(3))
        }
        #expect(p.clients.count == 3)
        #expect(p.pause(for: "rotated999", at: Self.t0 + .seconds(3)) != nil)
    }

    @Test(arguments: [
        ("2", nil, Duration?.some(.seconds(2))),
        (nil, "\"default\";r=0;t=7", .seconds(7)),
        (nil, "\"burst\";r=5;t=7, \"daily\";r=0;t=30", .seconds(30)),
        (nil, "\"default\";r=3;t=7", nil),
        (nil, nil, nil),
    ])
    func theSignalIsRetryAfterElseAnExhaustedRateLimit(retryAfter: String?, rateLimit: String?, expected: Duration?) {
        #expect(PacingSignal.wait(retryAfter: retryAfter, rateLimit: rateLimit, nowUnixSeconds: 1_700_000_000) == expected)
    }
}
