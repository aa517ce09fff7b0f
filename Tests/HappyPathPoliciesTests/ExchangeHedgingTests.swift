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

    @Test func aHedgeGoesBesideTheTryInFlight() {
        var m = Self.machine()
        #expect(m.mayHedge)
        let now = Self.t0 + .milliseconds(50)
        #expect(m.hedgeDue(at: now, admit: { true }, budget: { true }) == .send(attempt: 2, limit: .seconds(3)))
        #expect(m.inFlight == 2)
        #expect(m.hedges == 1)
        // max_extra 1: no second hedge while this one is out.
        #expect(!m.mayHedge)
        #expect(m.hedgeDue(at: now, admit: { true }, budget: { true }) == .none)
        // The hedge's head wins: the first try is cancelled; one try goes on.
        m.othersCancelled()
        #expect(m.inFlight == 1)
        #expect(m.streamingStarted(status: 200) == .stream)
        #expect(m.tryEnded(Self.answered(200), breakerOpen: false, at: now, random: 0) { true } == .finish(.completed, abandonProbe: false))
        #expect(m.attempt == 2)
    }

    /// Only requests the retry rules may repeat: a POST without an
    /// Idempotency-Key never, with one always.
    @Test(arguments: [("POST", false, false), ("POST", true, true), ("GET", false, true), ("PUT", false, true)])
    func onlyRepeatableRequestsAreHedged(method: String, key: Bool, hedged: Bool) {
        var m = Self.machine(method: method, idempotencyKey: key)
        #expect(m.mayHedge == hedged)
        var asked = false
        let decision = m.hedgeDue(at: Self.t0, admit: { asked = true; return true }, budget: { true })
        #expect(decision == (hedged ? .send(attempt: 2, limit: .seconds(3)) : .none))
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
        let hedge = m.hedgeDue(at: Self.t0 + .milliseconds(50), admit: { true }, budget: { true })
        #expect(hedge == (repeatable ? .send(attempt: 2, limit: .seconds(3)) : .none))
        // Its first try got a 503: a keyed request is tried again, one with an empty key gets the 503.
        var r = M(settings)
        _ = r.start()
        _ = r.admitted(.send(probe: false), at: Self.t0)
        let after503 = r.tryEnded(Self.answered(503), breakerOpen: false, at: Self.t0 + .milliseconds(100), random: 0) {
            true
        }
        let answered503 = M.Action.answer(.upstreamAnswer(status: 503), abandonProbe: false)
        #expect(after503 == (repeatable ? .backOff(.milliseconds(50)) : answered503))
    }

    @Test func skippedWhenAttemptsAdmissionOrBudgetSaySo() {
        var one = Self.machine(attempts: 1)
        #expect(one.hedgeDue(at: Self.t0, admit: { true }, budget: { true }) == .skip(.attempts))
        var closed = Self.machine()
        var budgetAsked = false
        #expect(closed.hedgeDue(at: Self.t0, admit: { false }, budget: { budgetAsked = true; return true }) == .skip(.admission))
        #expect(!budgetAsked)  // a refused hedge spends no budget
        var broke = Self.machine()
        #expect(broke.hedgeDue(at: Self.t0, admit: { true }, budget: { false }) == .skip(.budget))
        #expect(broke.inFlight == 1)
        #expect(broke.attempt == 1)
    }

    /// A retryable failure of one try while another is out does not end the
    /// request: it is noted, and the other goes on; the last try's end
    /// goes through the retry rules as usual.
    @Test func aFailureBesideAnotherTryIsNotedNotAnswered() {
        var m = Self.machine()
        _ = m.hedgeDue(at: Self.t0, admit: { true }, budget: { true })
        let now = Self.t0 + .milliseconds(100)
        #expect(m.tryEnded(Self.answered(503), breakerOpen: false, at: now, random: 0) { true } == .none)
        #expect(m.state == .trying)
        #expect(m.inFlight == 1)
        #expect(m.tryEnded(.failed(.init(.reset, "m")), breakerOpen: false, at: now, random: 0) { true } == .backOff(.milliseconds(100)))
        #expect(m.history == ["503", "connection reset"])
        // The retry goes out as try 3 (the hedge was try 2), and may be hedged again.
        _ = m.timerFired(at: now + .milliseconds(100))
        #expect(m.admitted(.send(probe: false), at: now + .milliseconds(100)) == .send(attempt: 3, limit: .seconds(3)))
        #expect(m.mayHedge)
        #expect(m.hedgeDue(at: now, admit: { true }, budget: { true }) == .skip(.attempts))
    }

    /// A try timing out beside a hedge: noted, the hedge goes on.
    @Test func aTimeoutBesideAHedge() {
        var m = Self.machine()
        _ = m.hedgeDue(at: Self.t0, admit: { true }, budget: { true })
        #expect(m.timerFired(at: Self.t0 + .seconds(3)) == .cancelTry)
        #expect(m.tryEnded(.failed(.init(.timeout, "timeout")), breakerOpen: false, at: Self.t0 + .seconds(3), random: 0) { true } == .none)
        #expect(m.state == .trying)
        #expect(m.history == ["timeout"])
    }

    @Test func twoExtrasAtOnce() {
        var m = Self.machine(attempts: 4, maxExtra: 2)
        #expect(m.hedgeDue(at: Self.t0, admit: { true }, budget: { true }) == .send(attempt: 2, limit: .seconds(3)))
        #expect(m.mayHedge)
        #expect(m.hedgeDue(at: Self.t0, admit: { true }, budget: { true }) == .send(attempt: 3, limit: .seconds(3)))
        #expect(!m.mayHedge)
        #expect(m.inFlight == 3)
        m.othersCancelled()
        #expect(m.inFlight == 1)
    }

    /// Not due once nothing is in flight any more, nor past the deadline.
    @Test func notDueOutsideTrying() {
        var m = Self.machine()
        _ = m.clientGone()
        #expect(m.hedgeDue(at: Self.t0, admit: { true }, budget: { true }) == .none)
        var late = Self.machine()
        #expect(late.hedgeDue(at: Self.t0 + .seconds(5), admit: { true }, budget: { true }) == .none)
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
