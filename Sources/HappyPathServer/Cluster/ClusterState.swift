import CoreMetrics
import Foundation
import HappyPathAdmin
import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Logging
import Synchronization

/// The process's side of the cluster (`cluster.redis`): whether every
/// worker's Redis link is up (limits shared) or not (each replica decides
/// alone, with its local share), the replica count the heartbeats last
/// saw, and what is logged, counted and shown of it. Made once at start and
/// kept by a reload (`cluster` is restart-only). Shared by the workers.
final class ClusterState: Sendable {
    let settings: ClusterConfiguration
    /// This replica's name in the heartbeat set: `POD_NAME`, else host, pid
    /// and a random suffix (two servers in one process are two replicas).
    let replicaID: String
    private let logger: Logger
    private let events: EventBus
    private let links: Int
    private let upLinks = Atomic<Int>(0)
    private let seen = Atomic<Int>(1)
    private let status: Locked<Status>
    private let fallbackGauge: CoreMetrics.Gauge
    private let replicasGauge: CoreMetrics.Gauge
    let rtt: CoreMetrics.Timer
    private let metrics: ProxyMetrics

    private struct Status {
        var mode: Mode = .connecting
        var since = Date()
        var reason: String?
        var everReached = false
    }

    enum Mode: String, Sendable {
        /// Not every link has connected yet (just started).
        case connecting
        /// Limits count in Redis.
        case shared
        /// Some worker cannot reach Redis: its requests use the local share.
        case degraded
    }

    /// - Parameter links: the workers' command links (each must be up for `shared`).
    init(_ settings: ClusterConfiguration, links: Int, logger: Logger, events: EventBus, metrics: ProxyMetrics) {
        self.settings = settings
        self.links = links
        self.logger = logger
        self.events = events
        self.metrics = metrics
        let env = ProcessInfo.processInfo.environment
        replicaID =
            env["POD_NAME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? "\(ProcessInfo.processInfo.hostName):\(getpid()):\(String(UInt32.random(in: 0...UInt32.max), radix: 16))"
        status = Locked(Status())
        fallbackGauge = metrics.gauge("happypath_cluster_fallback", [])
        replicasGauge = metrics.gauge("happypath_cluster_replicas", [])
        rtt = metrics.timer("happypath_cluster_redis_rtt_seconds", [])
        fallbackGauge.record(1)
        replicasGauge.record(1)
    }

    /// Live replicas the last heartbeat counted (1 until one was counted).
    var replicas: Int { seen.load(ordering: .relaxed) }

    var mode: Mode { status.withLock { $0.mode } }

    /// What `/status` and `/admin/state` show.
    func reading() -> AdminSnapshot.Cluster {
        let s = status.withLock { $0 }
        return AdminSnapshot.Cluster(
            mode: s.mode.rawValue, since: s.since, replicas: replicas, reason: s.reason, redis: settings.redis.description)
    }

    func error(kind: String) { metrics.counter("happypath_cluster_redis_errors_total", [("kind", kind)]).increment() }

    func counted(replicas n: Int) {
        let n = max(1, min(n, 100_000))
        if seen.exchange(n, ordering: .relaxed) != n {
            replicasGauge.record(Double(n))
            logger.info("cluster: replicas seen", metadata: ["replicas": "\(n)"])
        }
    }

    /// A worker's link connected (again).
    func linkUp() {
        let up = upLinks.wrappingAdd(1, ordering: .relaxed).newValue
        guard up == links else { return }
        let was = status.withLock { s -> Mode in
            let was = s.mode
            s.mode = .shared
            s.since = Date()
            s.reason = nil
            s.everReached = true
            return was
        }
        fallbackGauge.record(0)
        if was == .degraded {
            logger.info("cluster restored: rate limits are shared through Redis again", metadata: ["redis": "\(settings.redis)"])
            events.publish("cluster_restored", [("redis", settings.redis.description)])
        } else {
            logger.info("cluster: rate limits are shared through Redis", metadata: ["redis": "\(settings.redis)"])
        }
    }

    /// A worker's link failed (or its first connect did): its requests use the local share.
    func linkDown(wasUp: Bool, reason: String) {
        if wasUp { upLinks.wrappingSubtract(1, ordering: .relaxed) }
        let (was, reached) = status.withLock { s -> (Mode, Bool) in
            let was = s.mode
            if was != .degraded {
                s.mode = .degraded
                s.since = Date()
                s.reason = reason
            }
            return (was, s.everReached)
        }
        fallbackGauge.record(1)
        guard was != .degraded else { return }
        let share =
            reached
            ? "each replica admits its share of every scope: cluster limit (rate ÷ \(replicas) replicas)"
            : "Redis was never reached, so each replica admits the whole rate of every scope: cluster limit"
        logger.error(
            "cluster degraded: Redis cannot be reached; \(share) until it answers again",
            metadata: ["redis": "\(settings.redis)", "reason": "\(reason)"])
        events.publish("cluster_degraded", [("redis", settings.redis.description), ("reason", reason)])
    }
}
