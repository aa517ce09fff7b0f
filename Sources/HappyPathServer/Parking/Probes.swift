import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// The breaker's half-open probes on one worker (docs/circuit-breaker.md):
/// when the breaker lets one try through, one request parked behind it is
/// released as the probe, at the lane's probe timer. On the worker's loop.
final class Probes {
    /// Alive: the worker owns it (`ProxyWorker.probes`) and outlives it.
    unowned let worker: ProxyWorker

    init(worker: ProxyWorker) { self.worker = worker }

    /// Releases one parked command as the half-open probe once `after` passed.
    func schedule(guardian: UpstreamGuard, after: Duration) {
        worker.lanes.lane(guardian).armProbe(after: after)
    }

    /// The lane's probe timer fired: its oldest parked command goes.
    func due(_ l: Lane) {
        guard let probe = l.parked.takeProbe(places: worker.shared.parked) else { return }
        worker.parking.leftLot([probe], guardian: l.guardian)
        probe.replay()
    }
}
