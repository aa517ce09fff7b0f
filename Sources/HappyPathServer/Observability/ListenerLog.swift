import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// A worker's listener pauses and memory pressure, counted and logged:
/// one log line per interval for the pauses, however often they happen.
struct ListenerLog {
    let logger: Logger
    let metrics: WorkerMetrics
    /// Listener pauses (EMFILE, max_connections): one log line per 5 s.
    var acceptPauseLog = LogThrottle(every: .seconds(5))

    /// At `limits.max_connections` the listener stops accepting (see
    /// HTTPServer). This and `acceptPaused` share one log line per interval,
    /// however often they happen; every pause is counted.
    mutating func acceptCapped(limit: Int, at now: Instant) {
        metrics.acceptCapped()
        guard let pauses = acceptPauseLog.occurred(at: now) else { return }
        logger.warning(
            "the process holds limits.max_connections client connections; new ones wait in the backlog",
            metadata: [
                "max_connections": "\(limit)", "pauses_since_last_log": "\(pauses)",
                "hint": "raise limits.max_connections if the machine has room, or lower client_timeout to close idle clients sooner",
            ])
    }

    /// `limits.max_memory`'s overload action began or ended: an event, a
    /// counted change, one log line each time.
    func memoryPressureChanged(_ change: MemoryPressure.Change, holding bytes: Int, limit: Int) {
        if change == .began {
            logger.warning(
                "the process holds \(byteSizeText(bytes)) for clients, 90% of limits.max_memory: new connections wait and new HTTP/2 streams are refused",
                metadata: [
                    "max_memory": "\(byteSizeText(limit))",
                    "hint": "see happypath_memory_bytes by pool; raise limits.max_memory if the machine has room",
                ])
        } else {
            logger.info("the process holds \(byteSizeText(bytes)) for clients again, below 75% of limits.max_memory: accepting")
        }
    }

    /// Out of descriptors: the listener pauses for `pause`.
    mutating func acceptPaused(errno code: Int32, pause: Duration, at now: Instant) {
        metrics.acceptPaused()
        guard let pauses = acceptPauseLog.occurred(at: now) else { return }
        logger.error(
            "cannot accept connections: \(String(cString: strerror(code))); pausing the listener",
            metadata: [
                "pause_ms": "\(pause.nanoseconds / 1_000_000)", "pauses_since_last_log": "\(pauses)",
                "hint": "raise the open-files limit (ulimit -n / LimitNOFILE) or lower the number of idle clients",
            ])
    }
}
