import HappyPathCore

/// `pacing:` on an upstream: the statuses whose `Retry-After` (or a
/// `RateLimit` field with nothing remaining) pause the whole upstream.
public struct PacingConfiguration: Sendable, Equatable {
    public enum WhilePaused: String, Sendable, Equatable, CaseIterable {
        /// Requests wait (parked) until the pause ends, within their deadline.
        case wait
        /// Requests are answered at once (503 UPSTREAM_PAUSED, or 429 RATE_LIMITED after a 429).
        case fail
    }

    public var on: Set<Int> = [429, 503]
    public var maxPause: Duration = .seconds(60)
    public var whilePaused: WhilePaused = .wait

    public init() {}
}

/// One upstream's pause, as a pure state: the upstream said "not before
/// then", and nothing is sent to it until then. Shared by the workers
/// behind a lock (`UpstreamGuard`); tested on an injected clock.
public struct UpstreamPause: Sendable, Equatable {
    public let configuration: PacingConfiguration
    /// Paused until then (nil, or a time past: not paused).
    public private(set) var until: Instant?
    /// The status that started the pause (429 or 503, for the answer's code).
    public private(set) var cause = 0

    public init(_ configuration: PacingConfiguration) { self.configuration = configuration }

    public enum Change: Sendable, Equatable {
        case none
        /// The upstream is paused from now until then (it was not).
        case paused(until: Instant)
        /// A pause in force was extended.
        case extended(until: Instant)
    }

    /// An answer came back: `status` with the wait it asked for (from
    /// `Retry-After` or `RateLimit`), if any. Pauses only for a status in
    /// `on` and a wait above zero, and never longer than `max_pause`.
    public mutating func answered(status: Int, wait: Duration?, at now: Instant) -> Change {
        guard configuration.on.contains(status), let wait, wait > .zero else { return .none }
        let end = now + min(wait, configuration.maxPause)
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

    /// How long the pause still lasts (nil: not paused).
    public func remaining(at now: Instant) -> Duration? {
        guard let until, until > now else { return nil }
        return until - now
    }

    /// The pause is over (its time came, or a reload ended it): true once, when it was in force.
    public mutating func end(at now: Instant, early: Bool = false) -> Bool {
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
    /// years, the caller caps it at `max_pause`); `max` caps a Retry-After.
    public static func wait(
        retryAfter: String?, rateLimit: String?, nowUnixSeconds: Int64, max: Duration = RetryAfter.defaultMax
    ) -> Duration? {
        if let retryAfter, let d = RetryAfter.parse(retryAfter, nowUnixSeconds: nowUnixSeconds, max: max) { return d }
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
