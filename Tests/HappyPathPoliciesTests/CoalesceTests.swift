import HappyPathCore
import HappyPathPolicies
import Testing

/// Issue 50's pure parts: who coalesces and under which key
/// (`CoalesceRules.RequestReader`), what a leader's head and failure mean
/// for its followers, a group's life (`CoalesceGroupStateMachine`), and a
/// follower's (`ExchangeStateMachine+Following`). Tables, a manual clock.
@Suite struct CoalesceRulesTests {
    static let salt = Array("salt for the tests".utf8)
    static let key = StaleKey(privateHeaders: ["X-Api-Key"], rateLimitHeader: "X-Client")

    static func key(
        _ fields: [(String, String)], method: String = "GET", target: String = "/catalog/a", scheme: String = "http",
        pacing: String? = nil, route: Int = 0
    ) -> String? {
        var reader = CoalesceRules.RequestReader(key: key, salt: salt)
        for (name, value) in fields { reader.field(name: name, value: value) }
        return reader.key(
            method: method, route: CoalesceRules.routeTag(route), upstream: "api", target: target, scheme: scheme,
            pacingKey: pacing)
    }

    static let plain = key([("Host", "shop.example")])!

    @Test func theSameReadHasTheSameKeyWhateverTheFieldsCase() {
        #expect(Self.key([("host", "shop.example")]) == Self.plain)
        #expect(Self.key([("Host", "shop.example"), ("Accept", "text/html")]) == Self.plain)
        #expect(
            Self.key([("Host", "shop.example"), ("Authorization", "a"), ("Cookie", "c")])
                == Self.key([("host", "shop.example"), ("cookie", "c"), ("authorization", "a")]))
        #expect(Self.key([("Host", "shop.example"), ("Content-Length", "0")]) == Self.plain)
        // max-age=0 asks for a fresh answer, which the leader's is.
        #expect(Self.key([("Host", "shop.example"), ("Cache-Control", "max-age=0")]) == Self.plain)
    }

    /// Each of these makes another key: nobody gets an answer meant for
    /// another user, authority, target or precondition.
    @Test(arguments: [
        ("Host", "evil.example"), ("X-Forwarded-Host", "evil.example"), ("X-Forwarded-Proto", "https"),
        ("Authorization", "Bearer a"), ("Cookie", "session=1"), ("Proxy-Authorization", "Basic x"), ("X-Api-Key", "k1"),
        ("X-Client", "c1"), ("If-None-Match", "\"v1\""), ("If-Modified-Since", "Sat, 28 Nov 2026 10:00:00 GMT"),
    ])
    func aFieldOfTheKeyMakesAnotherKey(name: String, value: String) {
        let with = Self.key([("Host", "shop.example"), (name, value)])
        #expect(with != nil && with != Self.plain)
        #expect(Self.key([("Host", "shop.example"), (name, value + "2")]) != with)
    }

    @Test func theMethodTheRouteTheTargetTheSchemeAndThePacingClientAreInTheKey() {
        #expect(Self.key([("Host", "shop.example")], method: "HEAD") != Self.plain)
        #expect(Self.key([("Host", "shop.example")], route: 1) != Self.plain)
        #expect(Self.key([("Host", "shop.example")], target: "/catalog/a?page=2") != Self.plain)
        #expect(Self.key([("Host", "shop.example")], scheme: "https") != Self.plain)
        #expect(Self.key([("Host", "shop.example")], pacing: "10.0.0.1") != Self.plain)
        #expect(Self.key([("Host", "shop.example")], pacing: "10.0.0.1") != Self.key([("Host", "shop.example")], pacing: "10.0.0.2"))
    }

    @Test func noCredentialIsKeptInClear() {
        let key = Self.key([("Host", "shop.example"), ("Authorization", "Bearer secret-token"), ("X-Api-Key", "k-secret")])!
        #expect(!key.contains("secret"))
    }

    @Test(arguments: [
        ("POST", [("Host", "s")]), ("PUT", [("Host", "s")]), ("GET", [("Content-Length", "5")]),
        ("GET", [("Transfer-Encoding", "chunked")]), ("GET", [("Range", "bytes=0-10")]),
        ("GET", [("Cache-Control", "no-cache")]), ("GET", [("Cache-Control", "no-store")]),
        ("GET", [("Cache-Control", "max-age=0, no-cache")]), ("GET", [("Pragma", "no-cache")]),
        ("GET", [("Upgrade", "websocket")]),
    ])
    func theseNeverCoalesce(method: String, fields: [(String, String)]) {
        #expect(Self.key(fields, method: method) == nil)
    }

    static func head(_ fields: [(String, String)], length: Int? = 100) -> CoalesceRules.HeadVerdict {
        CoalesceRules.head(fields: KeptFields(fields.map { HTTPField(name: $0.0, value: $0.1) }), contentLength: length, largeAbove: 1000)
    }

    @Test func whatTheLeadersHeadSaysAboutSharingIt() {
        #expect(Self.head([("Content-Type", "text/html")]) == .share(varyNames: []))
        #expect(Self.head([("Cache-Control", "private, max-age=60")]) == .share(varyNames: []))
        #expect(Self.head([("Vary", "Accept-Language, accept-encoding"), ("Vary", "Accept-Language")]) == .share(varyNames: ["accept-language", "accept-encoding"]))
        #expect(Self.head([("Cache-Control", "max-age=5, no-store")]) == .release(.noStore))
        #expect(Self.head([("Set-Cookie", "id=1"), ("Cache-Control", "no-store")]) == .release(.noStore))
        #expect(Self.head([("Set-Cookie", "id=1")]) == .release(.setCookie))
        #expect(Self.head([("Vary", "*")]) == .release(.unshareable))
        #expect(Self.head([("Content-Type", "text/event-stream; charset=utf-8")]) == .release(.unshareable))
        #expect(Self.head([], length: 1001) == .release(.large))
        #expect(Self.head([], length: nil) == .share(varyNames: []))
    }

    @Test(arguments: [
        (ExchangeStateMachine.Failure.timeout, true, CoalesceRules.AfterLeader.handOver),
        (.timeout, false, .share),
        (.upstreamAnswer(status: 404), false, .share), (.upstreamAnswer(status: 503), false, .share),
        (.unavailable, false, .share), (.unreachable, false, .share), (.badGateway(message: "x"), false, .share),
        (.circuitOpen(retryAfter: .seconds(1)), false, .share), (.paused, false, .share),
        (.overloaded(byParking: false), false, .share),
        (.parkExpired(.unreachable, waited: .seconds(1), byDeadline: false), false, .share),
        (.parkExpired(.unreachable, waited: .seconds(1), byDeadline: true), true, .handOver),
        (.shed(.normal), false, .handOver),
    ])
    func aLeadersFailureIsSharedOrHandedOver(
        failure: ExchangeStateMachine.Failure, deadlinePassed: Bool, expected: CoalesceRules.AfterLeader
    ) {
        #expect(CoalesceRules.afterLeader(failure, deadlinePassed: deadlinePassed) == expected)
    }
}

@Suite struct CoalesceGroupStateMachineTests {
    typealias G = CoalesceGroupStateMachine
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    @Test func followersJoinUpToTheBoundThenGoAlone() {
        var g = G(leader: 0, maxFollowers: 2)
        #expect(g.join(1, deadline: Self.t0 + .seconds(5)) == .follow)
        #expect(g.join(2, deadline: Self.t0 + .seconds(5)) == .follow)
        #expect(g.join(3, deadline: Self.t0 + .seconds(5)) == .alone)
        let first = g.leave(1)
        let again = g.leave(1)
        #expect(first && !again)
        #expect(g.join(4, deadline: Self.t0 + .seconds(5)) == .follow)
        #expect(g.followers.map(\.id) == [2, 4])
    }

    @Test func aSharedFailureAnswersEveryFollowerAndEndsTheGroup() {
        var g = G(leader: 0, maxFollowers: 10)
        _ = g.join(1, deadline: Self.t0 + .seconds(5))
        _ = g.join(2, deadline: Self.t0 + .seconds(5))
        #expect(g.leaderEnded(.share, at: Self.t0) == .answerAll([1, 2]))
        #expect(g.state == .ended)
        #expect(g.size == 3)
        #expect(g.join(3, deadline: Self.t0 + .seconds(5)) == .alone)
    }

    /// The first follower with time left leads; those whose deadline
    /// passed in the same moment answer their timeout; the rest follow on.
    @Test func aHandOverPromotesTheFirstFollowerWithTimeLeft() {
        var g = G(leader: 0, maxFollowers: 10)
        _ = g.join(1, deadline: Self.t0 + .seconds(1))
        _ = g.join(2, deadline: Self.t0 + .seconds(3))
        _ = g.join(3, deadline: Self.t0 + .seconds(4))
        #expect(g.leaderEnded(.handOver, at: Self.t0 + .seconds(2)) == .promote(leader: 2, expired: [1]))
        #expect(g.state == .waiting && g.leader == 2)
        #expect(g.followers.map(\.id) == [3])
        #expect(g.leaderEnded(.handOver, at: Self.t0 + .seconds(5)) == .expireAll([3]))
        #expect(g.state == .ended)
    }

    /// A follower with only moments left would send a try bound to fail:
    /// one with time enough leads, and the other follows it.
    @Test func onlyAFollowerWithTimeEnoughLeads() {
        var g = G(leader: 0, maxFollowers: 10)
        _ = g.join(1, deadline: Self.t0 + .milliseconds(10))
        _ = g.join(2, deadline: Self.t0 + .seconds(2))
        #expect(g.leaderEnded(.handOver, at: Self.t0) == .promote(leader: 2, expired: []))
        #expect(g.followers.map(\.id) == [1])
        // Nobody with time enough: the one with the most leads.
        var h = G(leader: 0, maxFollowers: 10)
        _ = h.join(1, deadline: Self.t0 + .milliseconds(20))
        _ = h.join(2, deadline: Self.t0 + .milliseconds(30))
        _ = h.join(3, deadline: Self.t0 - .milliseconds(1))
        #expect(h.leaderEnded(.handOver, at: Self.t0) == .promote(leader: 2, expired: [3]))
        #expect(h.followers.map(\.id) == [1])
    }

    @Test func aLeaderAloneEndsItsGroup() {
        var g = G(leader: 0, maxFollowers: 10)
        #expect(g.leaderEnded(.handOver, at: Self.t0) == .ended)
        var h = G(leader: 0, maxFollowers: 10)
        #expect(h.leaderEnded(.share, at: Self.t0) == .ended)
    }

    @Test func theHeadIsSharedWithThoseKeptAndTheOthersAreReleased() {
        var g = G(leader: 0, maxFollowers: 10)
        for id in 1...5 { _ = g.join(id, deadline: Self.t0 + .seconds(5)) }
        let (shared, released) = g.share { $0 % 2 == 1 }
        #expect(shared == [1, 3, 5] && released == [2, 4])
        #expect(g.state == .sharing && g.followers.isEmpty && g.size == 4)
        #expect(g.join(6, deadline: Self.t0 + .seconds(5)) == .alone)
        let late = g.share { _ in true }
        #expect(late.shared.isEmpty && late.released.isEmpty)
        g.finished()
        #expect(g.state == .ended)
    }
}

@Suite struct ExchangeFollowingTests {
    typealias M = ExchangeStateMachine
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    static func machine() -> M {
        var retry = RetryPolicy.Configuration()
        retry.jitter = false
        return M(
            .init(
                deadline: t0 + .seconds(5), retry: RetryPolicy(retry), parkFor: .seconds(10), parkWhileOpen: true,
                endpoints: 1, method: "GET", hasIdempotencyKey: false, refreshOn: []))
    }

    static func following() -> M {
        var m = machine()
        _ = m.start()
        #expect(m.follow(at: t0 + .seconds(1)) == .follow(limit: .seconds(4)))
        return m
    }

    @Test func aFollowerHoldsNothingAndWaitsForItsOwnDeadline() {
        var m = Self.following()
        #expect(m.state == .following && m.slot == .none && m.lot == nil && m.attempt == 0)
        #expect(m.timerFired(at: Self.t0 + .seconds(5)) == .answer(.timeout, abandonProbe: false))
        #expect(m.state == .finished)
    }

    @Test func aFollowerThatLeavesOrIsDrainedIsFinished() {
        var gone = Self.following()
        #expect(gone.clientGone() == .finish(.clientClosed, abandonProbe: false))
        var drained = Self.following()
        #expect(drained.drain() == .answer(.shuttingDown, abandonProbe: false))
    }

    @Test func aSharedAnswerStreamsAndEndsWholeOrCut() {
        var m = Self.following()
        #expect(m.shared(status: 200) == .stream)
        #expect(m.state == .streaming && m.streamedStatus == 200 && m.attempt == 0)
        #expect(m.sharedEnded(complete: true) == .finish(.completed, abandonProbe: false))
        var cut = Self.following()
        _ = cut.shared(status: 200)
        #expect(cut.sharedEnded(complete: false) == .finish(.truncated, abandonProbe: false))
    }

    @Test func aSharedFailureIsAnsweredAsTheFollowersOwn() {
        var m = Self.following()
        #expect(m.sharedFailure(.upstreamAnswer(status: 404)) == .answer(.upstreamAnswer(status: 404), abandonProbe: false))
        #expect(m.sharedFailure(.timeout) == .none)
    }

    @Test func aPromotedFollowerIsAdmittedAndItsFirstTryIsAttemptOne() {
        var m = Self.following()
        #expect(m.promoted(at: Self.t0 + .seconds(2)) == .admit)
        #expect(m.admitted(.send(probe: false), at: Self.t0 + .seconds(2)) == .send(attempt: 1, limit: .seconds(3)))
        var late = Self.following()
        #expect(late.promoted(at: Self.t0 + .seconds(5)) == .answer(.timeout, abandonProbe: false))
    }

    @Test func onlyARequestNotYetTriedMayFollow() {
        var m = Self.machine()
        _ = m.start()
        _ = m.admitted(.send(probe: false), at: Self.t0)
        #expect(m.follow(at: Self.t0) == .none)
        #expect(m.shared(status: 200) == .none)
        #expect(m.promoted(at: Self.t0) == .none)
    }
}
