import HappyPathCore
import HappyPathPolicies
import Testing

/// `Partial`: one level's settings, "not set" apart from the defaults.
@Suite struct PartialTests {
    typealias Retry = Partial<RetryPolicy.Configuration>

    static func retry(attempts: Int? = nil, perTry: Duration? = nil) -> Retry {
        var p = Retry()
        p.set(\.attempts, attempts)
        p.set(\.perTryTimeout, perTry)
        return p
    }

    /// route over upstream over defaults: the first level that sets a field
    /// gives it; a field none sets keeps the configuration's default.
    @Test(
        arguments: [
            // (route, upstream, defaults) attempts → resolved attempts
            (nil, nil, nil, 3), (nil, nil, 5, 5), (nil, 2, 5, 2), (4, 2, 5, 4), (4, nil, nil, 4), (1, nil, 5, 1),
        ] as [(Int?, Int?, Int?, Int)])
    func theNearestLevelThatSetsAFieldWins(route: Int?, upstream: Int?, defaults: Int?, expected: Int) {
        let merged = Self.retry(attempts: route).merged(over: Self.retry(attempts: upstream))
            .merged(over: Self.retry(attempts: defaults))
        #expect(merged.resolved().attempts == expected)
        #expect(merged.attempts == route ?? upstream ?? defaults)
    }

    /// Setting a field to its default is not leaving it unset: it still
    /// hides what a level below sets.
    @Test func aFieldSetToItsDefaultStillOverridesTheLevelBelow() {
        let route = Self.retry(attempts: 3)
        #expect(route.isSet(\.attempts))
        #expect(route.merged(over: Self.retry(attempts: 7)).resolved().attempts == 3)
        #expect(Retry().merged(over: Self.retry(attempts: 7)).resolved().attempts == 7)
    }

    @Test func fieldsOfDifferentLevelsCombine() {
        let merged = Self.retry(attempts: 2).merged(over: Self.retry(perTry: .milliseconds(250)))
        #expect(merged.resolved().attempts == 2)
        #expect(merged.resolved().perTryTimeout == .milliseconds(250))
        #expect(merged.resolved().backoffMax == RetryPolicy.Configuration().backoffMax)
    }

    @Test func aNilValueLeavesTheFieldAsItWas() {
        var p = Self.retry(attempts: 4)
        p.set(\.attempts, nil)
        #expect(p.attempts == 4)
        #expect(Retry().isEmpty && Retry().attempts == nil)
        p.set(\.attempts, 6)
        #expect(p.attempts == 6)
    }

    /// Written through the key path, so property observers run: `on`
    /// keeps the `statuses` looked up on every answer in step.
    @Test func settingAFieldRunsItsObservers() {
        var p = Retry()
        p.set(\.on, ["429", "timeout"])
        #expect(p.resolved().statuses == [429])
        var o = Partial<OutlierDetector.Configuration>()
        o.set(\.baseEjection, .seconds(30))
        #expect(o.resolved().baseEjectionNanoseconds == 30_000_000_000)
    }

    @Test(arguments: [
        (Self.retry(attempts: 2), Self.retry(attempts: 2), true),
        (Self.retry(attempts: 2), Self.retry(attempts: 4), false),
        // The same resolved values, but one sets the field and one does not.
        (Self.retry(attempts: 3), Retry(), false),
        (
            Self.retry(attempts: 2, perTry: .seconds(1)), Self.retry(perTry: .seconds(1)).merged(over: Self.retry(attempts: 2)),
            true
        ),
    ])
    func equalMeansTheSameFieldsSetToTheSameValues(a: Retry, b: Retry, equal: Bool) {
        #expect((a == b) == equal)
    }

    /// Every policy's defaults, as docs/configuration.md lists them.
    @Test func theDefaultsAreTheDocumentedOnes() {
        #expect(TimeoutConfiguration().timeout == .seconds(10))
        #expect(ReachabilityConfiguration().parkFor == .seconds(10))
        let h = HealthCheckConfiguration()
        #expect(h.path == "/healthz" && h.interval == .seconds(2) && h.timeout == .seconds(1))
        #expect(h.unhealthyAfter == 3 && h.healthyAfter == 1 && h.grpc == nil)
        let b = RetryBudget.Configuration()
        #expect(b.ratio == 0.2 && b.minPerSecond == 10)
        #expect(CircuitBreakerStateMachine.Configuration().whileOpen == .park)
    }
}
