import HappyPathCore

/// One client request's life, from arrival to answer, as a pure state
/// machine: events in (an admission verdict, a try's end, a timer, the
/// client hanging up, a replay, drain), one `Action` out for the driver
/// (`Exchange`) to perform on the real transfer, client connection and
/// timer. Time and randomness are passed in and the retry budget is asked
/// for as an action, so its tests walk every path on a manual clock.
///
/// ```
///            ┌──────── backOff ◀──────────┐ (a retryable failure)
///            ▼                             │
///  start ▶ admitting ─▶ trying ─▶ (try ends, held) ─▶ answer problem
///            │  ▲   ╲      │
///            │  │    queued (no slot yet)  ╲─▶ streaming ─▶ finished
///            │  │                               │ (fails before its first byte left:
///            │  │                               ╰──▶ back to trying, a failed try)
///            ▼  │
///          parked (unreachable, circuit open, waiting for a token) ─▶ expiry: answer problem
/// ```
///
/// The driver performs each action and reports back with the next event:
/// `.admit` → `admitted(_:at:)`; `.send` → the try's end via `tryEnded`
/// (or `streamingStarted` first); `.withdrawRetry` → `retryBudget(granted:)`;
/// `.waitForSlot`, `.backOff`, `.park` and `.send` arm the one timer →
/// `timerFired`. A due hedge goes the same way: `hedgeDue` → `.admit` →
/// `hedgeAdmitted(_:)` → `.withdrawBudget` → `hedgeBudget(granted:)`. The
/// machine never calls into the driver: what only the driver can find out
/// (a budget, a free slot) is an action, and its answer the next event.
public struct ExchangeStateMachine: Sendable {
    public enum ParkReason: String, CaseIterable, Sendable {
        /// The upstream cannot be reached (connect failures, health checks).
        case unreachable
        /// The breaker is open and the upstream's `while_open` is `park`.
        case circuitOpen = "circuit_open"
        /// No usable token: waiting for the refresh.
        case auth
        /// The upstream paused itself (`pacing`: a 429 or 503 with
        /// `Retry-After`): waiting for the pause to end, within the deadline.
        case paused
    }

    public enum State: Sendable, Equatable {
        /// Deciding whether the next try may go (see `Admission`).
        case admitting
        /// Waiting in the upstream's queue for a connection slot, up to the deadline.
        case queued
        /// A try is in flight; nothing went to the client yet.
        case trying
        /// A retry is due: waiting for the retry budget's answer
        /// (`retryBudget(granted:)`: `backingOff`, or the problem).
        case awaitingRetryBudget
        /// Waiting out the backoff before the next try.
        case backingOff
        /// Waiting for the upstream to recover, until `until` (park_for or the deadline).
        case parked(ParkReason, until: Instant)
        /// The response head went to the client; the body follows as it comes.
        case streaming
        /// Answered (or given up on); every later event is ignored.
        case finished
    }

    /// What the machine needs from the route, its upstream and the request.
    public struct Settings: Sendable {
        /// The request's deadline (the route's `timeout` from arrival).
        public var deadline: Instant
        public var retry: RetryPolicy
        /// `reachability.park_for`.
        public var parkFor: Duration
        /// `while_open: park` (and `park_for` above zero).
        public var parkWhileOpen: Bool
        /// Endpoints of the upstream: an unreachable one is followed by another at once.
        public var endpoints: Int
        public var method: String
        /// The request carries an `Idempotency-Key` with a value (an empty
        /// one is not a key: `IdempotencyKey.isKey`).
        public var hasIdempotencyKey: Bool
        /// The statuses that mean the upstream refused the injected token
        /// (`auth.refresh_on`); empty when the proxy injects none.
        public var refreshOn: Set<Int>
        /// `hedge.max_extra`: tries that may be in flight beside the first
        /// (0: no hedging). Only for a request the retry rules may repeat.
        public var hedgeMaxExtra: Int

        public init(
            deadline: Instant, retry: RetryPolicy, parkFor: Duration, parkWhileOpen: Bool, endpoints: Int, method: String,
            hasIdempotencyKey: Bool, refreshOn: Set<Int>, hedgeMaxExtra: Int = 0
        ) {
            self.deadline = deadline
            self.retry = retry
            self.parkFor = parkFor
            self.parkWhileOpen = parkWhileOpen && parkFor > .zero
            self.endpoints = endpoints
            self.method = method
            self.hasIdempotencyKey = hasIdempotencyKey
            self.refreshOn = refreshOn
            // Only asked of hedging routes; a scan (the list is short) instead of a hash.
            self.hedgeMaxExtra =
                hedgeMaxExtra > 0 && (hasIdempotencyKey || retry.configuration.methods.contains { $0 == method })
                ? hedgeMaxExtra : 0
        }

        /// The same, from the request's `Idempotency-Key` value as sent (nil:
        /// none): only a value with something in it makes the request a keyed one.
        public init(
            deadline: Instant, retry: RetryPolicy, parkFor: Duration, parkWhileOpen: Bool, endpoints: Int, method: String,
            idempotencyKey: String?, refreshOn: Set<Int>, hedgeMaxExtra: Int = 0
        ) {
            self.init(
                deadline: deadline, retry: retry, parkFor: parkFor, parkWhileOpen: parkWhileOpen, endpoints: endpoints,
                method: method, hasIdempotencyKey: IdempotencyKey.isKey(idempotencyKey), refreshOn: refreshOn,
                hedgeMaxExtra: hedgeMaxExtra)
        }
    }

    /// Why a try produced no response.
    public struct TryFailure: Sendable, Equatable {
        public enum Kind: Sendable, Equatable {
            /// No connection (refused, unresolvable, connect timeout): the request never left.
            case unreachable
            /// No response head within the try's limit.
            case timeout
            /// The connection dropped before a whole response.
            case reset
            /// The answer was not valid HTTP (the proxy refuses to relay it).
            case invalidResponse
            /// The TLS connection to the upstream failed (its certificate not
            /// verified, no common protocol): not transient, never retried.
            case tls
        }

        public var kind: Kind
        /// For `detail`: what libcurl or the response checks said.
        public var message: String

        public init(_ kind: Kind, _ message: String) {
            self.kind = kind
            self.message = message
        }
    }

    /// How a try ended, as the driver saw it.
    public enum TryEnd: Sendable, Equatable {
        /// A whole response. If it was held back (an error status), the
        /// machine decides what follows; if it streamed, the request is done.
        /// `withToken`: the try carried an injected token.
        case answered(status: Int, retryAfter: Duration?, withToken: Bool)
        /// A gRPC call's Trailers-Only answer (HTTP `status`, nothing relayed)
        /// with a `grpc-status` that `retry.on` names: held, and retried like
        /// a failure; if the retry rules give up, it is the answer.
        case grpcAnswered(status: Int, grpcStatus: GRPCStatus, retryAfter: Duration?)
        case failed(TryFailure)
    }

    /// Why the client gets a problem instead of the upstream's answer.
    public enum Failure: Sendable, Equatable {
        /// The deadline passed (before a try, in the queue, or with the try in flight).
        case timeout
        /// `max_connections` busy and the queue full (`byParking`: `max_parked` reached).
        case overloaded(byParking: Bool)
        /// The breaker is open and `while_open` is `fail`.
        case circuitOpen(retryAfter: Duration)
        /// Parked for `reason` until `park_for` or the deadline (`byDeadline`) ran out, after `waited`.
        case parkExpired(ParkReason, waited: Duration, byDeadline: Bool)
        /// Every endpoint unreachable and no parking.
        case unreachable
        /// The upstream's own error answer (a 4xx, or the last 5xx): mapped, not replaced.
        case upstreamAnswer(status: Int)
        /// The upstream's answer was not valid HTTP.
        case badGateway(message: String)
        /// The TLS connection to the upstream failed; not retried.
        case upstreamTLS(message: String)
        /// Tries failed (resets) and the retry rules gave up.
        case unavailable
        /// The upstream refused a token that had just been refreshed.
        case tokenRefusedAfterRefresh(status: Int)
        /// The token refresh this request waited for failed.
        case tokenRefreshFailed(reason: String)
        /// Drain ran out of time before this request was answered.
        case shuttingDown
        /// The upstream is paused and `while_paused` is `fail`.
        case paused
        /// The client's streamed body passed `limits.max_request_body` while a try sent it.
        case requestBodyTooLarge
        /// Shed from the upstream's queue (adaptive concurrency): it waited
        /// past the queue's target while the queue stood, or a request that
        /// matters more took its place in a full queue.
        case shed(RequestPriority)
    }

    public enum Ending: Sendable, Equatable {
        /// The upstream's response was relayed whole.
        case completed
        /// The upstream failed mid-response: the client's connection is cut.
        case truncated
        /// The client hung up first.
        case clientClosed
        /// Drain ran out of time mid-response: the client's connection is cut.
        case drained
    }

    public enum Action: Sendable, Equatable {
        /// Run `Admission.decide` and hand the verdict to `admitted(_:at:)`.
        case admit
        /// Send try number `attempt`; arm the timer for `limit` (per_try_timeout, or the deadline if sooner).
        case send(attempt: Int, limit: Duration)
        /// The timer for `limit`: how long to wait in the queue for a slot.
        case waitForSlot(limit: Duration)
        /// The retry rules would try again: withdraw one retry from the
        /// upstream's budget and report `retryBudget(granted:)`.
        case withdrawRetry
        /// The timer for the backoff before the next try.
        case backOff(Duration)
        /// Park the request (then `replay`), arm the timer for `limit`;
        /// `probeAfter`: let the breaker's probe go after this long.
        case park(ParkReason, limit: Duration, probeAfter: Duration?)
        /// The try's limit passed: cancel it, then report `tryEnded(.failed(timeout))`.
        case cancelTry
        /// The upstream refused the token: ask the token source, then either
        /// `.admit` (a fresher token exists) or `admitted(.park(.auth))`.
        case tokenRefused
        /// The response head went to the client: disarm the timer (a
        /// streaming body is bounded by stalls, not the deadline).
        case stream
        /// Answer with this problem, release everything held, finish.
        /// `abandonProbe`: the breaker's probe place was taken and no try ran.
        case answer(Failure, abandonProbe: Bool)
        /// Release everything held and finish as `Ending` says.
        case finish(Ending, abandonProbe: Bool)
        case none
    }

    public let settings: Settings
    public private(set) var state: State = .admitting
    /// Tries sent so far (the attempt number of the latest).
    public private(set) var attempt = 0
    /// The try in flight (or queued for) is the breaker's half-open probe.
    public private(set) var probe = false
    /// One word per failed try, for `detail`: "503", "timeout", "connection failed".
    public private(set) var history: [String] = []
    /// The last try's failure, when it had no response.
    public private(set) var lastFailure: TryFailure?
    /// The last held response's `Retry-After`.
    public private(set) var retryAfter: Duration?
    /// The HTTP status of the last held gRPC answer (`grpcAnswered`).
    private var heldStatus = 200
    /// The status of the response that is streaming.
    public private(set) var streamedStatus = 0
    /// Tries in flight while `trying`: 1, plus the hedges beside it.
    public private(set) var inFlight = 0
    /// Hedges sent so far (they count in `attempt` too).
    public private(set) var hedges = 0
    private var refreshedOnce = false
    /// The retry waiting for the budget's answer: its backoff, and the
    /// outcome the problem is built from if the budget refuses.
    private var pendingRetry: (delay: Duration, outcome: Outcome)?
    /// The hedge being asked for (`hedgeDue` to `hedgeBudget`): its limit,
    /// and whether it was admitted (the budget is asked next).
    private var pendingHedge: (limit: Duration, admitted: Bool)?
    private var parkedSince: Instant?
    private var parkDeadline: Instant?

    public init(_ settings: Settings) { self.settings = settings }

    public func remaining(at now: Instant) -> Duration {
        now < settings.deadline ? settings.deadline - now : .zero
    }

    // MARK: - Events

    /// The request arrived.
    public mutating func start() -> Action {
        state = .admitting
        return .admit
    }

    /// The answer to `.admit`.
    public mutating func admitted(_ verdict: Admission.Verdict, at now: Instant) -> Action {
        guard state == .admitting else { return .none }
        switch verdict {
        case let .send(probe):
            return sendTry(probe: probe, at: now)
        case let .queue(probe):
            self.probe = probe
            state = .queued
            return .waitForSlot(limit: remaining(at: now))
        case let .park(reason, probeAfter):
            return park(reason, probeAfter: probeAfter, at: now)
        case .refuse(.deadline):
            return fail(.timeout)
        case .refuse(.overloaded):
            return fail(.overloaded(byParking: false))
        case let .refuse(.circuitOpen(retryAfter)):
            return fail(.circuitOpen(retryAfter: retryAfter))
        case .refuse(.paused):
            return fail(.paused)
        }
    }

    /// The queue handed this request a connection slot.
    public mutating func slotGranted(at now: Instant) -> Action {
        guard state == .queued else { return .none }
        guard remaining(at: now) > .zero else { return fail(.timeout, abandonProbe: probe) }
        return sendTry(probe: probe, at: now)
    }

    /// The queue shed this request (docs/overload.md): it is answered
    /// OVERLOADED, naming its priority.
    public mutating func shed(_ priority: RequestPriority) -> Action {
        guard state == .queued else { return .none }
        return fail(.shed(priority), abandonProbe: probe)
    }

    /// The worker could not park it: `limits.max_parked` is reached.
    public mutating func parkRefused() -> Action {
        guard case .parked = state else { return .none }
        return fail(.overloaded(byParking: true))
    }

    /// The try's response head (status `status`) went to the client.
    public mutating func streamingStarted(status: Int) -> Action {
        guard state == .trying else { return .none }
        state = .streaming
        streamedStatus = status
        return .stream
    }

    /// The request body streams as the client sends it, and a retry could no
    /// longer send it whole: some of it was let go (`max_buffered_bytes`),
    /// or it will not complete. While false, a try's end is final: no retry,
    /// no parking, no token refresh (gRFC A6's rule for streamed calls).
    public var bodyReplayable = true

    /// The try broke off because the client's streamed body did (`tooLarge`:
    /// it passed the limit; else the client left): not the upstream's
    /// failure, so it is neither counted nor retried.
    public mutating func requestBodyFailed(tooLarge: Bool) -> Action {
        switch state {
        case .finished: return .none
        case .streaming: return finish(tooLarge ? .truncated : .clientClosed)
        default: return tooLarge ? fail(.requestBodyTooLarge) : finish(.clientClosed)
        }
    }

    /// The streaming try failed before any byte of its response reached the
    /// client (the head waits to leave with the first body bytes): nothing
    /// is lost yet, so the try is a failed try like any other. The driver
    /// calls this before reporting the try's end, which then goes through
    /// the retry rules (and, if they give up, becomes a problem answer)
    /// instead of cutting the client's connection.
    public mutating func streamFailedBeforeFirstByte() {
        guard state == .streaming else { return }
        state = .trying
        streamedStatus = 0
    }

    /// Why a due hedge was not sent.
    public enum HedgeSkip: Sendable, Equatable {
        /// `retry.attempts` tries are already out.
        case attempts
        /// The upstream is paused, unreachable, its breaker not closed, no
        /// connection slot free, or no usable token.
        case admission
        /// The retry budget is spent.
        case budget
    }

    public enum HedgeDecision: Sendable, Equatable {
        /// Nothing to do: no try in flight any more, or hedging is off.
        case none
        /// Ask whether the upstream takes another try now (not paused,
        /// reachable, breaker closed, a free slot, a token) and report
        /// `hedgeAdmitted(_:)`.
        case admit
        /// Withdraw one hedge from the upstream's budget and report
        /// `hedgeBudget(granted:)`.
        case withdrawBudget
        /// Send try number `attempt` beside the others, with its own `limit`.
        case send(attempt: Int, limit: Duration)
        case skip(HedgeSkip)
    }

    /// The driver arms the hedge timer after each `.send` (and after each
    /// hedge, while more may go) when this is true.
    public var mayHedge: Bool { state == .trying && inFlight <= settings.hedgeMaxExtra }

    /// The hedge timer fired: another try beside the one(s) in flight?
    /// After the attempt count, the driver is asked to admit it (`.admit`),
    /// then, only if admitted, for the budget: a refused hedge spends none.
    public mutating func hedgeDue(at now: Instant) -> HedgeDecision {
        pendingHedge = nil
        guard mayHedge else { return .none }
        let limit = min(settings.retry.configuration.perTryTimeout, remaining(at: now))
        guard limit > .zero else { return .none }
        guard attempt < settings.retry.configuration.attempts else { return .skip(.attempts) }
        pendingHedge = (limit, false)
        return .admit
    }

    /// The answer to `hedgeDue`'s `.admit`.
    public mutating func hedgeAdmitted(_ admitted: Bool) -> HedgeDecision {
        guard let pending = pendingHedge, !pending.admitted, mayHedge else { return .none }
        guard admitted else {
            pendingHedge = nil
            return .skip(.admission)
        }
        pendingHedge = (pending.limit, true)
        return .withdrawBudget
    }

    /// The answer to `.withdrawBudget`: the hedge goes, or is skipped.
    public mutating func hedgeBudget(granted: Bool) -> HedgeDecision {
        guard let pending = pendingHedge, pending.admitted, mayHedge else { return .none }
        pendingHedge = nil
        let limit = pending.limit
        guard granted else { return .skip(.budget) }
        attempt += 1
        hedges += 1
        inFlight += 1
        return .send(attempt: attempt, limit: limit)
    }

    /// A try's head was usable (not a failure the retry rules would act
    /// on): the driver cancelled every other try in flight; this one goes on alone.
    public mutating func othersCancelled() {
        guard state == .trying else { return }
        inFlight = 1
    }

    /// How the driver reports a try's end to the breaker and metrics (before `tryEnded`).
    public func outcome(of end: TryEnd) -> Outcome {
        if state == .streaming {
            // A streamed error is an upstream's answer forwarded as it came
            // (`upstream_errors: pass`): it counts as it would held.
            guard case let .answered(status, _, _) = end else { return .reset }
            if status < 400 { return .success(status: status) }
            return status >= 500 || settings.retry.configuration.statuses.contains(status)
                ? .serverError(status: status) : .clientError(status: status)
        }
        switch end {
        case let .answered(status, _, withToken):
            if withToken, settings.refreshOn.contains(status), bodyReplayable { return .clientError(status: status) }
            if status < 500, !settings.retry.configuration.statuses.contains(status) { return .clientError(status: status) }
            return .serverError(status: status)
        case let .grpcAnswered(_, grpcStatus, _):
            return .grpcError(grpcStatus)
        case let .failed(failure):
            switch failure.kind {
            case .unreachable: return .unreachable
            case .timeout: return .timeout
            case .reset, .invalidResponse, .tls: return .reset
            }
        }
    }

    /// A try ended (after its outcome was reported).
    /// - Parameters:
    ///   - breakerOpen: the breaker is open after this try was counted.
    ///   - random: in [0, 1), for the backoff's jitter.
    ///   - retrySpendsBudget: a retry after this end needs the retry budget
    ///     (`.withdrawRetry`, asked last); false after a pacing answer,
    ///     whose pause, not the budget, bounds what reaches the upstream.
    public mutating func tryEnded(
        _ end: TryEnd, breakerOpen: Bool, at now: Instant, random: Double, retrySpendsBudget: Bool = true
    ) -> Action {
        let outcome = outcome(of: end)
        let wasProbe = probe
        probe = false
        switch state {
        case .streaming:
            // Only a broken transfer cuts the client's connection; a streamed
            // 5xx (pass mode) is a complete answer, counted as a failure above.
            if case .failed = end { return finish(.truncated) }
            return finish(.completed)
        case .trying where inFlight > 1:
            // Another try is still out: this one's failure is noted and the
            // request goes on with the other (the driver adopts it).
            inFlight -= 1
            history.append(Self.word(for: end, outcome))
            return .none
        case .trying:
            state = .admitting
            inFlight = 0
        default:
            return .none
        }
        history.append(Self.word(for: end, outcome))
        switch end {
        case let .failed(failure):
            lastFailure = failure
            // Another try would meet the same certificate: the answer now.
            if failure.kind == .tls { return fail(.upstreamTLS(message: failure.message)) }
        case let .answered(status, retryAfter, withToken):
            lastFailure = nil
            self.retryAfter = retryAfter
            if withToken, settings.refreshOn.contains(status) {
                if refreshedOnce { return fail(.tokenRefusedAfterRefresh(status: status)) }
                refreshedOnce = true
                return .tokenRefused
            }
            if case .clientError = outcome { return fail(.upstreamAnswer(status: status)) }
        case let .grpcAnswered(status, _, retryAfter):
            lastFailure = nil
            self.retryAfter = retryAfter
            heldStatus = status
        }
        if outcome == .timeout, remaining(at: now) <= .zero { return fail(.timeout) }
        // A streamed body that a new try could not send whole: this answer is final.
        if !bodyReplayable { return fail(finalFailure(outcome)) }
        // A failed half-open probe re-opened the breaker: with `while_open:
        // park` it waits with the others instead of spending retries on an
        // upstream known to be down.
        if wasProbe, breakerOpen, settings.parkWhileOpen { return park(.circuitOpen, probeAfter: nil, at: now) }
        let retry = settings.retry.configuration
        if outcome == .unreachable {
            // The request never left: another endpoint at once, then park
            // until the upstream is back, then (no parking) a retry after backoff.
            if retry.on.contains("connect-failure"), settings.endpoints > 1,
                attempt < min(retry.attempts, settings.endpoints)
            {
                return .admit
            }
            if settings.parkFor > .zero { return park(.unreachable, probeAfter: nil, at: now) }
        }
        // A gRPC status that `retry.on` names is retried whatever the method
        // (every call is a POST): listing it is what says it is safe (docs/grpc.md).
        var grpcStatusNamed = false
        if case .grpcError = outcome { grpcStatusNamed = true }
        let decision = settings.retry.decide(
            RetryPolicy.Failure(
                outcome: outcome, attempt: attempt, method: settings.method,
                hasIdempotencyKey: settings.hasIdempotencyKey || grpcStatusNamed,
                neverSent: outcome == .unreachable, retryAfter: retryAfter),
            remaining: remaining(at: now), random: random, budget: { true })
        switch decision {
        case let .retry(after: delay):
            guard retrySpendsBudget else {
                state = .backingOff
                return .backOff(delay)
            }
            state = .awaitingRetryBudget
            pendingRetry = (delay, outcome)
            return .withdrawRetry
        case .giveUp:
            return fail(finalFailure(outcome))
        }
    }

    /// The answer to `.withdrawRetry`: the retry waits out its backoff, or
    /// (the budget is spent) the last try's failure is the answer.
    public mutating func retryBudget(granted: Bool) -> Action {
        guard state == .awaitingRetryBudget, let (delay, outcome) = pendingRetry else { return .none }
        pendingRetry = nil
        guard granted else { return fail(finalFailure(outcome)) }
        state = .backingOff
        return .backOff(delay)
    }

    /// The one timer fired.
    public mutating func timerFired(at now: Instant) -> Action {
        switch state {
        case .trying:
            return .cancelTry
        case .backingOff:
            state = .admitting
            return .admit
        case .queued:
            return fail(.timeout, abandonProbe: probe)
        case let .parked(reason, _):
            return fail(parkExpired(reason, at: now))
        case .admitting, .awaitingRetryBudget, .streaming, .finished:
            return .none
        }
    }

    /// The upstream recovered (health check, breaker closed, token refreshed):
    /// a parked request tries again.
    public mutating func replay() -> Action {
        guard case .parked = state else { return .none }
        state = .admitting
        return .admit
    }

    /// The token refresh a parked request waited for failed.
    public mutating func tokenRefreshFailed(_ reason: String) -> Action {
        guard case .parked(.auth, _) = state else { return .none }
        return fail(.tokenRefreshFailed(reason: reason))
    }

    /// The client hung up.
    public mutating func clientGone() -> Action {
        switch state {
        case .finished: return .none
        case .trying, .queued: return finish(.clientClosed, abandonProbe: probe)
        default: return finish(.clientClosed)
        }
    }

    /// Drain ran out of time: answer now. A response already streaming is
    /// cut; anything else gets a retryable error (another instance can serve it).
    public mutating func drain() -> Action {
        switch state {
        case .finished: return .none
        case .streaming: return finish(.drained)
        case .trying, .queued: return fail(.shuttingDown, abandonProbe: probe)
        default: return fail(.shuttingDown)
        }
    }

    // MARK: - Steps

    private mutating func sendTry(probe: Bool, at now: Instant) -> Action {
        self.probe = probe
        attempt += 1
        state = .trying
        inFlight = 1
        return .send(attempt: attempt, limit: min(settings.retry.configuration.perTryTimeout, remaining(at: now)))
    }

    /// A try's end as one word of `history`: "503", "timeout", "invalid response".
    private static func word(for end: TryEnd, _ outcome: Outcome) -> String {
        switch end {
        case let .failed(failure): failure.kind == .invalidResponse ? "invalid response" : outcome.summary
        case let .answered(status, _, _): String(status)
        case let .grpcAnswered(_, grpcStatus, _): grpcStatus.name
        }
    }

    private mutating func park(_ reason: ParkReason, probeAfter: Duration?, at now: Instant) -> Action {
        if parkDeadline == nil {
            parkDeadline = min(now + settings.parkFor, settings.deadline)
            parkedSince = now
        }
        // A pause is waited out up to the deadline, not park_for: it has an
        // end the upstream named, and the request goes as soon as it comes.
        let until = reason == .paused ? settings.deadline : parkDeadline!
        guard until > now else { return fail(parkExpired(reason, at: now)) }
        state = .parked(reason, until: until)
        return .park(reason, limit: until - now, probeAfter: probeAfter)
    }

    private func parkExpired(_ reason: ParkReason, at now: Instant) -> Failure {
        .parkExpired(reason, waited: now - (parkedSince ?? now), byDeadline: reason == .paused || parkDeadline == settings.deadline)
    }

    private func finalFailure(_ outcome: Outcome) -> Failure {
        switch outcome {
        case .unreachable: return .unreachable
        case .timeout: return .timeout
        case let .serverError(status), let .clientError(status), let .success(status): return .upstreamAnswer(status: status)
        case .grpcError: return .upstreamAnswer(status: heldStatus)
        case .reset:
            if let lastFailure, lastFailure.kind == .invalidResponse { return .badGateway(message: lastFailure.message) }
            return .unavailable
        }
    }

    private mutating func fail(_ failure: Failure, abandonProbe: Bool = false) -> Action {
        state = .finished
        probe = false
        return .answer(failure, abandonProbe: abandonProbe)
    }

    private mutating func finish(_ ending: Ending, abandonProbe: Bool = false) -> Action {
        state = .finished
        probe = false
        return .finish(ending, abandonProbe: abandonProbe)
    }
}
