import HappyPathCore

/// Hedging (routes with `hedge:`): another try beside the one in flight,
/// asked for in three steps (the attempts, the upstream's admission, the
/// budget), each the driver's answer to the one before.
extension ExchangeStateMachine {
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
}
