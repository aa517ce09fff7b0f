/// `health_check:` in `defaults` or on an upstream: the active check the
/// proxy sends each endpoint (docs/reachability.md).
public struct HealthCheckConfiguration: PolicyConfiguration {
    /// The path asked with GET; it starts with `/`. Default `/healthz`.
    public var path = "/healthz"
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
