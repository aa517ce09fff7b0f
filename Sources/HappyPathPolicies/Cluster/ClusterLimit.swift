import HappyPathCore

/// A `scope: cluster` rate limit's one atomic step in Redis: GCRA on the
/// Redis server's clock (`TIME`), so replicas' clocks never meet. The key
/// holds the bucket's "theoretical arrival time" in microseconds; a call
/// takes up to `want` tokens that are there now (a lease), or, for
/// `over_limit: queue`, reserves the next one if it is due within
/// `max_wait`. Every key expires one emission past its arrival time, so
/// idle keys go and Redis holds only the buckets in use.
///
/// KEYS[1]: the bucket. ARGV: interval µs, capacity µs (burst × interval),
/// want, max wait µs (0: reject). Returns {granted, wait µs, remaining,
/// until full µs}, integers (read bounded by `ClusterGrant`).
public enum ClusterScript {
    public static let gcra = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local interval = tonumber(ARGV[1])
        local capacity = tonumber(ARGV[2])
        local want = tonumber(ARGV[3])
        local maxwait = tonumber(ARGV[4])
        local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
        if tat < now then tat = now end
        local avail = math.floor((capacity - (tat - now)) / interval)
        local granted = 0
        local wait = 0
        if avail >= 1 then
          granted = math.min(avail, want)
          tat = tat + granted * interval
        else
          wait = tat + interval - now - capacity
          if maxwait > 0 and wait <= maxwait then
            granted = 1
            tat = tat + interval
          end
        end
        if granted > 0 then
          redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
        end
        local left = math.floor((capacity - (tat - now)) / interval)
        if left < 0 then left = 0 end
        return {granted, wait, left, tat - now}
        """

    /// Unspent leased tokens go back to their bucket, as if never taken
    /// (the bucket's arrival time moves back by their emission time, never
    /// before now). KEYS[1]: the bucket. ARGV: tokens, interval µs.
    public static let giveBack = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
        tat = tat - tonumber(ARGV[1]) * tonumber(ARGV[2])
        if tat <= now then
          redis.call('DEL', KEYS[1])
          return 0
        end
        redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
        return 1
        """

    /// The replica's heartbeat on the server's clock: it says it is alive,
    /// forgets replicas silent for three heartbeats, and counts the rest.
    /// KEYS[1]: the set. ARGV: replica id, heartbeat ms. Returns the count.
    public static let heartbeat = """
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', KEYS[1], now, ARGV[1])
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3 * tonumber(ARGV[2]))
        redis.call('PEXPIRE', KEYS[1], 10 * tonumber(ARGV[2]))
        return redis.call('ZCARD', KEYS[1])
        """

    /// Every key is under this prefix.
    public static let prefix = "hp:"
    /// The channel pauses are published on.
    public static let pausesChannel = "hp:pauses"
    /// The sorted set of live replicas.
    public static let replicasKey = "hp:replicas"

    /// A route's bucket for `key`: the route's label in a hash tag (one
    /// route's keys on one Redis Cluster slot), then the key as the process
    /// limiter keeps it (at most 64 bytes, or its digest).
    public static func bucketKey(route: String, key: RateLimitBucketKey) -> [UInt8] {
        Array("\(prefix)rl:{\(route)}:\(key.text)".utf8)
    }
}

/// The script's answer, each number bounded as it is read (a peer's
/// integer is never trusted to fit arithmetic).
public struct ClusterGrant: Sendable, Equatable {
    public var granted: Int
    public var wait: Duration
    public var remaining: Int
    public var untilFull: Duration

    /// The longest wait or fill time kept: ten years.
    public static let maxMicroseconds: Int64 = 10 * 365 * 86_400 * 1_000_000

    public init(granted: Int, wait: Duration, remaining: Int, untilFull: Duration) {
        self.granted = granted
        self.wait = wait
        self.remaining = remaining
        self.untilFull = untilFull
    }

    /// Nil: not the script's answer (an error, another shape).
    public init?(_ reply: RedisReply, want: Int) {
        guard let items = reply.elements, items.count == 4, let g = items[0].integer, let w = items[1].integer,
            let r = items[2].integer, let u = items[3].integer
        else { return nil }
        func micros(_ v: Int64) -> Duration { .microseconds(min(max(0, v), Self.maxMicroseconds)) }
        granted = Int(min(max(0, g), Int64(want)))
        wait = micros(w)
        remaining = Int(min(max(0, r), 1_000_000_000))
        untilFull = micros(u)
    }
}

/// Tokens a process took from Redis ahead of its requests (`lease`), per
/// bucket key, each lot valid for a short while (`ttl`). A token was
/// counted in Redis before it is used, so leases never over-admit; what a
/// lease has left when it expires goes back to the bucket (`Take.ask`'s
/// `giveBack`), so idle leases do not starve the others either. One lease
/// is asked for at a time per key: requests that find none while one is
/// on its way ask Redis for a single token each, so a burst of concurrent
/// requests does not take a lease each. Bounded: at most `maxKeys` leases
/// are kept; beyond, expired ones go first, then the new one is not kept
/// (its tokens are given back).
public struct ClusterLeases: Sendable {
    public let size: Int
    public let ttl: Duration
    public let maxKeys: Int
    private var leases: [RateLimitBucketKey: (tokens: Int, until: Instant)] = [:]
    /// Keys with a lease asked for and not answered yet.
    private var asking: Set<RateLimitBucketKey> = []

    public init(size: Int, ttl: Duration, maxKeys: Int) {
        self.size = max(1, size)
        self.ttl = ttl
        self.maxKeys = max(1, maxKeys)
    }

    /// `max(1, rate × 10 ms)`: one Redis round trip per 10 ms of a key's
    /// traffic at full rate. `interval`: time per token.
    public static func auto(interval: Duration) -> Int {
        let ns = max(1, interval.nanoseconds)
        return Int(max(1, min(1000, 10_000_000 / ns)))
    }

    /// Leases kept now.
    public var count: Int { leases.count }

    public enum Take: Sendable, Equatable {
        /// A leased token: `left` remain in the lease.
        case token(left: Int)
        /// Ask Redis for `want` tokens (the lease's size, or 1 while a lease
        /// is on its way); first give back `giveBack` tokens of a lease that expired.
        case ask(want: Int, giveBack: Int)
    }

    public mutating func take(_ key: RateLimitBucketKey, at now: Instant) -> Take {
        guard size > 1 else { return .ask(want: 1, giveBack: 0) }
        var giveBack = 0
        if let lease = leases[key] {
            if lease.until > now, lease.tokens > 0 {
                let left = lease.tokens - 1
                if left == 0 { leases[key] = nil } else { leases[key] = (left, lease.until) }
                return .token(left: left)
            }
            giveBack = max(0, lease.tokens)
            leases[key] = nil
        }
        guard !asking.contains(key), asking.count < maxKeys else { return .ask(want: 1, giveBack: giveBack) }
        asking.insert(key)
        return .ask(want: size, giveBack: giveBack)
    }

    /// Redis answered an ask for `wanted` tokens with `granted` (0: refused,
    /// or no answer); one went to the request that asked. Returns tokens
    /// that could not be kept (to give back).
    public mutating func answered(wanted: Int, granted: Int, for key: RateLimitBucketKey, at now: Instant) -> Int {
        if wanted == size, size > 1 { asking.remove(key) }
        let extra = granted - 1
        guard extra > 0 else { return 0 }
        if leases[key] == nil, leases.count >= maxKeys {
            leases = leases.filter { $0.value.until > now && $0.value.tokens > 0 }
            guard leases.count < maxKeys else { return extra }
        }
        var returned = 0
        var kept = 0
        if let lease = leases[key] {
            if lease.until > now { kept = lease.tokens } else { returned = lease.tokens }
        }
        leases[key] = (kept + extra, now + ttl)
        return returned
    }
}

/// A `scope: cluster` limit's share while Redis cannot be reached: the
/// same limit divided among the replicas last seen alive, so the fleet
/// together still admits about the whole rate (at least one token a
/// period and a burst of one each).
public enum ClusterShare {
    public static func local(_ configuration: RateLimitConfiguration, replicas: Int) -> RateLimitConfiguration {
        var c = configuration
        let n = Int64(max(1, replicas))
        let (scaled, overflow) = max(1, configuration.interval.nanoseconds).multipliedReportingOverflow(by: n)
        c.interval = .nanoseconds(overflow ? Int64.max / 4 : scaled)
        c.burst = max(1, configuration.burst / Int(n))
        c.scope = .process
        return c
    }
}
