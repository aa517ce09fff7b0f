import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// A worker's lanes, one per upstream (keyed by its guard, which survives a
/// reload of an unchanged upstream), and the upstream's slots on this
/// worker: a slot for a try, a place in the queue, a slot handed over or
/// moved among the streams, a sample for the adaptive limit. On the
/// worker's loop.
final class Lanes {
    /// Alive: the worker owns its lanes (`ProxyWorker.lanes`) and outlives
    /// them. Only a new lane reads it (the request path does not).
    unowned let worker: ProxyWorker
    let clock: Clock
    let metrics: WorkerMetrics
    /// Drain ran out of time: freed slots go to nobody (no new tries).
    var stopping = false
    private var byGuard: [ObjectIdentifier: Lane] = [:]

    init(worker: ProxyWorker) {
        self.worker = worker
        clock = worker.clock
        metrics = worker.metrics
    }

    /// The lane of `guardian`'s upstream, opened on first use.
    func lane(_ guardian: UpstreamGuard) -> Lane {
        if let lane = byGuard[ObjectIdentifier(guardian)] { return lane }
        // The worker's share of the upstream's connections (a guard's
        // `connections` never changes), or of its adaptive limit.
        let workers = worker.workers
        let slots: ConcurrencyLimiter<Exchange>.Configuration =
            guardian.adaptive.map {
                .init(
                    adaptive: $0.limit, queue: $0.queue, connections: guardian.connections, workers: workers,
                    maxStreams: $0.maxStreams ?? $0.limit.maxLimit,
                    minPerWorker: $0.minLimitGiven ? nil : ConcurrencyLimiter<Exchange>.Configuration.defaultMinPerWorker)
            } ?? .init(connections: guardian.connections, workers: workers)
        let lane = Lane(worker: worker, guardian: guardian, slots: slots)
        byGuard[ObjectIdentifier(guardian)] = lane
        return lane
    }

    /// The lane of `guardian`, if it is open (nothing is opened).
    func existing(_ guardian: UpstreamGuard) -> Lane? { byGuard[ObjectIdentifier(guardian)] }

    /// A lane for every upstream from the start (and each new one at a
    /// reload): an upstream's limit gauge is then the sum of every
    /// worker's share before any traffic, not one worker's.
    func open(_ guards: [UpstreamGuard]) {
        for guardian in guards { _ = lane(guardian) }
    }

    /// Every lane, for a reload or the shutdown.
    var all: [(key: ObjectIdentifier, lane: Lane)] { byGuard.map { ($0.key, $0.value) } }

    /// A lane nothing is left on (after a reload changed its upstream) is forgotten.
    func forget(_ key: ObjectIdentifier) {
        byGuard[key]?.close()
        byGuard[key] = nil
    }

    /// The shutdown: every lane forgotten (their timers already cancelled).
    func removeAll() { byGuard.removeAll() }

    /// The next endpoint in round-robin order for this worker.
    func nextEndpointIndex(for guardian: UpstreamGuard, count: Int) -> Int {
        let l = lane(guardian)
        let i = l.nextEndpoint % count
        l.nextEndpoint = (i + 1) % count
        return i
    }

    // MARK: - Slots

    /// Whom an adaptive upstream's slots are shared between (issue 44): the
    /// client as the route's rate limit knows it, else its address (the
    /// connection's own text, made once, unless a trusted proxy names the
    /// client), as a bucket: FNV-1a of that key.
    static func slotClient(_ request: HTTPRequest, rateLimitKey key: String?, trusted: [IPRange]) -> Int {
        let client =
            key.flatMap { $0.isEmpty ? nil : $0 }
            ?? (trusted.isEmpty ? request.peerAddress : RateLimitKey.clientIP(request, trusted: trusted))
        return clientHash(client)
    }

    /// FNV-1a of a client's key (a bucket of an adaptive upstream's slots).
    static func clientHash(_ key: String) -> Int {
        var key = key
        return key.withUTF8 { bytes in
            var h: UInt64 = 0xcbf2_9ce4_8422_2325
            for b in bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
            return Int(truncatingIfNeeded: h ^ (h >> 29))
        }
    }

    /// A slot for one try; else a place in the upstream's queue (by the
    /// request's priority); else overloaded (OVERLOADED). Queuing may shed
    /// others (a full queue makes room for a request that matters more;
    /// an adaptive queue that stood sheds its late). The exchange keeps
    /// its lane for what follows (release, leave, sample): one lookup.
    func acquireSlot(_ exchange: Exchange, guardian: UpstreamGuard, at now: Instant)
        -> ConcurrencyLimiter<Exchange>.Acquisition
    {
        let l = lane(guardian)
        exchange.lane = l
        let acquisition = l.slots.acquire(exchange, exchange.slotHolder, at: now)
        if acquisition != .granted {
            shedFrom(l)
            if acquisition == .overloaded { metrics.shed(upstream: guardian.name, priority: exchange.priority) }
        }
        l.publish()
        return acquisition
    }

    /// A slot for a hedge, only if one is free now and nobody waits for one.
    func tryAcquireSlot(guardian: UpstreamGuard, _ holder: SlotHolder) -> Bool {
        let l = lane(guardian)
        guard l.slots.tryAcquire(holder) else { return false }
        l.publish()
        return true
    }

    /// A try ended: its slot goes to the waiting exchange of the highest
    /// priority (none once drain ran out of time, nor while an adaptive
    /// limit is below the tries in flight).
    func releaseSlot(guardian: UpstreamGuard, _ holder: SlotHolder) { releaseSlot(lane(guardian), holder) }

    func releaseSlot(_ l: Lane, _ holder: SlotHolder) {
        let release = l.slots.release(holder, handOver: !stopping, at: clock.now())
        shedFrom(l)
        l.publish()
        if case let .handedOver(next) = release { next.slotGranted() }
    }

    /// An answer held for `holder` streams past its head: its slot leaves
    /// the adaptive limit (handed over as a release would) if the
    /// upstream's `max_streams` has room. True if it moved.
    func moveToStreams(_ l: Lane, _ holder: SlotHolder) -> Bool {
        guard !stopping, let release = l.slots.moveToStreams(holder, at: clock.now()) else { return false }
        shedFrom(l)
        l.publish()
        if case let .handedOver(next) = release { next.slotGranted() }
        return true
    }

    /// A slot held past its exchange (a tunnel's), given back when it closes.
    func giveBack(_ slot: HeldSlot) {
        if slot.streams { streamEnded(slot.lane) } else { releaseSlot(slot.lane, slot.holder) }
    }

    /// A stream `moveToStreams` moved ended.
    func streamEnded(_ l: Lane) {
        l.slots.streamEnded()
        l.publish()
    }

    func leaveQueue(_ exchange: Exchange, lane l: Lane) {
        l.slots.leave(exchange)
        l.publish()
    }

    /// A try of an adaptive upstream sent at `start` completed at `end`,
    /// with `inFlight` tries in flight as it started: the limit learns from
    /// it (against its `kind`'s baseline); slots a grown limit opened go to waiters at once.
    func sampleTry(_ l: Lane, from start: Instant, to end: Instant, inFlight: Int, kind: UInt64) {
        var granted: [Exchange] = []
        let moved = l.slots.sample(from: start, to: end, inFlight: inFlight, kind: kind, granted: &granted)
        l.publishLimit(moved: moved)
        guard !granted.isEmpty else { return }
        l.publish()
        for exchange in granted { exchange.slotGranted() }
    }

    /// Answers what the lane's queue shed: OVERLOADED, naming their priority.
    private func shedFrom(_ l: Lane) {
        guard l.slots.hasShed else { return }
        for (exchange, priority) in l.slots.takeShed() {
            metrics.shed(upstream: l.guardian.name, priority: priority)
            exchange.shed(priority)
        }
    }
}

/// An upstream's slot held past its exchange (by a tunnel): for whom, and
/// whether it was moved among the upstream's streams.
struct HeldSlot {
    let lane: Lane
    let holder: SlotHolder
    let streams: Bool
}

