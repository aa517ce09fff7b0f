import HappyPathCore
import HappyPathPolicies

/// What the metrics registry already counts for one route since the
/// process started, read back from its Prometheus text for the status page
/// (the request path keeps counting as before; only the page reads).
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

    public init(route: String) { self.route = route }

    /// One sample of the text format: `name{label="value",...} value`.
    public typealias Sample = (name: String, labels: [String: String], value: Double)

    /// The samples of Prometheus text (comments and lines it cannot read are
    /// passed over). Label values are unescaped (`\\`, `\"`, `\n`).
    public static func samples(_ text: String) -> [Sample] {
        var out: [Sample] = []
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            let series = line[..<space]
            guard let brace = series.firstIndex(of: "{") else {
                out.append((String(series), [:], value))
                continue
            }
            guard series.last == "}",
                let labels = self.labels(series[series.index(after: brace)..<series.index(before: series.endIndex)])
            else { continue }
            out.append((String(series[..<brace]), labels, value))
        }
        return out
    }

    /// `a="x",b="y\"z"` as a dictionary; nil when it is not that.
    static func labels(_ text: Substring) -> [String: String]? {
        var labels: [String: String] = [:]
        var i = text.startIndex
        while i < text.endIndex {
            guard let eq = text[i...].firstIndex(of: "="), text.index(after: eq) < text.endIndex,
                text[text.index(after: eq)] == "\""
            else { return nil }
            let key = String(text[i..<eq])
            var value = ""
            var j = text.index(eq, offsetBy: 2)
            var closed = false
            while j < text.endIndex {
                let c = text[j]
                if c == "\\", text.index(after: j) < text.endIndex {
                    j = text.index(after: j)
                    value.append(text[j] == "n" ? "\n" : text[j])
                } else if c == "\"" {
                    closed = true
                    break
                } else {
                    value.append(c)
                }
                j = text.index(after: j)
            }
            guard closed else { return nil }
            labels[key] = value
            i = text.index(after: j)
            if i < text.endIndex {
                guard text[i] == "," else { return nil }
                i = text.index(after: i)
            }
        }
        return labels
    }

    /// Each route's totals from the registry's text, in `routes` order
    /// (the configuration's), every route listed even before its first request.
    public static func read(_ text: String, routes: [String]) -> [RouteTotals] {
        var totals = Dictionary(routes.map { ($0, RouteTotals(route: $0)) }, uniquingKeysWith: { first, _ in first })
        var buckets: [String: [(le: Double, count: Double)]] = [:]
        for s in samples(text) {
            guard let route = s.labels["route"], totals[route] != nil else { continue }
            switch s.name {
            case "happypath_requests_total":
                totals[route]!.requests += s.value
                if s.labels["code"] != "OK" { totals[route]!.errors += s.value }
            case "happypath_hedges_total":
                if s.labels["outcome"] == "won" { totals[route]!.hedgesWon += s.value }
                if s.labels["outcome"] == "lost" { totals[route]!.hedgesLost += s.value }
            case "happypath_fallback_total":
                totals[route]!.fallbacks += s.value
                totals[route]!.fallbacksByKind[s.labels["kind"] ?? "", default: 0] += s.value
            case "happypath_request_tries_total": totals[route]!.tries += s.value
            case "happypath_rate_limited_total": totals[route]!.rateLimited += s.value
            case "happypath_request_duration_seconds_bucket":
                guard let le = s.labels["le"].flatMap({ $0 == "+Inf" ? .infinity : Double($0) }) else { continue }
                buckets[route, default: []].append((le, s.value))
            default: continue
            }
        }
        for (route, list) in buckets {
            let sorted = list.sorted { $0.le < $1.le }
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
