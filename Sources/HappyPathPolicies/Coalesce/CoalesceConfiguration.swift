import HappyPathCore

/// `coalesce:` on a route (docs/coalescing.md): concurrent identical reads
/// (`GET`, `HEAD`, the same key: `CoalesceKey`) share one upstream try.
/// `coalesce: true` takes the defaults; absent or `false`, the route does
/// not coalesce and pays nothing for it.
public struct CoalesceConfiguration: Sendable, Equatable {
    /// Followers one leader's try serves at most; past it a request goes
    /// on its own try. Default 1,000 (1 to 100,000).
    public var maxFollowers = 1000
    /// Request fields that carry a credential on this route besides
    /// `Authorization`, `Cookie`, `Proxy-Authorization` and the rate
    /// limit's header: requests coalesce only with requests whose values
    /// are the same. Default `[X-Api-Key]`, at most 32 names.
    public var privateHeaders = ["X-Api-Key"]

    public static let maxFollowersRange = 1...100_000

    public init() {}
}
