import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Logging
import Synchronization

/// A health check's end: when, and how many endpoints answered healthy.
struct HealthCheckReading: Sendable {
    var at: Instant
    var healthy: Int
    var endpoints: Int
}

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
    /// The last health check's end, for the status page (the checker writes
    /// it on the admin loop every interval; nothing on the request path).
    let lastHealthCheck = Locked<HealthCheckReading?>(nil)
    /// The proxy's own HTTP/2 client's counters for this upstream (`protocol: h2`).
    let h2Counters = HTTP2ClientCounters()
    let logger: Logger
    let metrics: ProxyMetrics
    let events: EventBus
    /// Credentials (nil for `auth.kind: none`).
    let tokens: TokenSource?
    /// What this guard was built from: a reload keeps the guard (breaker,
    /// budget, token) when an upstream's definition did not change.
    let fingerprint: Fingerprint
    private let parkedCounts = Locked<[String: Int]>([:])
    /// `pacing:` (nil: the upstream never pauses).
    let pacing: PacingConfiguration?
    /// `pacing != nil`, read without copying the configuration.
    var hasPacing: Bool { pause != nil }
    /// Whether a 429 pauses one client key (`scope_429: client`), read
    /// without copying the configuration: the worker finds a request's key
    /// only then.
    let pausesClients: Bool
    private let pause: Locked<UpstreamPause>?
    /// The pause's end as monotonic nanoseconds (0: not paused), read on
    /// every admission without the lock.
    private let pausedUntil = Atomic<Int64>(0)
    /// The latest end of any client's pause (0: none): before it, an
    /// admission takes the lock to look its key up; after it, none does.
    private let clientsPausedUntil = Atomic<Int64>(0)
    /// Outlier ejection (`outlier_detection`); taken only with two
    /// endpoints or more.
    private let outliers: Locked<OutlierDetector>
    private let endpointCount: Int
    /// `outlier_detection.base_ejection`, for the log line.
    private let ejectionTime: Duration
    /// The upstream's `max_connections` × endpoints, which each worker's
    /// `ConcurrencyLimiter` splits (part of the fingerprint: constant for a guard).
    let connections: Int
    /// `adaptive_concurrency` (nil: each worker's limit is its share of `connections`).
    let adaptive: AdaptiveConcurrencySettings?
    /// What every worker's lane publishes of its slots, summed
    /// (UpstreamGuard+Concurrency.swift): read by `/metrics`, `/admin/state`
    /// and the status page, never on the request path.
    let concurrency = ConcurrencyGauges()

    init(upstream: RuntimeUpstream, definition: Upstream, logger: Logger, metrics: ProxyMetrics, events: EventBus) {
        let name = upstream.name
        let endpointCount = upstream.endpoints.count
        let breaker = upstream.breakerConfiguration
        tokens = definition.auth.kind == .none ? nil : TokenSource(settings: definition.auth, upstreamName: name)
        fingerprint = Fingerprint(definition: definition, policies: upstream.policies)
        self.name = name
        self.metrics = metrics
        self.events = events
        outliers = Locked(OutlierDetector(endpoints: endpointCount, configuration: upstream.outlierDetection))
        self.endpointCount = endpointCount
        connections = upstream.maxConnectionsPerEndpoint * endpointCount
        adaptive = upstream.adaptiveConcurrency
        ejectionTime = upstream.outlierDetection.baseEjection
        self.breaker = Locked(CircuitBreakerStateMachine(breaker))
        budget = Locked(RetryBudget(ratio: upstream.budget.ratio, minPerSecond: upstream.budget.minPerSecond))
        self.logger = logger
        pacing = definition.pacing
        pause = definition.pacing.map { Locked(UpstreamPause($0)) }
        pausesClients = definition.pacing?.scope429 == .client
    }

    // MARK: - Pacing

    /// How long the whole upstream's pause still lasts (nil: not paused):
    /// one atomic load, and nothing at all for an upstream without `pacing`.
    @inline(__always)
    func pausedFor(at now: Instant) -> Duration? {
        guard pause != nil else { return nil }
        let until = pausedUntil.load(ordering: .relaxed)
        guard until > now.nanoseconds else { return nil }
        return .nanoseconds(until - now.nanoseconds)
    }

    /// How long a request from `client` is still held: the upstream's pause
    /// or the client's own. Two atomic loads while no client is paused; the
    /// lock only while one is.
    @inline(__always)
    func pausedFor(client: String, at now: Instant) -> Duration? {
        guard pause != nil else { return nil }
        if clientsPausedUntil.load(ordering: .relaxed) <= now.nanoseconds { return pausedFor(at: now) }
        return pause?.withLock { $0.pause(for: client, at: now)?.left }
    }

    /// The pause that holds a request from `client`, with the status that
    /// caused it (for its answer's code and `Retry-After`).
    func pauseHolding(client: String, at now: Instant) -> (cause: Int, left: Duration)? {
        guard let pause else { return nil }
        if clientsPausedUntil.load(ordering: .relaxed) <= now.nanoseconds {
            guard let left = pausedFor(at: now) else { return nil }
            return (pause.withLock { $0.cause }, left)
        }
        return pause.withLock { $0.pause(for: client, at: now) }
    }

    /// The status that paused the whole upstream (429 or 503).
    var pauseCause: Int { pause?.withLock { $0.cause } ?? 0 }

    /// Client keys paused now, and the longest time one has left (for `/metrics` and `/admin/state`).
    func clientPauses(at now: Instant) -> (count: Int, longest: Duration?) {
        guard let pause, clientsPausedUntil.load(ordering: .relaxed) > now.nanoseconds else { return (0, nil) }
        return pause.withLock { p in
            let longest = p.clients.values.max().flatMap { $0 > now ? $0 - now : nil }
            return (p.pausedClients(at: now), longest)
        }
    }

    /// An answer of this upstream to a request from `client` that arrived
    /// at `sentAt`: does it pause the upstream, or that client? Returns the
    /// change; for a new pause of the whole upstream the caller tells the
    /// workers (a client's pause is waited for by its own requests, each
    /// arming its lane's timer as it parks).
    /// `resourceExhausted`: the answer is a gRPC call's RESOURCE_EXHAUSTED
    /// with RetryInfo (`resource-exhausted` in `pacing.on`), `status` its HTTP status.
    func paced(
        status: Int, resourceExhausted: Bool = false, wait: Duration?, client: String, sentAt: Instant, at now: Instant
    ) -> UpstreamPause.Change {
        guard let pause, let pacing, resourceExhausted ? pacing.onResourceExhausted : pacing.on.contains(status) else {
            return .none
        }
        let (change, clientsUntil) = pause.withLock { p in
            let change =
                resourceExhausted
                ? p.answeredResourceExhausted(wait: wait, client: client, sentAt: sentAt, at: now)
                : p.answered(status: status, wait: wait, client: client, sentAt: sentAt, at: now)
            return (change, p.clientsUntil)
        }
        publish(change, clientsUntil: clientsUntil)
        switch change {
        case let .paused(until, nil):
            let seconds = max(0, (until - now).seconds)
            let said = resourceExhausted ? GRPCStatus.resourceExhausted.configName : String(status)
            logger.warning(
                "upstream paused: it asked for no requests until then",
                metadata: ["upstream": "\(name)", "status": "\(said)", "for_s": "\(seconds)"])
            events.publish(
                "upstream_paused", [("upstream", name), ("status", said), ("for_s", String(Int(seconds.rounded(.up))))])
        case let .paused(until, client?):
            // One line per client would let a client write the log: debug only.
            logger.debug(
                "client paused: the upstream asked for no requests from it until then",
                metadata: ["upstream": "\(name)", "client": "\(client)", "for_s": "\(max(0, (until - now).seconds))"])
        default: break
        }
        return change
    }

    /// A change of the pause, where admissions read it without the lock.
    private func publish(_ change: UpstreamPause.Change, clientsUntil: Instant?) {
        switch change {
        case .none: break
        case let .paused(until, nil), let .extended(until, nil):
            pausedUntil.store(until.nanoseconds, ordering: .relaxed)
        case .paused, .extended:
            clientsPausedUntil.store(clientsUntil?.nanoseconds ?? 0, ordering: .relaxed)
        }
    }

    /// Another replica published a pause of this upstream (or of one of its
    /// clients) until `wait` from now (`scope: cluster`): applied as its
    /// answer was there. Returns the change, as `paced` does.
    func heardPause(status: Int, wait: Duration, client: String, at now: Instant) -> UpstreamPause.Change {
        guard let pause, wait > .zero else { return .none }
        let (change, clientsUntil) = pause.withLock { p in
            let change = p.heard(status: status, wait: wait, client: client, at: now)
            return (change, p.clientsUntil)
        }
        publish(change, clientsUntil: clientsUntil)
        if case .paused(_, nil) = change {
            logger.warning(
                "upstream paused: another replica heard it ask for no requests until then",
                metadata: ["upstream": "\(name)", "status": "\(status)", "for_s": "\(wait.seconds)"])
            events.publish(
                "upstream_paused", [("upstream", name), ("status", String(status)), ("for_s", String(Int(wait.seconds.rounded(.up))))])
        }
        return change
    }

    /// The pause is over (its end came), or a reload ended it (`early`,
    /// which ends every client's pause too).
    /// True for the one caller that ended the upstream's pause: it tells the others.
    func endPause(at now: Instant, early: Bool = false) -> Bool {
        guard let pause else { return false }
        let ended = pause.withLock { p -> Bool in
            guard p.end(at: now, early: early) else { return false }
            return true
        }
        if early { clientsPausedUntil.store(0, ordering: .relaxed) }
        guard ended else { return false }
        pausedUntil.store(0, ordering: .relaxed)
        logger.info("upstream resumed", metadata: ["upstream": "\(name)", "early": "\(early)"])
        events.publish("upstream_resumed", [("upstream", name)])
        return true
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

    /// The breaker's state and the failures behind it, read at once (the admin state and status page).
    func breakerReading(at now: Instant) -> (
        state: CircuitBreakerStateMachine.State, failures: (consecutive: Int, requests: Int, failed: Int)
    ) {
        breaker.withLock { ($0.state, $0.failures(at: now)) }
    }

    /// Retries the budget would grant now (nothing taken).
    func retriesLeft(at now: Instant) -> Int { budget.withLock { $0.retriesLeft(at: now) } }

    func recordRequest(at now: Instant) { budget.withLock { $0.recordRequest(at: now) } }

    func withdrawRetry(at now: Instant) -> Bool { budget.withLock { $0.tryWithdraw(at: now) } }

    /// A hedge spends from the same budget, but only from its ratio (no floor).
    func withdrawHedge(at now: Instant) -> Bool { budget.withLock { $0.tryWithdrawHedge(at: now) } }

    /// A retry would be granted now (nothing taken).
    func retryAvailable(at now: Instant) -> Bool { budget.withLock { $0.retryAvailable(at: now) } }

    /// `preferred`, or the next endpoint after it that is not ejected (all
    /// ejected: `preferred` anyway).
    func pickEndpoint(preferred: Int, at now: Instant) -> Int {
        outliers.withLock { $0.pick(preferred: preferred, at: now) }
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
    func ejected(at now: Instant) -> Set<Int> { outliers.withLock { $0.ejected(at: now) } }

    func recordEndpoint(_ i: Int, failure: Bool, at now: Instant) {
        guard endpointCount > 1 else { return }  // one endpoint is never ejected: no lock
        let verdict = outliers.withLock { $0.record(endpoint: i, failure: failure, at: now) }
        if case .ejected = verdict {
            events.publish("endpoint_ejected", [("upstream", name), ("endpoint", String(i))])
            logger.warning(
                "endpoint ejected", metadata: ["upstream": "\(name)", "endpoint": "\(i)", "for": "\(ejectionTime.configText)"])
        }
    }

    // MARK: - Operator overrides (admin API)

    /// Out of the rotation until `undrain` (`POST /admin/upstreams/{name}/endpoints/{i}/drain`).
    func drain(endpoint i: Int, url: String, by: String) -> OutlierDetector.DrainResult {
        let (was, result) = outliers.withLock { o -> (Bool, OutlierDetector.DrainResult) in
            let was = o.isDrained(i)
            return (was, o.drain(i))
        }
        guard result == .drained, !was else { return result }
        logger.info("endpoint drained", metadata: ["upstream": "\(name)", "endpoint": "\(url)", "by": "\(by)"])
        events.publish("endpoint_drained", [("upstream", name), ("endpoint", String(i)), ("url", url), ("by", by)])
        return result
    }

    /// Back in the rotation. False: it was not drained.
    func undrain(endpoint i: Int, url: String, by: String) -> Bool {
        guard outliers.withLock({ $0.undrain(i) }) else { return false }
        logger.info("endpoint undrained", metadata: ["upstream": "\(name)", "endpoint": "\(url)", "by": "\(by)"])
        events.publish("endpoint_undrained", [("upstream", name), ("endpoint", String(i)), ("url", url), ("by", by)])
        return true
    }

    /// Each endpoint in rotation, ejected until when, or drained.
    func rotation(at now: Instant) -> [OutlierDetector.Rotation] { outliers.withLock { $0.rotation(at: now) } }

    /// Forces the breaker open or closed, or releases it (nil). Returns the
    /// state after; the caller wakes what was parked when it lets tries through.
    func forceBreaker(_ forced: CircuitBreakerStateMachine.Forced?, by: String, at now: Instant)
        -> CircuitBreakerStateMachine.State
    {
        let state = breaker.withLock { b in
            _ = b.force(forced, at: now)
            return b.state
        }
        metrics.circuitState(upstream: name, gauge: state.gauge)
        let said = forced.map { "forced_\($0.rawValue)" } ?? "released"
        logger.warning(
            "circuit breaker \(forced.map { "forced \($0.rawValue)" } ?? "released to automatic")",
            metadata: ["upstream": "\(name)", "by": "\(by)"])
        events.publish("breaker_" + said, [("upstream", name), ("by", by)])
        return state
    }

    var breakerForced: CircuitBreakerStateMachine.Forced? { breaker.withLock { $0.forced } }

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
