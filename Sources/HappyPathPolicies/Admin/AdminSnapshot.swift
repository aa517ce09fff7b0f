import Foundation
import HappyPathCore

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
    /// nil: no route delivers later.
    public var deliveries: Deliveries?
    public var rateLimits: [RateLimit]
    /// nil: no route keeps answers (`fallback.serve_stale`).
    public var fallback: Fallback?
    public var configSource: String
    public var loadedAt: Date
    public var upstreams: [Upstream]
    /// What the metrics registry counts per route (only the page reads it:
    /// `/admin/state` leaves it empty).
    public var routes: [RouteTotals] = []

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
        public init(url: String, ejected: Bool = false) {
            self.url = url
            self.ejected = ejected
        }
    }

    /// The breaker as the page words it.
    public enum Breaker: Sendable, Equatable {
        case closed
        /// Lets probes through after `for` more.
        case open(for: Duration)
        case halfOpen(probesInFlight: Int, successes: Int)

        public init(_ state: CircuitBreakerStateMachine.State, at now: Instant) {
            switch state {
            case .closed: self = .closed
            case let .open(until): self = .open(for: now < until ? until - now : .zero)
            case let .halfOpen(probes, successes): self = .halfOpen(probesInFlight: probes, successes: successes)
            }
        }

        /// The JSON name (`/admin/state`): closed, open, half_open.
        public var name: String {
            switch self {
            case .closed: "closed"
            case .open: "open"
            case .halfOpen: "half_open"
            }
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
        /// Clients paused one by one (`pacing.scope: client`).
        public var pausedClients: Int

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

    /// A rate-limited route: keys tracked, requests queued.
    public typealias RateLimit = (route: String, keys: Int, queued: Int)

    /// The answers kept for `fallback.serve_stale`.
    public typealias Fallback = (entries: Int, bytes: Int, maxBytes: Int)

    public struct Deliveries: Sendable {
        /// Kept deliveries by state name (queued, in_flight, delivered, dead).
        public var counts: [(state: String, count: Int)]
        public var heldBytes: Int
        public var maxBytes: Int
        public var roundsInFlight: Int
        /// The store's name (sqlite, postgres, memory).
        public var store: String
        public var writable: Bool

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
