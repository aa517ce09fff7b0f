import Foundation
import HappyPathCore
import HappyPathPolicies

/// A validated configuration. Policy settings keep "not set" (nil) apart from
/// their defaults so that a route inherits from its upstream, which inherits
/// from `defaults`; `resolvedPolicies(forRoute:)` does the merge.
public struct Configuration: Sendable {
    /// The file this came from, for messages and `/admin/state`.
    public var source: String
    /// Every listener, in file order (at least one): plain HTTP, or TLS.
    public var listeners: [Listener]
    /// The first listener's address (a single `listen: HOST:PORT`).
    public var listen: ListenAddress {
        get { listeners[0].address }
        set { listeners[0].address = newValue }
    }
    /// Event-loop threads; `nil` means `auto` (one per core).
    public var workers: Int?
    public var admin: AdminConfiguration
    public var limits: Limits
    /// SIGTERM/SIGINT: how long in-flight and parked commands may take to finish.
    public var drainTimeout: Duration = .seconds(20)
    public var defaults: PolicySettings
    /// In file order.
    public var upstreams: [Upstream]
    /// In file order: first match wins.
    public var routes: [Route]
    /// The deliver-later store, opened only if a route has `delivery.mode: later`.
    public var storage = StorageConfiguration()
    /// `tracing`: nil, none (the default; it then costs nothing).
    public var tracing: TracingConfiguration?
    /// `trusted_proxies`: X-Forwarded-For hops from these networks are
    /// skipped when the proxy looks for a client's address (rate limits).
    public var trustedProxies: [IPRange] = []
    /// `normalize.merge_slashes`: `//` in a request path collapses to `/`
    /// before routing (default false). Dot-segments are always removed.
    public var mergeSlashes = false

    /// How the edge normalizes request paths (docs/http1.md, "Paths").
    public var pathNormalization: PathNormalization {
        PathNormalization(mergeSlashes: mergeSlashes, encodedSlashes: limits.encodedSlashes)
    }

    /// Some route stores its requests for later delivery (the store is needed).
    public var usesStore: Bool { routes.contains { $0.delivery.mode == .later } }
    /// Some route keeps answers for `fallback.serve_stale` (the process then has a store of them).
    public var keepsAnswers: Bool { routes.contains { $0.fallback?.serveStale != nil } }

    public func upstream(named name: String) -> Upstream? { upstreams.first { $0.name == name } }

    public var router: Router { Router(routes.map(\.match)) }
}

public struct AdminConfiguration: Sendable {
    public var listen: ListenAddress = ListenAddress(host: "127.0.0.1", port: 9901)
    /// Answer admin requests from other hosts than loopback. Default false.
    public var allowRemote = false
    /// Host names (no port) an admin request's `Host` may carry besides the
    /// listener's own address, `localhost` and the loopback literals: the
    /// names operators reach the admin listener by (a Service's DNS name).
    /// Stored lowercased. Default empty. Anything else is refused 403, which
    /// keeps a DNS-rebinding page away from the admin API (docs/operations.md).
    public var allowedHosts: [String] = []
}

public struct Limits: Sendable {
    /// Larger bodies are answered 413 PAYLOAD_TOO_LARGE.
    public var maxRequestBody: Int = 10 * 1024 * 1024
    /// Larger request heads are answered 431 HEADERS_TOO_LARGE.
    public var maxHeaderBytes: Int = 64 * 1024
    /// Idle or slow client connections are closed after this.
    public var clientTimeout: Duration = .seconds(30)
    /// Parked commands in the whole process.
    public var maxParked: Int = 10_000
    /// Client connections open in the whole process; above it the
    /// listeners stop accepting (clients wait in the kernel's backlog)
    /// until one closes.
    public var maxConnections: Int = 10_000
    /// Request bodies held in memory by the whole process (each body is
    /// kept whole for retries and replays); a body that does not fit is
    /// answered 503 OVERLOADED before it is read.
    public var maxBufferedBytes: Int = 256 * 1024 * 1024
    /// `%2F`, `%5C` and `\` in a path: kept as they came (never decoded)
    /// or refused with 400.
    public var encodedSlashes: PathNormalization.EncodedSlashes = .keep
    /// Memory for the answers `fallback.serve_stale` keeps, for the whole
    /// process; the least recently used go first.
    public var staleMaxBytes: Int = 64 * 1024 * 1024
    /// A larger answer is not kept.
    public var staleMaxEntry: Int = 1024 * 1024
}

/// Equatable so a reload can tell an unchanged upstream (and keep its
/// breaker, budget and token) without printing it: it holds credentials.
public struct Upstream: Sendable, Equatable {
    public var name: String
    /// Base URLs such as `http://127.0.0.1:9000`, without a trailing slash.
    public var endpoints: [String]
    public var connectTimeout: Duration = .seconds(1)
    public var maxConnections: Int = 256
    public var auth: AuthSettings = .none
    public var policies: PolicySettings = PolicySettings()
    /// Its routes' default for `upstream_errors` (nil: `normalize`).
    public var upstreamErrors: UpstreamErrorsMode?
    /// `pacing:` (nil: the upstream's Retry-After pauses nothing but the request that got it).
    public var pacing: PacingConfiguration?
    /// `tls:` for https:// endpoints (nil: libcurl's defaults: verified against the system's CAs).
    public var tls: UpstreamTLSSettings?
}

/// `upstreams.NAME.tls` (docs/tls.md, "Upstreams").
public struct UpstreamTLSSettings: Sendable, Equatable {
    /// PEM file of the CAs that sign the upstream's certificate (nil: the system's).
    public var ca: String?
    /// Verify the upstream's certificate and name (default true).
    public var verify = true
    /// A client certificate and its key, for upstreams that ask for one.
    public var clientCert: String?
    public var clientKey: String?
    /// The name sent in SNI and verified in the certificate, instead of the endpoint's host.
    public var serverName: String?

    public init() {}
}

/// `upstream_errors:` on a route or an upstream.
public enum UpstreamErrorsMode: String, Sendable, CaseIterable {
    /// An upstream's 4xx/5xx becomes the proxy's problem+json body (its
    /// headers that clients act on are kept: docs/errors.md).
    case normalize
    /// An upstream's 4xx/5xx reaches the client unchanged: status, reason,
    /// headers and body. Retries, the breaker and metrics treat it as with
    /// `normalize`; errors the proxy makes itself are still problem bodies.
    case pass
}

public struct Route: Sendable {
    public var match: RouteMatch
    public var upstream: String
    public var stripPrefix: String?
    public var policies: PolicySettings = PolicySettings()
    public var errors: [ErrorMapping] = []
    public var delivery = DeliverySettings()
    /// TRACE is answered 405 unless the route allows it (`allow_trace`):
    /// an upstream echoing the request would reflect credentials and cookies.
    public var allowTrace = false
    /// What happens to an upstream redirect to its own endpoint.
    public var redirects: RedirectMode = .rewrite
    /// nil: the upstream's setting, else `normalize`.
    public var upstreamErrors: UpstreamErrorsMode?
    /// `rate_limit:` (nil: none).
    public var rateLimit: RateLimitConfiguration?
    /// `hedge:` (nil: a try is only followed by another after it failed).
    public var hedge: HedgeConfiguration?
    /// `fallback:` (nil: failures are answered with a problem body).
    public var fallback: FallbackConfiguration?
    /// `upgrades:` the protocols a client may switch to on this route
    /// (`Upgrade` tokens, lowercased: `websocket`). Empty: `Upgrade` is
    /// dropped and the request is forwarded as a plain one.
    public var upgrades: [String] = []
    /// `upgrades_idle_timeout:` a tunnel with no byte either way this long is closed.
    public var upgradesIdleTimeout: Duration = .seconds(300)
}

/// `redirects:` on a route.
public enum RedirectMode: String, Sendable, CaseIterable {
    /// `Location`, `Content-Location` and `Refresh` URLs on the endpoint the
    /// request went to are rewritten to the proxy's origin and the route's
    /// path (as nginx's `proxy_redirect default`).
    case rewrite
    /// Sent as the upstream wrote them.
    case keep
}

/// `mode: now` answers with the upstream's response (the default); `later`
/// stores the request, answers 202, and delivers it in the background.
public enum DeliveryMode: String, Sendable, CaseIterable { case now, later }

/// A route's `delivery` block (docs/deliver-later.md).
public struct DeliverySettings: Sendable, Equatable {
    public var mode = DeliveryMode.now
    /// Undelivered this long after it was accepted: dead.
    public var maxAge: Duration = .seconds(24 * 3600)
    /// Delivery rounds (each with the route's own retries) before it is dead.
    public var maxAttempts = 50
    /// Between rounds: exponential from `backoffBase`, capped at `backoffMax`,
    /// each wait drawn between half the step and the whole step.
    public var backoffBase: Duration = .seconds(1)
    public var backoffMax: Duration = .seconds(600)
    /// `delivery.idempotency.client_header`: who a client is, for the scope
    /// of its `Idempotency-Key`, when it sends no `Authorization` (such as
    /// `X-Api-Key`). Nil (the default): such clients share the route's scope.
    public var idempotencyClientHeader: String?

    public init() {}
}

/// The top-level `tracing` block: OpenTelemetry spans sent over OTLP/HTTP.
public struct TracingConfiguration: Sendable, Equatable {
    /// The collector's OTLP/HTTP traces URL (protobuf), e.g. http://otel-collector:4318/v1/traces.
    public var endpoint: String
    /// Share of requests without a sampled `traceparent` that are traced;
    /// a request whose `traceparent` says sampled always is (parent-based).
    public var sampleRatio = 1.0
    public var serviceName = "happypath"

    public init(endpoint: String) { self.endpoint = endpoint }
}

/// The top-level `storage` block: where deliver-later requests are kept.
public struct StorageConfiguration: Sendable, Equatable {
    public static let defaultPath = "/var/lib/happypath/deliveries.db"

    public var path = Self.defaultPath
    public var sync = StorageSync.full
    /// Bytes of requests not yet delivered (and of delivered rows kept) the store may hold.
    public var maxBytes = 1 << 30
    /// Delivered and dead deliveries are kept this long, then purged.
    public var retention: Duration = .seconds(24 * 3600)
    /// `GET {status_path}/{id}` on the proxy's listener answers a delivery's status.
    public var statusPath = "/_happypath/deliveries"
    /// `storage.url`: a PostgreSQL database shared by every replica, instead of the file at `path`.
    public var url: String?
    /// Connections to it: one writes, the rest read (status URLs, listings).
    public var pool = 4
    /// A claimed delivery whose replica stopped renewing it (it died) is
    /// queued again this long after the last renewal.
    public var lease: Duration = .seconds(30)
    /// Not ready (`/readyz` 503) while the database cannot be reached. False:
    /// the proxy stays ready, since routes that deliver now still work.
    public var required = false

    /// What logs and `/admin/state` name the store by: the file, or the URL without its password.
    public var name: String { url.map(Self.redact) ?? path }

    /// `postgres://user:secret@host/db` as `postgres://user:***@host/db`; a `password=` value as `***`.
    public static func redact(_ url: String) -> String {
        var out = url
        if let scheme = out.range(of: "://"), let at = out[scheme.upperBound...].firstIndex(of: "@"),
            let colon = out[scheme.upperBound..<at].firstIndex(of: ":")
        {
            out.replaceSubrange(out.index(after: colon)..<at, with: "***")
        }
        if let key = out.range(of: "password=") {
            let end = out[key.upperBound...].firstIndex(where: { $0 == "&" || $0 == " " }) ?? out.endIndex
            out.replaceSubrange(key.upperBound..<end, with: "***")
        }
        return out
    }

    /// Where `path` is written in the file (1, 1 when it is the default), for messages.
    public var pathLine = 1
    public var pathColumn = 1

    public init() {}
}

// MARK: - Policy settings (every field optional: nil = inherit)

public struct PolicySettings: Sendable, Equatable {
    public var timeout: Duration?
    public var retry = RetrySettings()
    public var circuitBreaker = CircuitBreakerSettings()
    public var reachability = ReachabilitySettings()
    public var healthCheck = HealthCheckSettings()
    /// `outlier_detection:`, an upstream's (or `defaults`'); never a route's.
    public var outlierDetection = OutlierDetectionSettings()
    public var errors: [ErrorMapping] = []

    public init() {}

    /// `self` over `base`: each field set here wins, the rest come from `base`.
    public func over(_ base: PolicySettings) -> PolicySettings {
        var out = PolicySettings()
        out.timeout = timeout ?? base.timeout
        out.retry = retry.over(base.retry)
        out.circuitBreaker = circuitBreaker.over(base.circuitBreaker)
        out.reachability = reachability.over(base.reachability)
        out.healthCheck = healthCheck.over(base.healthCheck)
        out.outlierDetection = outlierDetection.over(base.outlierDetection)
        out.errors = errors + base.errors
        return out
    }
}

public enum Jitter: String, Sendable, CaseIterable { case full, none }
public enum WhileOpen: String, Sendable, CaseIterable { case park, fail }

public struct RetrySettings: Sendable, Equatable {
    public var attempts: Int?
    public var perTryTimeout: Duration?
    /// `connect-failure`, `reset`, `timeout`, or status codes as text.
    public var on: [String]?
    public var backoffBase: Duration?
    public var backoffMax: Duration?
    public var jitter: Jitter?
    public var honorRetryAfter: Bool?
    public var maxRetryAfter: Duration?
    public var budgetRatio: Double?
    public var budgetMinPerSecond: Int?
    public var methods: [String]?

    func over(_ b: RetrySettings) -> RetrySettings {
        RetrySettings(
            attempts: attempts ?? b.attempts, perTryTimeout: perTryTimeout ?? b.perTryTimeout, on: on ?? b.on,
            backoffBase: backoffBase ?? b.backoffBase, backoffMax: backoffMax ?? b.backoffMax,
            jitter: jitter ?? b.jitter, honorRetryAfter: honorRetryAfter ?? b.honorRetryAfter,
            maxRetryAfter: maxRetryAfter ?? b.maxRetryAfter, budgetRatio: budgetRatio ?? b.budgetRatio, budgetMinPerSecond: budgetMinPerSecond ?? b.budgetMinPerSecond,
            methods: methods ?? b.methods)
    }
}

public struct CircuitBreakerSettings: Sendable, Equatable {
    public var consecutiveFailures: Int?
    public var failureRate: Double?
    public var minimumRequests: Int?
    public var window: Duration?
    public var openFor: Duration?
    public var halfOpenProbes: Int?
    public var whileOpen: WhileOpen?

    func over(_ b: CircuitBreakerSettings) -> CircuitBreakerSettings {
        CircuitBreakerSettings(
            consecutiveFailures: consecutiveFailures ?? b.consecutiveFailures, failureRate: failureRate ?? b.failureRate,
            minimumRequests: minimumRequests ?? b.minimumRequests, window: window ?? b.window,
            openFor: openFor ?? b.openFor, halfOpenProbes: halfOpenProbes ?? b.halfOpenProbes,
            whileOpen: whileOpen ?? b.whileOpen)
    }
}

public struct ReachabilitySettings: Sendable, Equatable {
    public var parkFor: Duration?

    func over(_ b: ReachabilitySettings) -> ReachabilitySettings { ReachabilitySettings(parkFor: parkFor ?? b.parkFor) }
}

/// `outlier_detection: { consecutive_failures, base_ejection, max_ejected_percent }`.
public struct OutlierDetectionSettings: Sendable, Equatable {
    public var consecutiveFailures: Int?
    public var baseEjection: Duration?
    public var maxEjectedPercent: Int?

    public init(consecutiveFailures: Int? = nil, baseEjection: Duration? = nil, maxEjectedPercent: Int? = nil) {
        self.consecutiveFailures = consecutiveFailures
        self.baseEjection = baseEjection
        self.maxEjectedPercent = maxEjectedPercent
    }

    func over(_ b: OutlierDetectionSettings) -> OutlierDetectionSettings {
        OutlierDetectionSettings(
            consecutiveFailures: consecutiveFailures ?? b.consecutiveFailures, baseEjection: baseEjection ?? b.baseEjection,
            maxEjectedPercent: maxEjectedPercent ?? b.maxEjectedPercent)
    }
}

public struct HealthCheckSettings: Sendable, Equatable {
    public var path: String?
    public var interval: Duration?
    public var timeout: Duration?
    public var unhealthyAfter: Int?
    public var healthyAfter: Int?

    func over(_ b: HealthCheckSettings) -> HealthCheckSettings {
        HealthCheckSettings(
            path: path ?? b.path, interval: interval ?? b.interval, timeout: timeout ?? b.timeout,
            unhealthyAfter: unhealthyAfter ?? b.unhealthyAfter, healthyAfter: healthyAfter ?? b.healthyAfter)
    }
}

public enum AuthKind: String, Sendable, CaseIterable {
    case none, `static`
    case oauth2ClientCredentials = "oauth2_client_credentials"
    case oauth2RefreshToken = "oauth2_refresh_token"
    case login
}

/// Credentials for an upstream. The secret ones (`value`, `client_secret`,
/// `refresh_token`, `login_body`, which usually carries a password) come
/// from the environment and are `Secret`s: printing these settings, or
/// anything that holds them, shows `***` in their place.
public struct AuthSettings: Sendable, Equatable {
    public var kind: AuthKind = .none
    public var header: String = "Authorization"
    public var scheme: String?
    /// `static`: the header value.
    public var value: Secret?
    public var tokenURL: String?
    public var clientID: String?
    public var clientSecret: Secret?
    public var refreshToken: Secret?
    public var scope: String?
    public var audience: String?
    public var loginURL: String?
    public var loginBody: Secret?
    public var loginContentType: String?
    public var tokenPointer: String?
    public var expiresInPointer: String?
    public var refreshOn: [Int] = [401]
    public var refreshAhead: Duration = .seconds(30)

    public static let none = AuthSettings()
}

/// A route's or upstream's mapping of an upstream error onto the client's domain.
public struct ErrorMapping: Sendable, Equatable {
    public enum Condition: Sendable, Equatable {
        case status(Int)
        /// 4 for `4xx`, 5 for `5xx`.
        case statusClass(Int)
        case jsonPointer(String, equals: String)
    }

    public var when: [Condition]
    public var code: String
    public var title: String?
    public var detail: String?
    public var recoverySuggestion: String?
    public var recoveryOptions: [String]?
    public var retryable: Bool?
}

// MARK: - Built-in defaults and resolution

/// The policy values one route runs with, after route → upstream → defaults →
/// built-in defaults.
public struct ResolvedPolicies: Sendable {
    public var timeout: Duration
    public var retry: RetrySettings
    public var circuitBreaker: CircuitBreakerSettings
    public var reachability: ReachabilitySettings
    public var healthCheck: HealthCheckSettings
    public var errors: [ErrorMapping]
}

extension PolicySettings {
    /// The built-in defaults (docs/configuration.md), used where nothing is
    /// configured. The one place they are written: retry and breaker values
    /// come from the policies' own `Configuration()`, the rest is here.
    /// Every resolved setting is complete (see `resolved`).
    public static let builtIn: PolicySettings = {
        var p = PolicySettings()
        p.timeout = .seconds(10)
        let retry = RetryPolicy.Configuration()
        p.retry = RetrySettings(
            attempts: retry.attempts, perTryTimeout: retry.perTryTimeout, on: inDocumentedOrder(retry.on),
            backoffBase: retry.backoffBase, backoffMax: retry.backoffMax, jitter: retry.jitter ? .full : Jitter.none,
            honorRetryAfter: retry.honorRetryAfter, maxRetryAfter: retry.maxRetryAfter, budgetRatio: RetryBudget.defaultRatio,
            budgetMinPerSecond: RetryBudget.defaultMinPerSecond, methods: inDocumentedOrder(retry.methods))
        let breaker = CircuitBreakerStateMachine.Configuration()
        p.circuitBreaker = CircuitBreakerSettings(
            consecutiveFailures: breaker.consecutiveFailures, failureRate: breaker.failureRate,
            minimumRequests: breaker.minimumRequests, window: breaker.window, openFor: breaker.openFor,
            halfOpenProbes: breaker.halfOpenProbes, whileOpen: .park)
        p.reachability = ReachabilitySettings(parkFor: .seconds(10))
        let outliers = OutlierDetector.Configuration()
        p.outlierDetection = OutlierDetectionSettings(
            consecutiveFailures: outliers.consecutiveFailures, baseEjection: outliers.baseEjection,
            maxEjectedPercent: outliers.maxEjectedPercent)
        p.healthCheck = HealthCheckSettings(
            path: "/healthz", interval: .seconds(2), timeout: .seconds(1), unhealthyAfter: 3, healthyAfter: 1)
        return p
    }()
}

/// A set of `retry.on` or `retry.methods` values as the docs list them.
private func inDocumentedOrder(_ values: Set<String>) -> [String] {
    let order = ["connect-failure", "reset", "timeout", "GET", "HEAD", "OPTIONS", "PUT", "DELETE", "POST", "PATCH"]
    return values.sorted { a, b in
        let i = order.firstIndex(of: a) ?? order.count
        let j = order.firstIndex(of: b) ?? order.count
        return i != j ? i < j : a < b
    }
}

/// A setting after resolution over `PolicySettings.builtIn`, which sets
/// every key: nil here is a missing built-in default, a programming error.
public func resolved<T>(_ value: T?, _ key: StaticString) -> T {
    guard let value else { preconditionFailure("no built-in default for \(key)") }
    return value
}

extension RetryPolicy.Configuration {
    /// The policy for resolved settings (over `PolicySettings.builtIn`).
    public init(resolved settings: RetrySettings) {
        // Set on a copy, not on `self`: inside an initializer Swift does not
        // run property observers, and `on`'s observer keeps `statuses` (the
        // set looked up on every answer) in step. Set on `self`, a 429 or 408
        // in `retry.on` was never retried.
        var c = Self()
        c.attempts = resolved(settings.attempts, "retry.attempts")
        c.perTryTimeout = resolved(settings.perTryTimeout, "retry.per_try_timeout")
        c.on = Set(resolved(settings.on, "retry.on"))
        c.backoffBase = resolved(settings.backoffBase, "retry.backoff.base")
        c.backoffMax = resolved(settings.backoffMax, "retry.backoff.max")
        c.jitter = resolved(settings.jitter, "retry.backoff.jitter") == .full
        c.honorRetryAfter = resolved(settings.honorRetryAfter, "retry.honor_retry_after")
        c.maxRetryAfter = resolved(settings.maxRetryAfter, "retry.max_retry_after")
        c.methods = Set(resolved(settings.methods, "retry.methods"))
        self = c
    }
}

extension CircuitBreakerStateMachine.Configuration {
    /// The breaker for resolved settings (over `PolicySettings.builtIn`).
    public init(resolved b: CircuitBreakerSettings) {
        self.init()
        consecutiveFailures = resolved(b.consecutiveFailures, "circuit_breaker.consecutive_failures")
        failureRate = resolved(b.failureRate, "circuit_breaker.failure_rate")
        minimumRequests = resolved(b.minimumRequests, "circuit_breaker.minimum_requests")
        window = resolved(b.window, "circuit_breaker.window")
        openFor = resolved(b.openFor, "circuit_breaker.open_for")
        halfOpenProbes = resolved(b.halfOpenProbes, "circuit_breaker.half_open_probes")
    }
}

extension OutlierDetector.Configuration {
    /// Ejection for resolved settings (over `PolicySettings.builtIn`).
    public init(resolved o: OutlierDetectionSettings) {
        // Set on a copy: inside an initializer Swift runs no property
        // observers, and `baseEjection`'s keeps its nanoseconds in step.
        var c = Self()
        c.consecutiveFailures = resolved(o.consecutiveFailures, "outlier_detection.consecutive_failures")
        c.baseEjection = resolved(o.baseEjection, "outlier_detection.base_ejection")
        c.maxEjectedPercent = resolved(o.maxEjectedPercent, "outlier_detection.max_ejected_percent")
        self = c
    }
}

extension Configuration {
    public func resolvedPolicies(forRoute index: Int) -> ResolvedPolicies {
        let route = routes[index]
        let upstreamPolicies = upstream(named: route.upstream)?.policies ?? PolicySettings()
        var merged = route.policies.over(upstreamPolicies).over(defaults).over(.builtIn)
        merged.errors = route.errors + upstreamPolicies.errors
        return ResolvedPolicies(
            timeout: resolved(merged.timeout, "timeout"), retry: merged.retry, circuitBreaker: merged.circuitBreaker,
            reachability: merged.reachability, healthCheck: merged.healthCheck, errors: merged.errors)
    }
}

/// A listener: where the proxy accepts clients, and whether they speak TLS.
public struct Listener: Sendable, Equatable {
    public var address: ListenAddress
    /// nil: plain HTTP.
    public var tls: TLSListenerSettings?

    public init(address: ListenAddress, tls: TLSListenerSettings? = nil) {
        self.address = address
        self.tls = tls
    }
}

/// A TLS listener's `tls:` (docs/tls.md).
public struct TLSListenerSettings: Sendable, Equatable {
    /// SNI picks one by the names it covers; the first is the default.
    public var certificates: [CertificatePair]
    /// The oldest version accepted: "1.2" (default) or "1.3".
    public var minVersion: TLSMinimumVersion = .tls12
    /// Protocols offered by ALPN; the proxy speaks http/1.1 only.
    public var alpn: [String] = ["http/1.1"]

    public init(certificates: [CertificatePair]) { self.certificates = certificates }
}

public enum TLSMinimumVersion: String, Sendable, CaseIterable {
    case tls12 = "1.2"
    case tls13 = "1.3"
}
