/// `reachability:` in `defaults`, on an upstream or on a route
/// (docs/reachability.md).
public struct ReachabilityConfiguration: PolicyConfiguration {
    /// How long a command may wait parked for an unreachable upstream (or
    /// an open breaker under `while_open: park`) before it is answered;
    /// zero parks nothing. Default 10s.
    public var parkFor: Duration = .seconds(10)

    public init() {}
}
