import HappyPathCore

extension RetryPolicy {
    /// Every field's default is the documented one (docs/retry.md, docs/configuration.md).
    public struct Configuration: PolicyConfiguration {
        /// Tries in total, the first included. Default 3.
        public var attempts: Int = 3
        /// One try's limit. Default 3s.
        public var perTryTimeout: Duration = .seconds(3)
        /// Outcomes that may be retried: `connect-failure`, `reset`, `timeout`, statuses. Default the six below.
        /// gRPC status names (`unavailable`) apply to gRPC calls only (docs/grpc.md).
        public var on: Set<String> = ["connect-failure", "reset", "timeout", "502", "503", "504"] {
            didSet {
                statuses = Set(on.compactMap { Int($0) })
                grpcStatuses = Set(on.compactMap { GRPCStatus(configName: $0) }.filter { Self.retryableGRPC.contains($0) })
            }
        }
        /// The statuses among `on`, as numbers (looked up on every response).
        public private(set) var statuses: Set<Int> = [502, 503, 504]
        /// The gRPC statuses among `on`: a gRPC call answered with one of
        /// them (Trailers-Only, nothing relayed yet) is retried.
        public private(set) var grpcStatuses: Set<GRPCStatus> = []
        /// The gRPC statuses `retry.on` may name (issue 34, gRFC A6): those
        /// that can mean "not now" rather than "never".
        public static let retryableGRPC: [GRPCStatus] = [
            .cancelled, .unknown, .deadlineExceeded, .resourceExhausted, .aborted, .internal, .unavailable,
        ]
        /// Backoff before try n+1: full jitter over `min(max, base · 2^(n-1))`. Default 50ms.
        public var backoffBase: Duration = .milliseconds(50)
        /// Default 2s.
        public var backoffMax: Duration = .seconds(2)
        /// Full jitter (default) or the exact exponential delay.
        public var jitter: Bool = true
        /// An upstream's `Retry-After` sets the next delay. Default true.
        public var honorRetryAfter: Bool = true
        /// The longest `Retry-After` honoured or passed on: a longer one (or
        /// a later date) is read as this, and the field is always written
        /// back as whole seconds. Default 1h.
        public var maxRetryAfter: Duration = RetryAfter.defaultMax
        /// Methods retried after the request may have reached the upstream. Default GET, HEAD, OPTIONS, PUT, DELETE.
        public var methods: Set<String> = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]

        public init() {}

        /// The messages `happypath check` would give, empty when valid.
        public func validate() -> [String] {
            var problems: [String] = []
            if attempts < 1 { problems.append("retry.attempts must be at least 1") }
            if perTryTimeout <= .zero { problems.append("retry.per_try_timeout must be longer than zero") }
            if backoffMax < backoffBase { problems.append("retry.backoff.max must not be shorter than backoff.base") }
            if maxRetryAfter < .seconds(1) { problems.append("retry.max_retry_after must be at least 1s") }
            return problems
        }
    }
}
