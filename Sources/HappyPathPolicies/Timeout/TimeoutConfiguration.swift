/// `timeout:` in `defaults`, on an upstream or on a route (docs/configuration.md).
public struct TimeoutConfiguration: PolicyConfiguration {
    /// A request's whole deadline, every try, backoff and parked wait
    /// included; past it the client gets 504 TIMEOUT. Default 10s.
    public var timeout: Duration = .seconds(10)

    public init() {}
}
