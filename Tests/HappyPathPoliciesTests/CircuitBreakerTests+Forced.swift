import HappyPathCore
import HappyPathPolicies
import Testing

/// An operator forces the breaker (`POST /admin/upstreams/{name}/breaker/...`).
@Suite struct CircuitBreakerForcedTests {
    func breaker() -> CircuitBreakerStateMachine {
        var c = CircuitBreakerStateMachine.Configuration()
        c.consecutiveFailures = 2
        c.openFor = .seconds(5)
        return CircuitBreakerStateMachine(c)
    }

    @Test func forcedOpenRefusesEveryTryAndNeverProbes() {
        let clock = ManualClock()
        var b = breaker()
        #expect(b.force(.open, at: clock.now()) == .opened)
        #expect(b.forced == .open)
        clock.advance(by: .seconds(3600))
        #expect(b.admit(at: clock.now()).0 == .reject(retryAfter: .seconds(5)))
        #expect(b.state == .open(until: Instant(nanoseconds: .max)))
        // Late results of tries sent before change nothing.
        #expect(b.record(failure: false, probe: true, at: clock.now()) == nil)
        #expect(b.state.name == "open")
    }

    @Test func forcedClosedLetsEveryTryThroughAndCountsNoFailure() {
        let clock = ManualClock()
        var b = breaker()
        _ = b.record(failure: true, probe: false, at: clock.now())
        _ = b.record(failure: true, probe: false, at: clock.now())
        #expect(b.state.name == "open")
        #expect(b.force(.closed, at: clock.now()) == .closed)
        for _ in 0..<10 {
            #expect(b.admit(at: clock.now()).0 == .allow)
            #expect(b.record(failure: true, probe: false, at: clock.now()) == nil)
        }
        #expect(b.state == .closed)
        let f = b.failures(at: clock.now())
        #expect(f.consecutive == 0 && f.requests == 0 && f.failed == 0, "nothing counted while forced")
    }

    @Test(arguments: [CircuitBreakerStateMachine.Forced.open, .closed])
    func releasedItStartsClosedWithNothingCounted(forced: CircuitBreakerStateMachine.Forced) {
        let clock = ManualClock()
        var b = breaker()
        _ = b.record(failure: true, probe: false, at: clock.now())
        _ = b.force(forced, at: clock.now())
        #expect(b.force(nil, at: clock.now()) == (forced == .open ? .closed : nil))
        #expect(b.forced == nil)
        #expect(b.state == .closed)
        #expect(b.failures(at: clock.now()).consecutive == 0)
        // Automatic again: two failures in a row open it.
        #expect(b.record(failure: true, probe: false, at: clock.now()) == nil)
        #expect(b.record(failure: true, probe: false, at: clock.now()) == .opened)
    }

    @Test func forcingWhatItAlreadyIsIsNoTransition() {
        let clock = ManualClock()
        var b = breaker()
        #expect(b.force(.closed, at: clock.now()) == nil)
        #expect(b.force(.open, at: clock.now()) == .opened)
        #expect(b.force(.open, at: clock.now()) == nil)
        #expect(b.force(.closed, at: clock.now()) == .closed)
    }
}
