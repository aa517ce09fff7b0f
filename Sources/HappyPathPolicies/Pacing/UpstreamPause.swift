import HappyPathCore

/// `pacing:` on an upstream: the statuses whose `Retry-After` (or a
/// `RateLimit` field with nothing remaining) pause requests to it, and whom
/// a 429 pauses.
public struct PacingConfiguration: Sendable, Equatable {
    public enum WhilePaused: String, Sendable, Equatable, CaseIterable {
        /// Requests wait (parked) until the pause ends, within their deadline.
        case wait
        /// Requests are answered at once (503 UPSTREAM_PAUSED, or 429 RATE_LIMITED after a 429).
        case fail
    }

    /// Whom a 429 pauses (`scope_429`). A 503 (or any other status in `on`)
    /// always pauses the whole upstream: "the service is unavailable" is
    /// about everyone, while RFC 6585 defines 429 as "the user has sent too
    /// many requests", one client's state.
    public enum Scope: String, Sendable, Equatable, CaseIterable {
        /// Only the requests with the client key that got the 429.
        case client
        /// Every request to the upstream (the behaviour before `scope_429`).
        case upstream
    }

    /// Default `[429, 503]`.
    public var on: Set<Int> = [429, 503]
    /// `resource-exhausted` in `on` (default no): a gRPC call's
    /// `RESOURCE_EXHAUSTED` whose `grpc-status-details-bin` carries a
    /// `google.rpc.RetryInfo` pauses for its `retry_delay` as a 429 pauses
    /// for its `Retry-After` (whom: `scope_429`): it is gRPC's 429, "a
    /// quota is used up", per client or shared as the upstream's 429 is.
    public var onResourceExhausted = false
    /// Default 60 s: no answer pauses anything longer.
    public var maxPause: Duration = .seconds(60)
    /// Default `wait`.
    public var whilePaused: WhilePaused = .wait
    /// Default `client`.
    public var scope429: Scope = .client
    /// Default 10,000: client keys with a pause kept at once (`max_clients`);
    /// beyond, expired pauses go first, then the one ending soonest, so a
    /// client rotating keys cannot grow the table.
    public var maxClients = 10_000

    public init() {}

    /// Whom an answer with `status` pauses.
    public func scope(of status: Int) -> Scope { status == 429 ? scope429 : .upstream }
}

/// One upstream's pauses, as a pure state: the upstream said "not before
/// then", to everyone (a 503, or a 429 under `scope_429: upstream`) or to
/// one client key (a 429 under `scope_429: client`), and nothing is sent
/// for whom it said it until then. Shared by the workers behind a lock
/// (`UpstreamGuard`); tested on an injected clock.
public struct UpstreamPause: Sendable, Equatable {
    public let configuration: PacingConfiguration
    /// The whole upstream is paused until then (nil, or a time past: not paused).
    public private(set) var until: Instant?
    /// The status that started the upstream's pause (429 or 503, for the answer's code).
    public private(set) var cause = 0
    /// Client keys paused by their own 429, each until its end; at most
    /// `maxClients` kept, expired ones dropped lazily.
    public private(set) var clients: [String: Instant] = [:]
    /// The latest end among `clients` (nil: none kept): before it, no client
    /// pause can be in force, which the guard reads without the lock.
    public private(set) var clientsUntil: Instant?
    /// When a pause was last ended early (a reload): an answer to a request
    /// that arrived before then is stale, and revives nothing.
    public private(set) var endedEarlyAt: Instant?

    public init(_ configuration: PacingConfiguration) { self.configuration = configuration }

    public enum Change: Sendable, Equatable {
        case none
        /// Paused from now until then (it was not): the whole upstream
        /// (`client` nil), or one client key.
        case paused(until: Instant, client: String? = nil)
        /// A pause in force was extended.
        case extended(until: Instant, client: String? = nil)
    }

    /// An answer came back: `status` with the wait it asked for (from
    /// `Retry-After` or `RateLimit`), if any, to a request from `client`
    /// that arrived at `sentAt`. Pauses only for a status in `on` and a wait
    /// above zero, never longer than `max_pause`; a 429 under `scope_429:
    /// client` pauses that client's key only, and extends only that key's
    /// pause. An answer to a request older than an early end is ignored.
    public mutating func answered(
        status: Int, wait: Duration?, client: String = "", sentAt: Instant? = nil, at now: Instant
    ) -> Change {
        guard configuration.on.contains(status) else { return .none }
        return pause(as: status, wait: wait, client: client, sentAt: sentAt, at: now)
    }

    /// A gRPC call's `RESOURCE_EXHAUSTED` whose `RetryInfo` asks for `wait`:
    /// with `resource-exhausted` in `on`, it pauses as a 429 would (whom:
    /// `scope_429`; its cause, for the answers to paused calls, is 429).
    public mutating func answeredResourceExhausted(
        wait: Duration?, client: String = "", sentAt: Instant? = nil, at now: Instant
    ) -> Change {
        guard configuration.onResourceExhausted else { return .none }
        return pause(as: 429, wait: wait, client: client, sentAt: sentAt, at: now)
    }

    /// Another replica's pause of this upstream (`scope: cluster`): the
    /// same change as the answer that caused it there, for `wait` from now,
    /// whether or not this replica's `pacing.on` names the status (the
    /// replica that saw the answer decided).
    /// `client` is the key as replicas tell it to each other
    /// (`ClusterScript.heardKey`, a digest): `pause(for:)` looks it up too.
    public mutating func heard(status: Int, wait: Duration, client: String, at now: Instant) -> Change {
        if configuration.scope(of: status) == .client { heardClients = true }
        return pause(as: status, wait: wait, client: client, sentAt: nil, at: now)
    }

    /// Some client's pause was heard from another replica (kept under its digest).
    public private(set) var heardClients = false

    private mutating func pause(as status: Int, wait: Duration?, client: String, sentAt: Instant?, at now: Instant) -> Change {
        guard let wait, wait > .zero else { return .none }
        if let endedEarlyAt, (sentAt ?? now) < endedEarlyAt { return .none }
        let end = now + min(wait, configuration.maxPause)
        guard configuration.scope(of: status) == .client else {
            if let until, until > now {
                guard end > until else { return .none }
                self.until = end
                cause = status
                return .extended(until: end)
            }
            until = end
            cause = status
            return .paused(until: end)
        }
        if let current = clients[client], current > now {
            guard end > current else { return .none }
            clients[client] = end
            clientsUntil = max(clientsUntil ?? end, end)
            return .extended(until: end, client: client)
        }
        if clients[client] == nil, clients.count >= configuration.maxClients { makeRoom(at: now) }
        clients[client] = end
        clientsUntil = max(clientsUntil ?? end, end)
        return .paused(until: end, client: client)
    }

    /// The table is full: expired pauses go; if none had, the one ending
    /// soonest (a pause dropped early only lets that client's next request
    /// through, which its upstream can answer 429 again).
    private mutating func makeRoom(at now: Instant) {
        clients = clients.filter { $0.value > now }
        guard clients.count >= configuration.maxClients, let soonest = clients.min(by: { $0.value < $1.value }) else {
            if clients.isEmpty { clientsUntil = nil }
            return
        }
        clients[soonest.key] = nil
    }

    /// How long the whole upstream's pause still lasts (nil: not paused).
    public func remaining(at now: Instant) -> Duration? {
        guard let until, until > now else { return nil }
        return until - now
    }

    /// The pause that holds a request from `client` now: the upstream's or
    /// the client's own, whichever ends later, with the status that caused
    /// it (nil: not paused).
    public func pause(for client: String, at now: Instant) -> (cause: Int, left: Duration)? {
        var result: (cause: Int, left: Duration)?
        if let left = remaining(at: now) { result = (cause, left) }
        if let end = clients[client], end > now, end - now > result?.left ?? .zero { result = (429, end - now) }
        if heardClients, let end = clients[ClusterScript.heardKey(client)], end > now, end - now > result?.left ?? .zero {
            result = (429, end - now)
        }
        return result
    }

    /// Client keys whose pause is in force now.
    public func pausedClients(at now: Instant) -> Int { clients.values.count { $0 > now } }

    /// The pause is over (its time came, or a reload ended it): true once, when it was in force.
    /// Ended early, every client's pause ends with it.
    public mutating func end(at now: Instant, early: Bool = false) -> Bool {
        if early {
            endedEarlyAt = now
            clients.removeAll()
            clientsUntil = nil
        }
        guard let until else { return false }
        guard early || until <= now else { return false }
        self.until = nil
        return true
    }
}

/// What the upstream asked for, read from its answer's fields: a
/// `Retry-After` (seconds or an HTTP date), else a `RateLimit` field
/// (draft-ietf-httpapi-ratelimit-headers) whose remaining quota `r` is 0,
/// with its reset `t` in seconds.
public enum PacingSignal {
    /// Every number is read by `OutsideValues` (a `t` past ten years is ten
    /// years; the caller caps the wait at `max_pause`).
    public static func wait(retryAfter: String?, rateLimit: String?, nowUnixSeconds: Int64) -> Duration? {
        if let retryAfter, let d = RetryAfter.parse(retryAfter, nowUnixSeconds: nowUnixSeconds) { return d }
        guard let rateLimit else { return nil }
        var remaining: Int64?
        var reset: Int64?
        // `"policy";r=0;t=30` (several policies may be listed, comma-separated).
        for item in rateLimit.split(separator: ",") {
            remaining = nil
            reset = nil
            for parameter in item.split(separator: ";").dropFirst() {
                let kv = parameter.split(separator: "=", maxSplits: 1)
                guard kv.count == 2 else { continue }
                let key = kv[0].filter { $0 != " " && $0 != "\t" }
                let value = OutsideValues.deltaSeconds(kv[1])
                if key == "r" { remaining = value }
                if key == "t" { reset = value }
            }
            if remaining == 0, let reset, reset > 0 { return .seconds(reset) }
        }
        return nil
    }
}
