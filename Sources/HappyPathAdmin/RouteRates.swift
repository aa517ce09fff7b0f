import HappyPathCore
import HappyPathPolicies

/// One route between two readings of its totals: what Prometheus would
/// compute with `rate()` over the same span, for the status page.
public struct RouteWindow: Sendable, Equatable {
    /// The span between the two readings.
    public var seconds: Double
    public var requestsPerSecond: Double
    /// Errors over requests answered in the span; nil: none answered.
    public var errorRatio: Double?
    /// Upper bounds of the buckets the quantiles fall in, from the span's
    /// requests only; nil: none answered.
    public var p50: Double?
    public var p99: Double?
    /// Tries counted per request answered in the span.
    public var triesPerRequest: Double?

    public init(
        seconds: Double, requestsPerSecond: Double, errorRatio: Double? = nil, p50: Double? = nil, p99: Double? = nil,
        triesPerRequest: Double? = nil
    ) {
        self.seconds = seconds
        self.requestsPerSecond = requestsPerSecond
        self.errorRatio = errorRatio
        self.p50 = p50
        self.p99 = p99
        self.triesPerRequest = triesPerRequest
    }

    /// Between `before` and `after`, `seconds` apart; nil when a counter went
    /// back (the route's series are gone, or another process).
    public static func between(_ before: RouteTotals, _ after: RouteTotals, seconds: Double) -> RouteWindow? {
        let requests = after.requests - before.requests
        let errors = after.errors - before.errors
        let tries = after.tries - before.tries
        guard seconds > 0, requests >= 0, errors >= 0, tries >= 0 else { return nil }
        var window = RouteWindow(seconds: seconds, requestsPerSecond: requests / seconds)
        guard requests > 0 else { return window }
        window.errorRatio = errors / requests
        window.triesPerRequest = tries / requests
        let earlier = Dictionary(before.buckets.map { ($0.le, $0.count) }, uniquingKeysWith: { a, _ in a })
        let delta = after.buckets.map { (le: $0.le, count: $0.count - (earlier[$0.le] ?? 0)) }
        window.p50 = RouteTotals.quantile(0.5, delta)
        window.p99 = RouteTotals.quantile(0.99, delta)
        return window
    }
}

/// Earlier readings of the route totals, kept by the admin listener so
/// that each reading can be compared with one taken a while before: the
/// rates cost the request path nothing (it only counts, as always), and
/// the admin loop one registry read per `/admin/state`.
///
/// A reading is kept when the newest kept is `spacing` old or more;
/// readings older than `horizon` are dropped, but the newest kept stays,
/// so the span is at most about `horizon` while the page is open (it asks
/// every 5 s), and after a long quiet spell the span is that spell, said
/// with the rates. Pure, with the time passed in.
public struct RouteRates: Sendable {
    public let spacing: Duration
    public let horizon: Duration
    /// Below this span there is no rate (two readings at once say nothing).
    public let minimumSpan: Duration
    private var readings: [(at: Instant, totals: [String: RouteTotals])] = []

    public init(spacing: Duration = .seconds(5), horizon: Duration = .seconds(60), minimumSpan: Duration = .seconds(1)) {
        self.spacing = spacing
        self.horizon = horizon
        self.minimumSpan = minimumSpan
    }

    /// Readings kept now (for tests).
    public var kept: Int { readings.count }

    /// Takes `totals` read at `now`; returns each route's window since the
    /// oldest reading kept (none for a route that reading did not have, or
    /// when it is younger than `minimumSpan`).
    public mutating func read(_ totals: [RouteTotals], at now: Instant) -> [String: RouteWindow] {
        while readings.count > 1, now - readings[0].at > horizon, now - readings[1].at >= minimumSpan {
            readings.removeFirst()
        }
        var windows: [String: RouteWindow] = [:]
        if let base = readings.first, now - base.at >= minimumSpan {
            let seconds = (now - base.at).seconds
            for t in totals {
                guard let before = base.totals[t.route], let w = RouteWindow.between(before, t, seconds: seconds) else {
                    continue
                }
                windows[t.route] = w
            }
        }
        if readings.last.map({ now - $0.at >= spacing }) ?? true {
            readings.append((now, Dictionary(totals.map { ($0.route, $0) }, uniquingKeysWith: { a, _ in a })))
        }
        return windows
    }
}
