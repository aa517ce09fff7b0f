import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Logging
import Synchronization

/// What every worker shares about one upstream: its circuit breaker, its
/// retry budget and its reachability. Small and behind one lock each; the
/// hot path takes each lock once per try.
final class UpstreamGuard: Sendable {
    let name: String
    private let breaker: Mutex<CircuitBreakerStateMachine>
    private let budget: Mutex<RetryBudget>
    /// The health checker's verdict; starts reachable.
    let reachable = Atomic<Bool>(true)
    /// A worker saw a connect failure: the next successful health check
    /// replays parked commands even if the checker never saw it down.
    let suspect = Atomic<Bool>(false)
    let logger: Logger

    init(name: String, breaker: CircuitBreakerStateMachine.Configuration, budgetRatio: Double, budgetMinPerSecond: Int, logger: Logger) {
        self.name = name
        self.breaker = Mutex(CircuitBreakerStateMachine(breaker))
        budget = Mutex(RetryBudget(ratio: budgetRatio, minPerSecond: budgetMinPerSecond))
        self.logger = logger
    }

    func admit(at now: Instant) -> (CircuitBreakerStateMachine.Admission, CircuitBreakerStateMachine.Transition?) {
        let result = breaker.withLock { $0.admit(at: now) }
        if let t = result.1 { log(t) }
        return result
    }

    func record(_ outcome: Outcome, probe: Bool, at now: Instant) -> CircuitBreakerStateMachine.Transition? {
        let t = breaker.withLock { $0.record(failure: outcome.isFailure, probe: probe, at: now) }
        if let t { log(t) }
        return t
    }

    func probeAbandoned() { breaker.withLock { $0.probeAbandoned() } }

    var breakerState: CircuitBreakerStateMachine.State { breaker.withLock { $0.state } }

    func recordRequest(at now: Instant) { budget.withLock { $0.recordRequest(at: now) } }

    func withdrawRetry(at now: Instant) -> Bool { budget.withLock { $0.tryWithdraw(at: now) } }

    private func log(_ transition: CircuitBreakerStateMachine.Transition) {
        switch transition {
        case .opened: logger.warning("circuit opened", metadata: ["upstream": "\(name)"])
        case .halfOpened: logger.info("circuit half-open: probing", metadata: ["upstream": "\(name)"])
        case .closed: logger.info("circuit closed", metadata: ["upstream": "\(name)"])
        }
    }
}
