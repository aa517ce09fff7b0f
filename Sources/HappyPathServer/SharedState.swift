import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import Logging
import Synchronization

/// What the workers share: per-upstream guards (breaker, budget,
/// reachability), the process-wide parking count, and the way to tell every
/// worker that an upstream recovered.
final class SharedState: @unchecked Sendable {
    let guards: [UpstreamGuard]
    let parked: ParkingCount
    let metrics: ProxyMetrics
    let events: EventBus
    /// Exchanges in flight in the whole process (drain waits for zero).
    let inFlight = Atomic<Int>(0)
    /// Parked commands per upstream and reason (for metrics and /admin/state).
    private let parkedBy: Mutex<[[Int]]>
    let loadedAt = Date()
    /// Per upstream: its credentials (nil for `auth.kind: none`).
    let tokens: [TokenSource?]
    /// Set once, before any loop runs; then read-only.
    private var workers: [(loop: EventLoop, worker: WorkerHandle)] = []

    init(runtime: RuntimeConfiguration, logger: Logger, events: EventBus) {
        let metrics = ProxyMetrics()
        self.metrics = metrics
        self.events = events
        guards = runtime.upstreams.map { u in
            UpstreamGuard(
                name: u.name, endpointCount: u.endpoints.count, breaker: u.breakerConfiguration,
                budgetRatio: u.policies.retry.budgetRatio ?? 0.2, budgetMinPerSecond: u.policies.retry.budgetMinPerSecond ?? 10,
                logger: logger, metrics: metrics, events: events)
        }
        parkedBy = Mutex(runtime.upstreams.map { _ in Exchange.ParkReason.allCases.map { _ in 0 } })
        for u in runtime.upstreams {
            metrics.circuitState(upstream: u.name, gauge: 0)
            for r in Exchange.ParkReason.allCases { metrics.parked(upstream: u.name, reason: r.rawValue, count: 0) }
        }
        parked = ParkingCount(limit: runtime.configuration.limits.maxParked)
        tokens = runtime.configuration.upstreams.map { u in
            u.auth.kind == .none ? nil : TokenSource(settings: u.auth, upstreamName: u.name)
        }
    }

    /// A token refresh for upstream `u` ended: every worker replays the
    /// commands it parked waiting for it, or answers them AUTH_FAILED.
    func tokenRefreshed(upstreamIndex u: Int, failure: String?) {
        for (loop, handle) in workers {
            loop.execute { handle.worker.authDone(upstreamIndex: u, failure: failure) }
        }
    }

    func register(_ worker: ProxyWorker) { workers.append((worker.loop, WorkerHandle(worker))) }

    func parkedChanged(upstreamIndex u: Int, name: String, reason: Exchange.ParkReason, by delta: Int) {
        let i = Exchange.ParkReason.allCases.firstIndex(of: reason)!
        let now = parkedBy.withLock { counts in
            counts[u][i] += delta
            return counts[u][i]
        }
        metrics.parked(upstream: name, reason: reason.rawValue, count: now)
    }

    func parkedCount(upstreamIndex u: Int, reason: Exchange.ParkReason) -> Int {
        parkedBy.withLock { $0[u][Exchange.ParkReason.allCases.firstIndex(of: reason)!] }
    }

    /// Every worker replays its parked commands for upstream `u`, on its own loop.
    func recovered(upstreamIndex u: Int) {
        for (loop, handle) in workers {
            loop.execute { handle.worker.replayParked(upstreamIndex: u, reasons: [.unreachable, .circuitOpen]) }
        }
    }
}

/// A worker, handed to its own loop's thread (it is only touched there).
final class WorkerHandle: @unchecked Sendable {
    let worker: ProxyWorker
    init(_ worker: ProxyWorker) { self.worker = worker }
}

/// Parked commands in the whole process, bounded by `limits.max_parked`.
final class ParkingCount: Sendable {
    let limit: Int
    private let count = Atomic<Int>(0)

    init(limit: Int) { self.limit = limit }

    var current: Int { count.load(ordering: .relaxed) }

    func tryTake() -> Bool {
        let after = count.wrappingAdd(1, ordering: .relaxed).newValue
        if after > limit {
            count.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    func give() { count.wrappingSubtract(1, ordering: .relaxed) }
}
