import HappyPathCore
import Testing

@testable import HappyPathPolicies

@Suite struct UpstreamPauseTests {
    static let t0 = Instant(nanoseconds: 5_000_000_000)

    @Test func aStatusInOnWithAWaitPausesTheUpstreamForThatLong() {
        var p = UpstreamPause(PacingConfiguration())
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
        var p = UpstreamPause(PacingConfiguration())
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
        var p = UpstreamPause(PacingConfiguration())
        _ = p.answered(status: 429, wait: .seconds(30), at: Self.t0)
        do {
            let result = p.end(at: Self.t0, early: true)
            #expect(result)
        }
        #expect(p.remaining(at: Self.t0) == nil)
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
