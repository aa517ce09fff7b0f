import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging

/// A worker's parking (docs/reachability.md): exchanges parked in their
/// upstream's lane while it is unreachable, its circuit open, its token
/// refreshing or its pause on, each holding one of the process's
/// `max_parked` places; replayed in arrival order when it recovers (one is
/// released as the half-open probe by `Probes`). On the worker's loop.
final class Parking {
    /// Alive: the worker owns its parking (`ProxyWorker.parking`) and outlives it.
    unowned let worker: ProxyWorker

    init(worker: ProxyWorker) { self.worker = worker }

    private var lanes: Lanes { worker.lanes }
    private var shared: SharedState { worker.shared }

    /// False when the process-wide `max_parked` is reached.
    func park(_ exchange: Exchange, reason: Exchange.ParkReason) -> Bool {
        let l = lanes.lane(exchange.guardian)
        switch l.parked.park(exchange, reason: reason, arrivedAt: exchange.startedAt, places: shared.parked) {
        case .full: return false
        case .alreadyParked: return true
        case .parked: break
        }
        exchange.guardian.parkedChanged(reason, by: 1)
        shared.events.publish(
            "command_parked",
            [("upstream", exchange.upstream.name), ("reason", reason.rawValue), ("request_id", exchange.command.requestID)])
        worker.logger.debug(
            "command parked",
            metadata: [
                "request_id": "\(exchange.command.requestID)", "upstream": "\(exchange.upstream.name)",
                "reason": "\(reason.rawValue)",
            ])
        return true
    }

    func unpark(_ exchange: Exchange) {
        if let reason = lanes.lane(exchange.guardian).parked.unpark(exchange, places: shared.parked) {
            exchange.guardian.parkedChanged(reason, by: -1)
        }
    }

    /// Counts out of the lot what it gave back, by reason (the per-upstream gauges).
    func leftLot(_ exchanges: [Exchange], guardian: UpstreamGuard) {
        for exchange in exchanges { if let reason = exchange.parked { guardian.parkedChanged(reason, by: -1) } }
    }

    /// The upstream is reachable again (health check) or its circuit closed:
    /// replay every command parked for it (for those reasons) on this worker,
    /// in arrival order.
    func replayParked(guardian: UpstreamGuard, reasons: Set<Exchange.ParkReason>) {
        guard let l = lanes.existing(guardian), !l.parked.isEmpty else { return }
        let parked = l.parked.takeAll(for: reasons, places: shared.parked)
        guard !parked.isEmpty else { return }
        leftLot(parked, guardian: guardian)
        worker.logger.info("replaying parked commands", metadata: ["upstream": "\(guardian.name)", "count": "\(parked.count)"])
        shared.events.publish("commands_replayed", [("upstream", guardian.name), ("count", String(parked.count))])
        shared.metrics.replayed(upstream: guardian.name, count: parked.count)
        for exchange in parked { exchange.replay() }
    }

    /// A token refresh ended (on any worker): what waited for it goes, or
    /// hears why not.
    func authDone(guardian: UpstreamGuard, failure: String?) {
        if let failure {
            for exchange in lanes.lane(guardian).parked.waiters(for: .auth) { exchange.authFailed(failure) }
        } else {
            replayParked(guardian: guardian, reasons: [.auth])
        }
    }

    /// Every parked command of a lane whose upstream a reload changed or
    /// removed goes now, under its own configuration.
    func replayAll(_ l: Lane) {
        let parked = l.parked.takeAll(places: shared.parked)
        leftLot(parked, guardian: l.guardian)
        for exchange in parked { exchange.replay() }
    }

    /// The shutdown: the lot's places are given back, nobody is replayed.
    func dropAll(_ l: Lane) { leftLot(l.parked.takeAll(places: shared.parked), guardian: l.guardian) }
}
