import Foundation
import Testing

/// Polls `condition` until it holds, and returns true then. Tests wait for
/// the event they need (a count on the admin port, a log line, the
/// upstream's hit count), never for a span of time: `timeout` is only a
/// safety net. If the condition never holds, the test gets an issue naming
/// `what` it waited for (and the last error the condition threw, if any),
/// and false comes back so the test can stop there.
@discardableResult
func waitUntil(
    _ what: String, timeout: Double = 10, sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () throws -> Bool
) -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
    var interval = 0.001
    var lastError: (any Error)?
    while true {
        do {
            if try condition() { return true }
        } catch {
            lastError = error
        }
        if ContinuousClock.now >= deadline { break }
        // The polling interval of this helper (1 ms, doubling up to 20 ms):
        // not a wait for anything in particular.
        Thread.sleep(forTimeInterval: interval)
        interval = min(interval * 2, 0.02)
    }
    var message = "gave up after \(timeout) s waiting for \(what)"
    if let lastError { message += " (last error: \(lastError))" }
    Issue.record(Comment(rawValue: message), sourceLocation: sourceLocation)
    return false
}

/// Seconds on a monotonic clock since `start` (for the few bounds that are
/// about time; the wall clock may be stepped while a test runs).
func seconds(since start: ContinuousClock.Instant) -> Double {
    let d = ContinuousClock.now - start
    return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

/// `name{labels} value` lines of a Prometheus text exposition, by series.
func metricSamples(_ text: String) -> [String: Double] {
    var out: [String: Double] = [:]
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
        out[String(line[..<space])] = value
    }
    return out
}

/// The proxy's admin listener, read as an operator would: what the tests
/// wait for when the proxy offers no other signal.
struct AdminProbe {
    let port: Int

    /// `GET /admin/state`.
    func state() throws -> [String: Any] {
        let r = try HTTP.request(port: port, "/admin/state", timeout: 5)
        guard r.status == 200 else { throw TestError("/admin/state answered \(r.status)") }
        return r.json
    }

    /// Exchanges in flight in the whole proxy (queued and parked ones included).
    func inFlight() throws -> Int {
        guard let n = try state()["in_flight"] as? Int else { throw TestError("/admin/state has no in_flight") }
        return n
    }

    /// Commands parked in the whole proxy.
    func parked() throws -> Int {
        guard let n = try state()["parked"] as? Int else { throw TestError("/admin/state has no parked") }
        return n
    }

    /// One upstream's entry in `/admin/state`.
    func upstream(_ name: String) throws -> [String: Any] {
        let list = try state()["upstreams"] as? [[String: Any]] ?? []
        guard let u = list.first(where: { $0["name"] as? String == name }) else {
            throw TestError("/admin/state has no upstream \(name)")
        }
        return u
    }

    /// `GET /metrics`, by series.
    func metrics() throws -> [String: Double] {
        metricSamples(try HTTP.request(port: port, "/metrics", timeout: 5).text)
    }

    /// One series of `/metrics` (0 if it is not there yet).
    func metric(_ series: String) throws -> Double { try metrics()[series] ?? 0 }
}
