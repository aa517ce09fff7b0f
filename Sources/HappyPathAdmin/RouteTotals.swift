/// What the metrics registry already counts for one route since the
/// process started, for the status page: read from the values its route
/// series hold (`RouteReading`), never from the exposition text.
public struct RouteTotals: Sendable, Equatable {
    public var route: String
    /// Answered requests (`happypath_requests_total`).
    public var requests: Double = 0
    /// Of those, answered with anything but `OK`.
    public var errors: Double = 0
    /// Latency quantiles as the upper bound of the histogram bucket they fall
    /// in (seconds); `.infinity` past the last bucket, nil without requests.
    public var p50: Double?
    public var p99: Double?
    public var hedgesWon: Double = 0
    public var hedgesLost: Double = 0
    /// `happypath_fallback_total`, every kind and reason.
    public var fallbacks: Double = 0
    /// The same by kind (`stale`, `fixed`), every reason.
    public var fallbacksByKind: [String: Double] = [:]
    /// Tries counted for the answered requests (`happypath_request_tries_total`).
    public var tries: Double = 0
    /// `happypath_request_duration_seconds`'s cumulative buckets, by upper
    /// bound (for quantiles between two readings).
    public var buckets: [Bucket] = []

    public struct Bucket: Sendable, Equatable {
        public var le: Double
        public var count: Double
        public init(le: Double, count: Double) {
            self.le = le
            self.count = count
        }
    }
    /// `happypath_rate_limited_total`, queued and rejected.
    public var rateLimited: Double = 0
    /// Requests answered from another request's try (`happypath_coalesced_requests_total`).
    public var coalesced: Double = 0

    public init(route: String) { self.route = route }

    /// Each route's totals from the values the registry's route series hold
    /// now (`RouteReading`s, read from the series' own handles), in `routes`
    /// order (the configuration's), every route listed even before its first
    /// request. Readings of routes not listed (a route a reload removed) are
    /// passed over.
    public static func read(_ readings: [RouteReading], routes: [String]) -> [RouteTotals] {
        var totals = Dictionary(routes.map { ($0, RouteTotals(route: $0)) }, uniquingKeysWith: { first, _ in first })
        var buckets: [String: [Double: Double]] = [:]
        for r in readings {
            guard totals[r.route] != nil else { continue }
            switch r.series {
            case let .requests(code):
                totals[r.route]!.requests += r.value
                if code != "OK" { totals[r.route]!.errors += r.value }
            case let .hedges(outcome):
                if outcome == "won" { totals[r.route]!.hedgesWon += r.value }
                if outcome == "lost" { totals[r.route]!.hedgesLost += r.value }
            case let .fallbacks(kind):
                totals[r.route]!.fallbacks += r.value
                totals[r.route]!.fallbacksByKind[kind, default: 0] += r.value
            case .tries: totals[r.route]!.tries += r.value
            case .rateLimited: totals[r.route]!.rateLimited += r.value
            case .coalesced: totals[r.route]!.coalesced += r.value
            case let .durationBucket(le): buckets[r.route, default: [:]][le, default: 0] += r.value
            }
        }
        for (route, byBound) in buckets {
            let sorted = byBound.sorted { $0.key < $1.key }.map { (le: $0.key, count: $0.value) }
            totals[route]!.buckets = sorted.map { Bucket(le: $0.le, count: $0.count) }
            totals[route]!.p50 = quantile(0.5, sorted)
            totals[route]!.p99 = quantile(0.99, sorted)
        }
        var listed = Set<String>()
        return routes.filter { listed.insert($0).inserted }.map { totals[$0]! }
    }

    /// The upper bound of the first cumulative bucket holding `q` of the count.
    static func quantile(_ q: Double, _ buckets: [(le: Double, count: Double)]) -> Double? {
        guard let total = buckets.last?.count, total > 0 else { return nil }
        return buckets.first { $0.count >= q * total }?.le
    }
}

/// One value of a route series, as its handle holds it when the status page
/// or `/admin/state` is read: a counter's total, or the cumulative count of
/// `happypath_request_duration_seconds` up to one bucket's bound.
public struct RouteReading: Sendable, Equatable {
    /// Which series, by the labels that matter to `RouteTotals`.
    public enum Series: Sendable, Equatable, Hashable {
        /// `happypath_requests_total{code}`.
        case requests(code: String)
        /// `happypath_request_tries_total`.
        case tries
        /// `happypath_hedges_total{outcome}`.
        case hedges(outcome: String)
        /// `happypath_fallback_total{kind}` (every reason summed by the reader).
        case fallbacks(kind: String)
        /// `happypath_rate_limited_total` (queued and rejected).
        case rateLimited
        /// `happypath_coalesced_requests_total` (followers of coalesced groups).
        case coalesced
        /// `happypath_request_duration_seconds_bucket{le}`, cumulative;
        /// `.infinity` for `+Inf`.
        case durationBucket(le: Double)

        /// The series a family and its labels name, or nil when
        /// `RouteTotals` does not read that family (the route label is the
        /// caller's to find: `RouteSeriesBook`).
        public init?(family: String, labels: [(String, String)]) {
            func label(_ name: String) -> String? { labels.first { $0.0 == name }?.1 }
            switch family {
            case "happypath_requests_total": self = .requests(code: label("code") ?? "")
            case "happypath_request_tries_total": self = .tries
            case "happypath_hedges_total": self = .hedges(outcome: label("outcome") ?? "")
            case "happypath_fallback_total": self = .fallbacks(kind: label("kind") ?? "")
            case "happypath_rate_limited_total": self = .rateLimited
            case "happypath_coalesced_requests_total": self = .coalesced
            default: return nil
            }
        }
    }

    public var route: String
    public var series: Series
    public var value: Double

    public init(route: String, _ series: Series, _ value: Double) {
        self.route = route
        self.series = series
        self.value = value
    }

    /// The duration histogram `RouteTotals` reads (the counters: `Series(family:labels:)`).
    public static let durationFamily = "happypath_request_duration_seconds"
}
