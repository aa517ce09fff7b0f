extension DeliveryPolicy {
    /// `mode: now` answers with the upstream's response (the default); `later`
    /// stores the request, answers 202, and delivers it in the background.
    public enum Mode: String, Sendable, CaseIterable { case now, later }

    /// A route's `delivery` block (docs/deliver-later.md).
    public struct Configuration: PolicyConfiguration {
        /// Default `now`.
        public var mode = Mode.now
        /// Undelivered this long after it was accepted: dead. Default 24h.
        public var maxAge: Duration = .seconds(24 * 3600)
        /// Delivery rounds (each with the route's own retries) before it is dead. Default 50.
        public var maxAttempts = 50
        /// Between rounds: exponential from `backoffBase`, capped at `backoffMax`,
        /// each wait drawn between half the step and the whole step. Default 1s.
        public var backoffBase: Duration = .seconds(1)
        /// Default 10m.
        public var backoffMax: Duration = .seconds(600)
        /// `delivery.idempotency.client_header`: who a client is, for the scope
        /// of its `Idempotency-Key`, when it sends no `Authorization` (such as
        /// `X-Api-Key`). Nil (the default): such clients share the route's scope.
        public var idempotencyClientHeader: String?

        public init() {}
    }
}
