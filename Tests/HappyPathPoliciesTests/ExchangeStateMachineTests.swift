import HappyPathCore
import HappyPathPolicies
import Testing

/// The life of one request, as a table: each scenario is a story of events
/// and the action and state each one must produce, on a manual clock. Read
/// top to bottom, this is the specification of retry, park, probe, auth
/// refresh, deadline, client hang-up and drain.
@Suite struct ExchangeStateMachineTests {
    typealias M = ExchangeStateMachine
    typealias Action = M.Action

    /// A route with a 5 s deadline, 3 attempts, 3 s per try, no jitter
    /// (backoff 50 ms, 100 ms, ...), park_for 10 s, one endpoint, GET.
    struct Route: Sendable {
        var attempts = 3
        var parkFor: Duration = .seconds(10)
        var parkWhileOpen = true
        var endpoints = 1
        var method = "GET"
        var idempotencyKey = false
        var refreshOn: Set<Int> = []
        var on: Set<String>? = nil
    }

    enum Event: CustomStringConvertible, Sendable {
        case start
        case admitted(Admission.Verdict)
        case slotGranted
        /// The upstream's queue shed the request.
        case shed(RequestPriority)
        case parkRefused
        case streaming(Int)
        /// The streaming try failed before its first byte reached the client.
        case streamUnsent
        /// A try ended; a `.withdrawRetry` it asks for is granted.
        case ended(M.TryEnd, breakerOpen: Bool = false)
        /// The budget has no retry left for this end (`.withdrawRetry` refused).
        case endedWithoutBudget(M.TryEnd)
        /// A try ended, and nothing more: the action is what `tryEnded` returns.
        case endedOnly(M.TryEnd)
        /// A pacing answer ended the try: a retry spends no budget.
        case endedPaced(M.TryEnd)
        /// The answer to `.withdrawRetry`.
        case retryBudget(granted: Bool)
        case timer
        case replay
        case tokenRefreshFailed(String)
        case clientGone
        case drain
        /// Time passes (no event).
        case wait(Duration)

        var description: String { "\(self)" }
    }

    struct Step: Sendable {
        let event: Event
        let action: Action
        let state: M.State?
        init(_ event: Event, _ action: Action = .none, _ state: M.State? = nil) {
            self.event = event
            self.action = action
            self.state = state
        }
    }

    struct Scenario: CustomTestStringConvertible, Sendable {
        let name: String
        let route: Route
        let steps: [Step]
        /// What `history` holds at the end (one word per failed try).
        let history: [String]?
        init(_ name: String, route: Route = Route(), history: [String]? = nil, _ steps: [Step]) {
            self.name = name
            self.route = route
            self.steps = steps
            self.history = history
        }
        var testDescription: String { name }
    }

    static let t0 = Instant(nanoseconds: 1_000_000_000)
    static let deadline = t0 + .seconds(5)

    static func ok(_ status: Int = 200) -> M.TryEnd { .answered(status: status, retryAfter: nil, withToken: false) }
    static func failed(_ kind: M.TryFailure.Kind, _ message: String = "m") -> M.TryEnd { .failed(.init(kind, message)) }
    static let send1: Action = .send(attempt: 1, limit: .seconds(3))

    static let scenarios: [Scenario] = [
        Scenario(
            "the happy path: one try, streamed",
            [
                Step(.start, .admit, .admitting),
                Step(.admitted(.send(probe: false)), send1, .trying),
                Step(.streaming(200), .stream, .streaming),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false), .finished),
                Step(.timer, .none, .finished),
                Step(.clientGone, .none, .finished),
            ]),
        Scenario(
            "a 503 is retried after backoff, then the answer streams",
            history: ["503"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(ok(503)), .backOff(.milliseconds(50)), .backingOff),
                Step(.wait(.milliseconds(50))),
                Step(.timer, .admit, .admitting),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3)), .trying),
                Step(.streaming(200), .stream),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false)),
            ]),
        Scenario(
            "three 503s: attempts exhausted, the last answer is mapped",
            history: ["503", "503", "503"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(ok(503)), .backOff(.milliseconds(50))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.ended(ok(503)), .backOff(.milliseconds(100))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 3, limit: .seconds(3))),
                Step(.ended(ok(503)), .answer(.upstreamAnswer(status: 503), abandonProbe: false), .finished),
            ]),
        Scenario(
            "a 404 is the upstream's answer: never retried",
            history: ["404"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(ok(404)), .answer(.upstreamAnswer(status: 404), abandonProbe: false), .finished),
            ]),
        Scenario(
            "Retry-After sets the next delay",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(.answered(status: 503, retryAfter: .seconds(2), withToken: false)), .backOff(.seconds(2))),
            ]),
        Scenario(
            "no budget left: the 503 is the answer",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.endedWithoutBudget(ok(503)), .answer(.upstreamAnswer(status: 503), abandonProbe: false)),
            ]),
        Scenario(
            "a try past per_try_timeout is cancelled and retried",
            history: ["timeout"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.wait(.seconds(3))),
                Step(.timer, .cancelTry, .trying),
                Step(.ended(failed(.timeout)), .backOff(.milliseconds(50)), .backingOff),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(2))),
            ]),
        Scenario(
            "the deadline ends a try: UPSTREAM_TIMEOUT",
            history: ["timeout", "timeout"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.wait(.seconds(3))),
                Step(.timer, .cancelTry),
                Step(.ended(failed(.timeout)), .backOff(.milliseconds(50))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(2))),
                Step(.wait(.seconds(2))),
                Step(.timer, .cancelTry),
                Step(.ended(failed(.timeout)), .answer(.timeout, abandonProbe: false), .finished),
            ]),
        Scenario(
            "the deadline passed before a try could start",
            [
                Step(.start, .admit),
                Step(.admitted(.refuse(.deadline)), .answer(.timeout, abandonProbe: false), .finished),
            ]),
        Scenario(
            "a POST whose connection reset is not sent again",
            route: Route(method: "POST"), history: ["connection reset"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.reset)), .answer(.unavailable, abandonProbe: false)),
            ]),
        Scenario(
            "a gRPC call's UNAVAILABLE that retry.on names is retried, though a POST; the next answer streams",
            route: Route(method: "POST", on: ["unavailable", "503"]), history: ["UNAVAILABLE"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(.grpcAnswered(status: 200, grpcStatus: .unavailable, retryAfter: nil)), .backOff(.milliseconds(50))),
                Step(.wait(.milliseconds(50))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.streaming(200), .stream),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false)),
            ]),
        Scenario(
            "a gRPC error retried until the attempts run out is the answer, as the upstream gave it",
            route: Route(attempts: 2, method: "POST", on: ["unavailable"]), history: ["UNAVAILABLE", "UNAVAILABLE"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(.grpcAnswered(status: 200, grpcStatus: .unavailable, retryAfter: .milliseconds(300))),
                     .backOff(.milliseconds(300))),
                Step(.wait(.milliseconds(300))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.ended(.grpcAnswered(status: 200, grpcStatus: .unavailable, retryAfter: nil)),
                     .answer(.upstreamAnswer(status: 200), abandonProbe: false), .finished),
            ]),
        Scenario(
            "a gRPC call's connection reset is not sent again (the method rule stands for what is not a gRPC status)",
            route: Route(method: "POST", on: ["unavailable", "reset"]), history: ["connection reset"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.reset)), .answer(.unavailable, abandonProbe: false)),
            ]),
        Scenario(
            "a POST with an Idempotency-Key is",
            route: Route(method: "POST", idempotencyKey: true),
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.reset)), .backOff(.milliseconds(50))),
            ]),
        Scenario(
            "a POST that never left (connect failure) is retried when nothing parks it",
            route: Route(parkFor: .zero, method: "POST"), history: ["connection failed"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.unreachable, "connection refused")), .backOff(.milliseconds(50))),
            ]),
        Scenario(
            "without connect-failure in retry.on, an unreachable upstream is the answer",
            route: Route(parkFor: .zero, endpoints: 2, on: ["503"]),
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.unreachable, "connection refused")), .answer(.unreachable, abandonProbe: false)),
            ]),
        Scenario(
            "an unreachable endpoint: the next one at once, then park until the upstream is back",
            route: Route(endpoints: 2),
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.unreachable)), .admit, .admitting),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.ended(failed(.unreachable)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Step(.wait(.seconds(1))),
                Step(.replay, .admit, .admitting),
                Step(.admitted(.send(probe: false)), .send(attempt: 3, limit: .seconds(3))),
                Step(.streaming(200), .stream),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false)),
            ]),
        Scenario(
            "parked until the deadline: UPSTREAM_UNREACHABLE says how long it waited",
            [
                Step(.start, .admit),
                Step(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Step(.wait(.seconds(5))),
                Step(.timer, .answer(.parkExpired(.unreachable, waited: .seconds(5), byDeadline: true), abandonProbe: false)),
            ]),
        Scenario(
            "parked until park_for ran out",
            route: Route(parkFor: .seconds(2)),
            [
                Step(.start, .admit),
                Step(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(2), probeAfter: nil)),
                Step(.wait(.seconds(1))),
                Step(.replay, .admit),
                // Still down: parks again, for what is left of the same park_for.
                Step(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(1), probeAfter: nil)),
                Step(.wait(.seconds(1))),
                Step(.timer, .answer(.parkExpired(.unreachable, waited: .seconds(2), byDeadline: false), abandonProbe: false)),
            ]),
        Scenario(
            "park_for 0: nothing waits",
            route: Route(parkFor: .zero),
            [
                Step(.start, .admit),
                Step(
                    .admitted(.park(.unreachable, probeAfter: nil)),
                    .answer(.parkExpired(.unreachable, waited: .zero, byDeadline: false), abandonProbe: false)),
            ]),
        Scenario(
            "the parking lot is full: OVERLOADED",
            [
                Step(.start, .admit),
                Step(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Step(.parkRefused, .answer(.overloaded(byParking: true), abandonProbe: false), .finished),
            ]),
        Scenario(
            "circuit open with while_open: park, then the probe closes it",
            [
                Step(.start, .admit),
                Step(
                    .admitted(.park(.circuitOpen, probeAfter: .seconds(4))),
                    .park(.circuitOpen, limit: .seconds(5), probeAfter: .seconds(4))),
                Step(.wait(.seconds(4))),
                Step(.replay, .admit),
                Step(.admitted(.send(probe: true)), .send(attempt: 1, limit: .seconds(1))),
                Step(.streaming(200), .stream),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false)),
            ]),
        Scenario(
            "a failed probe parks again instead of retrying",
            history: ["503"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: true)), send1),
                Step(.ended(ok(503), breakerOpen: true), .park(.circuitOpen, limit: .seconds(5), probeAfter: nil)),
            ]),
        Scenario(
            "circuit open with while_open: fail",
            route: Route(parkWhileOpen: false),
            [
                Step(.start, .admit),
                Step(.admitted(.refuse(.circuitOpen(retryAfter: .seconds(3)))), .answer(.circuitOpen(retryAfter: .seconds(3)), abandonProbe: false)),
            ]),
        Scenario(
            "no slot: the queue, then a slot",
            [
                Step(.start, .admit),
                Step(.admitted(.queue(probe: false)), .waitForSlot(limit: .seconds(5)), .queued),
                Step(.wait(.seconds(1))),
                Step(.slotGranted, .send(attempt: 1, limit: .seconds(3)), .trying),
            ]),
        Scenario(
            "no slot before the deadline: UPSTREAM_TIMEOUT, the probe's place given back",
            [
                Step(.start, .admit),
                Step(.admitted(.queue(probe: true)), .waitForSlot(limit: .seconds(5))),
                Step(.wait(.seconds(5))),
                Step(.timer, .answer(.timeout, abandonProbe: true), .finished),
                // The request left the queue: a slot that comes now goes back at once.
                Step(.slotGranted, .returnSlot, .finished),
            ]),
        Scenario(
            "shed from the queue: OVERLOADED naming its priority, the probe's place given back; a late slot goes back",
            [
                Step(.start, .admit),
                Step(.admitted(.queue(probe: true)), .waitForSlot(limit: .seconds(5)), .queued),
                Step(.shed(.sheddable), .answer(.shed(.sheddable), abandonProbe: true), .finished),
                Step(.slotGranted, .returnSlot, .finished),
                Step(.shed(.sheddable), .none, .finished),
            ]),
        Scenario(
            "a request not in the queue is never shed",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 1, limit: .seconds(3)), .trying),
                Step(.shed(.critical), .none, .trying),
            ]),
        Scenario(
            "queue and slots full: OVERLOADED",
            [
                Step(.start, .admit),
                Step(.admitted(.refuse(.overloaded)), .answer(.overloaded(byParking: false), abandonProbe: false)),
            ]),
        Scenario(
            "the token is refused: one refresh, then the retry with the new token",
            route: Route(refreshOn: [401]),
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(.answered(status: 401, retryAfter: nil, withToken: true)), .tokenRefused, .admitting),
                Step(.admitted(.park(.auth, probeAfter: nil)), .park(.auth, limit: .seconds(5), probeAfter: nil)),
                Step(.replay, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.streaming(200), .stream),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false)),
            ]),
        Scenario(
            "a freshly refreshed token refused again: AUTH_FAILED",
            route: Route(refreshOn: [401]),
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(.answered(status: 401, retryAfter: nil, withToken: true)), .tokenRefused),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(
                    .ended(.answered(status: 401, retryAfter: nil, withToken: true)),
                    .answer(.tokenRefusedAfterRefresh(status: 401), abandonProbe: false)),
            ]),
        Scenario(
            "a 401 without an injected token is the upstream's answer",
            route: Route(refreshOn: [401]),
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(ok(401)), .answer(.upstreamAnswer(status: 401), abandonProbe: false)),
            ]),
        Scenario(
            "the refresh a parked request waits for fails",
            route: Route(refreshOn: [401]),
            [
                Step(.start, .admit),
                Step(.admitted(.park(.auth, probeAfter: nil)), .park(.auth, limit: .seconds(5), probeAfter: nil)),
                Step(.tokenRefreshFailed("HTTP 500"), .answer(.tokenRefreshFailed(reason: "HTTP 500"), abandonProbe: false)),
            ]),
        Scenario(
            "the client hangs up during a probe: the probe's place is given back",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: true)), send1),
                Step(.clientGone, .finish(.clientClosed, abandonProbe: true), .finished),
                Step(.ended(ok()), .none, .finished),
            ]),
        Scenario(
            "the client hangs up during a backoff",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(ok(503)), .backOff(.milliseconds(50))),
                Step(.clientGone, .finish(.clientClosed, abandonProbe: false), .finished),
                Step(.timer, .none, .finished),
            ]),
        Scenario(
            "the client hangs up while parked",
            [
                Step(.start, .admit),
                Step(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Step(.clientGone, .finish(.clientClosed, abandonProbe: false), .finished),
                Step(.replay, .none, .finished),
            ]),
        Scenario(
            "the upstream fails mid-response: the client's connection is cut",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.streaming(200), .stream),
                Step(.ended(failed(.reset)), .finish(.truncated, abandonProbe: false)),
            ]),
        Scenario(
            "the upstream breaks off before the first byte left: a failed try, retried, then answered",
            history: ["invalid response"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.streaming(200), .stream, .streaming),
                Step(.streamUnsent, .none, .trying),
                Step(.ended(failed(.invalidResponse, "broke off after its head")), .backOff(.milliseconds(50)), .backingOff),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.streaming(200), .stream),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false), .finished),
            ]),
        Scenario(
            "a TLS failure towards the upstream is answered at once, with retries left: UPSTREAM_TLS",
            route: .init(attempts: 3, endpoints: 2),
            history: ["connection reset"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(
                    .ended(failed(.tls, "certificate verify failed")),
                    .answer(.upstreamTLS(message: "certificate verify failed"), abandonProbe: false), .finished),
                Step(.timer, .none, .finished),
            ]),
        Scenario(
            "the upstream breaks off before the first byte left, nothing left to try: BAD_GATEWAY",
            route: .init(attempts: 1),
            history: ["invalid response"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.streaming(200), .stream),
                Step(.streamUnsent, .none, .trying),
                Step(
                    .ended(failed(.invalidResponse, "broke off after its head")),
                    .answer(.badGateway(message: "broke off after its head"), abandonProbe: false), .finished),
            ]),
        Scenario(
            "a paused upstream: waits until its pause ends (the deadline, not park_for, bounds it), then goes",
            route: .init(parkFor: .seconds(1)),
            [
                Step(.start, .admit),
                Step(.admitted(.park(.paused, probeAfter: nil)), .park(.paused, limit: .seconds(5), probeAfter: nil)),
                Step(.wait(.seconds(2))),
                Step(.replay, .admit, .admitting),
                Step(.admitted(.send(probe: false)), send1),
            ]),
        Scenario(
            "a paused upstream past the deadline: the pause's own answer",
            [
                Step(.start, .admit),
                Step(.admitted(.park(.paused, probeAfter: nil)), .park(.paused, limit: .seconds(5), probeAfter: nil)),
                Step(.wait(.seconds(5))),
                Step(
                    .timer, .answer(.parkExpired(.paused, waited: .seconds(5), byDeadline: true), abandonProbe: false),
                    .finished),
            ]),
        Scenario(
            "a paused upstream with while_paused: fail answers at once",
            [
                Step(.start, .admit),
                Step(.admitted(.refuse(.paused)), .answer(.paused, abandonProbe: false), .finished),
            ]),
        Scenario(
            "a streaming body outlives the deadline",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.streaming(200), .stream),
                Step(.wait(.seconds(9))),
                Step(.timer, .none, .streaming),
                Step(.ended(ok()), .finish(.completed, abandonProbe: false)),
            ]),
        Scenario(
            "an invalid response, tried again, then BAD_GATEWAY",
            history: ["invalid response", "invalid response", "invalid response"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.ended(failed(.invalidResponse, "two Content-Length values")), .backOff(.milliseconds(50))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 2, limit: .seconds(3))),
                Step(.ended(failed(.invalidResponse, "two Content-Length values")), .backOff(.milliseconds(100))),
                Step(.timer, .admit),
                Step(.admitted(.send(probe: false)), .send(attempt: 3, limit: .seconds(3))),
                Step(
                    .ended(failed(.invalidResponse, "two Content-Length values")),
                    .answer(.badGateway(message: "two Content-Length values"), abandonProbe: false)),
            ]),
        Scenario(
            "drain: a streaming response is cut",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.streaming(200), .stream),
                Step(.drain, .finish(.drained, abandonProbe: false), .finished),
            ]),
        Scenario(
            "drain: a request still trying gets a retryable error",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.drain, .answer(.shuttingDown, abandonProbe: false), .finished),
            ]),
        Scenario(
            "drain: a parked request too",
            [
                Step(.start, .admit),
                Step(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Step(.drain, .answer(.shuttingDown, abandonProbe: false), .finished),
            ]),
    ]

    /// What the driver does to the machine's books as it performs `action`:
    /// the worker's lot takes a parked request; everything is let go when
    /// it is answered or finished, and the try's slot when it is cancelled.
    static func performBooks(_ action: Action, on machine: inout M) {
        switch action {
        case .park: machine.parkAccepted()
        case .cancelTry: _ = machine.releaseSlot()
        case .answer, .finish:
            _ = machine.releaseSlot()
            _ = machine.leaveLot()
        default: break
        }
    }

    @Test(arguments: scenarios + budgetScenarios)
    func lifeOfARequest(_ scenario: Scenario) {
        let clock = ManualClock(start: Self.t0)
        var retry = RetryPolicy.Configuration()
        retry.attempts = scenario.route.attempts
        retry.jitter = false
        if let on = scenario.route.on { retry.on = on }
        var machine = M(
            .init(
                deadline: Self.deadline, retry: RetryPolicy(retry), parkFor: scenario.route.parkFor,
                parkWhileOpen: scenario.route.parkWhileOpen, endpoints: scenario.route.endpoints,
                method: scenario.route.method, hasIdempotencyKey: scenario.route.idempotencyKey,
                refreshOn: scenario.route.refreshOn))
        for (i, step) in scenario.steps.enumerated() {
            let now = clock.now()
            var action: Action
            switch step.event {
            case .ended, .endedWithoutBudget, .endedOnly, .endedPaced:
                // The driver gives the try's slot back before it reports the end.
                _ = machine.releaseSlot()
            default: break
            }
            switch step.event {
            case .start: action = machine.start()
            case let .admitted(verdict): action = machine.admitted(verdict, at: now)
            case .slotGranted: action = machine.slotGranted(at: now)
            case let .shed(priority): action = machine.shed(priority)
            case .parkRefused: action = machine.parkRefused()
            case let .streaming(status): action = machine.streamingStarted(status: status)
            case .streamUnsent:
                machine.streamFailedBeforeFirstByte()
                action = .none
            case let .ended(end, open):
                action = machine.tryEnded(end, breakerOpen: open, at: now, random: 0.5)
                if action == .withdrawRetry { action = machine.retryBudget(granted: true) }
            case let .endedWithoutBudget(end):
                action = machine.tryEnded(end, breakerOpen: false, at: now, random: 0.5)
                if action == .withdrawRetry { action = machine.retryBudget(granted: false) }
            case let .endedOnly(end): action = machine.tryEnded(end, breakerOpen: false, at: now, random: 0.5)
            case let .endedPaced(end):
                action = machine.tryEnded(end, breakerOpen: false, at: now, random: 0.5, retrySpendsBudget: false)
            case let .retryBudget(granted): action = machine.retryBudget(granted: granted)
            case .timer: action = machine.timerFired(at: now)
            case .replay: action = machine.replay()
            case let .tokenRefreshFailed(reason): action = machine.tokenRefreshFailed(reason)
            case .clientGone: action = machine.clientGone()
            case .drain: action = machine.drain()
            case let .wait(d):
                clock.advance(by: d)
                continue
            }
            Self.performBooks(action, on: &machine)
            #expect(action == step.action, "step \(i + 1): \(step.event)")
            if let state = step.state { #expect(machine.state == state, "state after step \(i + 1): \(step.event)") }
        }
        if let history = scenario.history { #expect(machine.history == history) }
    }

    @Test func outcomesAsTheBreakerCountsThem() {
        var retry = RetryPolicy.Configuration()
        retry.on = ["503", "timeout"]
        var m = M(
            .init(
                deadline: Self.deadline, retry: RetryPolicy(retry), parkFor: .zero, parkWhileOpen: false, endpoints: 1,
                method: "GET", hasIdempotencyKey: false, refreshOn: [401]))
        #expect(m.outcome(of: Self.ok(503)) == .serverError(status: 503))
        #expect(m.outcome(of: Self.ok(500)) == .serverError(status: 500))
        #expect(m.outcome(of: Self.ok(404)) == .clientError(status: 404))
        #expect(m.outcome(of: .answered(status: 401, retryAfter: nil, withToken: true)) == .clientError(status: 401))
        #expect(m.outcome(of: Self.failed(.unreachable)) == .unreachable)
        #expect(m.outcome(of: Self.failed(.invalidResponse)) == .reset)
        #expect(m.outcome(of: Self.failed(.tls)) == .reset, "the breaker counts it as a failure")
        _ = m.start()
        _ = m.admitted(.send(probe: false), at: Self.t0)
        _ = m.streamingStarted(status: 201)
        #expect(m.outcome(of: Self.ok(201)) == .success(status: 201))
        #expect(m.outcome(of: Self.failed(.reset)) == .reset)
    }
}

@Suite struct AdmissionTests {
    /// Gates that answer as told and record which were asked, in order.
    struct Gates: Admission.Gates {
        var reachable = true
        var credentials = true
        var breakerAnswer: CircuitBreakerStateMachine.Admission = .allow
        var slotAnswer: Admission.Slot = .acquired
        var pauseAnswer: Admission.Pause = .none
        var asked: [String] = []

        mutating func pause() -> Admission.Pause {
            asked.append("pause")
            return pauseAnswer
        }

        mutating func isReachable() -> Bool {
            asked.append("reachable")
            return reachable
        }
        mutating func hasCredentials() -> Bool {
            asked.append("credentials")
            return credentials
        }
        mutating func breaker() -> CircuitBreakerStateMachine.Admission {
            asked.append("breaker")
            return breakerAnswer
        }
        mutating func slot() -> Admission.Slot {
            asked.append("slot")
            return slotAnswer
        }
        mutating func abandonProbe() { asked.append("abandonProbe") }
    }

    @Test func everyGateInOrder() {
        var g = Gates()
        #expect(Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &g) == .send(probe: false))
        #expect(g.asked == ["pause", "reachable", "credentials", "breaker", "slot"])
    }

    /// A paused upstream is asked about right after the deadline: nothing
    /// else is taken (no breaker probe, no slot) while it lasts.
    @Test(arguments: [(Admission.Pause.wait, Admission.Verdict.park(.paused, probeAfter: nil)), (.fail, .refuse(.paused))])
    func aPausedUpstreamStopsAdmissionFirst(pause: Admission.Pause, verdict: Admission.Verdict) {
        var g = Gates()
        g.pauseAnswer = pause
        #expect(Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &g) == verdict)
        #expect(g.asked == ["pause"])
    }

    @Test func theDeadlineFirst() {
        var g = Gates()
        #expect(Admission.decide(remaining: .zero, parkWhileOpen: true, gates: &g) == .refuse(.deadline))
        #expect(g.asked.isEmpty)
    }

    @Test func unreachableParksWithoutTouchingTheBreaker() {
        var g = Gates(reachable: false)
        #expect(Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &g) == .park(.unreachable, probeAfter: nil))
        #expect(g.asked == ["pause", "reachable"])
    }

    @Test func noTokenWaitsForTheRefresh() {
        var g = Gates(credentials: false)
        #expect(Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &g) == .park(.auth, probeAfter: nil))
        #expect(g.asked == ["pause", "reachable", "credentials"])
    }

    @Test func anOpenBreakerParksOrRefuses() {
        var g = Gates(breakerAnswer: .reject(retryAfter: .seconds(2)))
        #expect(
            Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &g)
                == .park(.circuitOpen, probeAfter: .seconds(2)))
        var f = Gates(breakerAnswer: .reject(retryAfter: .seconds(2)))
        #expect(
            Admission.decide(remaining: .seconds(1), parkWhileOpen: false, gates: &f)
                == .refuse(.circuitOpen(retryAfter: .seconds(2))))
        #expect(f.asked == ["pause", "reachable", "credentials", "breaker"])
    }

    @Test func aProbeWithoutASlotGivesItsPlaceBack() {
        var g = Gates(breakerAnswer: .probe, slotAnswer: .full)
        #expect(Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &g) == .refuse(.overloaded))
        #expect(g.asked.last == "abandonProbe")
        var q = Gates(breakerAnswer: .probe, slotAnswer: .queued)
        #expect(Admission.decide(remaining: .seconds(1), parkWhileOpen: true, gates: &q) == .queue(probe: true))
    }
}
