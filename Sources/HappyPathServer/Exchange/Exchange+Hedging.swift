import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Hedging

/// Hedging (routes with `hedge:`, docs/hedging.md): the effects on the real
/// transfers, slots, metrics and the one timer. The books are kept in
/// `hedging` (`HedgeCoordinator`); whether a hedge goes is the machine's
/// (`hedgeDue`, `hedgeAdmitted`, `hedgeBudget`).
extension Exchange {
    /// The one timer, while a try is in flight on a route with `hedge`: at
    /// the next hedge if one is due before the try's limit, else at the limit.
    func armTryTimer(at now: Instant) {
        let at = hedging.timerAt
        let event = timers.main ?? env.loop.takeEvent(target: self)
        timers.main = event
        event.arm(afterNanoseconds: at.nanoseconds - now.nanoseconds)
    }

    /// The one timer fired while trying: a hedge may be due; the try's limit
    /// may not be reached yet (the head came before the hedge was due, or a
    /// hedge was sent): then the timer is armed again and the machine hears
    /// nothing. Returns whether the machine should hear of it.
    func tryTimerFired(at now: Instant) -> Bool {
        let fired = hedging.timerFired(at: now)
        if fired.hedgeDue { hedgeDue(at: now) }
        guard !fired.limitReached else { return true }
        armTryTimer(at: now)
        return false
    }

    /// A hedge is due with the try still unanswered: send another beside
    /// it if the attempts, the upstream and the budget allow.
    private func hedgeDue(at now: Instant) {
        // A streamed body still coming has one reader, the try: a hedge goes
        // only once the body is whole (it is then sent whole, read by nobody).
        if let bodyStream, bodyStream.completeBody == nil { return env.metrics.hedge(route: route, outcome: "skipped") }
        var slot = false
        var decision = machine.hedgeDue(at: now)
        if decision == .admit {
            slot = admitHedge(at: now)
            decision = machine.hedgeAdmitted(slot)
        }
        if decision == .withdrawBudget { decision = machine.hedgeBudget(granted: withdrawHedge(at: now)) }
        guard case let .send(attempt, limit) = decision else {
            if slot { env.releaseSlot(guardian: guardian, slotHolder) }
            if case .skip = decision { env.metrics.hedge(route: route, outcome: "skipped") }
            return
        }
        while command.attempt < attempt { command = command.nextAttempt() }
        let count = upstream.endpoints.count
        let index = count > 1 ? guardian.pickEndpoint(preferred: (hedging.lastEndpoint + 1) % count, at: now) : 0
        hedging.lastEndpoint = index
        let try_ = HedgeTry(exchange: self, endpointIndex: index, token: authToken, startedAt: now, limitAt: now + limit)
        try_.transfer = start(endpoint: index, limit: limit, token: authToken, handler: try_)
        hedging.add(try_)
        if machine.mayHedge { hedging.dueAt = route.hedgeDue(sentAt: now) }
    }

    /// A hedge from the upstream's budget (its ratio only, no floor). A
    /// refusal counts as the budget exhausted only if a retry would be
    /// refused too: a quiet route's hedges waiting for traffic are only
    /// `skipped`, not a sign of a failing upstream (the alert on
    /// `happypath_retry_budget_exhausted_total`).
    private func withdrawHedge(at now: Instant) -> Bool {
        if guardian.withdrawHedge(at: now) { return true }
        if !guardian.retryAvailable(at: now) { env.metrics.retryBudgetExhausted(upstream: upstream.name) }
        return false
    }

    /// What a hedge needs besides the budget: the upstream not paused and
    /// reachable, its breaker closed (a half-open breaker's probes are not
    /// hedged), a token if it takes one, and a connection slot free now.
    private func admitHedge(at now: Instant) -> Bool {
        guard guardian.pausedFor(client: pacingKey, at: now) == nil, guardian.reachable.load(ordering: .relaxed) else {
            return false
        }
        if tokens != nil, authToken == nil { return false }
        switch guardian.admit(at: now) {
        case .allow: break
        case .probe:
            abandonProbe()
            return false
        case .reject: return false
        }
        return env.tryAcquireSlot(guardian: guardian, slotHolder)
    }

    /// The try in flight has its status: no hedge is due any more, and if
    /// the answer is usable, every hedge still out has lost.
    func headArrived(status: Int) {
        let now = env.clock.now()
        route.recordTry(sentAt: hedging.tryStartedAt, headAt: now)
        // No hedge once a head came (the timer, if armed for it, is armed
        // again for the try's limit when it fires).
        hedging.dueAt = nil
        guard !hedging.hedges.isEmpty, !failsTry(status) else { return }
        for other in hedging.removeAll() { lose(other) }
        machine.othersCancelled()
        scheduleReap()
    }

    /// A hedge has its status (inside libcurl's callback). A failure is
    /// noted and the others go on; anything else wins: the others are
    /// detached, and the hedge becomes the exchange's try.
    func hedgeHead(_ winner: HedgeTry, status: Int, reason: UnsafeRawBufferPointer) {
        guard hedging.remove(winner) else { return }
        let now = env.clock.now()
        route.recordTry(sentAt: winner.startedAt, headAt: now)
        if failsTry(status) {
            let end = ExchangeStateMachine.TryEnd.answered(
                status: status, retryAfter: nil, withToken: winner.token != nil && tokens != nil)
            lose(winner, outcome: machine.outcome(of: end))
            _ = machine.tryEnded(end, breakerOpen: false, at: now, random: 0)
            return scheduleReap()
        }
        env.metrics.hedge(route: route, outcome: "won")
        if let transfer {
            transfer.detach()
            hedging.lost(.init(transfer: transfer, holdsSlot: machine.handOffSlot(), endpointIndex: endpointIndex))
        }
        for other in hedging.removeAll() { lose(other) }
        machine.othersCancelled()
        hedging.dueAt = nil
        adoptHedge(winner, at: now)
        scheduleReap()
        relayStatus(status, reason: reason)
    }

    /// A hedge ended before its status (a connection failure, a timeout):
    /// counted, and the request goes on with the other try.
    func hedgeFinished(_ loser: HedgeTry, _ failure: UpstreamFailure?) {
        guard hedging.remove(loser) else { return }
        env.releaseSlot(guardian: guardian, slotHolder)
        let now = env.clock.now()
        let end = ExchangeStateMachine.TryEnd.failed(failure?.tryFailure ?? .init(.reset, TryEndRules.closedInHead))
        _ = report(machine.outcome(of: end), endpoint: loser.endpointIndex, at: now)
        env.metrics.hedge(route: route, outcome: "lost")
        _ = machine.tryEnded(end, breakerOpen: false, at: now, random: 0)
    }

    /// The try it hedged failed: the oldest hedge still out, if any, goes on
    /// as the exchange's try (and another may be due beside it).
    func adoptNextHedge(at now: Instant) {
        guard machine.state == .trying, let hedge = hedging.removeFirst() else { return }
        if machine.mayHedge { hedging.dueAt = route.hedgeDue(sentAt: now) }
        adoptHedge(hedge, at: now)
    }

    /// The hedge goes on as the exchange's one try (it won, or the try it
    /// hedged failed), under its own limit.
    private func adoptHedge(_ hedge: HedgeTry, at now: Instant) {
        hedging.adopt(hedge)
        transfer = hedge.transfer
        machine.adoptSlot()
        endpointIndex = hedge.endpointIndex
        authToken = hedge.token
        relay.reset()
        armTryTimer(at: now)
    }

    func lose(_ hedge: HedgeTry, outcome: Outcome? = nil) {
        if trace != nil {
            trace?.tryEnded(lostHedge: true, outcome: outcome?.metricLabel ?? "lost", status: nil, at: env.clock.now())
        }
        hedge.transfer.detach()
        hedging.lost(.init(transfer: hedge.transfer, holdsSlot: true, endpointIndex: hedge.endpointIndex, outcome: outcome))
        env.metrics.hedge(route: route, outcome: "lost")
    }

    private func scheduleReap() {
        let event = hedging.reapEvent ?? env.loop.takeEvent(target: self)
        hedging.reapEvent = event
        event.arm(after: .zero)
    }

    /// Outside libcurl's callbacks: the losers' transfers go (their
    /// connections closed, not reused), their slots are freed and their
    /// failures counted.
    func reap(at now: Instant) {
        for loser in hedging.removeLosers() {
            loser.transfer.cancel()
            if loser.holdsSlot { env.releaseSlot(guardian: guardian, slotHolder) }
            if let outcome = loser.outcome { _ = report(outcome, endpoint: loser.endpointIndex, at: now) }
        }
    }

    /// Every hedge still out and every loser, let go (the exchange is
    /// answered or gives up).
    func releaseHedges() {
        if !hedging.isIdle {
            let now = env.clock.now()
            for hedge in hedging.removeAll() { lose(hedge) }
            reap(at: now)
        }
        hedging.dueAt = nil
    }
}
