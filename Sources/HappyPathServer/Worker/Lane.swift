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

        init(worker: ProxyWorker, guardian: UpstreamGuard, slots: ConcurrencyLimiter<Exchange>.Configuration) {
            self.worker = worker
            self.guardian = guardian
            self.slots = ConcurrencyLimiter(slots)
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
