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
/// `.admit` → `admitted(_:at:)`; `.send` → the try's end via `classify`
/// and `tryEnded` (or `streamingStarted` first); `.withdrawRetry` →
/// `retryBudget(granted:)`; `.park` → `parkAccepted()` (the lot took it;
/// later `replay()`) or `parkRefused()`; `.returnSlot` → the slot given
/// back, nothing more;
/// `.waitForSlot`, `.backOff`, `.park` and `.send` arm the one timer →
/// `timerFired`. A due hedge goes the same way: `hedgeDue` → `.admit` →
/// `hedgeAdmitted(_:)` → `.withdrawBudget` → `hedgeBudget(granted:)`. The
/// machine never calls into the driver: what only the driver can find out
/// (a budget, a free slot) is an action, and its answer the next event.
public struct ExchangeStateMachine: Sendable {
    public let settings: Settings
    public internal(set) var state: State = .admitting
    /// Tries sent so far (the attempt number of the latest).
    public internal(set) var attempt = 0
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
    public internal(set) var streamedStatus = 0
    /// Tries in flight while `trying`: 1, plus the hedges beside it.
    public internal(set) var inFlight = 0
    /// Hedges sent so far (they count in `attempt` too).
    public internal(set) var hedges = 0
    private var refreshedOnce = false
    /// The retry waiting for the budget's answer: its backoff, and the
    /// outcome the problem is built from if the budget refuses.
    private var pendingRetry: (delay: Duration, outcome: Outcome)?
    /// The hedge being asked for (`hedgeDue` to `hedgeBudget`): its limit,
    /// and whether it was admitted (the budget is asked next).
    var pendingHedge: (limit: Duration, admitted: Bool)?
    private var parkedSince: Instant?
    private var parkDeadline: Instant?

    // What the exchange holds besides its state (ExchangeStateMachine+Holdings):
    // the driver takes and gives back the real things, the machine keeps the books.

    /// The upstream's slot on this worker.
    public internal(set) var slot: Slot = .none
    /// Where the worker's parking lot has the request (nil: not in it).
    public internal(set) var lot: ParkReason?
    /// The adaptive limit's sample of the try in flight.
    public internal(set) var sample: Sample = .none
    /// The upstream's `101` went to the client: the exchange ended in a tunnel.
    public internal(set) var switched = false

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
        // The slot gate is the verdict's last step: `.send` took a slot, `.queue` a place.
        switch verdict {
        case .send: slot = .held
        case .queue: slot = .queued
        default: break
        }
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

    /// The queue handed this request a connection slot. Not waiting for
    /// one (any more): the slot goes back at once (`.returnSlot`).
    public mutating func slotGranted(at now: Instant) -> Action {
        guard slot == .queued else { return .returnSlot }
        slot = .held
        guard state == .queued else { return .none }
        guard remaining(at: now) > .zero else { return fail(.timeout, abandonProbe: probe) }
        return sendTry(probe: probe, at: now)
    }

    /// The queue shed this request (docs/overload.md): it is answered
    /// OVERLOADED, naming its priority.
    public mutating func shed(_ priority: RequestPriority) -> Action {
        guard slot == .queued else { return .none }
        // The queue let it go already: nothing to leave.
        slot = .none
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
    /// is lost yet, so the try is a failed try like any other. `classify`
    /// calls this before the try's end is reported, which then goes through
    /// the retry rules (and, if they give up, becomes a problem answer)
    /// instead of cutting the client's connection.
    public mutating func streamFailedBeforeFirstByte() {
        guard state == .streaming else { return }
        state = .trying
        streamedStatus = 0
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
        case .following:
            return fail(.timeout)
        case .admitting, .awaitingRetryBudget, .streaming, .finished:
            return .none
        }
    }

    /// The upstream recovered (health check, breaker closed, token refreshed):
    /// a parked request tries again (the worker took it out of the lot).
    public mutating func replay() -> Action {
        guard lot != nil else { return .none }
        lot = nil
        guard case .parked = state else { return .none }
        state = .admitting
        return .admit
    }

    /// The token refresh a parked request waited for failed.
    public mutating func tokenRefreshFailed(_ reason: String) -> Action {
        guard lot == .auth, case .parked(.auth, _) = state else { return .none }
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

    mutating func sendTry(probe: Bool, at now: Instant) -> Action {
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

    mutating func fail(_ failure: Failure, abandonProbe: Bool = false) -> Action {
        state = .finished
        probe = false
        return .answer(failure, abandonProbe: abandonProbe)
    }

    mutating func finish(_ ending: Ending, abandonProbe: Bool = false) -> Action {
        state = .finished
        probe = false
        return .finish(ending, abandonProbe: abandonProbe)
    }
}
