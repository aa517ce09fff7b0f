import HappyPathCore

/// How much a request matters when an upstream is full (issue 35): a
/// route's `priority`, which a trusted client may lower, never raise.
public enum RequestPriority: Int, Sendable, CaseIterable, Comparable {
    case critical = 0
    case normal = 1
    case sheddable = 2

    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}

/// The requests waiting for one upstream's slots (issue 35, not wired in
/// yet): admitted by priority (critical first, sheddable last, each in
/// arrival order), and kept short the way CoDel keeps a router's queue
/// short: once the queue has not been empty for `interval`, requests that
/// have waited past `target` are shed, the lowest priority first. A queue
/// that empties now and then is a burst absorbed; one that stands is
/// latency added to every request for nothing.
///
/// A pure value on an injected clock; table-tested in `PriorityQueueTests`.
public struct PriorityQueue<Waiter: AnyObject> {
    public struct Configuration: Sendable, Equatable {
        /// How long the queue may stand before it sheds. Default 100ms.
        public var interval: Duration = .milliseconds(100)
        /// A wait past this is shed once the queue stands. Default 5ms.
        public var target: Duration = .milliseconds(5)
        public init() {}
    }

    public let configuration: Configuration
    private var queues: [[(waiter: Waiter, since: Instant)]] = [[], [], []]
    /// When the queue last went from empty to not empty (nil: empty).
    public private(set) var standingSince: Instant?

    public init(_ configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    public var count: Int { queues[0].count + queues[1].count + queues[2].count }
    public func count(_ priority: RequestPriority) -> Int { queues[priority.rawValue].count }

    /// A request waits.
    public mutating func enqueue(_ waiter: Waiter, _ priority: RequestPriority, at now: Instant) {
        if count == 0 { standingSince = now }
        queues[priority.rawValue].append((waiter, now))
    }

    /// The request a freed slot goes to: the longest-waiting of the highest priority.
    public mutating func next(at now: Instant) -> Waiter? {
        for p in 0..<queues.count where !queues[p].isEmpty {
            let w = queues[p].removeFirst().waiter
            if count == 0 { standingSince = nil }
            return w
        }
        return nil
    }

    /// A request left the queue by itself (its deadline, its client).
    @discardableResult
    public mutating func leave(_ waiter: Waiter) -> Bool {
        for p in 0..<queues.count {
            if let i = queues[p].firstIndex(where: { $0.waiter === waiter }) {
                queues[p].remove(at: i)
                if count == 0 { standingSince = nil }
                return true
            }
        }
        return false
    }

    /// The requests to shed now (they left the queue): nothing unless the
    /// queue has stood for `interval`; then those of the lowest priority
    /// that has any waiting past `target`.
    public mutating func shed(at now: Instant) -> [(Waiter, RequestPriority)] {
        guard let since = standingSince, now - since >= configuration.interval else { return [] }
        for p in stride(from: queues.count - 1, through: 0, by: -1) {
            let late = queues[p].filter { now - $0.since > configuration.target }
            guard !late.isEmpty else { continue }
            queues[p].removeAll { now - $0.since > configuration.target }
            if count == 0 { standingSince = nil }
            let priority = RequestPriority(rawValue: p)!
            return late.map { ($0.waiter, priority) }
        }
        return []
    }
}
