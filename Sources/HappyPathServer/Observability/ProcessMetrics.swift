import HappyPathConfig
import HappyPathIO
import CoreMetrics
import Foundation
import HappyPathCore
import HappyPathPolicies
import Metrics
import Prometheus

/// The process's own series, the names every Prometheus client library
/// uses (`process_*`), read from `/proc/self` at each scrape: CPU time,
/// resident memory, descriptors open and their limit, and the start time
/// (whose changes an alert counts as restarts).
final class ProcessMetrics: Sendable {
    /// CPU seconds already added to the counter (it only counts up).
    private let counted = Locked<Double>(0)
    private let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
    private let pageSize = Double(sysconf(Int32(_SC_PAGESIZE)))

    func record(into metrics: ProxyMetrics) {
        #if os(Linux)
            guard let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return }
            // The fields after the command name, from the state (field 3) on.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 21, let utime = Double(fields[11]), let stime = Double(fields[12]),
                let started = Double(fields[19]), let rss = Double(fields[21])
            else { return }
            let cpu = (utime + stime) / ticks
            let delta = counted.withLock { c -> Double in
                defer { c = max(c, cpu) }
                return max(0, cpu - c)
            }
            metrics.registry.makeCounter(
                descriptor: MetricNameDescriptor(metricName: "process_cpu_seconds", unitName: "total", helpText: MetricHelp.text["process_cpu_seconds_total"]!)
            ).increment(by: delta)
            metrics.gauge("process_resident_memory_bytes", []).record(rss * pageSize)
            if let boot = Self.bootTime() { metrics.gauge("process_start_time_seconds", []).record(boot + started / ticks) }
            var limit = rlimit()
            if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 { metrics.gauge("process_max_fds", []).record(Double(limit.rlim_cur)) }
            metrics.gauge("process_open_fds", []).record(Self.openDescriptors())
        #endif
    }

    /// The boot time, seconds since 1970 (`btime` in /proc/stat).
    private static func bootTime() -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(line.dropFirst(6).trimmingCharacters(in: .whitespaces))
        }
        return nil
    }

    private static func openDescriptors() -> Int {
        guard let dir = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(dir) }
        var n = 0
        while let entry = readdir(dir) {
            if entry.pointee.d_name.0 != 0x2E { n += 1 }  // not . or ..
        }
        return max(0, n - 1)  // the descriptor opendir itself holds
    }
}
