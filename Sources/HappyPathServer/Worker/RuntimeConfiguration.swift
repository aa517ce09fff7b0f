import HappyPathConfig
import HappyPathIO
import HappyPathCore
import HappyPathPolicies

/// The configuration in the shape the hot path wants: routes resolved
/// (route → upstream → defaults), upstreams by index, endpoints pre-split.
/// Immutable and shared by every worker.
public final class RuntimeConfiguration: Sendable {
    public let configuration: Configuration
    let router: Router
    let routes: [RuntimeRoute]
    let upstreams: [RuntimeUpstream]
    /// Some route has a `rate_limit` (heads with a body are judged before it is read).
    let hasRateLimits: Bool

    /// - Parameter previous: the configuration a reload replaces. A route
    ///   that is the same route there (the same `match` and `upstream`, and
    ///   so the same metrics label) with the same `rate_limit` (and the
    ///   same `timeout`, which bounds its `max_wait`) keeps its
    ///   `RouteRateLimit`: its buckets as drained as they were and its queue
    ///   in order. Any other route's limit starts with full buckets.
    public init(_ configuration: Configuration, previous: RuntimeConfiguration? = nil) {
        self.configuration = configuration
        router = configuration.router
        let upstreams = configuration.upstreams.map {
            RuntimeUpstream($0, policies: configuration.resolvedPolicies(forUpstream: $0))
        }
        self.upstreams = upstreams
        routes = configuration.routes.indices.map { i in
            let route = configuration.routes[i]
            let policies = configuration.resolvedPolicies(forRoute: i)
            let prefix = route.match.pathPrefix
            let shared = configuration.routes.filter { $0.match.pathPrefix == prefix }.count > 1
            let label = shared ? "\(prefix)#\(i)" : prefix
            return RuntimeRoute(
                index: i, label: label,
                upstreamIndex: upstreams.firstIndex { $0.name == route.upstream }!,
                stripPrefix: route.stripPrefix, timeout: policies.timeout, retry: RetryPolicy(policies.retry),
                parkFor: policies.reachability.parkFor, errors: policies.errors,
                delivery: route.delivery, allowTrace: route.allowTrace,
                allowedMethods: route.match.methods.map { Array($0).sorted() } ?? Self.defaultMethods,
                rewritesRedirects: route.redirects == .rewrite,
                passesErrors: (route.upstreamErrors ?? configuration.upstream(named: route.upstream)?.upstreamErrors) == .pass,
                rateLimit: route.rateLimit,
                keptRateLimit: previous?.keptRateLimit(for: route, label: label, timeout: policies.timeout),
                hedge: route.hedge, fallback: route.fallback, upgrades: route.upgrades,
                upgradesIdleTimeout: route.upgradesIdleTimeout, grpc: route.grpc != nil,
                grpcIdempotent: route.grpc?.idempotent == true,
                priority: route.priority, priorityHeader: route.priorityHeader, coalesce: route.coalesce,
                cors: route.cors.map {
                    CORSPolicy(
                        $0, methods: route.match.methods.map { Array($0).sorted() } ?? Self.defaultMethods, grpc: route.grpc != nil)
                })
        }
        hasRateLimits = routes.contains { $0.rateLimit != nil }
    }
}

extension RuntimeConfiguration {
    /// A route's methods when its `match` names none (the `Allow` of a 405, CORS's allowed methods).
    static let defaultMethods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

    /// This configuration's limit for the same route as `route` of the
    /// next configuration, if its settings are unchanged (see `init`).
    fileprivate func keptRateLimit(for route: Route, label: String, timeout: Duration) -> RouteRateLimit? {
        guard let wanted = route.rateLimit else { return nil }
        for old in routes {
            guard let limit = old.rateLimit else { continue }
            let oldRoute = configuration.routes[old.index]
            if oldRoute.match == route.match, oldRoute.upstream == route.upstream,
                limit.isSame(as: wanted, label: label, timeout: timeout)
            {
                return limit
            }
        }
        return nil
    }

    /// What a listener's connections may hold and how long they may take
    /// (`limits`, its `http2` block), and the process's budgets they share.
    func serverLimits(http2: HTTP2Configuration?, shared: SharedState) -> HTTPServerLimits {
        let limits = configuration.limits
        var serverLimits = HTTPServerLimits(
            maxHeaderBytes: limits.maxHeaderBytes, maxBodyBytes: limits.maxRequestBody, timeout: limits.clientTimeout,
            maxFields: limits.maxHeaders, bodyBudget: shared.bodies, path: configuration.pathNormalization,
            connections: shared.connections,
            http2: http2.map {
                HTTP2ServerSettings(
                    maxConcurrentStreams: $0.maxConcurrentStreams, initialStreamWindow: $0.initialStreamWindow,
                    initialConnectionWindow: $0.initialConnectionWindow, drainTimeout: configuration.drainTimeout)
            })
        serverLimits.connectionBuffer = limits.connectionBuffer
        serverLimits.clientShares = shared.clientShares
        serverLimits.memory = shared.connectionMemory
        serverLimits.memoryPressure = shared.memoryPressure
        serverLimits.spool = shared.spool
        return serverLimits
    }

    /// libcurl's caps for one worker's connection pool, from the upstreams'
    /// `max_connections` split across the workers: per host, the largest
    /// upstream's share; idle connections kept, room for every endpoint's
    /// share. A reload recomputes them (`UpstreamClient.setConnectionLimits`).
    func connectionCaps(workers: Int) -> (perHost: Int, cached: Int) {
        let perHost = upstreams.map(\.maxConnectionsPerEndpoint).max() ?? 256
        let total = upstreams.reduce(0) { $0 + $1.maxConnectionsPerEndpoint * $1.endpoints.count }
        return (max(1, perHost / workers), max(16, total / workers))
    }
}

/// A class, so an exchange holds its route (and upstream) with one
/// reference instead of copying every field.
final class RuntimeRoute: Sendable {
    let index: Int
    /// The `route` label of metrics and access logs: its path prefix (with
    /// `#index` when several routes share one).
    let label: String
    let upstreamIndex: Int
    let stripPrefix: String?
    /// Overall deadline for a request on this route, all tries included.
    let timeout: Duration
    let retry: RetryPolicy
    /// How long a command may wait parked for an unreachable upstream.
    let parkFor: Duration
    /// Error mappings: the route's, then its upstream's.
    let errors: [ErrorMapping]
    /// `now`, or `later`: stored, answered 202, delivered in the background.
    let delivery: DeliveryPolicy.Configuration
    /// TRACE is forwarded (`allow_trace`); else answered 405 by the proxy.
    let allowTrace: Bool
    /// For the `Allow` header of that 405: the route's methods.
    let allowedMethods: [String]
    /// `redirects: rewrite` (the default): redirects to the endpoint point at the proxy.
    let rewritesRedirects: Bool
    /// `upstream_errors: pass` (route, else upstream): upstream 4xx/5xx go to the client unchanged.
    let passesErrors: Bool
    /// `rate_limit:` (nil: none), shared by every worker.
    let rateLimit: RouteRateLimit?
    /// `hedge:` (nil: none).
    let hedge: HedgeConfiguration?
    /// `cors:` (nil: none): preflights answered here, and the fields on every answer to an allowed origin.
    let cors: CORSPolicy?
    /// `grpc:` the route carries gRPC calls, and takes gRPC-Web ones (docs/grpc.md).
    let grpc: Bool
    /// `grpc: { idempotent: true }`: the route's gRPC calls may be sent
    /// again after they may have reached the upstream (a reset, a
    /// timeout) and may be hedged, as methods in `retry.methods` are.
    let grpcIdempotent: Bool
    /// `priority:` how much its requests matter when the upstream is full (docs/overload.md).
    let priority: RequestPriority
    /// `priority_header:` (lowercased; nil: none) a client may lower its request's priority with.
    let priorityHeader: String?
    /// `fallback:` (nil: none).
    let fallback: FallbackConfiguration?
    /// What its kept answers are filed under (nil: it keeps none).
    let staleKey: StaleKey?
    /// `coalesce:` (nil: off, and the route pays one branch for it).
    let coalesce: CoalesceConfiguration?
    /// What its coalesced requests are grouped by (nil: it does not
    /// coalesce). With `serve_stale` too, both read the same credential
    /// fields, the union of both lists: a field that is a credential for
    /// one is one for both.
    let coalesceKey: StaleKey?
    /// Its part of its requests' coalescing keys (`CoalesceRules.routeTag`).
    let coalesceTag: String
    /// `upgrades:` protocols a client may switch to (lowercased; empty: none).
    let upgrades: [String]
    /// `upgrades_idle_timeout`: a tunnel quiet both ways this long is closed.
    let upgradesIdleTimeout: Duration
    /// `hedge: { after: p95 }`: how long tries took to their status, on
    /// every worker (nil for other routes: nothing recorded).
    private let tryLatency: Locked<LatencyWindow>?

    /// `hedge.after` in nanoseconds when it is fixed (nil: p95, or no hedge).
    private let hedgeAfterNanoseconds: Int64?

    /// When a hedge is due for a try sent at `now`.
    func hedgeDue(sentAt now: Instant) -> Instant {
        if let fixed = hedgeAfterNanoseconds { return Instant(nanoseconds: now.nanoseconds &+ fixed) }
        guard let hedge else { return now }
        return now + hedge.delay(observed: observedTryLatency(at: now))
    }

    /// A try sent at `start` got its response head at `now` (p95 routes keep it).
    func recordTry(sentAt start: Instant, headAt now: Instant) {
        guard let tryLatency else { return }
        tryLatency.withLock { $0.record(now - start, at: now) }
    }

    /// The 95th percentile of the last seconds' tries (nil: too few seen, or not `after: p95`).
    func observedTryLatency(at now: Instant) -> Duration? {
        tryLatency?.withLock { $0.quantile(0.95, at: now) }
    }

    init(
        index: Int, label: String, upstreamIndex: Int, stripPrefix: String?, timeout: Duration, retry: RetryPolicy,
        parkFor: Duration, errors: [ErrorMapping], delivery: DeliveryPolicy.Configuration = DeliveryPolicy.Configuration(),
        allowTrace: Bool = false, allowedMethods: [String] = [], rewritesRedirects: Bool = true, passesErrors: Bool = false,
        rateLimit: RateLimitConfiguration? = nil, keptRateLimit: RouteRateLimit? = nil, hedge: HedgeConfiguration? = nil,
        fallback: FallbackConfiguration? = nil, upgrades: [String] = [], upgradesIdleTimeout: Duration = .seconds(300),
        grpc: Bool = false, grpcIdempotent: Bool = false, priority: RequestPriority = .normal,
        priorityHeader: String? = nil, coalesce: CoalesceConfiguration? = nil, cors: CORSPolicy? = nil
    ) {
        self.cors = cors
        self.grpc = grpc || grpcIdempotent
        self.grpcIdempotent = grpcIdempotent
        self.priority = priority
        self.priorityHeader = priorityHeader
        self.upgrades = upgrades
        self.upgradesIdleTimeout = upgradesIdleTimeout
        self.hedge = hedge
        self.fallback = fallback
        var rateLimitHeader: String?
        if case .header(let name)? = rateLimit?.key { rateLimitHeader = name }
        let keepsStale = fallback?.serveStale != nil
        let privateHeaders =
            (keepsStale ? fallback?.privateHeaders ?? [] : []) + (coalesce?.privateHeaders ?? [])
        // Routes with serve_stale only keep their key as it was, byte for byte.
        let key = keepsStale || coalesce != nil ? StaleKey(privateHeaders: privateHeaders, rateLimitHeader: rateLimitHeader) : nil
        staleKey = keepsStale ? key : nil
        self.coalesce = coalesce
        coalesceKey = coalesce != nil ? key : nil
        coalesceTag = CoalesceRules.routeTag(index)
        if case .p95 = hedge?.after { tryLatency = Locked(LatencyWindow()) } else { tryLatency = nil }
        if case let .fixed(after) = hedge?.after { hedgeAfterNanoseconds = after.nanoseconds } else { hedgeAfterNanoseconds = nil }
        self.rateLimit = keptRateLimit ?? rateLimit.map { RouteRateLimit($0, label: label, timeout: timeout) }
        self.rewritesRedirects = rewritesRedirects
        self.passesErrors = passesErrors
        self.delivery = delivery
        self.allowTrace = allowTrace
        self.allowedMethods = allowedMethods
        self.index = index
        self.label = label
        self.upstreamIndex = upstreamIndex
        self.stripPrefix = stripPrefix
        self.timeout = timeout
        self.retry = retry
        self.parkFor = parkFor
        self.errors = errors
    }
}

final class RuntimeUpstream: Sendable {
    let name: String
    let endpoints: [Endpoint]
    let connectTimeout: Duration
    /// `max_connections`: tries in flight per endpoint, across the workers.
    let maxConnectionsPerEndpoint: Int
    /// `tls:` as libcurl takes it (nil: its defaults).
    let tls: UpstreamTLS?
    /// `protocol: h2`: a client's `TE: trailers` is passed on (gRPC servers need it).
    let speaksH2: Bool
    /// `adaptive_concurrency:` (nil: the limit is `max_connections`).
    let adaptiveConcurrency: AdaptiveConcurrencySettings?

    /// Upstream-level policies (upstream over defaults over the policies'
    /// own defaults): the breaker, the budget and health checks belong to the upstream.
    let policies: ResolvedPolicies

    init(_ upstream: Upstream, policies: ResolvedPolicies) {
        name = upstream.name
        speaksH2 = upstream.protocol == .h2
        let serverName = upstream.tls?.serverName
        endpoints = upstream.endpoints.map { Endpoint($0, serverName: serverName, protocol: upstream.protocol) }
        tls = upstream.tls.map {
            UpstreamTLS(ca: $0.ca, verify: $0.verify, clientCert: $0.clientCert, clientKey: $0.clientKey)
        }
        connectTimeout = upstream.connectTimeout
        maxConnectionsPerEndpoint = upstream.maxConnectionsPerEndpoint
        adaptiveConcurrency = upstream.adaptiveConcurrency
        self.policies = policies
    }

    var whileOpen: CircuitBreakerStateMachine.WhileOpen { policies.circuitBreaker.whileOpen }
    var breakerConfiguration: CircuitBreakerStateMachine.Configuration { policies.circuitBreaker }
    /// `outlier_detection` (upstream over defaults).
    var outlierDetection: OutlierDetector.Configuration { policies.outlierDetection }
    /// The retry budget: ratio and floor per second.
    var budget: RetryBudget.Configuration { policies.retryBudget }
    var healthCheck: HealthCheckConfiguration { policies.healthCheck }
}

/// `http://host:port/base` split into what libcurl connects to and the path
/// prefix put in front of every request target.
struct Endpoint: Sendable {
    let url: String
    let origin: String
    let basePath: String
    /// With `tls.server_name`: the origin names the server name (SNI, the
    /// certificate check, `Host`) and libcurl connects to the endpoint's
    /// own host and port (`HOST:PORT:CONNECT-HOST:CONNECT-PORT`).
    let connectTo: String?
    /// `protocol:` with this endpoint's scheme: HTTP/1.1, h2 or h2c.
    let httpVersion: UpstreamHTTPVersion

    init(_ url: String, serverName: String? = nil, protocol: UpstreamProtocol = .http1) {
        self.url = url
        httpVersion = UpstreamHTTPVersion(`protocol`, origin: url)
        let schemeEnd = url.range(of: "://")!.upperBound
        var origin: String
        if let slash = url[schemeEnd...].firstIndex(of: "/") {
            origin = String(url[..<slash]) + "/"
            basePath = String(url[slash...])
        } else {
            origin = url + "/"
            basePath = ""
        }
        var connectTo: String?
        if let serverName {
            let scheme = String(url[..<schemeEnd])
            let authority = String(origin.dropFirst(scheme.count).dropLast())
            // `host:port` or `[v6]:port`, read as a listen address is; no port: the scheme's.
            let parsed = ListenAddress.parse(authority)
            let port = parsed?.port ?? (scheme == "https://" ? 443 : 80)
            let host = parsed.map { $0.host.contains(":") ? "[\($0.host)]" : $0.host } ?? authority
            origin = "\(scheme)\(serverName):\(port)/"
            connectTo = "\(serverName):\(port):\(host):\(port)"
        }
        self.origin = origin
        self.connectTo = connectTo
    }
}
