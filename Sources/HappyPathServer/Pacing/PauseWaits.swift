import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// A worker's side of pacing (docs/shaping.md): requests parked while
/// their upstream, or their client of it, is paused, and the lane's timer
/// that wakes them at the pause's end (a later, longer pause re-arms it).
/// On the worker's loop.
final class PauseWaits {
    /// Alive: the worker owns it (`ProxyWorker.pacing`) and outlives it.
    unowned let worker: ProxyWorker

    init(worker: ProxyWorker) { self.worker = worker }

    /// Whom an upstream's 429 to this request is about: the client as the
    /// route's rate limit knows it (its `key`: a header's value, or the
    /// address), else its address after `trusted_proxies`. A limit keyed
    /// by `route` makes the route's clients one: a 429 holds that route.
    static func clientKey(_ request: HTTPRequest, route: RuntimeRoute, rateLimitKey: String?, trusted: [IPRange]) -> String {
        if let rateLimitKey { return rateLimitKey.isEmpty ? "r:" + route.label : rateLimitKey }
        return RateLimitKey.clientIP(request, trusted: trusted)
    }

    /// The upstream paused itself until `at`: this worker wakes what it
    /// parked for the pause then (a later, longer pause re-arms).
    func schedulePauseEnd(guardian: UpstreamGuard, at until: Instant) {
        worker.lanes.lane(guardian).armPause(at: until, now: worker.clock.now())
    }

    /// `exchange` parked for a pause (the upstream's or its client's own):
    /// its lane wakes at that pause's end, if not before.
    func parkedForPause(_ exchange: Exchange) {
        let now = worker.clock.now()
        guard let left = exchange.guardian.pausedFor(client: exchange.pacingKey, at: now) else { return }
        worker.lanes.lane(exchange.guardian).armPause(at: now + left, now: now)
    }

    func pauseDue(_ l: Lane) {
        let now = worker.clock.now()
        l.cancelPause()
        // Extended since: wait for the new end.
        if let left = l.guardian.pausedFor(at: now) { return l.armPause(at: now + left, now: now) }
        if l.guardian.endPause(at: now) { worker.shared.metrics.paused(upstream: l.guardian.name, scope: .upstream, seconds: 0) }
        replayPaused(l, at: now)
    }

    /// A reload changed the lane's upstream: its pause ends, and what
    /// waited for it goes now (with the rest of the lot).
    func endForReload(_ l: Lane) {
        if l.guardian.endPause(at: worker.clock.now(), early: true) {
            worker.shared.metrics.paused(upstream: l.guardian.name, scope: .upstream, seconds: 0)
        }
        l.cancelPause()
    }

    /// Requests parked for a pause that is over go, in the order they
    /// arrived (the concurrency limit still applies: the slot queue takes
    /// the rest); those whose client's own pause lasts stay, and the lane
    /// wakes again at the first of their ends.
    private func replayPaused(_ l: Lane, at now: Instant) {
        let guardian = l.guardian
        let shared = worker.shared
        let paused = l.parked.takeAll(for: [.paused], places: shared.parked) {
            guardian.pausedFor(client: $0.pacingKey, at: now) == nil
        }
        var next: Duration?
        for held in l.parked.waiters(for: .paused) {
            if let left = guardian.pausedFor(client: held.pacingKey, at: now) { next = min(next ?? left, left) }
        }
        if let next { l.armPause(at: now + next, now: now) }
        guard !paused.isEmpty else { return }
        worker.parking.leftLot(paused, guardian: guardian)
        shared.metrics.replayed(upstream: guardian.name, count: paused.count)
        for exchange in paused { exchange.replay() }
    }
}
