import Foundation
import HappyPathCore
import HappyPathPolicies

/// What the admin listener knows at one moment: taken once per
/// `GET /admin/state` or `GET /status` on the admin loop, from the same
/// counters and locks, and rendered as JSON or HTML. Plain values, so the
/// renderers are pure and tested without a server.
public struct AdminSnapshot: Sendable {
    /// When it was taken (wall clock): times in the page are this plus a
    /// monotonic duration, written as UTC.
    public var takenAt: Date
    public var ready: Bool
    public var inFlight: Int
    public var parked: Int
    public var maxParked: Int
    public var bufferedBytes: Int
    public var maxBufferedBytes: Int
    /// What the process holds for its clients, pool by pool
    /// (`happypath_memory_bytes{pool}`), in a fixed order.
    public var memory: [(pool: String, bytes: Int)] = []
    /// Bytes in spool files now: answers read ahead, bodies kept (`happypath_spool_bytes`).
    public var spooled = 0
    /// nil: no route delivers later.
    public var deliveries: Deliveries?
    public var rateLimits: [RateLimit]
    /// nil: no route keeps answers (`fallback.serve_stale`).
    public var fallback: Fallback?
    public var configSource: String
    public var loadedAt: Date
    public var upstreams: [Upstream]
    /// What the metrics registry counts per route, read back from its text
    /// on the admin loop, with the rates since an earlier reading.
    public var routes: [RouteTotals] = []
    /// Per route label: rates between an earlier reading and this one (none
    /// yet at the first reading).
    public var windows: [String: RouteWindow] = [:]
    /// `cluster.redis` (nil: none): whether limits are shared now.
    public var cluster: Cluster?
    /// The last events (the page only; `/admin/state` leaves them out).
    public var events: [Event] = []

    public init(
        takenAt: Date, ready: Bool = true, inFlight: Int = 0, parked: Int = 0, maxParked: Int = 0, bufferedBytes: Int = 0,
        maxBufferedBytes: Int = 0, deliveries: Deliveries? = nil, rateLimits: [RateLimit] = [], fallback: Fallback? = nil,
        configSource: String = "", loadedAt: Date? = nil, upstreams: [Upstream] = []
    ) {
        self.takenAt = takenAt
        self.ready = ready
        self.inFlight = inFlight
        self.parked = parked
        self.maxParked = maxParked
        self.bufferedBytes = bufferedBytes
        self.maxBufferedBytes = maxBufferedBytes
        self.deliveries = deliveries
        self.rateLimits = rateLimits
        self.fallback = fallback
        self.configSource = configSource
        self.loadedAt = loadedAt ?? takenAt
        self.upstreams = upstreams
    }

    public struct Endpoint: Sendable, Equatable {
        public var url: String
        /// Out of rotation (outlier detection) now.
        public var ejected: Bool
        /// Back in the rotation after this long (when ejected).
        public var ejectedFor: Duration?
        /// Taken out by an operator (`POST .../drain`) until undrained.
        public var drained: Bool
        public init(url: String, ejected: Bool = false, ejectedFor: Duration? = nil, drained: Bool = false) {
            self.url = url
            self.ejected = ejected || ejectedFor != nil
            self.ejectedFor = ejectedFor
            self.drained = drained
        }

        public init(url: String, _ rotation: OutlierDetector.Rotation, at now: Instant) {
            switch rotation {
            case .inRotation: self.init(url: url)
            case let .ejected(until): self.init(url: url, ejectedFor: now < until ? until - now : .zero)
            case .drained: self.init(url: url, drained: true)
            }
        }
    }

    /// The last health check: how long ago it ended, and how many endpoints
    /// answered healthy of how many were asked.
    public struct HealthCheck: Sendable, Equatable {
        public var age: Duration
        public var healthy: Int
        public var endpoints: Int
        public init(age: Duration, healthy: Int, endpoints: Int) {
            self.age = age
            self.healthy = healthy
            self.endpoints = endpoints
        }
    }

    /// The breaker as the page words it.
    public enum Breaker: Sendable, Equatable {
        case closed
        /// Lets probes through after `for` more.
        case open(for: Duration)
        case halfOpen(probesInFlight: Int, successes: Int)
        /// Held open or closed by an operator until released.
        case forced(CircuitBreakerStateMachine.Forced)

        public init(_ state: CircuitBreakerStateMachine.State, forced: CircuitBreakerStateMachine.Forced? = nil, at now: Instant)
        {
            if let forced {
                self = .forced(forced)
                return
            }
            switch state {
            case .closed: self = .closed
            case let .open(until): self = .open(for: now < until ? until - now : .zero)
            case let .halfOpen(probes, successes): self = .halfOpen(probesInFlight: probes, successes: successes)
            }
        }

        /// The JSON name (`/admin/state`): closed, open, half_open (a
        /// forced breaker is in the state it was forced to).
        public var name: String {
            switch self {
            case .closed, .forced(.closed): "closed"
            case .open, .forced(.open): "open"
            case .halfOpen: "half_open"
            }
        }

        /// What an operator forced it to; nil: automatic.
        public var forcedTo: CircuitBreakerStateMachine.Forced? {
            if case let .forced(f) = self { return f }
            return nil
        }
    }

    public struct Upstream: Sendable {
        public var name: String
        /// The health check's verdict (true when there is none).
        public var reachable: Bool
        public var breaker: Breaker
        /// Failures in a row, and tries and failed tries in the breaker's
        /// window (only counted while closed).
        public var breakerFailures: (consecutive: Int, requests: Int, failed: Int)
        /// Retries the retry budget would grant now.
        public var retriesLeft: Int
        public var endpoints: [Endpoint]
        /// Parked requests by reason, in a fixed order.
        public var parked: [(reason: String, count: Int)]
        /// The token source's kind and seconds until its token expires (never the token).
        public var token: (kind: String, expiresIn: Int?)?
        /// The upstream pause (pacing) has this long left; nil: not paused.
        public var pausedFor: Duration?
        /// The status whose answer started the pause (429 or 503; a gRPC
        /// RESOURCE_EXHAUSTED counts as 429).
        public var pauseCause: Int = 0
        /// nil: no check has ended yet.
        public var healthCheck: HealthCheck?
        /// Clients paused one by one (`pacing.scope: client`).
        public var pausedClients: Int
        /// Its slots: tries in flight against the limit, requests queued (docs/overload.md).
        public var concurrency = Concurrency()
        /// The proxy's own HTTP/2 client towards it (`h2_client: nghttp2`); nil otherwise.
        public var h2: H2Client?

        public init(
            name: String, reachable: Bool = true, breaker: Breaker = .closed,
            breakerFailures: (consecutive: Int, requests: Int, failed: Int) = (0, 0, 0), retriesLeft: Int = 0,
            endpoints: [Endpoint] = [], parked: [(reason: String, count: Int)] = [],
            token: (kind: String, expiresIn: Int?)? = nil,
            pausedFor: Duration? = nil, pausedClients: Int = 0
        ) {
            self.name = name
            self.reachable = reachable
            self.breaker = breaker
            self.breakerFailures = breakerFailures
            self.retriesLeft = retriesLeft
            self.endpoints = endpoints
            self.parked = parked
            self.token = token
            self.pausedFor = pausedFor
            self.pausedClients = pausedClients
        }

        public var parkedTotal: Int { parked.reduce(0) { $0 + $1.count } }
    }

    /// The proxy's own HTTP/2 client towards one upstream, over every
    /// worker and the health checks (docs/http2.md).
    public struct H2Client: Sendable, Equatable {
        public var connections = 0
        public var streams = 0
        public var opened = 0
        public var replayed = 0
        public var goaways = 0
        public init(connections: Int = 0, streams: Int = 0, opened: Int = 0, replayed: Int = 0, goaways: Int = 0) {
            self.connections = connections
            self.streams = streams
            self.opened = opened
            self.replayed = replayed
            self.goaways = goaways
        }
    }

    /// An upstream's slots over all workers (docs/overload.md).
    public struct Concurrency: Sendable, Equatable {
        public var limit = 0
        public var inFlight = 0
        public var queued = 0
        /// Answers streaming past their head, moved out of an adaptive
        /// limit (`max_streams`).
        public var streaming = 0
        /// The limit is learned (`adaptive_concurrency`), with its latest
        /// baseline and recent latency in seconds (0: no sample yet).
        public var adaptive = false
        public var baseline = 0.0
        public var recent = 0.0

        public init(
            limit: Int = 0, inFlight: Int = 0, queued: Int = 0, streaming: Int = 0, adaptive: Bool = false,
            baseline: Double = 0, recent: Double = 0
        ) {
            self.limit = limit
            self.inFlight = inFlight
            self.queued = queued
            self.streaming = streaming
            self.adaptive = adaptive
            self.baseline = baseline
            self.recent = recent
        }
    }

    /// A rate-limited route: keys tracked, requests queued.
    public typealias RateLimit = (route: String, keys: Int, queued: Int)

    /// The answers kept for `fallback.serve_stale`.
    public typealias Fallback = (entries: Int, bytes: Int, maxBytes: Int)

    /// The cluster link: `shared` (every worker's link is up), `degraded`
    /// (some cannot reach Redis: their requests use the local share) or
    /// `connecting` (just started), since when, and the replicas last counted.
    public struct Cluster: Sendable, Equatable {
        public var mode: String
        public var since: Date
        public var replicas: Int
        public var reason: String?
        /// The server, without credentials.
        public var redis: String
        public init(mode: String, since: Date, replicas: Int, reason: String?, redis: String) {
            self.mode = mode
            self.since = since
            self.replicas = replicas
            self.reason = reason
            self.redis = redis
        }
    }

    public struct Deliveries: Sendable {
        /// Kept deliveries by state name (queued, in_flight, delivered, dead).
        public var counts: [(state: String, count: Int)]
        public var heldBytes: Int
        public var maxBytes: Int
        public var roundsInFlight: Int
        /// The store's name (sqlite, postgres, memory).
        public var store: String
        public var writable: Bool
        /// Why the store cannot write, as it said (nil: it can).
        public var problem: String?
        /// Per upstream with deliveries not yet delivered or dead: how many,
        /// and the age of the oldest (read from the store, as
        /// `happypath_delivery_oldest_queued_seconds` is); nil: not read.
        public var pending: [(upstream: String, count: Int, oldest: Duration)]?

        /// The oldest pending delivery's age over every upstream.
        public var oldestPending: Duration? { pending?.map(\.oldest).max() }

        public init(
            counts: [(state: String, count: Int)], heldBytes: Int = 0, maxBytes: Int = 0, roundsInFlight: Int = 0,
            store: String = "", writable: Bool = true
        ) {
            self.counts = counts
            self.heldBytes = heldBytes
            self.maxBytes = maxBytes
            self.roundsInFlight = roundsInFlight
            self.store = store
            self.writable = writable
        }

        public func count(_ state: String) -> Int { counts.first { $0.state == state }?.count ?? 0 }
    }

    /// One of the events `/admin/events` streams, as kept for the page:
    /// its type, time, and other fields in order (values as text).
    public typealias Event = (type: String, ts: String, fields: [(key: String, value: String)])
}
