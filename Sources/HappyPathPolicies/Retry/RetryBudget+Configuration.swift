extension RetryBudget {
    /// `retry.budget:` of an upstream (or `defaults`): it counts the
    /// upstream's requests, so a route does not set it.
    public struct Configuration: PolicyConfiguration {
        /// Retries may add at most this share of the requests. Default 0.2.
        public var ratio = RetryBudget.defaultRatio
        /// Retries allowed per second whatever the traffic. Default 10.
        public var minPerSecond = RetryBudget.defaultMinPerSecond

        public init() {}
    }

    public init(_ configuration: Configuration) {
        self.init(ratio: configuration.ratio, minPerSecond: configuration.minPerSecond)
    }
}
