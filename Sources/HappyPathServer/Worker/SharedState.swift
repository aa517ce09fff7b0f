import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging
import Synchronization

/// What the workers share: per-upstream guards (breaker, budget,
/// reachability), the process-wide parking count, and the way to tell every
/// worker that an upstream recovered.
///
/// `@unchecked Sendable`: its two `var`s (`deliveries`, `workers`) are set
/// before any loop runs and then only read, until `forgetWorkers` after
/// every loop stopped; everything else is immutable, atomic or locked.
final class SharedState: @unchecked Sendable {
    /// Per upstream of the current configuration, in its order.
    let guards: [UpstreamGuard]
    let parked: ParkingCount
    let metrics: ProxyMetrics
    let events: EventBus
    /// Exchanges in flight in the whole process (drain waits for zero).
    let inFlight: InFlightCount
    /// Tunnels open on every worker (`happypath_tunnels_open`).
    let tunnels: InFlightCount
    /// HTTP/2 connections and streams open on every worker
    /// (`happypath_http2_connections`, `happypath_http2_streams_open`).
    let http2Connections: InFlightCount
    let http2Streams: InFlightCount
    /// Request bodies held in memory (`limits.max_buffered_bytes`).
    let bodies: BodyBudget
    /// Each client's share of `bodies` (`limits.max_buffered_per_client`).
    let clientShares: ClientShares
    /// What client connections hold: staged answers and queued output.
    let connectionMemory: ConnectionMemory
    /// The admin listener's connections (its output: `/admin/events`
    /// streams, scrapes), in `happypath_memory_bytes{pool="admin_output"}`.
    let adminMemory: ConnectionMemory
    /// `limits.max_memory` and its overload action.
    let memoryPressure: MemoryPressure
    /// Answers read ahead of slow clients into spool files (`limits.read_ahead`,
    /// `limits.max_spooled_bytes`, `storage.spool_dir`): one for the
    /// process's life (the directory is restart-only), its limits reloaded.
    let spool: Spool
    /// Client connections open (`limits.max_connections`).
    let connections: ConnectionBudget
    let loadedAt = Date()
    /// Answers kept for `fallback.serve_stale`, for the whole process (nil:
    /// no route keeps any). Carried over by a reload, its contents too.
    let stale: StaleStore?
    /// The deliver-later dispatcher (nil: no route delivers later). Set
    /// before any loop runs and carried over by a reload.
    var deliveries: Deliveries?
    /// `tracing` (nil: none). Set before any loop runs and carried over by a reload.
    var tracer: Tracer?
    /// `cluster.redis` (nil: none). Set before any loop runs and carried over by a reload.
    var cluster: ClusterState?
    /// Set before any loop runs (and carried over by a reload); then
    /// read-only until the server stops and calls `forgetWorkers()`: each
    /// worker holds the shared state, so this list keeps both alive until then.
    private var workers: [LoopBound<ProxyWorker>] = []

    /// - Parameter previous: on a reload, the state to carry over: counters,
    ///   metrics, the event bus, workers, and the guard of every upstream whose
    ///   definition did not change (so its breaker, budget and token survive).
    ///   The parking count is carried over too (commands parked under the old
    ///   configuration still hold their places), but takes the new
    ///   `limits.max_parked`: a reload must never keep an old value silently.
    init(runtime: RuntimeConfiguration, logger: Logger, events: EventBus, previous: SharedState? = nil) {
        let metrics = previous?.metrics ?? ProxyMetrics()
        self.metrics = metrics
        self.events = events
        let maxParked = runtime.configuration.limits.maxParked
        if let carried = previous?.parked {
            carried.limit = maxParked
            parked = carried
        } else {
            parked = ParkingCount(limit: maxParked)
        }
        inFlight = previous?.inFlight ?? InFlightCount()
        tunnels = previous?.tunnels ?? InFlightCount()
        http2Connections = previous?.http2Connections ?? InFlightCount()
        http2Streams = previous?.http2Streams ?? InFlightCount()
        // The same for the body budget: bodies held now stay counted.
        bodies = previous?.bodies ?? BodyBudget(limit: runtime.configuration.limits.maxBufferedBytes)
        bodies.limit = runtime.configuration.limits.maxBufferedBytes
        clientShares = previous?.clientShares ?? ClientShares(process: bodies, perClient: runtime.configuration.limits.bufferedPerClient)
        clientShares.limit = runtime.configuration.limits.bufferedPerClient
        connectionMemory = previous?.connectionMemory ?? ConnectionMemory()
        adminMemory = previous?.adminMemory ?? ConnectionMemory()
        memoryPressure =
            previous?.memoryPressure
            ?? MemoryPressure(
                limit: runtime.configuration.limits.maxMemory, bodies: bodies, memory: connectionMemory,
                other: adminMemory.output)
        memoryPressure.limit = runtime.configuration.limits.maxMemory
        let spooling = runtime.configuration.limits
        spool =
            previous?.spool
            ?? Spool(
                directory: runtime.configuration.spoolDirectory, perAnswer: spooling.readAhead,
                maxSpooled: spooling.maxSpooledBytes, perClient: spooling.spooledPerClient,
                bodyInMemory: spooling.bodyInMemory)
        spool.perAnswer = spooling.readAhead
        spool.bodyInMemory = spooling.bodyInMemory
        spool.shares.process.limit = spooling.maxSpooledBytes
        spool.shares.limit = spooling.spooledPerClient
        // Connections open now stay counted; a lower cap stops new ones only.
        connections = previous?.connections ?? ConnectionBudget(limit: runtime.configuration.limits.maxClientConnections)
        connections.limit = runtime.configuration.limits.maxClientConnections
        workers = previous?.workers ?? []
        tracer = previous?.tracer
        cluster = previous?.cluster
        deliveries = previous?.deliveries
        let limits = runtime.configuration.limits
        stale =
            previous?.stale
            ?? (runtime.configuration.keepsAnswers
                ? StaleStore(maxBytes: limits.staleMaxBytes, maxEntryBytes: limits.staleMaxEntry) : nil)
        guards = zip(runtime.upstreams, runtime.configuration.upstreams).map { u, definition in
            let fresh = UpstreamGuard(upstream: u, definition: definition, logger: logger, metrics: metrics, events: events)
            if let old = previous?.guards.first(where: { $0.name == u.name && $0.fingerprint == fresh.fingerprint }) {
                return old
            }
            metrics.circuitState(upstream: u.name, gauge: 0)
            for r in Exchange.ParkReason.allCases { metrics.parked(upstream: u.name, reason: r.rawValue, count: 0) }
            return fresh
        }
    }

    func register(_ worker: LoopBound<ProxyWorker>) { workers.append(worker) }

    /// The server stopped (every loop has ended): let go of the workers.
    func forgetWorkers() {
        workers.removeAll()
        deliveries = nil
    }

    /// Every worker replays its parked commands for this upstream, on its own loop.
    func recovered(_ guardian: UpstreamGuard) {
        deliveries?.recovered(upstream: guardian.name)
        for worker in workers {
            worker.loop.execute(with: worker) { $0.parking.replayParked(guardian: guardian, reasons: [.unreachable, .circuitOpen]) }
        }
    }

    /// The upstream paused itself: every worker wakes the requests it
    /// parks for the pause when it ends.
    func paused(_ guardian: UpstreamGuard, until: Instant) {
        for worker in workers {
            worker.loop.execute(with: worker) { $0.pacing.schedulePauseEnd(guardian: guardian, at: until) }
        }
    }

    /// A token refresh ended: every worker replays the commands it parked
    /// waiting for it, or answers them AUTH_FAILED.
    func tokenRefreshed(_ guardian: UpstreamGuard, failure: String?) {
        for worker in workers {
            worker.loop.execute(with: worker) { $0.parking.authDone(guardian: guardian, failure: failure) }
        }
    }
}

extension UpstreamGuard {
    /// An upstream's definition and resolved policies, compared field by
    /// field (credentials included, so a rotated secret gets a fresh token)
    /// and never turned into text.
    struct Fingerprint: Equatable, Sendable {
        let definition: Upstream
        let policies: ResolvedPolicies
    }
}

final class InFlightCount: Sendable {
    private let count = Atomic<Int>(0)
    var current: Int { count.load(ordering: .relaxed) }
    func add(_ n: Int) { count.wrappingAdd(n, ordering: .relaxed) }
}

/// What the process holds for its clients now, pool by pool
/// (`happypath_memory_bytes{pool}`, `/admin/state`'s `memory`, the status page).
struct MemoryReading: Sendable {
    var requestBodies = 0
    var stagedAnswers = 0
    var clientOutput = 0
    var tunnels = 0
    /// Response bytes the proxy's own HTTP/2 client holds for slow clients' streams.
    var upstreamH2 = 0
    /// Answer bytes kept once for coalesced groups' members that have not read them.
    var coalesced = 0
    var adminOutput = 0
    var keptAnswers = 0
    /// `limits.max_memory`, and whether its overload action is on.
    var limit = 0
    var pressure = false
    /// Bytes in spool files (answers read ahead, `limits.read_ahead`, and
    /// bodies kept, `limits.body_in_memory`), and their budget
    /// (`limits.max_spooled_bytes`): on disk, not in `limit`.
    var spooled = 0
    var spoolLimit = 0

    /// Each pool by its label, in a fixed order.
    var pools: [(pool: String, bytes: Int)] {
        [
            ("request_bodies", requestBodies), ("staged_answers", stagedAnswers), ("client_output", clientOutput),
            ("tunnels", tunnels), ("upstream_h2", upstreamH2), ("coalesced", coalesced), ("admin_output", adminOutput),
            ("kept_answers", keptAnswers),
        ]
    }
}

extension SharedState {
    /// `limits.max_memory`'s overload action began or ended (seen by a
    /// worker at an accept or a new stream, or by a `/metrics` scrape): the
    /// event and the count, once per change.
    func memoryPressureChanged(_ change: MemoryPressure.Change, holding bytes: Int) {
        let began = change == .began
        metrics.counter("happypath_memory_pressure_changes_total", [("change", began ? "began" : "ended")]).increment()
        events.publish(
            "memory_pressure",
            [("state", began ? "high" : "normal"), ("bytes", "\(bytes)"), ("max_memory", "\(memoryPressure.limit)")])
    }

    /// Checks the overload action against what is held now (a scrape's view).
    func checkMemoryPressure() {
        let (_, change, total) = memoryPressure.check()
        if let change { memoryPressureChanged(change, holding: total) }
    }

    var memoryReading: MemoryReading {
        MemoryReading(
            requestBodies: bodies.current, stagedAnswers: connectionMemory.staged.current,
            clientOutput: connectionMemory.output.current, tunnels: connectionMemory.tunnels.current,
            upstreamH2: connectionMemory.upstreamH2.current, coalesced: connectionMemory.coalesced.current,
            adminOutput: adminMemory.output.current, keptAnswers: stale?.usage.bytes ?? 0,
            limit: memoryPressure.limit, pressure: memoryPressure.active, spooled: spool.spooled,
            spoolLimit: spool.shares.process.limit)
    }
}
