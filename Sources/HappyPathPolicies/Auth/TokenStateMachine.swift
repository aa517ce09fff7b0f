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
        if let expiry = token.expiresAt, now >= expiry - refreshAhead, begin() {
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
        generation += 1
        let t = Token(credential: credential, expiresAt: expiresIn.map { now + $0 }, generation: generation)
        token = t
        return t
    }

    /// The refresh failed for good; the next use starts another.
    public mutating func failed() { refreshing = false }

    /// Seconds until expiry, for `/admin/state` (never the token).
    public func expiresIn(at now: Instant) -> Duration? { token?.expiresAt.map { $0 - now } }
}
