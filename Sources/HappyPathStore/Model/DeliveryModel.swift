import HappyPathCore

/// Where a stored delivery is in its life.
public enum DeliveryState: Int, Sendable, CaseIterable {
    case queued = 0
    case inFlight = 1
    case delivered = 2
    case dead = 3

    public var name: String {
        switch self {
        case .queued: "queued"
        case .inFlight: "in_flight"
        case .delivered: "delivered"
        case .dead: "dead"
        }
    }

    public init?(name: String) {
        guard let s = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = s
    }
}

/// A request to store: everything needed to send it later, as it will go upstream.
public struct NewDelivery: Sendable {
    public var id: String
    public var upstream: String
    /// The route's label when it was accepted (for listings; delivery routes again).
    public var route: String
    public var idempotencyKey: String?
    /// Whose key it is: a hash of the route and the client's identity
    /// (`IdempotencyScope`); the key is looked up only within its scope.
    public var idempotencyScope: String?
    /// A hash of the method, target and body: the same key with another
    /// fingerprint is another request (`keyReused`).
    public var fingerprint: String?
    public var requestID: String
    public var method: String
    /// The client's path and query, routed again at delivery.
    public var target: String
    /// `name: value\r\n` lines, as forwarded (see `HeaderBlock.lines`).
    public var headers: [UInt8]
    public var body: RequestBody
    public var maxAttempts: Int
    /// Wall clock, milliseconds since 1970.
    public var expiresAt: Int64

    public init(
        id: String, upstream: String, route: String, idempotencyKey: String?, idempotencyScope: String? = nil,
        fingerprint: String? = nil, requestID: String, method: String, target: String, headers: [UInt8],
        body: RequestBody, maxAttempts: Int, expiresAt: Int64
    ) {
        self.id = id
        self.upstream = upstream
        self.route = route
        self.idempotencyKey = idempotencyKey
        self.idempotencyScope = idempotencyScope ?? (idempotencyKey == nil ? nil : upstream)
        self.fingerprint = fingerprint
        self.requestID = requestID
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.maxAttempts = maxAttempts
        self.expiresAt = expiresAt
    }

    /// What it counts against `storage.max_bytes`.
    var payloadBytes: Int { headers.count + body.count + target.utf8.count + method.utf8.count }
}

/// A delivery taken for one round: it is `in_flight` in the store until `finish`.
public struct ClaimedDelivery: Sendable {
    public let id: String
    public let upstream: String
    public let requestID: String
    public let method: String
    public let target: String
    public let headers: [UInt8]
    public let body: RequestBody
    /// Rounds started, this one included.
    public let attempts: Int
    public let maxAttempts: Int
    public let expiresAt: Int64
}

/// A delivery as the status URL and the admin API show it.
public struct DeliveryRecord: Sendable, Equatable {
    public let cursor: Int64
    public let id: String
    public let state: DeliveryState
    public let attempts: Int
    public let maxAttempts: Int
    public let upstream: String
    public let route: String
    public let requestID: String
    public let method: String
    public let target: String
    public let createdAt: Int64
    public let updatedAt: Int64
    public let nextAttemptAt: Int64
    public let expiresAt: Int64
    /// The upstream's status in the last round (nil: none answered).
    public let lastStatus: Int?
    /// The last round's problem, as problem+json (kept once dead).
    public let lastProblem: String?
}

public enum SubmitResult: Sendable {
    /// Stored durably (the commit is on disk, per `storage.sync`).
    case stored(id: String)
    /// The same `Idempotency-Key` in the same scope, for the same request
    /// (fingerprint), is already stored.
    case existing(id: String, state: DeliveryState)
    /// The same `Idempotency-Key` in the same scope is stored for another
    /// request (another method, target or body): nothing was stored.
    case keyReused
    /// `storage.max_bytes` reached: nothing was stored.
    case full(heldBytes: Int, maxBytes: Int)
    /// The store could not write (the disk is full or failing, or the store
    /// could not be opened yet): nothing was stored.
    case failed(StoreError)
}

/// The store's ability to write changed; reported on the writer thread.
public enum StoreHealth: Sendable {
    /// A write (or opening the store) failed. Reported for every failure.
    case failed(StoreError)
    /// A write succeeded after failures, or the store opened after it could
    /// not at start; `requeued` rounds found in flight went back to `queued`.
    case writable(requeued: Int)
}

/// How one delivery round ended.
public enum DeliveryOutcome: Sendable {
    case delivered(status: Int)
    /// Queued again for `at` (wall ms), with what went wrong.
    case retry(at: Int64, status: Int?, problem: String)
    case dead(status: Int?, problem: String)
    /// Not tried (no room to run it now): queued again, the round not counted.
    case postpone(at: Int64)
}

/// Why the store itself made a delivery dead (a round's own end is
/// `DeliveryPolicy`'s to decide).
public enum SetAsideReason: String, Sendable {
    /// Its `delivery.max_age` passed while it waited.
    case maxAge = "max_age"
    /// A round of it was in flight when the process died (with the shared
    /// store: its lease ran out on a replica that died) at two starts in a
    /// row: it may be what kills the proxy, so it is not sent a third time.
    case crashedTheProxy = "crashed_the_proxy"
}

/// A delivery the store made dead, reported by the next claim.
public typealias SetAside = (id: String, upstream: String, reason: SetAsideReason)

public enum ReplayResult: Sendable {
    case replayed
    case notDead(DeliveryState)
    case unknown
}

/// Counts for `/metrics`: the kept counts, and the oldest pending delivery
/// of each upstream (read on the reader thread).
public struct StoreStats: Sendable {
    public var counts = DeliveryCounts()
    /// Per upstream: deliveries not yet delivered or dead, and the oldest one's creation (wall ms).
    public var pending: [String: (count: Int, oldest: Int64)] = [:]
    /// The readers were too busy to read `pending` (`StoreReadQueue`):
    /// the pending gauges keep their last values rather than read as empty.
    public var readersBusy = false
    public var heldBytes = 0
    public var maxBytes = 0
}
