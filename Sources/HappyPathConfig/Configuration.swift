import Foundation
import HappyPathCore
import HappyPathPolicies

/// A validated configuration. Policy settings keep "not set" apart from
/// their defaults (`Partial`) so that a route inherits from its upstream,
/// which inherits from `defaults`; `resolvedPolicies(forRoute:)` does the merge.
public struct Configuration: Sendable {
    /// The file this came from, for messages and `/admin/state`.
    public var source: String
    /// `upstreams.NAME.h2_client` as written, by upstream (read and ignored:
    /// `protocol: h2` always uses the proxy's own HTTP/2 client; `happypath
    /// check` warns). Kept out of `Upstream`, so deleting the key is no
    /// change to the upstream on a reload.
    public var ignoredH2Clients: [String: String] = [:]
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
    /// `cluster`: the Redis that `scope: cluster` rate limits and pauses are
    /// shared through (nil: none; every limit is the process's own).
    public var cluster: ClusterConfiguration?
    /// `tracing`: nil, none (the default; it then costs nothing).
    public var tracing: TracingConfiguration?
    /// `trusted_proxies`: X-Forwarded-For hops from these networks are
    /// skipped when the proxy looks for a client's address (rate limits).
    public var trustedProxies: [IPRange] = []
    /// `http2:` at the top level: HTTP/2 on every listener that does not say
    /// otherwise (nil: `http2: false`). On by default.
    public var http2: HTTP2Configuration? = HTTP2Configuration()
    /// `normalize.merge_slashes`: `//` in a request path collapses to `/`
    /// before routing (default false). Dot-segments are always removed.
    public var mergeSlashes = false

    /// How the edge normalizes request paths (docs/http1.md, "Paths").
    public var pathNormalization: PathNormalization {
        PathNormalization(mergeSlashes: mergeSlashes, encodedSlashes: limits.encodedSlashes)
    }

    /// Some route stores its requests for later delivery (the store is needed).
    public var usesStore: Bool { routes.contains { $0.delivery.mode == .later } }
    /// Where spool files go: `storage.spool_dir`, else beside the delivery
    /// store's file when a route delivers later (a directory the process
    /// writes already), else `$TMPDIR` or `/tmp`.
    public var spoolDirectory: String {
        if let dir = storage.spoolDir { return dir }
        if usesStore, storage.url == nil {
            let dir = (storage.path as NSString).deletingLastPathComponent
            return dir.isEmpty ? "." : dir
        }
        let tmp = ProcessInfo.processInfo.environment["TMPDIR"] ?? ""
        return tmp.isEmpty ? "/tmp" : tmp
    }
    /// Some route keeps answers for `fallback.serve_stale` (the process then has a store of them).
    public var keepsAnswers: Bool { routes.contains { $0.fallback?.serveStale != nil } }

    /// What `listener` offers of HTTP/2 (nil: HTTP/1.1 only).
    public func http2(for listener: Listener) -> HTTP2Configuration? {
        switch listener.http2 {
        case .inherit: http2
        case .off: nil
        case let .on(settings): settings
        }
    }

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
    /// Header fields in a request head (HTTP/1.1 and HTTP/2); more are answered 431.
    public var maxHeaders: Int = 100
    /// Idle or slow client connections are closed after this.
    public var clientTimeout: Duration = .seconds(30)
    /// Parked commands in the whole process.
    public var maxParked: Int = 10_000
    /// Client connections open in the whole process; above it the
    /// listeners stop accepting (clients wait in the kernel's backlog)
    /// until one closes. `limits.max_connections` in the file.
    public var maxClientConnections: Int = 10_000
    /// Request bodies held in memory by the whole process (each body is
    /// kept whole for retries and replays); a body that does not fit is
    /// answered 503 OVERLOADED before it is read.
    public var maxBufferedBytes: Int = 256 * 1024 * 1024
    /// Answer bytes staged for one client connection and not yet taken by
    /// the client, all its HTTP/2 streams together: past it every upstream
    /// transfer feeding the connection pauses until the client drains it.
    /// `limits.connection_buffer` in the file.
    public var connectionBuffer: Int = 256 * 1024
    /// Request bodies one client (its address) may hold in memory, all its
    /// connections together; nil: an eighth of `maxBufferedBytes`.
    /// `limits.max_buffered_per_client` in the file.
    public var maxBufferedPerClient: Int?

    /// What the process may hold for clients in all (request bodies, staged
    /// answers, queued output): at 90 % the listeners stop accepting and new
    /// HTTP/2 streams are refused, below 75 % they resume. `limits.max_memory`.
    public var maxMemory: Int = 1024 * 1024 * 1024

    /// `maxBufferedPerClient` as it applies.
    public var bufferedPerClient: Int { maxBufferedPerClient ?? max(1, maxBufferedBytes / 8) }

    /// Bytes of one answer read ahead of a slow client into a spool file
    /// (`storage.spool_dir`) past `connectionBuffer`, so that its upstream
    /// is free once it sent its last byte; 0: off (the upstream waits for
    /// the client). `limits.read_ahead` in the file.
    public var readAhead: Int = 16 * 1024 * 1024
    /// A request body larger than this is kept (for retries and replays) in
    /// a spool file instead of memory, counted in `maxSpooledBytes`; one
    /// the disk cannot take is kept in memory within `maxBufferedBytes`.
    /// `limits.body_in_memory` in the file.
    public var bodyInMemory: Int = 64 * 1024
    /// Spool files of the whole process, all answers together
    /// (`limits.max_spooled_bytes`); past it answers wait for their clients.
    public var maxSpooledBytes: Int = 1024 * 1024 * 1024
    /// One client's share of `maxSpooledBytes`: `max_buffered_per_client`
    /// when set, else an eighth.
    public var spooledPerClient: Int {
        min(maxSpooledBytes, maxBufferedPerClient ?? max(1, maxSpooledBytes / 8))
    }
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
    /// Tries in flight per endpoint (split across the workers), open
    /// tunnels included; beyond, a bounded queue, then 503 OVERLOADED.
    /// `max_connections` in the file: not `limits.max_connections`.
    public var maxConnectionsPerEndpoint: Int = 256
    public var auth: AuthSettings = .none
    public var policies: PolicySettings = PolicySettings()
    /// Its routes' default for `upstream_errors` (nil: `normalize`).
    public var upstreamErrors: UpstreamErrorsMode?
    /// `pacing:` (nil: the upstream's Retry-After pauses nothing but the request that got it).
    public var pacing: PacingConfiguration?
    /// `tls:` for https:// endpoints (nil: libcurl's defaults: verified against the system's CAs).
    public var tls: UpstreamTLSSettings?
    /// `protocol:` HTTP/1.1 (the default) or HTTP/2 to the endpoints.
    public var `protocol`: UpstreamProtocol = .http1
    /// `adaptive_concurrency:` (nil: the limit of tries in flight is `max_connections`).
    public var adaptiveConcurrency: AdaptiveConcurrencySettings?
    /// Its health check is gRPC's because it serves gRPC routes and its
    /// `health_check` names no `path` of its own and no `grpc` (`happypath check` says so).
    public var grpcHealthCheckByDefault = false
}

/// `upstreams.NAME.adaptive_concurrency` (docs/overload.md): the limit of
/// tries in flight learned from latency, between `min_limit` and
/// `max_limit` (never above `max_connections` × endpoints), and a queue
/// that sheds CoDel-style, the lowest priority first.
public struct AdaptiveConcurrencySettings: Sendable, Equatable {
    /// The limit's bounds and how it moves, for the whole upstream (each
    /// worker learns its share).
    public var limit = AdaptiveLimit.Configuration()
    /// `queue: { interval, target }`.
    public var queue = QueueShedding()
    /// `max_streams`: answers that stream past their head (event streams,
    /// gRPC calls, tunnels, answers read slower than they come past
    /// `limits.read_ahead`) counted apart from the limit, for the whole
    /// upstream (nil: as many as `max_limit`). Past it a stream keeps its slot.
    public var maxStreams: Int?
    /// `min_limit` was given. Without it each worker's share of the limit
    /// never goes below 2 (`ConcurrencyLimiter.Configuration.defaultMinPerWorker`):
    /// one slot for the top priority in use and one for the rest (issue 44).
    public var minLimitGiven = false

    public init() {}
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
    public var delivery = DeliveryPolicy.Configuration()
    /// TRACE is answered 405 unless the route allows it (`allow_trace`):
    /// an upstream echoing the request would reflect credentials and cookies.
    public var allowTrace = false
    /// What happens to an upstream redirect to its own endpoint.
    public var redirects: RedirectMode = .rewrite
    /// nil: the upstream's setting, else `normalize`.
    public var upstreamErrors: UpstreamErrorsMode?
    /// `rate_limit:` (nil: none).
    public var rateLimit: RateLimitConfiguration?
    /// `cors:` (nil: none): browsers on these other origins may call the route.
    public var cors: CORSConfiguration?
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
    /// `grpc:` the route carries gRPC calls (nil: not declared). Its
    /// upstream must have `protocol: h2`, and it may not deliver later.
    public var grpc: GRPCRouteConfiguration?
    /// `priority:` how much its requests matter when the upstream is full
    /// (docs/overload.md): admitted first (critical) or shed first (sheddable).
    public var priority: RequestPriority = .normal
    /// `priority_header:` a request header (lowercased) through which a
    /// client may lower its own request's priority, never raise it (nil: none).
    public var priorityHeader: String?
    /// `coalesce:` (nil: off): concurrent identical reads share one upstream try (docs/coalescing.md).
    public var coalesce: CoalesceConfiguration?
}

/// `grpc:` on a route (docs/grpc.md): the route carries gRPC calls.
public struct GRPCRouteConfiguration: Sendable, Equatable {
    /// `idempotent:` the route's methods may run twice with no harm (the
    /// condition gRFC A6 puts on hedging a call). Default false. Read and
    /// kept; hedging does not act on it yet.
    public var idempotent = false

    public init(idempotent: Bool = false) { self.idempotent = idempotent }
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
    /// `storage.spool_dir`: where answers read ahead of slow clients are
    /// spooled (`limits.read_ahead`); nil: beside the delivery store's
    /// file when a route delivers later, else the system's temporary
    /// directory (`spoolDirectory`).
    public var spoolDir: String?
    /// Connections to it: one writes, the rest read (status URLs, listings).
    public var pool = 4
    /// A claimed delivery whose replica stopped renewing it (it died) is
    /// queued again this long after the last renewal.
    public var lease: Duration = .seconds(30)
    /// Not ready (`/readyz` 503) while the database cannot be reached. False:
    /// the proxy stays ready, since routes that deliver now still work.
    public var required = false

    /// What logs and `/admin/state` name the store by: the file, or the URL without its password.
    public var name: String { url.map { Self.redact($0) } ?? path }

    /// `postgres://user:secret@host/db` as `postgres://user:***@host/db`; a
    /// `password=` value as `***`. The password runs from the first `:`
    /// after the scheme to the last `@` before the query: one that holds an
    /// `@` or a `/` of its own, written raw, is hidden whole too.
    /// `hidingLoneUser`: a user without a password (`https://TOKEN@host`)
    /// shows as `***` as well, since a user part alone is often a token
    /// (for `storage.url` it is a role name, and stays).
    public static func redact(_ url: String, hidingLoneUser: Bool = false) -> String {
        var out = url
        if let scheme = out.range(of: "://") {
            let rest = out[scheme.upperBound...]
            let end = rest.firstIndex { $0 == "?" || $0 == "#" } ?? rest.endIndex
            if let at = rest[..<end].lastIndex(of: "@") {
                if let colon = rest[..<at].firstIndex(of: ":") {
                    out.replaceSubrange(out.index(after: colon)..<at, with: "***")
                } else if hidingLoneUser {
                    out.replaceSubrange(scheme.upperBound..<at, with: "***")
                }
            }
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

// MARK: - Policy settings (what one level sets; the rest inherits)

/// The policies one level of the file sets: `defaults`, an upstream, or a
/// route. Each is its policy's own configuration struct inside a `Partial`,
/// which keeps "not set" apart from the defaults written beside the fields;
/// `merged(over:)` is the one inheritance (route → upstream → `defaults`)
/// and `resolved()` puts the defaults under what is left.
public struct PolicySettings: Sendable, Equatable {
    public var timeout = Partial<TimeoutConfiguration>()
    public var retry = Partial<RetryPolicy.Configuration>()
    /// `retry.budget`, an upstream's (or `defaults`'); never a route's.
    public var retryBudget = Partial<RetryBudget.Configuration>()
    /// An upstream's (or `defaults`'); never a route's.
    public var circuitBreaker = Partial<CircuitBreakerStateMachine.Configuration>()
    public var reachability = Partial<ReachabilityConfiguration>()
    /// An upstream's (or `defaults`'); never a route's.
    public var healthCheck = Partial<HealthCheckConfiguration>()
    /// `outlier_detection:`, an upstream's (or `defaults`'); never a route's.
    public var outlierDetection = Partial<OutlierDetector.Configuration>()
    public var errors: [ErrorMapping] = []

    public init() {}

    /// `self` over `base`: each field set here wins, the rest come from `base`.
    public func merged(over base: PolicySettings) -> PolicySettings {
        var out = PolicySettings()
        out.timeout = timeout.merged(over: base.timeout)
        out.retry = retry.merged(over: base.retry)
        out.retryBudget = retryBudget.merged(over: base.retryBudget)
        out.circuitBreaker = circuitBreaker.merged(over: base.circuitBreaker)
        out.reachability = reachability.merged(over: base.reachability)
        out.healthCheck = healthCheck.merged(over: base.healthCheck)
        out.outlierDetection = outlierDetection.merged(over: base.outlierDetection)
        out.errors = errors + base.errors
        return out
    }

    /// Every policy complete: the fields set here, the documented defaults elsewhere.
    public func resolved() -> ResolvedPolicies {
        ResolvedPolicies(
            timeout: timeout.resolved().timeout, retry: retry.resolved(), retryBudget: retryBudget.resolved(),
            circuitBreaker: circuitBreaker.resolved(), reachability: reachability.resolved(),
            healthCheck: healthCheck.resolved(), outlierDetection: outlierDetection.resolved(), errors: errors)
    }
}

/// `retry.backoff.jitter` as the file writes it (`RetryPolicy.Configuration.jitter`).
public enum Jitter: String, Sendable, CaseIterable { case full, none }

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

// MARK: - Resolution

/// The policy values one route (or upstream) runs with, after route →
/// upstream → defaults → the policies' own defaults. Equatable so a reload
/// can tell an upstream whose policies did not change.
public struct ResolvedPolicies: Sendable, Equatable {
    public var timeout: Duration
    public var retry: RetryPolicy.Configuration
    public var retryBudget: RetryBudget.Configuration
    public var circuitBreaker: CircuitBreakerStateMachine.Configuration
    public var reachability: ReachabilityConfiguration
    public var healthCheck: HealthCheckConfiguration
    public var outlierDetection: OutlierDetector.Configuration
    public var errors: [ErrorMapping]
}

extension Configuration {
    public func resolvedPolicies(forRoute index: Int) -> ResolvedPolicies {
        let route = routes[index]
        let upstreamPolicies = upstream(named: route.upstream)?.policies ?? PolicySettings()
        var out = route.policies.merged(over: upstreamPolicies).merged(over: defaults).resolved()
        out.errors = route.errors + upstreamPolicies.errors
        return out
    }

    /// An upstream's own policies (the breaker, the budget, health checks,
    /// ejection): the upstream's over `defaults`.
    public func resolvedPolicies(forUpstream upstream: Upstream) -> ResolvedPolicies {
        upstream.policies.merged(over: defaults).resolved()
    }
}

/// A listener: where the proxy accepts clients, and whether they speak TLS.
public struct Listener: Sendable, Equatable {
    public var address: ListenAddress
    /// nil: plain HTTP.
    public var tls: TLSListenerSettings?
    /// The listener's own `http2:`; `.inherit` takes the top level's.
    public var http2: HTTP2Choice = .inherit

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
    /// Protocols offered by ALPN: `h2` (when the listener speaks HTTP/2) before `http/1.1`.
    public var alpn: [String] = ["h2", "http/1.1"]

    public init(certificates: [CertificatePair]) { self.certificates = certificates }
}

public enum TLSMinimumVersion: String, Sendable, CaseIterable {
    case tls12 = "1.2"
    case tls13 = "1.3"
}

/// `http2:` (docs/http2.md): HTTP/2 by prior knowledge on a cleartext
/// listener, by ALPN `h2` on a TLS one. Envoy's edge defaults.
public struct HTTP2Configuration: Sendable, Equatable {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams a client may have open at once (1 to 1000).
    public var maxConcurrentStreams = 100
    /// SETTINGS_INITIAL_WINDOW_SIZE: request body a stream may send ahead (64KiB to 2³¹−1 bytes).
    public var initialStreamWindow = 64 * 1024
    /// The connection's receive window, over all its streams (at least the stream window).
    public var initialConnectionWindow = 1024 * 1024

    public init() {}

    public static let maxWindow = Int(Int32.max)
}

/// A listener's `http2:`.
public enum HTTP2Choice: Sendable, Equatable {
    /// Not set on the listener: the top level's.
    case inherit
    /// `http2: false`.
    case off
    case on(HTTP2Configuration)
}

/// `cluster.redis`: where replicas share rate limits and pauses.
public struct ClusterConfiguration: Sendable, Equatable {
    public var redis: RedisEndpoint
    /// A connect or a command later than this: the replica decides alone
    /// (its local share) until Redis answers again. Default 50ms.
    public var timeout: Duration = .milliseconds(50)
    /// Tokens a worker takes from Redis at once (nil: `auto`, one round
    /// trip per 10 ms of a route's rate: `max(1, rate × 10ms)`).
    public var lease: Int?
    /// How often a replica says it is alive (the replica count). Default 1s.
    public var heartbeat: Duration = .seconds(1)
    /// For rediss://: the CA and whether to verify (nil: the system's CAs, verified).
    public var tls: UpstreamTLSSettings?

    public init(redis: RedisEndpoint) { self.redis = redis }

    /// Some route counts in Redis.
    public func isUsed(by routes: [Route]) -> Bool { routes.contains { $0.rateLimit?.scope == .cluster } }
}
