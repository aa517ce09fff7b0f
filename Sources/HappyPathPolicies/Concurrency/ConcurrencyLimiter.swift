import HappyPathCore

/// One upstream's tries in flight on one worker, and the bounded queue of
/// requests waiting for one of its slots (docs/reachability.md, "the
/// concurrency limit"). A pure value: the worker holds one per upstream,
/// performs what it decides (a queued request arms its own wait; a freed
/// slot handed over starts that request's try) and never looks inside.
///
/// Generic over the waiter so it knows nothing of exchanges; waiters are
/// told apart by identity. The queue is first in, first out: a freed slot
/// goes to the request that has waited longest.
///
/// On the hot path (once per try: `acquire` and `release`) it is a count
/// and a comparison; the queue's array is touched only when the slots are
/// all taken. The methods are inlinable so the server's use is specialized
/// for its waiter type instead of going through generic witnesses.
public struct ConcurrencyLimiter<Waiter: AnyObject> {
    public struct Configuration: Sendable, Equatable {
        /// Tries in flight at once. The worker's share of the upstream's
        /// `max_connections` × endpoints (at least 1).
        public var maxInFlight: Int
        /// Requests that may wait for a slot; beyond it a request is
        /// refused (503 OVERLOADED). Default: as many as `maxInFlight`.
        public var maxQueued: Int

        public init(maxInFlight: Int, maxQueued: Int? = nil) {
            self.maxInFlight = maxInFlight
            self.maxQueued = maxQueued ?? maxInFlight
        }

        /// The worker's share of an upstream's connections: `connections`
        /// (its `max_connections` × endpoints) split across `workers`, at
        /// least one; the queue is as long.
        public init(connections: Int, workers: Int) {
            self.init(maxInFlight: Swift.max(1, connections / Swift.max(1, workers)))
        }

        /// The messages a configuration error would give, empty when valid.
        public func validate() -> [String] {
            var problems: [String] = []
            if maxInFlight < 1 { problems.append("concurrency: at least 1 try in flight must be allowed, got \(maxInFlight)") }
            if maxQueued < 0 { problems.append("concurrency: the queue cannot hold fewer than 0 requests, got \(maxQueued)") }
            return problems
        }
    }

    /// What `acquire` decided.
    public enum Acquisition: Sendable, Equatable {
        /// A slot is the caller's: send the try, `release` when it ends.
        case granted
        /// All slots are taken: the caller waits in the queue (bounded by
        /// its own deadline) until `release` hands it a slot or it `leave`s.
        case queued
        /// Slots and queue are full: refuse the request (OVERLOADED).
        case overloaded
    }

    /// What `release` decided about the freed slot.
    public enum Release {
        /// Nobody waits (or hand-over is off): the slot is free again.
        case freed
        /// The slot goes, still taken, to this waiter (the longest waiting),
        /// which has left the queue: start its try.
        case handedOver(Waiter)
    }

    public let configuration: Configuration
    /// Slots taken now.
    public var inFlight: Int { taken }
    @usableFromInline var taken = 0
    @usableFromInline var waiting: [Waiter] = []

    public init(_ configuration: Configuration) {
        self.configuration = configuration
    }

    /// Requests waiting for a slot now.
    public var queued: Int { waiting.count }

    /// No slot taken, nobody waiting.
    public var isIdle: Bool { taken == 0 && waiting.isEmpty }

    /// A slot for one try; else a place at the back of the queue; else
    /// overloaded.
    @inlinable
    public mutating func acquire(_ waiter: Waiter) -> Acquisition {
        if taken < configuration.maxInFlight {
            taken += 1
            return .granted
        }
        guard waiting.count < configuration.maxQueued else { return .overloaded }
        waiting.append(waiter)
        return .queued
    }

    /// A slot only if one is free now and nobody waits for one (a hedge
    /// never overtakes a queued request, and never queues itself).
    @inlinable
    public mutating func tryAcquire() -> Bool {
        guard taken < configuration.maxInFlight, waiting.isEmpty else { return false }
        taken += 1
        return true
    }

    /// A try ended and gives its slot back. With `handOver` (the default)
    /// the longest-waiting request takes it over; without (a drain that ran
    /// out of time starts no new tries) the slot is simply freed.
    @inlinable
    public mutating func release(handOver: Bool = true) -> Release {
        if handOver, !waiting.isEmpty { return .handedOver(waiting.removeFirst()) }
        taken -= 1
        return .freed
    }

    /// A queued request gave up its place (its deadline came, its client
    /// left, drain answered it). True if it was in the queue.
    @inlinable @discardableResult
    public mutating func leave(_ waiter: Waiter) -> Bool {
        guard let i = waiting.firstIndex(where: { $0 === waiter }) else { return false }
        waiting.remove(at: i)
        return true
    }

    /// Shutdown: forget every waiter (the worker abandons them itself).
    public mutating func removeAllWaiters() { waiting.removeAll() }
}
