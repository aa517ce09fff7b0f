import HappyPathCore
import HappyPathPolicies

/// A `scope: cluster` route limit's side in the process: the script's
/// arguments (made once), the tokens leased from Redis ahead of requests,
/// and the local share used while Redis cannot be reached.
final class ClusterRouteLimit: Sendable {
    /// The bucket key's prefix: `hp:rl:{route}:`.
    let keyPrefix: [UInt8]
    /// ARGV for the GCRA script, as text: interval µs, capacity µs, lease, max wait µs.
    let interval: [UInt8]
    let capacity: [UInt8]
    /// `want` as text: a lease's size, and one token.
    let wantLease: [UInt8]
    static let wantOne = Array("1".utf8)
    let maxWait: [UInt8]
    let leaseSize: Int
    private let leases: Locked<ClusterLeases>
    private let configuration: RateLimitConfiguration
    private let label: String
    private let timeout: Duration
    /// The local share for the replica count it was made for.
    private let share: Locked<(replicas: Int, limit: RouteRateLimit)?>

    init(_ configuration: RateLimitConfiguration, label: String, timeout: Duration, maxWait: Duration) {
        self.configuration = configuration
        self.label = label
        self.timeout = timeout
        keyPrefix = ClusterScript.bucketPrefix(route: label)
        // At least 1 µs a token: the script counts in microseconds (a million a second a key at most).
        let intervalUs = max(1, configuration.interval.nanoseconds / 1000)
        let (cap, overflow) = intervalUs.multipliedReportingOverflow(by: Int64(max(1, configuration.burst)))
        interval = Array(String(intervalUs).utf8)
        capacity = Array(String(overflow ? ClusterGrant.maxMicroseconds : min(cap, ClusterGrant.maxMicroseconds)).utf8)
        leaseSize = max(1, configuration.lease)
        wantLease = Array(String(leaseSize).utf8)
        self.maxWait = Array(String(configuration.overLimit == .queue ? max(1, maxWait.nanoseconds / 1000) : 0).utf8)
        leases = Locked(ClusterLeases(size: leaseSize, maxKeys: min(configuration.maxKeys, 100_000)))
        share = Locked(nil)
    }

    /// The key's bucket in Redis: the prefix and the SHA-256 of the key (its
    /// first 128 bits in hex), never the key itself: an API key, a client's
    /// address, is not written into another system.
    func bucketKey(_ key: RateLimitBucketKey) -> [UInt8] { keyPrefix + ClusterScript.digest(key.text) }

    /// A token leased earlier, or how many to ask Redis for.
    func take(_ key: RateLimitBucketKey, at now: Instant) -> ClusterLeases.Take {
        guard leaseSize > 1 else { return .ask(want: 1) }
        return leases.withLock { $0.take(key, at: now) }
    }

    /// Redis answered an ask (`granted` 0: refused, no answer, or its client left).
    func answered(wanted: Int, granted: Int, for key: RateLimitBucketKey, at now: Instant) {
        guard leaseSize > 1 else { return }
        leases.withLock { $0.answered(wanted: wanted, granted: granted, for: key, at: now) }
    }

    /// The local share of this limit for `replicas` replicas (made again when the count changed).
    func localShare(replicas: Int) -> RouteRateLimit {
        share.withLock { s in
            if let s, s.replicas == replicas { return s.limit }
            let limit = RouteRateLimit(ClusterShare.local(configuration, replicas: replicas), label: label, timeout: timeout)
            s = (replicas, limit)
            return limit
        }
    }
}
