import HappyPathCore

/// One upstream's tries in flight on one worker, and the bounded queue of
/// requests waiting for one of its slots (docs/reachability.md, "the
/// concurrency limit"; docs/overload.md). A pure value: the worker holds
/// one per upstream, performs what it decides (a queued request arms its
/// own wait; a freed slot handed over starts that request's try; a shed
/// request is answered OVERLOADED) and never looks inside.
///
/// The limit is fixed (the worker's share of `max_connections`) or, with
/// `adaptive_concurrency`, learned from the latency of completed tries
/// (`AdaptiveLimit`); then the queue also sheds CoDel-style
/// (`PriorityQueue`). Waiting requests go by priority (critical first),
/// each priority first in, first out.
///
/// Generic over the waiter so it knows nothing of exchanges; waiters are
/// told apart by identity. On the hot path (once per try: `acquire` and
/// `release`) it is a count and a comparison; the queue is touched only
/// when the slots are all taken. The methods are inlinable so the server's
/// use is specialized for its waiter type.
public struct ConcurrencyLimiter<Waiter: AnyObject> {
    public struct Configuration: Sendable, Equatable {
        /// Tries in flight at once, when the limit is fixed: the worker's
        /// share of the upstream's `max_connections` × endpoints (at least 1).
        /// With `adaptive`, the most the learned limit may reach.
        public var maxInFlight: Int
        /// Requests that may wait for a slot; beyond it a request is
        /// refused (503 OVERLOADED) unless it matters more than one
        /// waiting, which is shed to make room. Default: as many as `maxInFlight`.
        public var maxQueued: Int
        /// The worker's share of `adaptive_concurrency` (nil: a fixed limit).
        public var adaptive: AdaptiveLimit.Configuration?
        /// How the queue sheds (only with `adaptive`).
        public var queue = QueueShedding()

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

        /// The worker's share of an adaptive limit between `min` and `max`
        /// (the upstream's whole), starting at `initial`, capped by its
        /// share of `connections`; the queue holds up to the share of `max`.
        public init(
            adaptive: AdaptiveLimit.Configuration, queue: QueueShedding, connections: Int,
            workers: Int
        ) {
            let workers = Swift.max(1, workers)
            func share(_ n: Int) -> Int { Swift.max(1, (n + workers - 1) / workers) }
            let cap = Swift.max(1, connections / workers)
            var a = adaptive
            a.maxLimit = Swift.min(share(adaptive.maxLimit), cap)
            a.minLimit = Swift.min(share(adaptive.minLimit), a.maxLimit)
            a.initialLimit = Swift.min(Swift.max(share(adaptive.initialLimit), a.minLimit), a.maxLimit)
            self.init(maxInFlight: a.maxLimit, maxQueued: a.maxLimit)
            self.adaptive = a
            self.queue = queue
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
        /// its own deadline) until `release` hands it a slot, it is shed,
        /// or it `leave`s.
        case queued
        /// Slots and queue are full of requests that matter as much: refuse
        /// the request (OVERLOADED).
        case overloaded
    }

    /// What `release` decided about the freed slot.
    public enum Release {
        /// Nobody waits (or hand-over is off, or the limit shrank below the
        /// tries in flight): the slot is free again.
        case freed
        /// The slot goes, still taken, to this waiter (the longest waiting
        /// of the highest priority), which has left the queue: start its try.
        case handedOver(Waiter)
    }

    public let configuration: Configuration
    /// Slots taken now.
    @inlinable public var inFlight: Int { taken }
    @usableFromInline var taken = 0
    /// Tries that may be in flight now: fixed, or `adaptive.current`.
    @inlinable public var limit: Int { storedLimit }
    @usableFromInline var storedLimit: Int {
        didSet { reserve = Self.reserve(limit: storedLimit, adaptive: learned != nil) }
    }
    /// Slots of an adaptive limit kept for more important requests: a
    /// sheddable request takes a slot only while `reserve` are free, a
    /// normal one while half of them are; a critical one takes any. A
    /// critical request then seldom waits behind sheddable tries, and the
    /// limit, which grows while it is used, grows past the reserve. 0 for a
    /// fixed limit (nothing changes there) and for a limit under 3.
    @usableFromInline var reserve = 0
    @usableFromInline var waiting: PriorityQueue<Waiter>
    /// The learned limit (nil: fixed).
    @inlinable public var adaptive: AdaptiveLimit? { learned }
    @usableFromInline var learned: AdaptiveLimit?
    /// Waiters that left the queue without a slot (shed by CoDel, or
    /// displaced from a full queue), with their priority: the caller takes
    /// them with `takeShed` after each call and answers them OVERLOADED.
    @inlinable public var shedOutbox: [(Waiter, RequestPriority)] { outbox }
    @usableFromInline var outbox: [(Waiter, RequestPriority)] = [] {
        didSet { pendingShed = !outbox.isEmpty }
    }
    /// Something waits in `shedOutbox`: the one check the hot path makes
    /// (a plain field; the outbox's own `isEmpty` is a generic call).
    @inlinable public var hasShed: Bool { pendingShed }
    @usableFromInline var pendingShed = false

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        waiting = PriorityQueue(configuration.queue)
        if let a = configuration.adaptive {
            let limit = AdaptiveLimit(a)
            learned = limit
            storedLimit = limit.current
            reserve = Self.reserve(limit: storedLimit, adaptive: true)
        } else {
            storedLimit = configuration.maxInFlight
        }
    }

    /// A fifth of an adaptive limit of 3 or more (at least 1), else none.
    @usableFromInline static func reserve(limit: Int, adaptive: Bool) -> Int { adaptive && limit >= 3 ? max(1, limit / 5) : 0 }

    /// The tries in flight under which a request of `priority` takes a slot.
    @inlinable
    public func cap(_ priority: RequestPriority) -> Int {
        guard reserve > 0 else { return limit }
        switch priority {
        case .critical: return limit
        case .normal: return limit - reserve / 2
        case .sheddable: return limit - reserve
        }
    }

    /// Requests waiting for a slot now.
    @inlinable public var queued: Int { waiting.count }
    @inlinable public func queued(_ priority: RequestPriority) -> Int { waiting.count(priority) }

    /// No slot taken, nobody waiting.
    @inlinable public var isIdle: Bool { taken == 0 && waiting.isEmpty }

    /// A slot for one try; else a place in the queue (making room by
    /// shedding a waiter of a lower priority when it is full); else
    /// overloaded. `now` dates the wait (CoDel's sojourn time).
    @inlinable
    public mutating func acquire(_ waiter: Waiter, priority: RequestPriority = .normal, at now: Instant) -> Acquisition {
        if taken < limit, reserve == 0, waiting.isEmpty {
            taken += 1
            return .granted
        }
        return enqueue(waiter, priority, at: now)
    }

    @inlinable
    mutating func enqueue(_ waiter: Waiter, _ priority: RequestPriority, at now: Instant) -> Acquisition {
        if learned != nil { shedLate(at: now) }
        // A free slot within its priority's share, and nobody as important
        // waiting for one (those less important wait for their own share).
        if taken < cap(priority), !waiting.waits(atLeast: priority) {
            taken += 1
            return .granted
        }
        if waiting.count >= configuration.maxQueued {
            guard let lowest = waiting.lowest, let displaced = waiting.displace(below: priority) else { return .overloaded }
            outbox.append((displaced, lowest))
        }
        waiting.enqueue(waiter, priority, at: now)
        return .queued
    }

    /// A slot only if one is free now and nobody waits for one (a hedge
    /// never overtakes a queued request, and never queues itself).
    @inlinable
    public mutating func tryAcquire() -> Bool {
        // A hedge is extra work: it takes a slot within a sheddable request's share.
        guard taken < cap(.sheddable), waiting.isEmpty else { return false }
        taken += 1
        return true
    }

    /// A try ended and gives its slot back. With `handOver` (the default)
    /// the waiter of the highest priority takes it over, unless the limit
    /// shrank below the tries in flight; without (a drain that ran out of
    /// time starts no new tries) the slot is simply freed. `now` is needed
    /// only when requests wait on an adaptive limit (to shed the late first).
    @inlinable
    public mutating func release(handOver: Bool = true, at now: @autoclosure () -> Instant) -> Release {
        if handOver, !waiting.isEmpty, taken <= limit { return handOverOrFree(at: now()) }
        taken -= 1
        return .freed
    }

    /// The freed slot goes to the most important waiter if its share
    /// allows one more than the others hold (else it is freed: the limit
    /// shrank, or only less important requests wait, over their share).
    @inlinable
    mutating func handOverOrFree(at now: Instant) -> Release {
        if learned != nil { shedLate(at: now) }
        if let p = waiting.highest, taken <= cap(p), let next = waiting.next() { return .handedOver(next) }
        taken -= 1
        return .freed
    }

    /// A queued request gave up its place (its deadline came, its client
    /// left, drain answered it). True if it was in the queue.
    @inlinable @discardableResult
    public mutating func leave(_ waiter: Waiter) -> Bool { waiting.leave(waiter) }

    /// A try of this upstream sent at `start` completed at `end`, with
    /// `inFlight` tries in flight when it started: the adaptive limit learns
    /// from it, against the baseline of its `kind` (`AdaptiveLimit`).
    /// Returns whether the limit moved; a limit that grew hands its new
    /// slots to waiters at once (`granted`: start their tries). Nothing
    /// without `adaptive`.
    @inlinable
    public mutating func sample(
        from start: Instant, to end: Instant, inFlight: Int, kind: UInt64 = 0, granted: inout [Waiter]
    ) -> Bool {
        guard learned != nil else { return false }
        // In place: the limit's state is not copied out and back.
        guard let moved = learned!.sample(from: start, to: end, inFlight: inFlight, queued: !waiting.isEmpty, kind: kind)
        else {
            return false
        }
        granted = limitMoved(to: moved)
        return true
    }

    @inlinable
    mutating func limitMoved(to moved: Int) -> [Waiter] {
        storedLimit = moved
        var granted: [Waiter] = []
        while let p = waiting.highest, taken < cap(p), let next = waiting.next() {
            taken += 1
            granted.append(next)
        }
        return granted
    }

    /// The waiters shed since the last call, with their priority.
    @inlinable
    public mutating func takeShed() -> [(Waiter, RequestPriority)] {
        guard pendingShed else { return [] }
        defer { outbox.removeAll(keepingCapacity: true) }
        return outbox
    }

    /// Shutdown: forget every waiter (the worker abandons them itself).
    @inlinable public mutating func removeAllWaiters() { waiting.removeAll() }

    @inlinable
    mutating func shedLate(at now: Instant) {
        guard !waiting.isEmpty, let lowest = waiting.lowest else { return }
        for w in waiting.shed(at: now) { outbox.append((w, lowest)) }
    }
}
