import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct BackoffTests {
    let policy: RetryPolicy = {
        var c = RetryPolicy.Configuration()
        c.backoffBase = .milliseconds(50)
        c.backoffMax = .milliseconds(300)
        return RetryPolicy(c)
    }()

    @Test(arguments: [(1, 50), (2, 100), (3, 200), (4, 300), (10, 300), (80, 300)])
    func upperBoundDoublesUpToMax(attempt: Int, ms: Int) {
        #expect(policy.backoff(afterAttempt: attempt, random: 1) == .milliseconds(ms))
        #expect(policy.backoff(afterAttempt: attempt, random: 0) == .zero)
    }

    @Test func fullJitterSpreadsAcrossTheRange() {
        let delays = stride(from: 0.0, to: 1.0, by: 0.1).map { policy.backoff(afterAttempt: 3, random: $0) }
        #expect(Set(delays).count == 10)
        #expect(delays.allSatisfy { $0 >= .zero && $0 <= .milliseconds(200) })
        #expect(delays.first == .zero)
    }

    @Test func withoutJitterTheDelayIsExact() {
        var c = RetryPolicy.Configuration()
        c.jitter = false
        #expect(RetryPolicy(c).backoff(afterAttempt: 2, random: 0) == .milliseconds(100))
    }

    @Test func validationMessages() {
        var c = RetryPolicy.Configuration()
        c.attempts = 0
        c.backoffBase = .seconds(3)
        #expect(c.validate() == ["retry.attempts must be at least 1", "retry.backoff.max must not be shorter than backoff.base"])
    }
}

@Suite struct RetryDecisionTests {
    let policy = RetryPolicy(RetryPolicy.Configuration())

    func failure(
        _ outcome: Outcome, attempt: Int = 1, method: String = "GET", key: Bool = false, neverSent: Bool = false,
        retryAfter: Duration? = nil
    ) -> RetryPolicy.Failure {
        RetryPolicy.Failure(
            outcome: outcome, attempt: attempt, method: method, hasIdempotencyKey: key, neverSent: neverSent,
            retryAfter: retryAfter)
    }

    func decide(_ f: RetryPolicy.Failure, remaining: Duration = .seconds(10), budget: Bool = true) -> RetryPolicy.Decision {
        policy.decide(f, remaining: remaining, random: 0.5, budget: { budget })
    }

    @Test func retriesAListedStatus() {
        #expect(decide(failure(.serverError(status: 503))) == .retry(after: .milliseconds(25)))
    }

    @Test func doesNotRetryAnUnlistedOutcome() {
        #expect(decide(failure(.serverError(status: 500))) == .giveUp(.notRetryable))
        #expect(decide(failure(.clientError(status: 404))) == .giveUp(.notRetryable))
    }

    @Test func stopsAfterTheLastAttempt() {
        #expect(decide(failure(.timeout, attempt: 3)) == .giveUp(.attemptsExhausted))
        #expect(decide(failure(.timeout, attempt: 2)) != .giveUp(.attemptsExhausted))
    }

    @Test func doesNotRetryPostWithoutIdempotencyKey() {
        #expect(decide(failure(.serverError(status: 503), method: "POST")) == .giveUp(.unsafeMethod))
        #expect(decide(failure(.reset, method: "PATCH")) == .giveUp(.unsafeMethod))
    }

    @Test func retriesPostWithIdempotencyKeyOrWhenItNeverLeft() {
        #expect(decide(failure(.serverError(status: 503), method: "POST", key: true)) == .retry(after: .milliseconds(25)))
        #expect(decide(failure(.unreachable, method: "POST", neverSent: true)) == .retry(after: .milliseconds(25)))
    }

    @Test func retryAfterSetsTheDelay() {
        #expect(decide(failure(.serverError(status: 503), retryAfter: .seconds(1))) == .retry(after: .seconds(1)))
    }

    @Test func noTryThatCannotFinishBeforeTheDeadline() {
        #expect(decide(failure(.serverError(status: 503), retryAfter: .seconds(2)), remaining: .seconds(1)) == .giveUp(.deadline))
        #expect(decide(failure(.timeout), remaining: .milliseconds(10)) == .giveUp(.deadline))
    }

    @Test func budgetIsAskedLast() {
        var asked = 0
        _ = policy.decide(failure(.serverError(status: 500)), remaining: .seconds(5), random: 0) {
            asked += 1; return true
        }
        #expect(asked == 0)
        #expect(decide(failure(.timeout), budget: false) == .giveUp(.budgetExhausted))
    }
}

@Suite struct RetryAfterTests {
    @Test func seconds() {
        #expect(RetryAfter.parse("5", nowUnixSeconds: 0) == .seconds(5))
        #expect(RetryAfter.parse(" 0 ", nowUnixSeconds: 0) == .zero)
        #expect(RetryAfter.parse("-3", nowUnixSeconds: 0) == nil)
    }

    @Test func httpDate() {
        // 1994-11-06 08:49:37 UTC = 784111777
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") == 784_111_777)
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:49:47 GMT", nowUnixSeconds: 784_111_777) == .seconds(10))
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:49:37 GMT", nowUnixSeconds: 784_111_800) == .zero)
    }

    @Test(arguments: ["soon", "", "Sun, 06 Nov 1994 08:49:37 CET", "Sun, 32 Nov 1994 08:49:37 GMT"])
    func garbage(value: String) { #expect(RetryAfter.parse(value, nowUnixSeconds: 0) == nil) }
}

@Suite struct RetryBudgetTests {
    @Test func floorAllowsMinPerSecondWithoutTraffic() {
        let clock = ManualClock()
        var budget = RetryBudget(ratio: 0.2, minPerSecond: 1, windowSeconds: 10)
        var granted = 0
        for _ in 0..<20 where budget.tryWithdraw(at: clock.now()) { granted += 1 }
        #expect(granted == 10)
    }

    @Test func ratioOfRequestsOnTopOfTheFloor() {
        let clock = ManualClock()
        var budget = RetryBudget(ratio: 0.2, minPerSecond: 0, windowSeconds: 10)
        for _ in 0..<100 { budget.recordRequest(at: clock.now()) }
        var granted = 0
        for _ in 0..<100 where budget.tryWithdraw(at: clock.now()) { granted += 1 }
        #expect(granted == 20)
    }

    /// A slow upstream at 5 requests a second, every request due a hedge:
    /// the floor (10 a second) would grant them all; hedges get only the
    /// ratio, so over the 10 s window they add at most 20 % to the load.
    @Test func hedgesSpendOnlyTheRatioNotTheFloor() {
        let clock = ManualClock()
        var budget = RetryBudget(ratio: 0.2, minPerSecond: 10, windowSeconds: 10)
        var hedges = 0
        for i in 0..<50 {
            if i > 0 { clock.advance(by: .milliseconds(200)) }
            budget.recordRequest(at: clock.now())
            if budget.tryWithdrawHedge(at: clock.now()) { hedges += 1 }
        }
        #expect(hedges == 10)
        // Retries still have the floor and the ratio (100 + 10), less what the hedges spent.
        var retries = 0
        for _ in 0..<200 where budget.tryWithdraw(at: clock.now()) { retries += 1 }
        #expect(retries == 100)
        // With the ratio spent by retries, no hedge.
        budget.recordRequest(at: clock.now())
        let spentHedge = budget.tryWithdrawHedge(at: clock.now())
        #expect(!spentHedge)
    }

    /// A quiet upstream: one request, no hedge at the default ratio, one
    /// at ratio 1 (hedging at most doubles the load).
    @Test func aQuietUpstreamIsHedgedOnlyWithinTheRatio() {
        let clock = ManualClock()
        var byDefault = RetryBudget(ratio: 0.2, minPerSecond: 10)
        byDefault.recordRequest(at: clock.now())
        let quietHedge = byDefault.tryWithdrawHedge(at: clock.now())
        #expect(!quietHedge && byDefault.retryAvailable(at: clock.now()))  // skipped, not exhausted
        let quietRetry = byDefault.tryWithdraw(at: clock.now())
        #expect(quietRetry)
        var whole = RetryBudget(ratio: 1, minPerSecond: 0)
        whole.recordRequest(at: clock.now())
        let one = whole.tryWithdrawHedge(at: clock.now())
        let two = whole.tryWithdrawHedge(at: clock.now())
        #expect(one && !two)
    }

    @Test func oldTrafficLeavesTheWindow() {
        let clock = ManualClock()
        var budget = RetryBudget(ratio: 0.5, minPerSecond: 0, windowSeconds: 2)
        for _ in 0..<10 { budget.recordRequest(at: clock.now()) }
        let first = budget.tryWithdraw(at: clock.now())
        #expect(first)
        clock.advance(by: .seconds(3))
        let later = budget.tryWithdraw(at: clock.now())
        #expect(!later)
    }
}

@Suite struct SlidingWindowTests {
    @Test func countsOnlyTheLastSeconds() {
        let clock = ManualClock()
        var w = SlidingWindow(seconds: 3)
        w.add(first: 2, second: 1, at: clock.now())
        clock.advance(by: .seconds(1))
        w.add(first: 1, at: clock.now())
        #expect(w.totals(at: clock.now()) == (3, 1))
        clock.advance(by: .seconds(2))
        #expect(w.totals(at: clock.now()) == (1, 0))
        clock.advance(by: .seconds(5))
        #expect(w.totals(at: clock.now()) == (0, 0))
    }
}
