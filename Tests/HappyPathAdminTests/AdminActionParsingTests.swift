import HappyPathAdmin
import HappyPathCore
import Testing

/// What each request to the admin listener asks for, from its method, path
/// and query alone, as a table (`AdminAction.parse`).
@Suite struct AdminActionParsingTests {
    struct Row: CustomTestStringConvertible, Sendable {
        let method: String
        let path: String
        let query: String?
        let action: AdminAction
        init(_ method: String, _ path: String, query: String? = nil, _ action: AdminAction) {
            self.method = method
            self.path = path
            self.query = query
            self.action = action
        }
        var testDescription: String { "\(method) \(path)\(query.map { "?" + $0 } ?? "")" }
    }

    static func refused(_ status: Int, _ code: ProblemCode, _ detail: String) -> AdminAction {
        .refused(.init(status, code, detail))
    }

    static let rows: [Row] = [
        Row("GET", "/healthz", .healthz),
        Row("HEAD", "/readyz", .readyz),
        Row("GET", "/metrics", .metrics),
        Row("GET", "/admin/state", .state),
        Row("GET", "/", .root),
        Row("GET", "/status", .status),
        Row("GET", "/status.js", .statusScript),
        Row("GET", "/status.css", .statusStyle),
        Row("GET", "/admin/events", .events),
        Row("POST", "/admin/state", refused(400, .badRequest, "The admin API is read-only: use GET.")),
        Row(
            "GET", "/nowhere",
            refused(
                404, .noRoute,
                "The admin listener serves /status, /healthz, /readyz, /metrics, /admin/state, /admin/events, /admin/deliveries, /admin/upstreams and /admin/fallback/purge."
            )),
        // Deliveries
        Row("GET", "/admin/deliveries", .listDeliveries(.init())),
        Row(
            "GET", "/admin/deliveries", query: "state=dead&upstream=hooks&limit=5&after=42",
            .listDeliveries(.init(state: "dead", upstream: "hooks", after: 42, limit: 5))),
        Row(
            "GET", "/admin/deliveries", query: "state=lost&limit=0",
            refused(400, .badRequest, "state must be one of queued, in_flight, delivered, dead; got 'lost'.")),
        Row("GET", "/admin/deliveries", query: "limit=1001", refused(400, .badRequest, "limit must be 1 to 1000.")),
        Row("GET", "/admin/deliveries", query: "limit=0", refused(400, .badRequest, "limit must be 1 to 1000.")),
        Row("GET", "/admin/deliveries", query: "after=x", refused(400, .badRequest, "after must be the 'next' of a page.")),
        Row(
            "GET", "/admin/deliveries", query: "sort=id",
            refused(400, .badRequest, "Unknown parameter 'sort' (state, upstream, limit, after).")),
        Row("POST", "/admin/deliveries", refused(400, .badRequest, "/admin/deliveries takes GET.")),
        Row("POST", "/admin/deliveries/purge", .purgeDeliveries),
        Row("GET", "/admin/deliveries/purge", refused(400, .badRequest, "/admin/deliveries/purge takes POST.")),
        Row("GET", "/admin/deliveries/d-1", .delivery(id: "d-1")),
        Row("DELETE", "/admin/deliveries/d-1", refused(400, .badRequest, "/admin/deliveries/d-1 takes GET.")),
        Row("POST", "/admin/deliveries/d-1/replay", .replayDelivery(id: "d-1")),
        Row("GET", "/admin/deliveries/d-1/replay", refused(400, .badRequest, "/admin/deliveries/d-1/replay takes POST.")),
        Row("GET", "/admin/deliveries/d-1/x/y", refused(404, .noRoute, "No admin resource at /admin/deliveries/d-1/x/y.")),
        // Kept answers
        Row("POST", "/admin/fallback/purge", .purgeStale(prefix: "/")),
        Row("POST", "/admin/fallback/purge", query: "prefix=%2Fcatalog%2F", .purgeStale(prefix: "/catalog/")),
        Row("GET", "/admin/fallback/purge", refused(400, .badRequest, "/admin/fallback/purge takes POST.")),
        // Upstreams
        Row("POST", "/admin/upstreams/pay/endpoints/1/drain", .upstream(name: "pay", .endpoint(index: "1", drain: true))),
        Row("POST", "/admin/upstreams/pay/endpoints/0/undrain", .upstream(name: "pay", .endpoint(index: "0", drain: false))),
        Row("POST", "/admin/upstreams/pay/endpoints/0/kick", .upstream(name: "pay", .endpoint(index: "0", drain: nil))),
        Row("POST", "/admin/upstreams/pay/breaker/open", .upstream(name: "pay", .breaker(.open))),
        Row("POST", "/admin/upstreams/pay/breaker/auto", .upstream(name: "pay", .breaker(.auto))),
        Row("POST", "/admin/upstreams/pay/breaker/half", .upstream(name: "pay", .breaker(nil))),
        Row("POST", "/admin/upstreams/a%20b/breaker/closed", .upstream(name: "a b", .breaker(.closed))),
        Row("POST", "/admin/upstreams/pay/other/x", .upstream(name: "pay", .unknown)),
        Row(
            "GET", "/admin/upstreams/pay/breaker/open",
            refused(400, .badRequest, "/admin/upstreams/pay/breaker/open takes POST.")),
        Row(
            "POST", "/admin/upstreams/pay",
            refused(404, .noRoute, "No admin resource at /admin/upstreams/pay. " + AdminAction.upstreamsUsage)),
    ]

    @Test(arguments: rows)
    func parse(_ row: Row) {
        #expect(AdminAction.parse(method: row.method, path: row.path, query: row.query) == row.action)
    }

    @Test func aPurgesPrefixMustBeAPath() {
        #expect(AdminAction.stalePrefixRefusal("/catalog/") == nil)
        #expect(
            AdminAction.stalePrefixRefusal("catalog")
                == .init(400, .badRequest, "prefix must be a path starting with /, got 'catalog'."))
    }

    @Test func queryItemsAreDecoded() {
        #expect(AdminAction.queryItems("a=1+2&b=%2F&c").map { "\($0.0)=\($0.1)" } == ["a=1 2", "b=/", "c="])
        #expect(AdminAction.queryItems(nil).isEmpty && AdminAction.queryItems("").isEmpty)
    }
}
