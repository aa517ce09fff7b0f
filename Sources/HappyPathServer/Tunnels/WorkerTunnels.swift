import HappyPathConfig
import HappyPathCore
import HappyPathIO
import Logging

/// The tunnels open on one worker's connections (docs/websocket.md): each
/// kept (and counted in flight, so a drain waits for it until
/// `drain_timeout`) until it closes, its upstream slot given back then.
final class WorkerTunnels {
    /// Alive: the worker owns it (`ProxyWorker.tunnels`) and outlives it.
    unowned let worker: ProxyWorker
    private var open: [ObjectIdentifier: Tunnel] = [:]

    init(worker: ProxyWorker) { self.worker = worker }

    /// An exchange ended in a tunnel. Already counted in
    /// `happypath_tunnels_open` (before its 101 was written). `slot`: the
    /// upstream's slot the tunnel holds, given back (to the longest-waiting
    /// request, if any) when it closes.
    func opened(_ tunnel: Tunnel, route: RuntimeRoute, upstream: RuntimeUpstream, slotOf slot: HeldSlot?) {
        let shared = worker.shared
        // The client may have gone as it opened (its first bytes could not be written).
        guard !tunnel.isClosed else {
            shared.tunnels.add(-1)
            if let slot { worker.lanes.giveBack(slot) }
            return
        }
        let id = ObjectIdentifier(tunnel)
        open[id] = tunnel
        shared.inFlight.add(1)
        let name = upstream.name
        // Alive: this object holds the tunnel (`open`) and its worker closes
        // every one in `shutdown()` (`shutdownAll`) before the proxy lets go
        // of the worker, which owns this object; `onClose` is cleared as it
        // is called.
        tunnel.onClose = { [unowned self] summary in
            open[id] = nil
            // The worker's state now (a reload may have swapped it since).
            let shared = worker.shared
            shared.inFlight.add(-1)
            shared.tunnels.add(-1)
            if let slot { worker.lanes.giveBack(slot) }
            worker.metrics.tunnelClosed(upstream: name, summary)
            worker.logger.info(
                "tunnel closed",
                metadata: [
                    "upstream": "\(name)", "route": "\(route.label)", "reason": "\(summary.reason.rawValue)",
                    "bytes_to_upstream": "\(summary.bytesToUpstream)", "bytes_to_client": "\(summary.bytesToClient)",
                    "duration_ms": "\(summary.duration.nanoseconds / 1_000_000)",
                ])
        }
    }

    /// Drain ran out of time, or the worker shuts down: every tunnel closes.
    func shutdownAll() { for tunnel in Array(open.values) { tunnel.shutdown() } }
}
