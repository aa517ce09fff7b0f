import HappyPathCore

/// One upstream's token: when to use it, when to refresh it, and the rule
/// that at most one refresh runs at a time (single flight). Pure: the clock
/// is passed in. Shared by all workers behind a lock.
public struct TokenStateMachine: Sendable {
    /// Refresh this long before expiry (`refresh_ahead`).
    public let refreshAhead: Duration
    public private(set) var token: Token?
    public private(set) var refreshing = false
    private var generation = 0
    /// When the token held now is refreshed ahead of its expiry: the later
    /// of `expiry - refresh_ahead` and half its lifetime, so a lifetime
    /// shorter than `refresh_ahead` refreshes once per token, not on every
    /// request. Nil: no refresh ahead (none due, or it was started).
    private var refreshAt: Instant?
    /// The refresh ahead running now was due then (a failure puts it back).
    private var aheadDue: Instant?
    /// When the next token request may be sent (see `reserveRequest`).
    private var nextRequestAt: Instant?

    /// The shortest lifetime a token is held for: an `expires_in` below it
    /// is read as it (`OutsideValues.lifetimeSeconds`).
    public static let minimumLifetime: Duration = .seconds(1)
    /// Token requests to one endpoint are spaced at least this far apart,
    /// whatever it answers: at most four a second per upstream.
    public static let requestSpacing: Duration = .milliseconds(250)

    public init(refreshAhead: Duration, initial: Token? = nil) {
        self.refreshAhead = refreshAhead
        token = initial
        generation = initial?.generation ?? 0
    }

    public enum Use: Sendable, Equatable {
        /// Send with this token.
        case use(Token)
        /// Send with this token, and start a refresh in the background (the
        /// caller won the single flight).
        case useAndRefresh(Token)
        /// No usable token: wait for the refresh; `start` says whether the
        /// caller must start it (it won the single flight).
        case wait(start: Bool)
    }

    public mutating func use(at now: Instant) -> Use {
        guard let token, token.expiresAt.map({ now < $0 }) ?? true else {
            return .wait(start: begin())
        }
        if let due = refreshAt, now >= due, begin() {
            refreshAt = nil
            aheadDue = due
            return .useAndRefresh(token)
        }
        return .use(token)
    }

    /// The upstream refused `generation` (a `refresh_on` status).
    public enum Refusal: Sendable, Equatable {
        /// A fresher token exists already: try again with it.
        case retryWith(Token)
        /// Wait for the refresh; `start` as in `use`.
        case wait(start: Bool)
    }

    public mutating func refused(generation used: Int) -> Refusal {
        if let token, token.generation > used { return .retryWith(token) }
        token = nil
        return .wait(start: begin())
    }

    private mutating func begin() -> Bool {
        guard !refreshing else { return false }
        refreshing = true
        return true
    }

    /// The refresh succeeded: the new token, one generation on.
    @discardableResult
    public mutating func succeeded(credential: Secret, expiresIn: Duration?, at now: Instant) -> Token {
        refreshing = false
        aheadDue = nil
        generation += 1
        // The lifetime was bounded where it was read; the floor holds here too.
        let lifetime = expiresIn.map { max($0, Self.minimumLifetime) }
        let t = Token(credential: credential, expiresAt: lifetime.map { now + $0 }, generation: generation)
        token = t
        refreshAt = lifetime.map { now + max($0 - refreshAhead, $0 / 2) }
        return t
    }

    /// A token request is about to go out: how long it must wait first so
    /// that requests stay `requestSpacing` apart (zero: send now). Each
    /// call takes the next slot, retries included.
    public mutating func reserveRequest(at now: Instant) -> Duration {
        let slot = max(now, nextRequestAt ?? now)
        nextRequestAt = slot + Self.requestSpacing
        return slot - now
    }

    /// The refresh failed for good; the next use starts another.
    public mutating func failed() {
        refreshing = false
        // A failed refresh ahead may be tried again by the next use (spaced by `reserveRequest`).
        if let due = aheadDue { refreshAt = due }
        aheadDue = nil
    }

    /// Seconds until expiry, for `/admin/state` (never the token).
    public func expiresIn(at now: Instant) -> Duration? { token?.expiresAt.map { $0 - now } }
}
