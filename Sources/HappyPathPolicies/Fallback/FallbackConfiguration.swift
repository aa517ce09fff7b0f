import HappyPathCore

/// `fallback:` on a route: what the client gets instead of an error when
/// the upstream fails in one of the `on` ways — the last good answer
/// (`serve_stale`), else a fixed answer (`response`), else the problem
/// body as without a fallback (docs/fallback.md).
public struct FallbackConfiguration: Sendable, Equatable {
    /// The ways of failing a fallback answers (the names of `on:`).
    public enum Reason: String, Sendable, Equatable, CaseIterable {
        /// The deadline or the last try's limit passed (504 TIMEOUT).
        case timeout
        /// No connection to any endpoint (503 UPSTREAM_UNREACHABLE, or parked until `park_for`).
        case unreachable
        /// The upstream answered 5xx, or its answer was broken or cut off
        /// before it reached the client (502, 503), and the retries gave up.
        case serverError = "5xx"
        /// The breaker is open (503 CIRCUIT_OPEN).
        case circuitOpen = "circuit-open"
        /// No connection slot, queue or parking place (503 OVERLOADED).
        case overloaded
        /// The upstream paused itself (`pacing`: 503 UPSTREAM_PAUSED or 429).
        case paused
    }

    /// A fixed answer for when there is no kept one.
    public struct FixedResponse: Sendable, Equatable {
        public var status: Int
        public var contentType: String
        public var body: String

        public init(status: Int, contentType: String, body: String) {
            self.status = status
            self.contentType = contentType
            self.body = body
        }
    }

    /// Request fields that carry a credential besides `Authorization`,
    /// `Cookie`, `Proxy-Authorization` and the `rate_limit` key's header,
    /// which always do (`private_headers`; setting it replaces this).
    public static let defaultPrivateHeaders = ["X-Api-Key"]

    /// How long the last good answer to a GET is kept. Default nil: none kept.
    public var serveStale: Duration?
    /// The ways of failing it answers. Default all of them.
    public var on: Set<Reason> = Set(Reason.allCases)
    /// Default nil: without a kept answer, the problem body.
    public var response: FixedResponse?
    /// `private_headers`: more credential fields. An answer to a request
    /// with any credential is kept apart for those very values, unless the
    /// upstream declared it shareable (docs/fallback.md).
    public var privateHeaders: [String] = FallbackConfiguration.defaultPrivateHeaders

    public init() {}
}
