import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Admission

/// Whether the next try may go: `Admission.decide` asks the gates below in
/// order, and its verdict is the machine's next event.
extension Exchange {
    /// Deadline → pause → reachability → credentials → breaker → slot, as one decision.
    func admit() {
        var gates = Gates(exchange: self, now: env.clock.now())
        let verdict = Admission.decide(
            remaining: machine.remaining(at: gates.now), parkWhileOpen: machine.settings.parkWhileOpen, gates: &gates)
        perform(machine.admitted(verdict, at: gates.now))
    }

    struct Gates: Admission.Gates {
        let exchange: Exchange
        let now: Instant

        func pause() -> Admission.Pause {
            // Two atomic loads while nothing is paused (none without pacing).
            guard exchange.guardian.pausedFor(client: exchange.pacingKey, at: now) != nil else { return .none }
            return exchange.guardian.pacing?.whilePaused == .fail ? .fail : .wait
        }

        func isReachable() -> Bool { exchange.guardian.reachable.load(ordering: .relaxed) }

        func hasCredentials() -> Bool {
            guard let tokens = exchange.tokens else { return true }
            switch tokens.use(at: now) {
            case let .use(token):
                exchange.authToken = token
                return true
            case let .useAndRefresh(token):
                exchange.authToken = token
                exchange.env.startRefresh(guardian: exchange.guardian)
                return true
            case let .wait(start):
                if start { exchange.env.startRefresh(guardian: exchange.guardian) }
                return false
            }
        }

        func breaker() -> CircuitBreakerStateMachine.Admission { exchange.guardian.admit(at: now) }

        func slot() -> Admission.Slot {
            // The machine books the slot or the place from the verdict.
            switch exchange.env.acquireSlot(exchange, guardian: exchange.guardian, at: now) {
            case .granted:
                return .acquired
            case .queued:
                return .queued
            case .overloaded:
                return .full
            }
        }

        func abandonProbe() { exchange.abandonProbe() }
    }
}
