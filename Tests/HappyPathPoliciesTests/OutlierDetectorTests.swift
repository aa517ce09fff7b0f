import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct OutlierDetectorTests {
    enum Event {
        case fail(Int)
        case succeed(Int)
        case advance(milliseconds: Int)
        /// The endpoint a try that prefers `preferred` goes to.
        case pick(preferred: Int)
    }

    enum Decision: Equatable {
        case none
        /// Ejected until this many milliseconds after the scenario's start.
        case ejected(Int, untilMilliseconds: Int)
        case picked(Int)
    }

    struct Step {
        let event: Event
        let decision: Decision
        init(_ event: Event, _ decision: Decision = .none) {
            self.event = event
            self.decision = decision
        }
    }

    struct Scenario: CustomTestStringConvertible {
        let name: String
        let endpoints: Int
        let failures: Int
        let percent: Int
        let steps: [Step]
        var testDescription: String { name }

        /// Ejection for 10 s, as by default.
        init(_ name: String, endpoints: Int, failures: Int = 3, percent: Int = 50, _ steps: [Step]) {
            self.name = name
            self.endpoints = endpoints
            self.failures = failures
            self.percent = percent
            self.steps = steps
        }
    }

    static let scenarios: [Scenario] = [
        Scenario(
            "ejected after consecutive_failures failed tries in a row; tries go to the other endpoint",
            endpoints: 2,
            [
                Step(.fail(0)), Step(.fail(0)),
                Step(.fail(0), .ejected(0, untilMilliseconds: 10_000)),
                Step(.pick(preferred: 0), .picked(1)),
                Step(.pick(preferred: 1), .picked(1)),
            ]),
        Scenario(
            "a success resets the count", endpoints: 2,
            [
                Step(.fail(0)), Step(.fail(0)), Step(.succeed(0)),
                Step(.fail(0)), Step(.fail(0)),
                Step(.pick(preferred: 0), .picked(0)),
                Step(.fail(0), .ejected(0, untilMilliseconds: 10_000)),
            ]),
        Scenario(
            "failures of other endpoints do not count", endpoints: 2,
            [
                Step(.fail(0)), Step(.fail(1)), Step(.fail(0)), Step(.fail(1)),
                Step(.fail(0), .ejected(0, untilMilliseconds: 10_000)),
            ]),
        Scenario(
            "the ejection ends after base_ejection", endpoints: 2,
            [
                Step(.fail(1)), Step(.fail(1)), Step(.fail(1), .ejected(1, untilMilliseconds: 10_000)),
                Step(.advance(milliseconds: 9_999)),
                Step(.pick(preferred: 1), .picked(0)),
                Step(.advance(milliseconds: 1)),
                Step(.pick(preferred: 1), .picked(1)),
            ]),
        Scenario(
            "every ejection lasts base_ejection, however often the endpoint was ejected", endpoints: 2,
            [
                Step(.fail(0)), Step(.fail(0)), Step(.fail(0), .ejected(0, untilMilliseconds: 10_000)),
                Step(.advance(milliseconds: 10_000)),
                Step(.fail(0)), Step(.fail(0)), Step(.fail(0), .ejected(0, untilMilliseconds: 20_000)),
            ]),
        Scenario(
            "never more than max_ejected_percent out at once; the next failure after one comes back ejects", endpoints: 4,
            [
                Step(.fail(0)), Step(.fail(0)), Step(.fail(0), .ejected(0, untilMilliseconds: 10_000)),
                Step(.advance(milliseconds: 1_000)),
                Step(.fail(1)), Step(.fail(1)), Step(.fail(1), .ejected(1, untilMilliseconds: 11_000)),
                Step(.fail(2)), Step(.fail(2)), Step(.fail(2)), Step(.fail(2)),
                Step(.pick(preferred: 0), .picked(2)),
                Step(.advance(milliseconds: 9_000)),
                Step(.fail(2), .ejected(2, untilMilliseconds: 20_000)),
                Step(.pick(preferred: 1), .picked(3)),
            ]),
        Scenario(
            "at 100 percent one endpoint is always kept", endpoints: 2, percent: 100,
            [
                Step(.fail(0)), Step(.fail(0)), Step(.fail(0), .ejected(0, untilMilliseconds: 10_000)),
                Step(.fail(1)), Step(.fail(1)), Step(.fail(1)), Step(.fail(1)),
                Step(.pick(preferred: 0), .picked(1)),
            ]),
        Scenario(
            "at 100 percent all but one may go, and picks wrap around to it", endpoints: 3, failures: 1, percent: 100,
            [
                Step(.fail(1), .ejected(1, untilMilliseconds: 10_000)),
                Step(.fail(2), .ejected(2, untilMilliseconds: 10_000)),
                Step(.fail(0)),
                Step(.pick(preferred: 1), .picked(0)),
                Step(.pick(preferred: 2), .picked(0)),
            ]),
        Scenario(
            "a share smaller than one endpoint ejects none", endpoints: 3, failures: 1, percent: 30,
            [Step(.fail(0)), Step(.fail(0)), Step(.pick(preferred: 0), .picked(0))]),
        Scenario(
            "0 percent never ejects", endpoints: 10, failures: 1, percent: 0,
            [Step(.fail(0)), Step(.fail(0)), Step(.pick(preferred: 0), .picked(0))]),
        Scenario(
            "a single endpoint is never ejected", endpoints: 1, failures: 1, percent: 100,
            [Step(.fail(0)), Step(.fail(0)), Step(.pick(preferred: 0), .picked(0))]),
    ]

    @Test(arguments: scenarios)
    func ejection(_ scenario: Scenario) {
        let clock = ManualClock()
        let start = clock.now()
        var c = OutlierDetector.Configuration()
        c.consecutiveFailures = scenario.failures
        c.maxEjectedPercent = scenario.percent
        var detector = OutlierDetector(endpoints: scenario.endpoints, configuration: c)
        for (i, step) in scenario.steps.enumerated() {
            let now = clock.now()
            var decision = Decision.none
            switch step.event {
            case let .fail(e), let .succeed(e):
                let failure: Bool
                if case .fail = step.event { failure = true } else { failure = false }
                if case let .ejected(endpoint, until) = detector.record(endpoint: e, failure: failure, at: now) {
                    decision = .ejected(endpoint, untilMilliseconds: Int((until - start).nanoseconds / 1_000_000))
                }
            case let .advance(ms):
                clock.advance(by: .milliseconds(ms))
            case let .pick(preferred):
                decision = .picked(detector.pick(preferred: preferred, at: now))
            }
            #expect(decision == step.decision, "step \(i)")
        }
    }

    @Test func ejectedEndpointsAreListedUntilTheirTimeIsUp() {
        let clock = ManualClock()
        var c = OutlierDetector.Configuration()
        c.consecutiveFailures = 1
        c.baseEjection = .seconds(2)
        var detector = OutlierDetector(endpoints: 4, configuration: c)
        _ = detector.record(endpoint: 3, failure: true, at: clock.now())
        #expect(detector.ejected(at: clock.now()) == [3])
        #expect(detector.isEjected(3, at: clock.now()))
        clock.advance(by: .seconds(2))
        #expect(detector.ejected(at: clock.now()).isEmpty)
    }

    @Test func anEjectionRestartsTheCount() {
        let clock = ManualClock()
        var c = OutlierDetector.Configuration()
        c.consecutiveFailures = 2
        var detector = OutlierDetector(endpoints: 2, configuration: c)
        _ = detector.record(endpoint: 0, failure: true, at: clock.now())
        #expect(detector.consecutiveFailures(of: 0) == 1)
        _ = detector.record(endpoint: 0, failure: true, at: clock.now())
        #expect(detector.consecutiveFailures(of: 0) == 0)
    }

    // MARK: - Configuration

    /// The defaults are the values ejection had before it was configurable.
    @Test func defaultsAreTheFormerFixedValues() {
        let c = OutlierDetector.Configuration()
        #expect(c.consecutiveFailures == 5)
        #expect(c.baseEjection == .seconds(10))
        #expect(c.baseEjectionNanoseconds == 10_000_000_000)
        #expect(c.maxEjectedPercent == 50)
        #expect(c.validate().isEmpty)
    }

    @Test func baseEjectionKeepsItsNanosecondsInStep() {
        var c = OutlierDetector.Configuration()
        c.baseEjection = .milliseconds(1500)
        #expect(c.baseEjectionNanoseconds == 1_500_000_000)
    }

    static let invalid: [(Int, Duration, Int, [String])] = [
        (0, .seconds(1), 50, ["outlier_detection.consecutive_failures must be at least 1, got 0"]),
        (1, .zero, 50, ["outlier_detection.base_ejection must be longer than zero"]),
        (1, .seconds(-1), 50, ["outlier_detection.base_ejection must be longer than zero"]),
        (1, .seconds(1), 101, ["outlier_detection.max_ejected_percent must be between 0 and 100, got 101"]),
        (1, .seconds(1), -1, ["outlier_detection.max_ejected_percent must be between 0 and 100, got -1"]),
        (1, .seconds(1), 0, []),
        (1, .seconds(1), 100, []),
        (
            -2, .zero, 200,
            [
                "outlier_detection.consecutive_failures must be at least 1, got -2",
                "outlier_detection.base_ejection must be longer than zero",
                "outlier_detection.max_ejected_percent must be between 0 and 100, got 200",
            ]
        ),
    ]

    @Test(arguments: invalid)
    func validationMessages(failures: Int, ejection: Duration, percent: Int, messages: [String]) {
        var c = OutlierDetector.Configuration()
        c.consecutiveFailures = failures
        c.baseEjection = ejection
        c.maxEjectedPercent = percent
        #expect(c.validate() == messages)
    }
}
