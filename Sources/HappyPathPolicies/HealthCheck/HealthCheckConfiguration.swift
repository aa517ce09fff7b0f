/// `health_check:` in `defaults` or on an upstream: the active check the
/// proxy sends each endpoint (docs/reachability.md).
public struct HealthCheckConfiguration: PolicyConfiguration {
    /// `health_check.grpc`: the check is gRPC's health service
    /// (`grpc.health.v1.Health/Check`) instead of a GET of `path`.
    public struct GRPC: Sendable, Equatable {
        /// The service asked about; "" is the server as a whole. Default "".
        public var service: String

        public init(service: String = "") { self.service = service }
    }

    /// The path asked with GET; it starts with `/`. Default `/healthz`.
    /// Not used when `grpc` is set.
    public var path = "/healthz"
    /// nil: an HTTP check of `path`. Default nil.
    public var grpc: GRPC?
    /// Between two checks of one endpoint. Default 2s.
    public var interval: Duration = .seconds(2)
    /// One check's limit. Default 1s.
    public var timeout: Duration = .seconds(1)
    /// Failed checks in a row that mark an endpoint down. Default 3.
    public var unhealthyAfter = 3
    /// Passed checks in a row that mark it up again. Default 1.
    public var healthyAfter = 1

    public init() {}
}
