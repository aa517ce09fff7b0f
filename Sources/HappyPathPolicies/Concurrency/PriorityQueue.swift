import HappyPathCore

/// How much a request matters when its upstream is full (docs/overload.md):
/// a route's `priority`, which a trusted client may lower with the route's
/// `priority_header`, never raise.
public enum RequestPriority: String, Sendable, CaseIterable, Comparable {
    case critical
    case normal
    case sheddable

    /// 0 for critical: admitted first, shed last.
    @inlinable public var rank: Int {
        switch self {
        case .critical: 0
        case .normal: 1
        case .sheddable: 2
        }
    }

    public static func < (a: Self, b: Self) -> Bool { a.rank < b.rank }

    /// The longest `priority_header` value looked at: no name is longer than
    /// 9 bytes (`sheddable`), and room is left for spaces around it; a
    /// longer value is not a name and is not copied.
    public static let maxHeaderValueBytes = 32

    /// A client's `priority_header` value (case-insensitive, surrounding
    /// spaces ignored): `route`'s priority or a lower one. Anything else,
    /// and a raise, leaves `route`'s: the header only ever lowers.
    public static func lowered(_ route: Self, by value: some Collection<UInt8>) -> Self {
        guard value.count <= maxHeaderValueBytes else { return route }
        var word: [UInt8] = []
        for b in value where b != 0x20 && b != 0x09 { word.append(HTTPBytes.lower(b)) }
        guard let asked = Self(rawValue: String(decoding: word, as: UTF8.self)) else { return route }
        return max(route, asked)
    }
}

/// `adaptive_concurrency.queue`: when a queue of waiting requests sheds
/// (docs/overload.md).
public struct QueueShedding: Sendable, Equatable {
    /// How long the queue may stand (not empty) before it sheds. Default 100ms.
    public var interval: Duration = .milliseconds(100)
    /// A wait past this is shed once the queue stands. Default 5ms.
    public var target: Duration = .milliseconds(5)
    public init() {}
}

/// The requests waiting for one upstream's slots on one worker
/// (docs/overload.md): admitted by priority (critical first, sheddable
/// last, each in arrival order), and kept short the way CoDel keeps a
/// router's queue short: once the queue has not been empty for `interval`,
/// the requests of the lowest priority waiting that have waited past
/// `target` are shed. A queue that empties now and then is a burst
/// absorbed; one that stands is latency added to every request for nothing.
///
/// Only the lowest priority present is ever shed: a critical request is
/// shed only when nothing but critical requests wait, and then only if it
/// waited past `target` in a queue that stood for `interval`.
///
/// A pure value on an injected clock; table-tested in `PriorityQueueTests`.
public struct PriorityQueue<Waiter: AnyObject> {
    public typealias Configuration = QueueShedding

    public let configuration: Configuration
    // Every member is inlinable, so the limiter's use of it is specialized
    // for its waiter in the server: a generic call would look up the type's
    // metadata on every request (callgrind: about 500 instructions).
    @usableFromInline var queues: [[(waiter: Waiter, since: Instant, client: Int)]] = [[], [], []]
    @usableFromInline var storedCount = 0
    @usableFromInline var standing: Instant?
    /// Requests waiting now.
    @inlinable public var count: Int { storedCount }
    /// When the queue last went from empty to not empty (nil: empty).
    @inlinable public var standingSince: Instant? { standing }

    public init(_ configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    @inlinable public var isEmpty: Bool { storedCount == 0 }
    @inlinable public func count(_ priority: RequestPriority) -> Int { queues[priority.rank].count }

    /// The lowest priority waiting now (nil: none).
    @inlinable public var lowest: RequestPriority? {
        RequestPriority.allCases.reversed().first { !queues[$0.rank].isEmpty }
    }

    /// The highest priority waiting now: whom `next` would give a slot (nil: none).
    @inlinable public var highest: RequestPriority? {
        RequestPriority.allCases.first { !queues[$0.rank].isEmpty }
    }

    /// Whether a request of `priority` or a more important one waits.
    @inlinable public func waits(atLeast priority: RequestPriority) -> Bool {
        guard storedCount > 0 else { return false }
        var p = 0
        while p <= priority.rank {
            if !queues[p].isEmpty { return true }
            p += 1
        }
        return false
    }

    /// A request waits (for `client`: see `next(fewestHeld:)`).
    @inlinable public mutating func enqueue(_ waiter: Waiter, _ priority: RequestPriority, client: Int = 0, at now: Instant) {
        if storedCount == 0 { standing = now }
        queues[priority.rank].append((waiter, now, client))
        storedCount += 1
    }

    /// The request a freed slot goes to: the longest-waiting of the highest priority.
    @inlinable public mutating func next() -> Waiter? {
        for p in 0..<queues.count where !queues[p].isEmpty {
            return removed(from: p, at: 0)
        }
        return nil
    }

    /// Waiters of a priority `next(fewestHeld:)` looks at (its cost is bounded).
    public static var fairnessScan: Int { 32 }

    /// The request a freed slot goes to when clients share fairly (issue
    /// 44): of the highest priority, among its first `fairnessScan`
    /// waiters, the one whose client holds the fewest slots now (`held`),
    /// the longest-waiting of those. One client's many requests then wait
    /// while another client's one is served, whatever their order.
    @inlinable public mutating func next(fewestHeld held: (Int) -> Int) -> (waiter: Waiter, client: Int)? {
        for p in 0..<queues.count where !queues[p].isEmpty {
            var best = 0
            var least = held(queues[p][0].client)
            var i = 1
            let end = Swift.min(queues[p].count, Self.fairnessScan)
            while least > 0, i < end {
                let h = held(queues[p][i].client)
                if h < least {
                    least = h
                    best = i
                }
                i += 1
            }
            let client = queues[p][best].client
            return (removed(from: p, at: best), client)
        }
        return nil
    }

    /// The newest request of the lowest priority, if that priority is
    /// below `priority`: it makes room in a full queue for a request that
    /// matters more (it is shed).
    @inlinable public mutating func displace(below priority: RequestPriority) -> Waiter? {
        guard let lowest, lowest > priority else { return nil }
        return removed(from: lowest.rank, at: queues[lowest.rank].count - 1)
    }

    /// A request left the queue by itself (its deadline, its client).
    @discardableResult
    @inlinable public mutating func leave(_ waiter: Waiter) -> Bool {
        for p in 0..<queues.count {
            if let i = queues[p].firstIndex(where: { $0.waiter === waiter }) {
                _ = removed(from: p, at: i)
                return true
            }
        }
        return false
    }

    /// The requests to shed now (they have left the queue): nothing unless
    /// the queue has stood for `interval`; then those of the lowest
    /// priority waiting that have waited past `target`. Critical requests
    /// are late only past `interval`: they go first at every freed slot,
    /// so one that waits is waiting for a slot to free, not behind others,
    /// and shedding it at `target` would turn a short wait into a refusal.
    @inlinable public mutating func shed(at now: Instant) -> [Waiter] {
        guard let since = standing, now - since >= configuration.interval, let lowest else { return [] }
        let p = lowest.rank
        let target = lowest == .critical ? configuration.interval : configuration.target
        // Arrival order: the late are at the front.
        var late = 0
        while late < queues[p].count, now - queues[p][late].since > target { late += 1 }
        guard late > 0 else { return [] }
        let shed = queues[p][0..<late].map(\.waiter)
        queues[p].removeFirst(late)
        storedCount -= late
        if storedCount == 0 { standing = nil }
        return shed
    }

    /// Shutdown: forget every waiter.
    @inlinable public mutating func removeAll() {
        for p in 0..<queues.count { queues[p].removeAll() }
        storedCount = 0
        standing = nil
    }

    @usableFromInline mutating func removed(from p: Int, at i: Int) -> Waiter {
        let w = queues[p].remove(at: i).waiter
        storedCount -= 1
        if storedCount == 0 { standing = nil }
        return w
    }
}
