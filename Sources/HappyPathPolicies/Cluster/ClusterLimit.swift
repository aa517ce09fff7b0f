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
    /// route's keys on one Redis Cluster slot), then the key's digest.
    public static func bucketKey(route: String, key: RateLimitBucketKey) -> [UInt8] {
        bucketPrefix(route: route) + digest(key.text)
    }

    /// What every bucket key of `route` starts with (made once per limit).
    public static func bucketPrefix(route: String) -> [UInt8] { Array("\(prefix)rl:{\(route)}:".utf8) }

    /// What Redis is told of a client's key (a rate limit's, a pause's):
    /// its SHA-256, the first 128 bits in hex. Every replica computes the
    /// same; nobody reading Redis learns an API key from it.
    /// The digest as a pause's client key: `#` and the hex digest (no
    /// client key of this replica's own starts with `#`).
    public static func heardKey(_ text: String) -> String { "#" + String(decoding: digest(text), as: UTF8.self) }

    public static func digest(_ text: String) -> [UInt8] {
        var hasher = SHA256()
        var text = text
        text.withUTF8 { hasher.update(UnsafeRawBufferPointer($0)) }
        let d = hasher.finish()
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(32)
        for b in d.prefix(16) {
            out.append(hex[Int(b >> 4)])
            out.append(hex[Int(b & 15)])
        }
        return out
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
/// bucket key. A token was counted in Redis before it is used, and a
/// process holds at most one lease's tokens per key, so over any window the
/// fleet admits at most the shared bound plus one lease per process (what
/// each held when the window began). A lease lives `ttl` (a second): what
/// it has left then is thrown away, which can only make the fleet admit
/// less; a key busy enough to need a lease spends it long before. (Giving
/// unspent tokens back is not safe: while the bucket would have been full,
/// its refill would be credited twice.) One lease is asked for at a time
/// per key: requests that find none while one is on its way ask Redis for a
/// single token each, so concurrent requests do not take a lease each and
/// let it expire. Bounded: at most `maxKeys` leases and asks are kept;
/// beyond, expired ones go first, then the new lease is not kept.
public struct ClusterLeases: Sendable {
    public let size: Int
    public let ttl: Duration
    public let maxKeys: Int
    private var leases: [RateLimitBucketKey: (tokens: Int, until: Instant)] = [:]
    /// Keys with a lease asked for and not answered yet.
    private var asking: Set<RateLimitBucketKey> = []

    public init(size: Int, ttl: Duration = .seconds(1), maxKeys: Int) {
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
        /// Ask Redis for `want` tokens: the lease's size, or 1 while a lease is on its way.
        case ask(want: Int)
    }

    public mutating func take(_ key: RateLimitBucketKey, at now: Instant) -> Take {
        guard size > 1 else { return .ask(want: 1) }
        if let lease = leases[key] {
            if lease.until > now, lease.tokens > 0 {
                let left = lease.tokens - 1
                if left == 0 { leases[key] = nil } else { leases[key] = (left, lease.until) }
                return .token(left: left)
            }
            leases[key] = nil
        }
        guard !asking.contains(key), asking.count < maxKeys else { return .ask(want: 1) }
        asking.insert(key)
        return .ask(want: size)
    }

    /// Redis answered an ask for `wanted` tokens with `granted` (0: refused,
    /// no answer, or its client left); one went to the request that asked.
    public mutating func answered(wanted: Int, granted: Int, for key: RateLimitBucketKey, at now: Instant) {
        if wanted == size, size > 1 { asking.remove(key) }
        let extra = granted - 1
        guard extra > 0 else { return }
        if leases[key] == nil, leases.count >= maxKeys {
            leases = leases.filter { $0.value.until > now && $0.value.tokens > 0 }
            guard leases.count < maxKeys else { return }
        }
        let kept = leases[key].flatMap { $0.until > now ? $0.tokens : nil } ?? 0
        leases[key] = (kept + extra, now + ttl)
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
