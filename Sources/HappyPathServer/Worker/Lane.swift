import HappyPathCore
import HappyPathIO
import HappyPathPolicies

extension ProxyWorker {
    /// One upstream as one worker sees it (keyed by its guard, which
    /// survives a reload of an unchanged upstream): the round-robin
    /// position, the parked exchanges (the reachability and auth listeners'
    /// lot), the slots for tries in flight on this worker with their
    /// bounded queue, and the two timers (the half-open probe, the end of a
    /// pause). Owned by the worker's `lanes` until shutdown empties them.
    final class Lane: LoopEventTarget {
        let worker: ProxyWorker
        let guardian: UpstreamGuard
        var nextEndpoint = 0
        /// Parked exchanges; each holds one of the process's `max_parked` places.
        var parked = ParkingLot<Exchange>()
        /// Tries in flight on this worker, and the queue waiting for a slot.
        var slots: ConcurrencyLimiter<Exchange>
        private var probeTimer: LoopEvent?
        /// Fires when the upstream's pause (pacing), or the first of its
        /// clients' pauses that requests here wait for, should be over.
        private var pauseTimer: LoopEvent?
        /// When `pauseTimer` fires (nil: not armed).
        private var pauseDueAt: Instant?
        private static let pauseTag = 1

        /// What this lane last added to the guard's gauges (`publish`).
        private var publishedInFlight = 0
        private var publishedQueued = 0
        private var publishedStreaming = 0
        private(set) var publishedLimit: Int

        init(worker: ProxyWorker, guardian: UpstreamGuard, slots: ConcurrencyLimiter<Exchange>.Configuration) {
            self.worker = worker
            self.guardian = guardian
            self.slots = ConcurrencyLimiter(slots)
            publishedLimit = self.slots.limit
            guardian.laneOpened(limit: publishedLimit)
        }

        /// The lane is forgotten (idle): its limit leaves the guard's sum.
        func close() { guardian.laneClosed(limit: publishedLimit) }

        /// The guard's gauges follow this lane's counts: an atomic add for
        /// each count that moved (once per try: in flight up, then down).
        @inline(__always)
        func publish() {
            let i = slots.inFlight, q = slots.queued, s = slots.streaming
            guardian.concurrency.moved(inFlight: i - publishedInFlight, queued: q - publishedQueued, streaming: s - publishedStreaming)
            publishedInFlight = i
            publishedQueued = q
            publishedStreaming = s
        }

        /// Samples since the latency gauges were last published (the first
        /// sample publishes: a status page shows a baseline at once).
        private var unpublishedSamples = 15

        /// After a sample: a limit that moved goes to the guard's sum and the
        /// SSE stream; the latency gauges follow every 16th sample (a
        /// scrape's worth of freshness, not a store per try).
        func publishLimit(moved: Bool) {
            unpublishedSamples += 1
            guard moved || unpublishedSamples >= 16, let latency = slots.latencies else { return }
            unpublishedSamples = 0
            let now = slots.limit
            if now != publishedLimit {
                guardian.limitMoved(from: publishedLimit, to: now, baseline: latency.baseline, recent: latency.recent)
                publishedLimit = now
            } else {
                guardian.latencyMeasured(baseline: latency.baseline, recent: latency.recent)
            }
        }

        /// Nothing of the upstream is left here: the lane can be forgotten.
        var isIdle: Bool { parked.isEmpty && slots.isIdle && probeTimer == nil && pauseTimer == nil }

        /// The half-open probe in `after` (unless one is already due).
        func armProbe(after: Duration) {
            guard probeTimer == nil else { return }
            let event = worker.loop.takeEvent(target: self)
            probeTimer = event
            event.arm(after: after)
        }

        /// A pause ends at `due`: the timer fires then, unless it is armed
        /// to fire before (a pause that ends later is seen when it fires:
        /// `pauseDue` arms again for what is left).
        func armPause(at due: Instant, now: Instant) {
            if let pauseDueAt, pauseDueAt <= due, pauseTimer != nil { return }
            let event = pauseTimer ?? worker.loop.takeEvent(target: self, tag: Self.pauseTag)
            pauseTimer = event
            pauseDueAt = due
            event.arm(after: due > now ? due - now : .zero)
        }

        func cancelPause() {
            pauseTimer?.recycle()
            pauseTimer = nil
            pauseDueAt = nil
        }

        func cancelTimers() {
            probeTimer?.recycle()
            probeTimer = nil
            cancelPause()
        }

        func loopEventFired(_ event: LoopEvent) {
            if event.tag == Self.pauseTag { return worker.pauseDue(self) }
            probeTimer?.recycle()
            probeTimer = nil
            worker.probeDue(self)
        }
    }
}

// MARK: - Concurrency limit

/// An upstream's slot held past its exchange (by a tunnel): for whom, and
/// whether it was moved among the upstream's streams.
struct HeldSlot {
    let lane: ProxyWorker.Lane
    let holder: SlotHolder
    let streams: Bool
}

extension ProxyWorker {
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
