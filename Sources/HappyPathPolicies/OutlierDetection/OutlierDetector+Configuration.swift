import HappyPathCore

extension OutlierDetector {
    /// `outlier_detection:` on an upstream or in `defaults`. Every field's
    /// default is the documented one (docs/configuration.md), and the
    /// defaults are the values the proxy used before the keys existed.
    ///
    /// The names follow Envoy's outlier detection, with one difference in
    /// meaning: Envoy makes each ejection of the same host longer (base ×
    /// the times it was ejected, up to a cap); here every ejection lasts
    /// `baseEjection`, however often the endpoint was ejected before.
    public struct Configuration: PolicyConfiguration {
        /// Failed tries in a row (connect failures, resets, timeouts, and
        /// the statuses that fail a try) that eject an endpoint. Default 5.
        public var consecutiveFailures: Int = 5
        /// How long an ejected endpoint stays out of the rotation. Default 10s.
        public var baseEjection: Duration = .seconds(10) {
            didSet { baseEjectionNanoseconds = baseEjection.nanoseconds }
        }
        /// `baseEjection` in nanoseconds, what the detector adds to an instant.
        public private(set) var baseEjectionNanoseconds: Int64 = 10_000_000_000
        /// The largest share of an upstream's endpoints (in percent) out at
        /// once; an ejection that would pass it does not happen, and one
        /// endpoint always stays in. 0 turns ejection off. Default 50.
        public var maxEjectedPercent: Int = 50

        public init() {}

        /// The messages `happypath check` would give, empty when valid.
        public func validate() -> [String] {
            var problems: [String] = []
            if consecutiveFailures < 1 {
                problems.append("outlier_detection.consecutive_failures must be at least 1, got \(consecutiveFailures)")
            }
            if baseEjection <= .zero { problems.append("outlier_detection.base_ejection must be longer than zero") }
            if !(0...100).contains(maxEjectedPercent) {
                problems.append("outlier_detection.max_ejected_percent must be between 0 and 100, got \(maxEjectedPercent)")
            }
            return problems
        }
    }
}
