import HappyPathCore
import HappyPathIO
import HappyPathPolicies

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
        if event.tag == Self.pauseTag { return worker.pacing.pauseDue(self) }
        probeTimer?.recycle()
        probeTimer = nil
        worker.probes.due(self)
    }
}
