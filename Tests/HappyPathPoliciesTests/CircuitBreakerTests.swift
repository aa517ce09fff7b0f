import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct CircuitBreakerTests {
    func breaker(consecutive: Int = 5, rate: Double = 0.5, minimum: Int = 20, probes: Int = 1) -> CircuitBreakerStateMachine {
        var c = CircuitBreakerStateMachine.Configuration()
        c.consecutiveFailures = consecutive
        c.failureRate = rate
        c.minimumRequests = minimum
        c.openFor = .seconds(5)
        c.halfOpenProbes = probes
        return CircuitBreakerStateMachine(c)
    }

    @Test func opensAfterFiveConsecutiveFailures() {
        let clock = ManualClock()
        var b = breaker()
        for _ in 0..<4 { #expect(b.record(failure: true, probe: false, at: clock.now()) == nil) }
        #expect(b.record(failure: true, probe: false, at: clock.now()) == .opened)
        #expect(b.state == .open(until: clock.now() + .seconds(5)))
    }

    @Test func aSuccessResetsTheStreak() {
        let clock = ManualClock()
        var b = breaker(minimum: 1000)
        for _ in 0..<4 { _ = b.record(failure: true, probe: false, at: clock.now()) }
        _ = b.record(failure: false, probe: false, at: clock.now())
        for _ in 0..<4 { #expect(b.record(failure: true, probe: false, at: clock.now()) == nil) }
        #expect(b.state == .closed)
    }

    @Test func opensOnFailureRateOnceMinimumRequestsWereSeen() {
        let clock = ManualClock()
        var b = breaker(consecutive: 100, rate: 0.5, minimum: 10)
        var transitions: [CircuitBreakerStateMachine.Transition?] = []
        for i in 0..<10 { transitions.append(b.record(failure: i % 2 == 0, probe: false, at: clock.now())) }
        #expect(transitions.prefix(9).allSatisfy { $0 == nil })
        #expect(b.state == .closed)  // the 10th was a success: 5/10 but no failure to trigger on
        #expect(b.record(failure: true, probe: false, at: clock.now()) == .opened)
    }

    @Test func failuresOutsideTheWindowDoNotCount() {
        let clock = ManualClock()
        var b = breaker(consecutive: 100, rate: 0.5, minimum: 4)
        for _ in 0..<3 { _ = b.record(failure: true, probe: false, at: clock.now()) }
        clock.advance(by: .seconds(11))
        #expect(b.record(failure: true, probe: false, at: clock.now()) == nil)
        #expect(b.state == .closed)
    }

    @Test func rejectsWhileOpenWithTheTimeLeft() {
        let clock = ManualClock()
        var b = breaker(consecutive: 1)
        _ = b.record(failure: true, probe: false, at: clock.now())
        clock.advance(by: .seconds(2))
        let admission = b.admit(at: clock.now()).0
        #expect(admission == .reject(retryAfter: .seconds(3)))
    }

    @Test func halfOpenProbeSuccessCloses() {
        let clock = ManualClock()
        var b = breaker(consecutive: 1)
        _ = b.record(failure: true, probe: false, at: clock.now())
        clock.advance(by: .seconds(5))
        let (admission, transition) = b.admit(at: clock.now())
        #expect(admission == .probe)
        #expect(transition == .halfOpened)
        let second = b.admit(at: clock.now()).0
        #expect(second == .reject(retryAfter: .seconds(5)))  // one probe at a time
        #expect(b.record(failure: false, probe: true, at: clock.now()) == .closed)
        let after = b.admit(at: clock.now()).0
        #expect(after == .allow)
    }

    @Test func halfOpenProbeFailureReopens() {
        let clock = ManualClock()
        var b = breaker(consecutive: 1)
        _ = b.record(failure: true, probe: false, at: clock.now())
        clock.advance(by: .seconds(6))
        _ = b.admit(at: clock.now())
        #expect(b.record(failure: true, probe: true, at: clock.now()) == .opened)
        #expect(b.state == .open(until: clock.now() + .seconds(5)))
    }

    @Test func severalProbesMustAllSucceed() {
        let clock = ManualClock()
        var b = breaker(consecutive: 1, probes: 2)
        _ = b.record(failure: true, probe: false, at: clock.now())
        clock.advance(by: .seconds(5))
        let first = b.admit(at: clock.now()).0
        let second = b.admit(at: clock.now()).0
        #expect(first == .probe)
        #expect(second == .probe)
        #expect(b.record(failure: false, probe: true, at: clock.now()) == nil)
        #expect(b.record(failure: false, probe: true, at: clock.now()) == .closed)
    }

    @Test func lateResultsWhileOpenAreIgnored() {
        let clock = ManualClock()
        var b = breaker(consecutive: 1)
        _ = b.record(failure: true, probe: false, at: clock.now())
        #expect(b.record(failure: false, probe: false, at: clock.now()) == nil)
        #expect(b.state.gauge == 2)
    }
}
