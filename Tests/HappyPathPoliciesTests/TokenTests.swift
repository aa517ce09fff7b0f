import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct TokenResponseTests {
    @Test func oauth2Answer() throws {
        let r = try TokenResponse.oauth2(
            Array(#"{"access_token":"abc","token_type":"Bearer","expires_in":3600,"refresh_token":"r2"}"#.utf8)
        ).get()
        #expect(
            r
                == TokenResponse(
                    accessToken: Secret("abc"), tokenType: "Bearer", expiresIn: .seconds(3600), refreshToken: Secret("r2")))
    }

    @Test func oauth2WithoutTokenOrNotJSON() {
        #expect(TokenResponse.oauth2(Array(#"{"token_type":"Bearer"}"#.utf8)) == .failure(.missing("access_token")))
        #expect(TokenResponse.oauth2(Array("<html>".utf8)) == .failure(.notJSON))
    }

    @Test func aTokenThatCouldBreakTheHeaderIsRefused() {
        #expect(TokenResponse.oauth2(Array(#"{"access_token":"a\r\nX-Evil: 1"}"#.utf8)) == .failure(.unusable))
        #expect(TokenResponse.oauth2(Array(#"{"access_token":"a b"}"#.utf8)) == .failure(.unusable))
        #expect(
            TokenResponse.login(Array(#"{"t":"x\u0000y"}"#.utf8), tokenPointer: "/t", expiresInPointer: nil)
                == .failure(.unusable))
        #expect((try? TokenResponse.oauth2(Array(#"{"access_token":"eyJ.a-b_c~d+e/f=="}"#.utf8)).get()) != nil)
    }

    @Test func expiresInAsText() throws {
        let r = try TokenResponse.oauth2(Array(#"{"access_token":"a","expires_in":"90"}"#.utf8)).get()
        #expect(r.expiresIn == .seconds(90))
    }

    @Test func loginAnswerWithPointers() throws {
        let body = Array(#"{"data":{"token":"t-1","ttl":120}}"#.utf8)
        let r = try TokenResponse.login(body, tokenPointer: "/data/token", expiresInPointer: "/data/ttl").get()
        #expect(r.accessToken.reveal == "t-1")
        #expect(r.expiresIn == .seconds(120))
        #expect(
            TokenResponse.login(body, tokenPointer: "/data/nope", expiresInPointer: nil)
                == .failure(.missing("token at /data/nope")))
    }

    @Test func formEncoding() {
        #expect(
            FormEncoding.encode([("grant_type", "client_credentials"), ("client_secret", "a b&c=d/é")])
                == "grant_type=client_credentials&client_secret=a+b%26c%3Dd%2F%C3%A9")
    }
}

@Suite struct TokenStateMachineTests {
    @Test func firstUseWaitsAndStartsOneRefresh() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .seconds(30))
        let first = m.use(at: clock.now())
        let second = m.use(at: clock.now())
        #expect(first == .wait(start: true))
        #expect(second == .wait(start: false))  // single flight
        let token = m.succeeded(credential: Secret("Bearer a"), expiresIn: .seconds(100), at: clock.now())
        let third = m.use(at: clock.now())
        #expect(third == .use(token))
    }

    @Test func refreshesAheadOfExpiryOnce() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .seconds(30))
        _ = m.use(at: clock.now())
        let token = m.succeeded(credential: Secret("Bearer a"), expiresIn: .seconds(100), at: clock.now())
        clock.advance(by: .seconds(71))
        let a = m.use(at: clock.now())
        let b = m.use(at: clock.now())
        #expect(a == .useAndRefresh(token))
        #expect(b == .use(token))
        clock.advance(by: .seconds(30))  // expired, refresh still running
        let c = m.use(at: clock.now())
        #expect(c == .wait(start: false))
    }

    @Test func refusalOfAnOldGenerationUsesTheFresherToken() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .zero)
        _ = m.use(at: clock.now())
        let t1 = m.succeeded(credential: Secret("Bearer 1"), expiresIn: nil, at: clock.now())
        let r1 = m.refused(generation: t1.generation)
        #expect(r1 == .wait(start: true))
        let r1b = m.refused(generation: t1.generation)
        #expect(r1b == .wait(start: false))
        let t2 = m.succeeded(credential: Secret("Bearer 2"), expiresIn: nil, at: clock.now())
        #expect(t2.generation == t1.generation + 1)
        let late = m.refused(generation: t1.generation)
        #expect(late == .retryWith(t2))
    }

    @Test func aFailedRefreshLetsTheNextUseStartAnother() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .zero)
        _ = m.use(at: clock.now())
        m.failed()
        let again = m.use(at: clock.now())
        #expect(again == .wait(start: true))
    }

    @Test func expiryArithmetic() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .seconds(10))
        _ = m.use(at: clock.now())
        m.succeeded(credential: Secret("x"), expiresIn: .seconds(60), at: clock.now())
        clock.advance(by: .seconds(15))
        #expect(m.expiresIn(at: clock.now()) == .seconds(45))
    }
}

/// Issue 30: token lifetimes from a misbehaving endpoint.
@Suite struct TokenLifetimeBoundsTests {
    /// Below the 1 s floor a token is held for the floor.
    @Test func aLifetimeBelowTheFloorIsHeldForTheFloor() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .zero)
        _ = m.use(at: clock.now())
        let t = m.succeeded(credential: Secret("Bearer a"), expiresIn: .milliseconds(0), at: clock.now())
        #expect(t.expiresAt == clock.now() + .seconds(1))
        #expect(m.use(at: clock.now()) == .use(t))
        clock.advance(by: .milliseconds(999))
        if case .wait = m.use(at: clock.now()) { Issue.record("expired before the floor") }
    }

    /// A lifetime shorter than refresh_ahead refreshes once per token, at
    /// half its lifetime, not on every request.
    @Test func aLifetimeShorterThanRefreshAheadRefreshesOncePerToken() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .seconds(30))
        _ = m.use(at: clock.now())
        let t1 = m.succeeded(credential: Secret("Bearer 1"), expiresIn: .seconds(10), at: clock.now())
        #expect(m.use(at: clock.now()) == .use(t1))
        clock.advance(by: .seconds(4))
        #expect(m.use(at: clock.now()) == .use(t1))  // before half its lifetime
        clock.advance(by: .seconds(1))
        #expect(m.use(at: clock.now()) == .useAndRefresh(t1))
        let t2 = m.succeeded(credential: Secret("Bearer 2"), expiresIn: .seconds(10), at: clock.now())
        // The fresh token is not refreshed on the next requests.
        for _ in 0..<100 { #expect(m.use(at: clock.now()) == .use(t2)) }
    }

    @Test func aFailedRefreshAheadMayBeTriedAgain() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .seconds(30))
        _ = m.use(at: clock.now())
        let t = m.succeeded(credential: Secret("Bearer 1"), expiresIn: .seconds(100), at: clock.now())
        clock.advance(by: .seconds(75))
        #expect(m.use(at: clock.now()) == .useAndRefresh(t))
        #expect(m.use(at: clock.now()) == .use(t))
        m.failed()
        #expect(m.use(at: clock.now()) == .useAndRefresh(t))
    }

    /// Token requests are spaced 250 ms apart, retries included.
    @Test func tokenRequestsAreSpacedOut() {
        let clock = ManualClock()
        var m = TokenStateMachine(refreshAhead: .zero)
        #expect(m.reserveRequest(at: clock.now()) == .zero)
        #expect(m.reserveRequest(at: clock.now()) == .milliseconds(250))
        #expect(m.reserveRequest(at: clock.now()) == .milliseconds(500))
        clock.advance(by: .seconds(2))
        #expect(m.reserveRequest(at: clock.now()) == .zero)
        clock.advance(by: .milliseconds(100))
        #expect(m.reserveRequest(at: clock.now()) == .milliseconds(150))
    }

    /// expires_in as a token endpoint may send it, read into a bounded lifetime.
    @Test(arguments: [
        ("1e16", Duration?.some(.seconds(315_360_000))), ("1e308", .some(.seconds(315_360_000))),
        ("0.0001", .some(.seconds(1))), ("3600", .some(.seconds(3600))), ("0", nil), ("-5", nil),
        ("\"Infinity\"", nil), ("\"NaN\"", nil), ("\"inf\"", nil), ("\"0x10\"", nil), ("\"120\"", .some(.seconds(120))),
        ("\"1e16\"", .some(.seconds(315_360_000))), ("null", nil), ("\"\u{663}\"", nil),
    ])
    func expiresInIsBounded(_ json: String, _ expected: Duration?) {
        let body = Array(#"{"access_token":"t","expires_in":\#(json)}"#.utf8)
        guard case let .success(r) = TokenResponse.oauth2(body) else {
            Issue.record("not parsed: \(json)")
            return
        }
        #expect(r.expiresIn == expected, "expires_in \(json)")
    }
}
