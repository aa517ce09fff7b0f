import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging

/// What an exchange needs from the worker it runs on, and nothing more:
/// the loop and its clock, the way a try is started, the upstream's slots
/// on this worker, parking, pacing and probes, token refreshes, kept
/// answers, tunnels, metrics, and where it reports its end. `ProxyWorker`
/// is the environment in the proxy (each requirement handed to the service
/// that holds it); a test drives an exchange with an environment of its
/// own, without a worker (ExchangeEnvironmentTests). On the loop's thread.
protocol ExchangeEnvironment: AnyObject {
    /// The worker's coalescing groups (`coalesce:`; nil: none here).
    var coalescing: Coalescing? { get }
    // MARK: Time, the loop, logs
    var clock: Clock { get }
    var loop: EventLoop { get }
    var logger: Logger { get }
    /// A pseudo-random number (a retry's jitter, a span's id).
    func random() -> UInt64
    /// The access log is on: the request's protocol name is read for it.
    var logsAccess: Bool { get }

    // MARK: Trying
    /// An upstream silent this long in mid-response is cut (`limits.client_timeout`).
    var idleTimeout: Duration { get }
    /// The most bytes of trailer fields relayed (`limits.max_header_bytes`).
    var maxTrailerBytes: Int { get }
    /// Starts a try on the transport its upstream speaks.
    func startTry(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> any UpstreamTry
    /// The next endpoint in this worker's round-robin order.
    func nextEndpointIndex(for guardian: UpstreamGuard, count: Int) -> Int

    // MARK: Budgets: the upstream's slots on this worker
    /// A slot, a place in the queue, or overloaded. Sets `exchange.lane`,
    /// which every later slot call, sample and queue exit goes through (an
    /// environment that sets none: releases by guard, no samples).
    func acquireSlot(_ exchange: Exchange, guardian: UpstreamGuard, at now: Instant)
        -> ConcurrencyLimiter<Exchange>.Acquisition
    func tryAcquireSlot(guardian: UpstreamGuard, _ holder: SlotHolder) -> Bool
    func releaseSlot(guardian: UpstreamGuard, _ holder: SlotHolder)
    func releaseSlot(_ lane: Lane, _ holder: SlotHolder)
    func leaveQueue(_ exchange: Exchange, lane: Lane)
    func moveToStreams(_ lane: Lane, _ holder: SlotHolder) -> Bool
    func streamEnded(_ lane: Lane)
    func giveBack(_ slot: HeldSlot)
    func sampleTry(_ lane: Lane, from start: Instant, to end: Instant, inFlight: Int, kind: UInt64)

    // MARK: Parking, probes, pacing
    /// False when the process-wide `max_parked` is reached.
    func park(_ exchange: Exchange, reason: Exchange.ParkReason) -> Bool
    func unpark(_ exchange: Exchange)
    func parkedForPause(_ exchange: Exchange)
    func scheduleProbe(guardian: UpstreamGuard, after: Duration)
    /// The upstream paused itself until `until`: every worker hears of it.
    func paused(_ guardian: UpstreamGuard, until: Instant)
    /// This try's answer paused (or extended a pause of) the upstream or
    /// one client of it: other replicas hear of it (`cluster.redis`).
    func learnedPause(_ guardian: UpstreamGuard, _ change: UpstreamPause.Change, status: Int)
    /// The upstream's circuit closed: every worker replays what it parked.
    func recovered(_ guardian: UpstreamGuard)

    // MARK: Tokens, kept answers, tunnels
    func startRefresh(guardian: UpstreamGuard)
    /// The process's kept answers (`fallback.serve_stale`), if any route keeps some.
    var stale: StaleStore? { get }
    /// `happypath_tunnels_open`, counted before a 101 leaves.
    var tunnelsOpen: InFlightCount { get }
    func tunnelOpened(_ tunnel: Tunnel, route: RuntimeRoute, upstream: RuntimeUpstream, slotOf slot: HeldSlot?)

    // MARK: Metrics and the end
    var metrics: WorkerMetrics { get }
    /// The exchange ended: it is counted, logged, traced and let go.
    func finished(_ exchange: Exchange)
}

/// The proxy's worker as an exchange's environment: each requirement goes
/// to the service that holds it.
extension ProxyWorker: ExchangeEnvironment {
    func random() -> UInt64 { ids.next() }
    var logsAccess: Bool { accessLog.enabled }
    var maxTrailerBytes: Int { server.limits.maxHeaderBytes }

    func startTry(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> any UpstreamTry {
        transports.start(request, handler: handler)
    }

    func nextEndpointIndex(for guardian: UpstreamGuard, count: Int) -> Int {
        lanes.nextEndpointIndex(for: guardian, count: count)
    }

    func acquireSlot(_ exchange: Exchange, guardian: UpstreamGuard, at now: Instant)
        -> ConcurrencyLimiter<Exchange>.Acquisition
    { lanes.acquireSlot(exchange, guardian: guardian, at: now) }
    func tryAcquireSlot(guardian: UpstreamGuard, _ holder: SlotHolder) -> Bool {
        lanes.tryAcquireSlot(guardian: guardian, holder)
    }
    func releaseSlot(guardian: UpstreamGuard, _ holder: SlotHolder) { lanes.releaseSlot(guardian: guardian, holder) }
    func releaseSlot(_ lane: Lane, _ holder: SlotHolder) { lanes.releaseSlot(lane, holder) }
    func leaveQueue(_ exchange: Exchange, lane: Lane) { lanes.leaveQueue(exchange, lane: lane) }
    func moveToStreams(_ lane: Lane, _ holder: SlotHolder) -> Bool { lanes.moveToStreams(lane, holder) }
    func streamEnded(_ lane: Lane) { lanes.streamEnded(lane) }
    func giveBack(_ slot: HeldSlot) { lanes.giveBack(slot) }
    func sampleTry(_ lane: Lane, from start: Instant, to end: Instant, inFlight: Int, kind: UInt64) {
        lanes.sampleTry(lane, from: start, to: end, inFlight: inFlight, kind: kind)
    }

    func park(_ exchange: Exchange, reason: Exchange.ParkReason) -> Bool { parking.park(exchange, reason: reason) }
    func unpark(_ exchange: Exchange) { parking.unpark(exchange) }
    func parkedForPause(_ exchange: Exchange) { pacing.parkedForPause(exchange) }
    func scheduleProbe(guardian: UpstreamGuard, after: Duration) { probes.schedule(guardian: guardian, after: after) }
    func paused(_ guardian: UpstreamGuard, until: Instant) { shared.paused(guardian, until: until) }
    func learnedPause(_ guardian: UpstreamGuard, _ change: UpstreamPause.Change, status: Int) {
        guard let cluster else { return }
        switch change {
        case let .paused(until, client), let .extended(until, client):
            cluster.publishPause(upstream: guardian.name, status: status, until: until, client: client)
        case .none: break
        }
    }
    func recovered(_ guardian: UpstreamGuard) { shared.recovered(guardian) }

    func startRefresh(guardian: UpstreamGuard) { refreshes.start(guardian: guardian) }
    var stale: StaleStore? { shared.stale }
    var tunnelsOpen: InFlightCount { shared.tunnels }
    func tunnelOpened(_ tunnel: Tunnel, route: RuntimeRoute, upstream: RuntimeUpstream, slotOf slot: HeldSlot?) {
        tunnels.opened(tunnel, route: route, upstream: upstream, slotOf: slot)
    }
}

extension ExchangeEnvironment {
    /// The worker's coalescing groups (nil: requests never coalesce here).
    var coalescing: Coalescing? { nil }

    /// Without a cluster, what a try learns stays in this process.
    func learnedPause(_ guardian: UpstreamGuard, _ change: UpstreamPause.Change, status: Int) {}
}
