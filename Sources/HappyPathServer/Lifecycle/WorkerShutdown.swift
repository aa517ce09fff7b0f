import HappyPathCore
import HappyPathIO

/// The end of one worker (docs/operations.md, "Drain"): when the drain runs
/// out of time every request still here is answered now, and at the
/// shutdown everything in flight is dropped and the listeners close, each
/// service in its turn. On the worker's loop.
enum WorkerShutdown {
    /// Drain timed out (from now on `worker.stopping`): the slots freed go
    /// to nobody, no delivery round starts, requests
    /// waiting for a rate-limit token get their 503, every exchange its
    /// answer, every tunnel closes.
    static func answerEverything(_ worker: ProxyWorker) {
        worker.lanes.stopping = true
        worker.gate.answerEverything()
        for exchange in Array(worker.exchanges) { exchange.answerNow() }
        worker.tunnels.shutdownAll()
    }

    /// Drops everything in flight and closes the listeners, in order: the
    /// lanes' timers, queues and lots, the requests waiting for a token, the
    /// exchanges (their transfers and timers), the tunnels, the refreshes,
    /// the lanes, the client connections, the transports, and the access
    /// log's last lines.
    static func shutdown(_ worker: ProxyWorker) {
        let lanes = worker.lanes!
        for (_, l) in lanes.all {
            l.cancelTimers()
            l.slots.removeAllWaiters()
            worker.parking.dropAll(l)
        }
        worker.gate.abandonAll()
        worker.cluster?.close()
        let exchanges = Array(worker.exchanges)
        for exchange in exchanges { exchange.abandon() }
        worker.shared.inFlight.add(-exchanges.filter { $0.delivery == nil }.count)
        worker.forgetExchanges()
        worker.tunnels.shutdownAll()
        worker.refreshes.abandonAll()
        lanes.removeAll()
        for s in worker.servers { s.close() }
        worker.transports.shutdown()
        worker.accessLog.flush()
    }
}
