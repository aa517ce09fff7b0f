import HappyPathCore
import HappyPathPolicies
import Testing

/// An operator's drain (`POST /admin/upstreams/{name}/endpoints/{i}/drain`).
@Suite struct OutlierDetectorDrainTests {
    func detector(endpoints: Int, failures: Int = 1, percent: Int = 100) -> OutlierDetector {
        var c = OutlierDetector.Configuration()
        c.consecutiveFailures = failures
        c.baseEjection = .seconds(10)
        c.maxEjectedPercent = percent
        return OutlierDetector(endpoints: endpoints, configuration: c)
    }

    @Test func aDrainedEndpointGetsNoTriesUntilUndrained() {
        let clock = ManualClock()
        var d = detector(endpoints: 3)
        #expect(d.drain(1) == .drained)
        for preferred in 0..<3 {
            let picked = d.pick(preferred: preferred, at: clock.now())
            #expect(picked != 1, "preferred \(preferred)")
        }
        // It does not come back by itself.
        clock.advance(by: .seconds(3600))
        let picked = d.pick(preferred: 1, at: clock.now())
        #expect(picked == 2)
        #expect(d.rotation(at: clock.now()) == [.inRotation, .drained, .inRotation])
        let undrained = d.undrain(1)
        #expect(undrained)
        let back = d.pick(preferred: 1, at: clock.now())
        #expect(back == 1)
        #expect(d.rotation(at: clock.now()) == [.inRotation, .inRotation, .inRotation])
        let again = d.undrain(1)
        #expect(!again, "not drained any more")
    }

    @Test func theLastUndrainedEndpointIsRefused() {
        var d = detector(endpoints: 2)
        #expect(d.drain(0) == .drained)
        #expect(d.drain(1) == .lastEndpoint)
        #expect(!d.isDrained(1))
        #expect(d.drain(0) == .drained, "draining it again is no change")
        var single = detector(endpoints: 1)
        #expect(single.drain(0) == .lastEndpoint)
    }

    @Test func outlierDetectionLeavesADrainedEndpointDrained() {
        let clock = ManualClock()
        var d = detector(endpoints: 3)
        #expect(d.drain(0) == .drained)
        // A try sent before the drain fails after it: no ejection replaces the drain.
        #expect(d.record(endpoint: 0, failure: true, at: clock.now()) == .none)
        clock.advance(by: .seconds(11))
        #expect(d.rotation(at: clock.now())[0] == .drained)
    }

    @Test func anEjectedEndpointSaysUntilWhen() {
        let clock = ManualClock()
        var d = detector(endpoints: 3)
        let until = clock.now() + .seconds(10)
        #expect(d.record(endpoint: 2, failure: true, at: clock.now()) == .ejected(endpoint: 2, until: until))
        #expect(d.rotation(at: clock.now()) == [.inRotation, .inRotation, .ejected(until: until)])
        clock.advance(by: .seconds(10))
        #expect(d.rotation(at: clock.now()) == [.inRotation, .inRotation, .inRotation])
    }

    /// A drained endpoint counts as out for `max_ejected_percent`, and
    /// when every other is ejected a try goes to an ejected one, never to
    /// the drained one.
    @Test func drainedCountsAsOutAndIsNeverTheLastResort() {
        let clock = ManualClock()
        var d = detector(endpoints: 2, percent: 100)
        #expect(d.drain(0) == .drained)
        // Ejecting endpoint 1 would leave none in: refused, as without a drain.
        #expect(d.record(endpoint: 1, failure: true, at: clock.now()) == .none)
        var three = detector(endpoints: 3, percent: 100)
        #expect(three.drain(0) == .drained)
        #expect(three.record(endpoint: 1, failure: true, at: clock.now()) != .none)
        // Endpoint 2 would be the last one in: not ejected.
        #expect(three.record(endpoint: 2, failure: true, at: clock.now()) == .none)
        let lastResort = three.pick(preferred: 0, at: clock.now())
        #expect(lastResort == 2)
    }
}
