import HappyPathCore
import HappyPathIO

/// What a reload changes on one worker besides its configuration and
/// shared state (swapped by `ProxyWorker.apply`; exchanges in flight keep
/// the ones they started with): the transports' connection caps follow the
/// new `max_connections`; a lane whose upstream the new configuration
/// changed or removed ends its pause and replays what it parked (under the
/// requests' own configuration), and is forgotten once nothing is left on
/// it; every new upstream gets its lane. On the worker's loop.
enum WorkerReload {
    static func carryOver(_ worker: ProxyWorker) {
        let (runtime, shared, lanes) = (worker.runtime, worker.shared, worker.lanes!)
        let caps = runtime.connectionCaps(workers: worker.workers)
        worker.client.setConnectionLimits(perHost: caps.perHost, cached: caps.cached)
        worker.transports.h2.maxConnectionsPerEndpoint = caps.perHost
        let kept = Set(shared.guards.map(ObjectIdentifier.init))
        for (key, l) in lanes.all where !kept.contains(key) {
            // A reload that changed the upstream ends its pause: what waited goes now.
            worker.pacing.endForReload(l)
            worker.parking.replayAll(l)
            // Nothing of the old upstream left on this worker: forget its lane.
            if l.isIdle { lanes.forget(key) }
        }
        lanes.open(shared.guards)
    }
}
