import HappyPathCore
import HappyPathPolicies
import Testing

/// Hedging in the exchange's state machine, as tables of events and the
/// decisions they produce on a manual clock: when a hedge goes, when it is
/// skipped and why, and how the ends of several tries in flight are
/// counted (a failure beside another try does not end the request).
@Suite struct ExchangeHedgingTests {
    typealias M = ExchangeStateMachine

    static let t0 = Instant(nanoseconds: 1_000_000_000)

    /// 5 s deadline, `attempts` tries, 3 s per try, no jitter (backoff 50 ms).
    static func machine(
        attempts: Int = 3, method: String = "GET", idempotencyKey: Bool = false, maxExtra: Int = 1
    ) -> M {
        var retry = RetryPolicy.Configuration()
        retry.attempts = attempts
        retry.perTryTimeout = .seconds(3)
        retry.backoffBase = .milliseconds(50)
        retry.jitter = false
        var m = M(
            .init(
                deadline: t0 + .seconds(5), retry: RetryPolicy(retry), parkFor: .zero, parkWhileOpen: false, endpoints: 2,
                method: method, hasIdempotencyKey: idempotencyKey, refreshOn: [], hedgeMaxExtra: maxExtra))
        #expect(m.start() == .admit)
        #expect(m.admitted(.send(probe: false), at: t0) == .send(attempt: 1, limit: .seconds(3)))
        return m
    }

    static func answered(_ status: Int) -> M.TryEnd { .answered(status: status, retryAfter: nil, withToken: false) }

    /// A due hedge as the driver walks it: `hedgeDue`, then admission if
    /// asked, then the budget if asked, each answered with the given value.
    struct Hedged {
        var decision: M.HedgeDecision
        var admitAsked = false
        var budgetAsked = false
    }

    static func hedge(_ m: inout M, at now: Instant, admit: Bool = true, budget: Bool = true) -> Hedged {
        var hedged = Hedged(decision: m.hedgeDue(at: now))
        if hedged.decision == .admit {
            hedged.admitAsked = true
            hedged.decision = m.hedgeAdmitted(admit)
        }
        if hedged.decision == .withdrawBudget {
            hedged.budgetAsked = true
            hedged.decision = m.hedgeBudget(granted: budget)
        }
        return hedged
    }

    @Test func aHedgeGoesBesideTheTryInFlight() {
        var m = Self.machine()
        #expect(m.mayHedge)
        let now = Self.t0 + .milliseconds(50)
        #expect(Self.hedge(&m, at: now, admit: true, budget: true).decision == .send(attempt: 2, limit: .seconds(3)))
        #expect(m.inFlight == 2)
        #expect(m.hedges == 1)
        // max_extra 1: no second hedge while this one is out.
        #expect(!m.mayHedge)
        #expect(Self.hedge(&m, at: now, admit: true, budget: true).decision == .none)
        // The hedge's head wins: the first try is cancelled; one try goes on.
        m.othersCancelled()
        #expect(m.inFlight == 1)
        #expect(m.streamingStarted(status: 200) == .stream)
        #expect(m.tryEnded(Self.answered(200), breakerOpen: false, at: now, random: 0) == .finish(.completed, abandonProbe: false))
        #expect(m.attempt == 2)
    }

    /// Only requests the retry rules may repeat: a POST without an
    /// Idempotency-Key never, with one always.
    @Test(arguments: [("POST", false, false), ("POST", true, true), ("GET", false, true), ("PUT", false, true)])
    func onlyRepeatableRequestsAreHedged(method: String, key: Bool, hedged: Bool) {
        var m = Self.machine(method: method, idempotencyKey: key)
        #expect(m.mayHedge == hedged)
        var asked = false
        let hedge = Self.hedge(&m, at: Self.t0)
        asked = hedge.admitAsked
        #expect(hedge.decision == (hedged ? .send(attempt: 2, limit: .seconds(3)) : .none))
        #expect(asked == hedged)
    }

    /// An `Idempotency-Key` with nothing in it is not a key: a POST that
    /// carries one is neither hedged nor retried after it may have reached
    /// the upstream; a key with a value makes it both.
    @Test(arguments: [("", false), ("   ", false), ("\t", false), (" \t ", false), ("k-1", true), (" k ", true)])
    func aPostWithAnEmptyIdempotencyKeyIsNeitherHedgedNorRetried(key: String, repeatable: Bool) {
        var retry = RetryPolicy.Configuration()
        retry.jitter = false
        retry.backoffBase = .milliseconds(50)
        let settings = M.Settings(
            deadline: Self.t0 + .seconds(5), retry: RetryPolicy(retry), parkFor: .zero, parkWhileOpen: false, endpoints: 2,
            method: "POST", idempotencyKey: key, refreshOn: [], hedgeMaxExtra: 1)
        #expect(settings.hasIdempotencyKey == repeatable)
        var m = M(settings)
        _ = m.start()
        _ = m.admitted(.send(probe: false), at: Self.t0)
        #expect(m.mayHedge == repeatable)
        let hedge = Self.hedge(&m, at: Self.t0 + .milliseconds(50), admit: true, budget: true).decision
        #expect(hedge == (repeatable ? .send(attempt: 2, limit: .seconds(3)) : .none))
        // Its first try got a 503: a keyed request is tried again, one with an empty key gets the 503.
        var r = M(settings)
        _ = r.start()
        _ = r.admitted(.send(probe: false), at: Self.t0)
        var after503 = r.tryEnded(Self.answered(503), breakerOpen: false, at: Self.t0 + .milliseconds(100), random: 0)
        if after503 == .withdrawRetry { after503 = r.retryBudget(granted: true) }
        let answered503 = M.Action.answer(.upstreamAnswer(status: 503), abandonProbe: false)
        #expect(after503 == (repeatable ? .backOff(.milliseconds(50)) : answered503))
    }

    @Test func skippedWhenAttemptsAdmissionOrBudgetSaySo() {
        var one = Self.machine(attempts: 1)
        #expect(Self.hedge(&one, at: Self.t0, admit: true, budget: true).decision == .skip(.attempts))
        var closed = Self.machine()
        let refused = Self.hedge(&closed, at: Self.t0, admit: false)
        #expect(refused.decision == .skip(.admission))
        #expect(!refused.budgetAsked)  // a refused hedge spends no budget
        var broke = Self.machine()
        #expect(Self.hedge(&broke, at: Self.t0, admit: true, budget: false).decision == .skip(.budget))
        #expect(broke.inFlight == 1)
        #expect(broke.attempt == 1)
    }

    /// A retryable failure of one try while another is out does not end the
    /// request: it is noted, and the other goes on; the last try's end
    /// goes through the retry rules as usual.
    @Test func aFailureBesideAnotherTryIsNotedNotAnswered() {
        var m = Self.machine()
        _ = Self.hedge(&m, at: Self.t0, admit: true, budget: true).decision
        let now = Self.t0 + .milliseconds(100)
        #expect(m.tryEnded(Self.answered(503), breakerOpen: false, at: now, random: 0) == .none)
        #expect(m.state == .trying)
        #expect(m.inFlight == 1)
        #expect(m.tryEnded(.failed(.init(.reset, "m")), breakerOpen: false, at: now, random: 0) == .withdrawRetry)
        #expect(m.retryBudget(granted: true) == .backOff(.milliseconds(100)))
        #expect(m.history == ["503", "connection reset"])
        // The retry goes out as try 3 (the hedge was try 2), and may be hedged again.
        _ = m.timerFired(at: now + .milliseconds(100))
        #expect(m.admitted(.send(probe: false), at: now + .milliseconds(100)) == .send(attempt: 3, limit: .seconds(3)))
        #expect(m.mayHedge)
        #expect(Self.hedge(&m, at: now, admit: true, budget: true).decision == .skip(.attempts))
    }

    /// A try timing out beside a hedge: noted, the hedge goes on.
    @Test func aTimeoutBesideAHedge() {
        var m = Self.machine()
        _ = Self.hedge(&m, at: Self.t0, admit: true, budget: true).decision
        #expect(m.timerFired(at: Self.t0 + .seconds(3)) == .cancelTry)
        #expect(m.tryEnded(.failed(.init(.timeout, "timeout")), breakerOpen: false, at: Self.t0 + .seconds(3), random: 0) == .none)
        #expect(m.state == .trying)
        #expect(m.history == ["timeout"])
    }

    @Test func twoExtrasAtOnce() {
        var m = Self.machine(attempts: 4, maxExtra: 2)
        #expect(Self.hedge(&m, at: Self.t0, admit: true, budget: true).decision == .send(attempt: 2, limit: .seconds(3)))
        #expect(m.mayHedge)
        #expect(Self.hedge(&m, at: Self.t0, admit: true, budget: true).decision == .send(attempt: 3, limit: .seconds(3)))
        #expect(!m.mayHedge)
        #expect(m.inFlight == 3)
        m.othersCancelled()
        #expect(m.inFlight == 1)
    }

    /// Not due once nothing is in flight any more, nor past the deadline.
    @Test func notDueOutsideTrying() {
        var m = Self.machine()
        _ = m.clientGone()
        #expect(Self.hedge(&m, at: Self.t0, admit: true, budget: true).decision == .none)
        var late = Self.machine()
        #expect(Self.hedge(&late, at: Self.t0 + .seconds(5), admit: true, budget: true).decision == .none)
    }

    /// The steps of a due hedge, one event each: admission is asked after
    /// the attempt count, the budget only after admission; an answer with
    /// no question pending is ignored.
    @Test func aDueHedgeAsksAdmissionThenTheBudget() {
        var m = Self.machine()
        #expect(m.hedgeAdmitted(true) == .none)
        #expect(m.hedgeBudget(granted: true) == .none)
        #expect(m.hedgeDue(at: Self.t0) == .admit)
        #expect(m.hedgeBudget(granted: true) == .none, "the budget before admission")
        #expect(m.inFlight == 1)
        #expect(m.hedgeDue(at: Self.t0) == .admit)
        #expect(m.hedgeAdmitted(true) == .withdrawBudget)
        #expect(m.inFlight == 1)
        #expect(m.hedgeBudget(granted: true) == .send(attempt: 2, limit: .seconds(3)))
        #expect(m.inFlight == 2)
        #expect(m.hedgeBudget(granted: true) == .none, "answered once")
        #expect(m.attempt == 2)
    }

    @Test func aRefusedBudgetSkipsTheHedgeAndSpendsNoAttempt() {
        var m = Self.machine()
        #expect(m.hedgeDue(at: Self.t0) == .admit)
        #expect(m.hedgeAdmitted(true) == .withdrawBudget)
        #expect(m.hedgeBudget(granted: false) == .skip(.budget))
        #expect(m.attempt == 1)
        #expect(m.hedges == 0)
        #expect(m.hedgeAdmitted(true) == .none)
    }

    /// The try ended while the hedge was being admitted: nothing goes.
    @Test func noHedgeOnceTheTryEnded() {
        var m = Self.machine()
        #expect(m.hedgeDue(at: Self.t0) == .admit)
        _ = m.clientGone()
        #expect(m.hedgeAdmitted(true) == .none)
        #expect(m.hedgeBudget(granted: true) == .none)
    }

    /// The delay: fixed, or the observed p95 clamped (max until enough was seen).
    @Test func hedgeDelay() {
        #expect(HedgeConfiguration(after: .fixed(.milliseconds(50))).delay(observed: .seconds(9)) == .milliseconds(50))
        var p95 = HedgeConfiguration(after: .p95)
        p95.min = .milliseconds(10)
        p95.max = .seconds(1)
        #expect(p95.delay(observed: nil) == .seconds(1))
        #expect(p95.delay(observed: .milliseconds(2)) == .milliseconds(10))
        #expect(p95.delay(observed: .milliseconds(200)) == .milliseconds(200))
        #expect(p95.delay(observed: .seconds(5)) == .seconds(1))
    }
}
