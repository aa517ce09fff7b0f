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
    private let breaker: Locked<CircuitBreakerStateMachine>
    private let budget: Locked<RetryBudget>
    /// The health checker's verdict; starts reachable.
    let reachable = Atomic<Bool>(true)
    /// A worker saw a connect failure: the next successful health check
    /// replays parked commands even if the checker never saw it down.
    let suspect = Atomic<Bool>(false)
    let logger: Logger
    let metrics: ProxyMetrics
    let events: EventBus
    /// Credentials (nil for `auth.kind: none`).
    let tokens: TokenSource?
    /// What this guard was built from: a reload keeps the guard (breaker,
    /// budget, token) when an upstream's definition did not change.
    let fingerprint: Fingerprint
    private let parkedCounts = Locked<[String: Int]>([:])
    private let endpoints: Locked<[EndpointHealth]>
    private let endpointCount: Int

    /// Outlier ejection (Envoy's consecutive-5xx rule): an endpoint with this
    /// many failed tries in a row leaves the rotation for `ejectionTime`,
    /// as long as at least half of the endpoints stay in.
    static let ejectAfter = 5
    static let ejectionTime: Duration = .seconds(10)

    private struct EndpointHealth {
        var consecutiveFailures = 0
        var ejectedUntil: Instant?
    }

    init(upstream: RuntimeUpstream, definition: Upstream, logger: Logger, metrics: ProxyMetrics, events: EventBus) {
        let name = upstream.name
        let endpointCount = upstream.endpoints.count
        let breaker = upstream.breakerConfiguration
        tokens = definition.auth.kind == .none ? nil : TokenSource(settings: definition.auth, upstreamName: name)
        fingerprint = Fingerprint(definition: definition, policies: upstream.policies)
        self.name = name
        self.metrics = metrics
        self.events = events
        endpoints = Locked(Array(repeating: EndpointHealth(), count: endpointCount))
        self.endpointCount = endpointCount
        self.breaker = Locked(CircuitBreakerStateMachine(breaker))
        budget = Locked(RetryBudget(ratio: upstream.budget.ratio, minPerSecond: upstream.budget.minPerSecond))
        self.logger = logger
    }

    /// Asks the breaker to let a try through (may move it open → half-open).
    func admit(at now: Instant) -> CircuitBreakerStateMachine.Admission {
        let (admission, transition) = breaker.withLock { $0.admit(at: now) }
        if let transition { log(transition) }
        return admission
    }

    /// Counts a try's outcome. Returns the transition it caused and the
    /// state after it, read under the same lock (another worker may change
    /// the state right after; what a caller acts on is what this try did).
    func record(_ outcome: Outcome, probe: Bool, at now: Instant)
        -> (CircuitBreakerStateMachine.Transition?, CircuitBreakerStateMachine.State)
    {
        let (transition, state) = breaker.withLock { b in
            (b.record(failure: outcome.isFailure, probe: probe, at: now), b.state)
        }
        if let transition { log(transition) }
        return (transition, state)
    }

    func probeAbandoned() { breaker.withLock { $0.probeAbandoned() } }

    var breakerState: CircuitBreakerStateMachine.State { breaker.withLock { $0.state } }

    func recordRequest(at now: Instant) { budget.withLock { $0.recordRequest(at: now) } }

    func withdrawRetry(at now: Instant) -> Bool { budget.withLock { $0.tryWithdraw(at: now) } }

    /// `preferred`, or the next endpoint after it that is not ejected (all
    /// ejected: `preferred` anyway).
    func pickEndpoint(preferred: Int, at now: Instant) -> Int {
        endpoints.withLock { list in
            for step in 0..<list.count {
                let i = (preferred + step) % list.count
                if let until = list[i].ejectedUntil, now < until { continue }
                list[i].ejectedUntil = nil
                return i
            }
            return preferred
        }
    }

    func parkedChanged(_ reason: Exchange.ParkReason, by delta: Int) {
        let now = parkedCounts.withLock { counts -> Int in
            counts[reason.rawValue, default: 0] += delta
            return counts[reason.rawValue]!
        }
        metrics.parked(upstream: name, reason: reason.rawValue, count: now)
    }

    func parkedCount(_ reason: Exchange.ParkReason) -> Int { parkedCounts.withLock { $0[reason.rawValue] ?? 0 } }

    /// Indices of endpoints out of the rotation now.
    func ejected(at now: Instant) -> Set<Int> {
        endpoints.withLock { list in Set(list.indices.filter { list[$0].ejectedUntil.map { now < $0 } ?? false }) }
    }

    func recordEndpoint(_ i: Int, failure: Bool, at now: Instant) {
        guard endpointCount > 1 else { return }  // one endpoint is never ejected: no lock
        let ejected = endpoints.withLock { list -> Bool in
            guard failure else {
                list[i].consecutiveFailures = 0
                return false
            }
            list[i].consecutiveFailures += 1
            let out = list.filter { $0.ejectedUntil.map { now < $0 } ?? false }.count
            guard list[i].consecutiveFailures >= Self.ejectAfter, (out + 1) * 2 <= list.count else { return false }
            list[i].consecutiveFailures = 0
            list[i].ejectedUntil = now + Self.ejectionTime
            return true
        }
        if ejected {
            events.publish("endpoint_ejected", [("upstream", name), ("endpoint", String(i))])
            logger.warning(
                "endpoint ejected",
                metadata: ["upstream": "\(name)", "endpoint": "\(i)", "for": "\(Self.ejectionTime.configText)"])
        }
    }

    private func log(_ transition: CircuitBreakerStateMachine.Transition) {
        let state: CircuitBreakerStateMachine.State =
            transition == .opened
            ? .open(until: Instant(nanoseconds: 0)) : transition == .closed ? .closed : .halfOpen(probesInFlight: 0, successes: 0)
        metrics.circuitState(upstream: name, gauge: state.gauge)
        events.publish("breaker_" + (transition == .halfOpened ? "half_open" : "\(transition)"), [("upstream", name)])
        switch transition {
        case .opened: logger.warning("circuit opened", metadata: ["upstream": "\(name)"])
        case .halfOpened: logger.info("circuit half-open: probing", metadata: ["upstream": "\(name)"])
        case .closed: logger.info("circuit closed", metadata: ["upstream": "\(name)"])
        }
    }
}
