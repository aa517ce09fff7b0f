import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Counting a try

/// A try's result to everything that counts it besides the machine: the
/// upstream's pause (pacing), metrics, the breaker and the endpoint's
/// ejection count, the retry budget.
extension Exchange {
    /// Whether the try's answer is pacing: it paused the upstream or its
    /// client (published here). A gRPC call's `RESOURCE_EXHAUSTED` with
    /// `RetryInfo` is pacing when `pacing.on` names `resource-exhausted`,
    /// whether it was held for the retry rules or went to the client; any
    /// other answer, as its HTTP status and `Retry-After` say.
    func pacing(_ end: ExchangeStateMachine.TryEnd, at now: Instant) -> Bool {
        switch end {
        case let .answered(status, retryAfter, _):
            (relay.readsGRPCDetails && pacedResourceExhausted(status, at: now)) || paced(status, retryAfter, at: now)
        case let .grpcAnswered(status, _, _):
            relay.readsGRPCDetails && pacedResourceExhausted(status, at: now)
        case .failed:
            false
        }
    }

    /// A gRPC call's `RESOURCE_EXHAUSTED` whose `RetryInfo` asks for a wait
    /// pauses as a 429 with that `Retry-After` would (`scope_429`).
    private func pacedResourceExhausted(_ status: Int, at now: Instant) -> Bool {
        guard let wait = relay.resourceExhaustedDelay else { return false }
        let change = guardian.paced(
            status: status, resourceExhausted: true, wait: wait, client: pacingKey, sentAt: startedAt, at: now)
        if case let .paused(until, nil) = change { env.paused(guardian, until: until) }
        if change != .none { env.learnedPause(guardian, change, status: 429) }
        return true
    }

    /// A status in `pacing.on` with a wait (Retry-After, or an exhausted
    /// RateLimit field) pauses the whole upstream (every worker hears of a
    /// new pause), or, a 429 under `scope_429: client`, this request's
    /// client key (its requests find it as they are admitted). Returns
    /// whether this answer is pacing.
    func paced(_ status: Int, _ retryAfter: Duration?, at now: Instant) -> Bool {
        guard guardian.pacing?.on.contains(status) == true else { return false }
        let wait =
            retryAfter
            ?? PacingSignal.wait(retryAfter: nil, rateLimit: relay.rateLimit, nowUnixSeconds: env.clock.wallSeconds())
        guard wait != nil else { return false }
        // `startedAt`: an answer to a request older than a reload that ended
        // the pause early is stale, and revives nothing.
        let change = guardian.paced(status: status, wait: wait, client: pacingKey, sentAt: startedAt, at: now)
        if case let .paused(until, nil) = change { env.paused(guardian, until: until) }
        if change != .none { env.learnedPause(guardian, change, status: status) }
        return true
    }

    /// One try's result to everything that counts it: metrics, the breaker,
    /// the endpoint's ejection count. A probe's result also decides what the
    /// lot does next: replay everything (closed) or probe again later (open).
    /// Returns whether the breaker is open after it.
    func report(_ outcome: Outcome, endpoint: Int? = nil, at now: Instant) -> Bool {
        env.metrics.upstreamTry(upstream: upstream.name, outcome: outcome.metricLabel)
        let (transition, state) = guardian.record(outcome, probe: machine.probe, at: now)
        guardian.recordEndpoint(endpoint ?? endpointIndex, failure: outcome.isFailure, at: now)
        if transition != nil || machine.probe {
            switch state {
            case .closed: env.recovered(guardian)
            case let .open(until) where upstream.whileOpen == .park:
                env.scheduleProbe(guardian: guardian, after: until - now)
            default: break
            }
        }
        if case .open = state { return true }
        return false
    }

    /// A probe admitted by the breaker will not be sent: free its place and
    /// let the lot send another.
    func abandonProbe() {
        guardian.probeAbandoned()
        if upstream.whileOpen == .park { env.scheduleProbe(guardian: guardian, after: .zero) }
    }

    /// A retry from the upstream's budget; a refusal is counted
    /// (`happypath_retry_budget_exhausted_total`).
    func withdrawRetry(at now: Instant) -> Bool {
        if guardian.withdrawRetry(at: now) { return true }
        env.metrics.retryBudgetExhausted(upstream: upstream.name)
        return false
    }
}
