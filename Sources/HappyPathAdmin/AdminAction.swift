import Foundation
import HappyPathCore

/// What a request to the admin listener asks for, read from its method,
/// path and query alone (after `AdminAccessPolicy` let it in): a page, a
/// reading, an action, or why it is refused (wrong method, no such
/// resource, a bad parameter). Pure: `AdminServer` performs what this says
/// (docs/operations.md's admin API; docs/deliver-later.md for deliveries;
/// AdminActionParsingTests).
public enum AdminAction: Sendable, Equatable {
    case healthz
    case readyz
    case metrics
    /// `/admin/state`: the snapshot as JSON.
    case state
    /// `/`: to the status page.
    case root
    case status
    case statusScript
    case statusStyle
    /// `/admin/events`: server-sent events.
    case events
    /// `GET /admin/deliveries`, one page.
    case listDeliveries(DeliveryQuery)
    /// `GET /admin/deliveries/{id}`.
    case delivery(id: String)
    /// `POST /admin/deliveries/{id}/replay`.
    case replayDelivery(id: String)
    /// `POST /admin/deliveries/purge`.
    case purgeDeliveries
    /// `POST /admin/fallback/purge[?prefix=]`: the kept answers under a
    /// path prefix (checked by `stalePrefixRefusal` once the server knows
    /// answers are kept at all).
    case purgeStale(prefix: String)
    /// `POST /admin/upstreams/{name}/...`: an operator's action on an
    /// upstream. The name, then the endpoint's index, then the verb are
    /// checked against the configuration in that order by the server.
    case upstream(name: String, UpstreamAction)
    /// Refused before anything is read or changed.
    case refused(Refusal)

    public enum UpstreamAction: Sendable, Equatable {
        /// `endpoints/{i}/drain` (`drain` true), `.../undrain` (false),
        /// another verb (nil: no such resource, once the index is checked).
        case endpoint(index: String, drain: Bool?)
        /// `breaker/open`, `/closed`, `/auto`; another verb (nil).
        case breaker(Breaker?)
        /// Neither.
        case unknown
    }

    /// A breaker as an operator sets it (`auto`: as its failures say).
    public enum Breaker: String, Sendable, Equatable {
        case open, closed, auto
    }

    /// A delivery listing's filters (`?state=&upstream=&limit=&after=`).
    public struct DeliveryQuery: Sendable, Equatable {
        /// One of `deliveryStates`.
        public var state: String?
        public var upstream: String?
        public var after: Int64?
        public var limit = 100

        public init(state: String? = nil, upstream: String? = nil, after: Int64? = nil, limit: Int = 100) {
            self.state = state
            self.upstream = upstream
            self.after = after
            self.limit = limit
        }
    }

    /// Why a request is refused, as its problem says it.
    public struct Refusal: Sendable, Equatable {
        public var status: Int
        public var code: ProblemCode
        public var detail: String

        public init(_ status: Int, _ code: ProblemCode, _ detail: String) {
            self.status = status
            self.code = code
            self.detail = detail
        }
    }

    /// The most deliveries one page lists.
    public static let maxPage = 1000

    /// The states a listing filters by: the store's names for them
    /// (`DeliveryState.name`; a test holds the two lists equal).
    public static let deliveryStates = ["queued", "in_flight", "delivered", "dead"]

    public static let upstreamsUsage =
        "Use POST /admin/upstreams/{name}/endpoints/{i}/drain or /undrain, or /admin/upstreams/{name}/breaker/open, /closed or /auto."

    /// What `method` on `path` with `query` asks for.
    public static func parse(method: String, path: String, query: String?) -> AdminAction {
        let isGet = method == "GET" || method == "HEAD"
        if isDeliveries(path) {
            return deliveries(path: path, query: query, isGet: isGet, isPost: method == "POST")
        }
        if path == "/admin/fallback/purge" {
            guard method == "POST" else { return .refused(.init(400, .badRequest, "/admin/fallback/purge takes POST.")) }
            return .purgeStale(prefix: queryItems(query).first { $0.0 == "prefix" }?.1 ?? "/")
        }
        if path.hasPrefix("/admin/upstreams/") { return upstreams(path: path, isPost: method == "POST") }
        guard isGet else { return .refused(.init(400, .badRequest, "The admin API is read-only: use GET.")) }
        switch path {
        case "/healthz": return .healthz
        case "/readyz": return .readyz
        case "/metrics": return .metrics
        case "/admin/state": return .state
        case "/": return .root
        case "/status": return .status
        case "/status.js": return .statusScript
        case "/status.css": return .statusStyle
        case "/admin/events": return .events
        default:
            return .refused(
                .init(
                    404, .noRoute,
                    "The admin listener serves /status, /healthz, /readyz, /metrics, /admin/state, /admin/events, /admin/deliveries, /admin/upstreams and /admin/fallback/purge."
                ))
        }
    }

    /// `/admin/deliveries[/{id}[/replay]]` and `/admin/deliveries/purge`.
    static func deliveries(path: String, query: String?, isGet: Bool, isPost: Bool) -> AdminAction {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        func wrongMethod(_ allowed: String) -> AdminAction { .refused(.init(400, .badRequest, "\(path) takes \(allowed).")) }
        switch parts.count {
        case 2:
            guard isGet else { return wrongMethod("GET") }
            var q = DeliveryQuery()
            for (key, value) in queryItems(query) {
                switch key {
                case "state":
                    guard deliveryStates.contains(value) else {
                        return .refused(
                            .init(
                                400, .badRequest,
                                "state must be one of \(deliveryStates.joined(separator: ", ")); got '\(value)'."))
                    }
                    q.state = value
                case "upstream": q.upstream = value
                case "after":
                    guard let v = Int64(value) else {
                        return .refused(.init(400, .badRequest, "after must be the 'next' of a page."))
                    }
                    q.after = v
                case "limit":
                    guard let v = Int(value), (1...maxPage).contains(v) else {
                        return .refused(.init(400, .badRequest, "limit must be 1 to \(maxPage)."))
                    }
                    q.limit = v
                default:
                    return .refused(.init(400, .badRequest, "Unknown parameter '\(key)' (state, upstream, limit, after)."))
                }
            }
            return .listDeliveries(q)
        case 3 where parts[2] == "purge":
            return isPost ? .purgeDeliveries : wrongMethod("POST")
        case 3:
            return isGet ? .delivery(id: parts[2]) : wrongMethod("GET")
        case 4 where parts[3] == "replay":
            return isPost ? .replayDelivery(id: parts[2]) : wrongMethod("POST")
        default:
            return .refused(.init(404, .noRoute, "No admin resource at \(path)."))
        }
    }

    /// `/admin/upstreams/{name}/endpoints/{i}/drain|undrain` and `.../breaker/open|closed|auto`.
    static func upstreams(path: String, isPost: Bool) -> AdminAction {
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst(3).map {
            String($0).removingPercentEncoding ?? String($0)
        }
        guard parts.count == 3 || parts.count == 4 else {
            return .refused(.init(404, .noRoute, "No admin resource at \(path). " + upstreamsUsage))
        }
        guard isPost else { return .refused(.init(400, .badRequest, "\(path) takes POST.")) }
        switch (parts[1], parts.count) {
        case ("endpoints", 4):
            let drain: Bool? = parts[3] == "drain" ? true : parts[3] == "undrain" ? false : nil
            return .upstream(name: parts[0], .endpoint(index: parts[2], drain: drain))
        case ("breaker", 3):
            return .upstream(name: parts[0], .breaker(Breaker(rawValue: parts[2])))
        default:
            return .upstream(name: parts[0], .unknown)
        }
    }

    /// A purge's prefix that is not a path.
    public static func stalePrefixRefusal(_ prefix: String) -> Refusal? {
        prefix.hasPrefix("/") ? nil : Refusal(400, .badRequest, "prefix must be a path starting with /, got '\(prefix)'.")
    }

    /// The path is the deliveries API's (answered 404 when no route delivers later).
    public static func isDeliveries(_ path: String) -> Bool {
        path == "/admin/deliveries" || path.hasPrefix("/admin/deliveries/")
    }

    /// A query's `key=value` pairs, `+` and percent-escapes decoded.
    public static func queryItems(_ query: String?) -> [(String, String)] {
        guard let query, !query.isEmpty else { return [] }
        return query.split(separator: "&").map { item in
            let pair = item.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ s: Substring) -> String {
                String(s).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String(s)
            }
            return (decode(pair[0]), pair.count > 1 ? decode(pair[1]) : "")
        }
    }
}
