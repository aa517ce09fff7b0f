import CoreMetrics
import HappyPathAdmin
import HappyPathCore
import Prometheus
import Synchronization

/// The route series the status page reads (`RouteTotals`), kept readable:
/// swift-prometheus's handles can be written and exported but not read
/// back, so each one of these families is made through a handle that also
/// keeps its value in an atomic of its own. One book per server; the
/// factory asks it for a handle once per label set (a worker keeps what it
/// is given), so a request pays one relaxed atomic add more per series it
/// counts in (its requests, its tries, and the duration's bucket, found by
/// a scan of the 14 bounds). An entry stays for the server's life: the
/// registry's handles are never destroyed (`HelpfulMetricsFactory`'s
/// `destroy…` unregister the series only).
final class RouteSeriesBook: Sendable {
    private let counters = Locked<[String: ReadableCounter]>([:])
    private let timers = Locked<[String: ReadableTimer]>([:])

    /// `series` made readable when `family` is one `RouteTotals` reads and
    /// the labels name a route; otherwise `series` itself.
    func counter(_ series: Prometheus.Counter, family: String, labels: [(String, String)]) -> any CounterHandler {
        guard let route = labels.first(where: { $0.0 == "route" })?.1,
            let which = RouteReading.Series(family: family, labels: labels)
        else { return series }
        let key = Self.key(family, labels)
        return counters.withLock { book in
            if let known = book[key] { return known }
            let made = ReadableCounter(series, route: route, which)
            book[key] = made
            return made
        }
    }

    /// The duration histogram made readable for the route it names.
    func timer(_ series: DurationHistogram, family: String, labels: [(String, String)], buckets: [Duration])
        -> any TimerHandler
    {
        guard family == RouteReading.durationFamily, let route = labels.first(where: { $0.0 == "route" })?.1 else {
            return series
        }
        let key = Self.key(family, labels)
        return timers.withLock { book in
            if let known = book[key] { return known }
            let made = ReadableTimer(series, route: route, buckets: buckets)
            book[key] = made
            return made
        }
    }

    /// Every readable series' value now (a status page's or `/admin/state`'s reading).
    func readings() -> [RouteReading] {
        var out = counters.withLock { book in
            book.values.map { RouteReading(route: $0.route, $0.series, Double($0.value.load(ordering: .relaxed))) }
        }
        for timer in timers.withLock({ Array($0.values) }) { out += timer.readings() }
        return out
    }

    private static func key(_ family: String, _ labels: [(String, String)]) -> String {
        labels.reduce(family) { $0 + "\u{0}" + $1.0 + "\u{0}" + $1.1 }
    }
}

/// A counter of a route series: the exported one, and its total to read.
final class ReadableCounter: CounterHandler, Sendable {
    let exported: Prometheus.Counter
    let route: String
    let series: RouteReading.Series
    let value = Atomic<Int64>(0)

    init(_ exported: Prometheus.Counter, route: String, _ series: RouteReading.Series) {
        self.exported = exported
        self.route = route
        self.series = series
    }

    func increment(by amount: Int64) {
        exported.increment(by: amount)
        value.wrappingAdd(amount, ordering: .relaxed)
    }

    func reset() {
        exported.reset()
        value.store(0, ordering: .relaxed)
    }
}

/// `happypath_request_duration_seconds` of one route: the exported
/// histogram, and a count per bucket to read (the same bounds, `le`: a
/// value on a bound counts in that bucket).
final class ReadableTimer: TimerHandler, Sendable {
    let exported: DurationHistogram
    let route: String
    /// Upper bounds in nanoseconds, ascending; the last count is `+Inf`'s.
    private let bounds: [Int64]
    private let counts: [AtomicCount]

    init(_ exported: DurationHistogram, route: String, buckets: [Duration]) {
        self.exported = exported
        self.route = route
        self.bounds = buckets.map(\.nanoseconds).sorted()
        self.counts = (0...buckets.count).map { _ in AtomicCount() }
    }

    func recordNanoseconds(_ duration: Int64) {
        exported.recordNanoseconds(duration)
        var i = 0
        while i < bounds.count, duration > bounds[i] { i += 1 }
        counts[i].value.wrappingAdd(1, ordering: .relaxed)
    }

    /// Cumulative counts by bound, as Prometheus's `_bucket` series are.
    func readings() -> [RouteReading] {
        var cumulative = 0
        return counts.indices.map { i in
            cumulative += counts[i].value.load(ordering: .relaxed)
            let le = i < bounds.count ? Double(bounds[i]) / 1e9 : .infinity
            return RouteReading(route: route, .durationBucket(le: le), Double(cumulative))
        }
    }

    final class AtomicCount: Sendable {
        let value = Atomic<Int>(0)
    }
}
