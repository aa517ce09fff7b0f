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
/// Whom a slot is held for: the request's priority and its client (the
/// route's rate-limit key, else its address, hashed by the caller). The
/// adaptive limit keeps a reserve for the top priority in use and shares
/// slots fairly between clients (issue 44); a fixed limit ignores both.
public struct SlotHolder: Sendable, Equatable {
    public var priority: RequestPriority
    public var client: Int
    @inlinable public init(_ priority: RequestPriority = .normal, client: Int = 0) {
        self.priority = priority
        self.client = client
    }
}

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
        /// Answers streaming past their head that may leave the limit
        /// (`moveToStreams`; only with `adaptive`): the worker's share of
        /// `adaptive_concurrency.max_streams`. 0: streams keep their slots.
        public var maxStreams = 0

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
        /// share of `connections`; the queue holds up to the share of `max`,
        /// and the streams moved out of the limit the share of `maxStreams`.
        public init(
            adaptive: AdaptiveLimit.Configuration, queue: QueueShedding, connections: Int,
            workers: Int, maxStreams: Int = 0, minPerWorker: Int? = nil
        ) {
            let workers = Swift.max(1, workers)
            func share(_ n: Int) -> Int { Swift.max(1, (n + workers - 1) / workers) }
            let cap = Swift.max(1, connections / workers)
            var a = adaptive
            a.maxLimit = Swift.min(share(adaptive.maxLimit), cap)
            a.minLimit = Swift.min(minPerWorker ?? share(adaptive.minLimit), a.maxLimit)
            a.initialLimit = Swift.min(Swift.max(share(adaptive.initialLimit), a.minLimit), a.maxLimit)
            self.init(maxInFlight: a.maxLimit, maxQueued: a.maxLimit)
            self.adaptive = a
            self.queue = queue
            self.maxStreams = maxStreams > 0 ? share(maxStreams) : 0
        }

        /// A worker's least share of an adaptive limit when `min_limit` is
        /// not given: 2, so the reserve for the top priority in use fits
        /// inside the limit (at 1 it takes a slot past it). Chosen from
        /// measurement (docs/overload.md, "The default min_limit").
        public static var defaultMinPerWorker: Int { 2 }

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
    /// Slots taken now (streams moved apart not included).
    @inlinable public var inFlight: Int { taken }
    @usableFromInline var taken = 0
    /// Tries that may be in flight now: fixed, or `adaptive.current`.
    @inlinable public var limit: Int { storedLimit }
    @usableFromInline var storedLimit: Int {
        didSet { reserve = Self.reserve(limit: storedLimit, adaptive: isAdaptive) }
    }
    /// Slots of an adaptive limit kept for the top priority in use (issue
    /// 44): a fifth of the limit, at least one at any limit. A request of a
    /// lower priority takes a slot only while `reserve` are free (a normal
    /// one below critical, half of them); one of the top priority takes
    /// any, and at a limit of 1, one past a lower try that holds it: a
    /// critical request always has a way in. 0 for a fixed limit (nothing
    /// changes there).
    @usableFromInline var reserve = 0
    @usableFromInline var waiting: PriorityQueue<Waiter>
    /// The learned limit (nil: fixed).
    @inlinable public var adaptive: AdaptiveLimit? { learned }
    /// The adaptive limit's latest baseline and recent latency, read in
    /// place (nil: a fixed limit).
    @inlinable public var latencies: (baseline: Double, recent: Double)? {
        isAdaptive ? (learned?.baseline ?? 0, learned?.recent ?? 0) : nil
    }
    @usableFromInline var learned: AdaptiveLimit?
    /// `learned != nil`, kept apart: the optional's check is a call into
    /// its type's value witnesses (the limit holds arrays), this a load.
    @usableFromInline let isAdaptive: Bool
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

    // Adaptive only (issue 44): who holds the slots.
    /// Slots held per priority (by rank).
    @usableFromInline var takenCritical = 0
    @usableFromInline var takenNormal = 0
    @usableFromInline var takenSheddable = 0
    /// When a critical and a normal request last asked for a slot
    /// (nanoseconds; `Int64.min`: never): the top priority in use is the
    /// highest seen within `priorityMemory`.
    @usableFromInline var criticalSeen = Int64.min
    @usableFromInline var normalSeen = Int64.min
    /// The top priority's rank as of the last request.
    @usableFromInline var top = RequestPriority.sheddable.rank
    /// Slots held per client, in `clientBuckets` buckets by the client's
    /// hash (clients that share a bucket share a count: at worst a little
    /// less than their fair turn).
    @usableFromInline var held: [Int] = []
    /// Answers that stream past their head, moved out of the limit (`moveToStreams`).
    @inlinable public var streaming: Int { streams }
    @usableFromInline var streams = 0

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        waiting = PriorityQueue(configuration.queue)
        if let a = configuration.adaptive {
            let limit = AdaptiveLimit(a)
            learned = limit
            storedLimit = limit.current
            reserve = Self.reserve(limit: storedLimit, adaptive: true)
            held = Array(repeating: 0, count: Self.clientBuckets)
            isAdaptive = true
        } else {
            storedLimit = configuration.maxInFlight
            isAdaptive = false
        }
    }

    /// A fifth of an adaptive limit, at least 1; none for a fixed one.
    @usableFromInline static func reserve(limit: Int, adaptive: Bool) -> Int { adaptive ? max(1, limit / 5) : 0 }
    /// How long a priority counts as in use after its last request.
    public static var priorityMemory: Int64 { 10_000_000_000 }
    @usableFromInline static var clientBuckets: Int { 64 }

    /// The tries in flight under which a request of `priority` takes a slot.
    @inlinable
    public func cap(_ priority: RequestPriority) -> Int {
        guard reserve > 0 else { return limit }
        // At a limit of 1 the reserve cannot fit: the top priority gets one
        // slot past a lower try holding it. Above, it waits for the next
        // freed slot, which is its (in the upstream's own queue it would
        // wait behind every try sent before it).
        if priority.rank <= top { return limit == 1 ? 1 + min(1, heldBelow(priority)) : limit }
        switch priority {
        case .critical: return limit
        case .normal: return max(1, limit - max(1, reserve / 2))
        case .sheddable: return max(1, limit - reserve)
        }
    }

    /// Slots held by requests of lower priority than `priority`.
    @inlinable func heldBelow(_ priority: RequestPriority) -> Int {
        switch priority {
        case .critical: takenNormal + takenSheddable
        case .normal: takenSheddable
        case .sheddable: 0
        }
    }

    /// Slots held by `client` now (adaptive only; else 0).
    @inlinable public func held(by client: Int) -> Int { held.isEmpty ? 0 : held[client & (Self.clientBuckets - 1)] }

    /// Requests waiting for a slot now.
    @inlinable public var queued: Int { waiting.count }
    @inlinable public func queued(_ priority: RequestPriority) -> Int { waiting.count(priority) }

    /// No slot taken, no stream, nobody waiting.
    @inlinable public var isIdle: Bool { taken == 0 && streams == 0 && waiting.isEmpty }

    /// A slot for one try; else a place in the queue (making room by
    /// shedding a waiter of a lower priority when it is full); else
    /// overloaded. `now` dates the wait (CoDel's sojourn time).
    @inlinable
    public mutating func acquire(_ waiter: Waiter, priority: RequestPriority = .normal, at now: Instant) -> Acquisition {
        acquire(waiter, SlotHolder(priority), at: now)
    }

    @inlinable
    public mutating func acquire(_ waiter: Waiter, _ holder: SlotHolder, at now: Instant) -> Acquisition {
        if taken < limit, reserve == 0, waiting.isEmpty {
            taken += 1
            return .granted
        }
        if isAdaptive { seen(holder.priority, at: now) }
        return enqueue(waiter, holder, at: now)
    }

    /// The top priority in use, as of a request of `priority` at `now`.
    @inlinable
    mutating func seen(_ priority: RequestPriority, at now: Instant) {
        let ns = now.nanoseconds
        switch priority {
        case .critical: criticalSeen = ns
        case .normal: normalSeen = ns
        case .sheddable: break
        }
        let memory = Self.priorityMemory
        top =
            criticalSeen != .min && ns &- criticalSeen < memory
            ? 0 : normalSeen != .min && ns &- normalSeen < memory ? 1 : 2
    }

    @inlinable
    mutating func enqueue(_ waiter: Waiter, _ holder: SlotHolder, at now: Instant) -> Acquisition {
        let priority = holder.priority
        if isAdaptive { shedLate(at: now) }
        // A free slot within its priority's share, and nobody as important
        // waiting for one (those less important wait for their own share).
        if taken < cap(priority), !waiting.waits(atLeast: priority) {
            take(holder)
            return .granted
        }
        if waiting.count >= configuration.maxQueued {
            guard let lowest = waiting.lowest, let displaced = waiting.displace(below: priority) else { return .overloaded }
            outbox.append((displaced, lowest))
        }
        waiting.enqueue(waiter, priority, client: holder.client, at: now)
        return .queued
    }

    @inlinable
    mutating func take(_ holder: SlotHolder) {
        taken += 1
        guard isAdaptive else { return }
        count(holder, by: 1)
    }

    @inlinable
    mutating func count(_ holder: SlotHolder, by n: Int) {
        switch holder.priority {
        case .critical: takenCritical += n
        case .normal: takenNormal += n
        case .sheddable: takenSheddable += n
        }
        held[holder.client & (Self.clientBuckets - 1)] += n
    }

    /// A slot only if one is free now and nobody waits for one (a hedge
    /// never overtakes a queued request, and never queues itself). It is
    /// held for `holder` (counted with its request's priority and client).
    @inlinable
    public mutating func tryAcquire(_ holder: SlotHolder = SlotHolder()) -> Bool {
        // A hedge is extra work: it takes a slot within a sheddable request's share.
        guard taken < cap(.sheddable), waiting.isEmpty else { return false }
        take(holder)
        return true
    }

    /// A try held for `holder` ended and gives its slot back. With
    /// `handOver` (the default) a waiter of the highest priority takes it
    /// over, unless the limit shrank below the tries in flight; without (a
    /// drain that ran out of time starts no new tries) the slot is simply
    /// freed. `now` is needed only when requests wait on an adaptive limit
    /// (to shed the late first).
    @inlinable
    public mutating func release(
        _ holder: SlotHolder = SlotHolder(), handOver: Bool = true, at now: @autoclosure () -> Instant
    ) -> Release {
        if isAdaptive { count(holder, by: -1) }
        if handOver, !waiting.isEmpty { return handOverOrFree(at: now()) }
        taken -= 1
        return .freed
    }

    /// The freed slot goes to the most important waiter if its share
    /// allows one more than the others hold (else it is freed: the limit
    /// shrank, or only less important requests wait, over their share).
    /// With an adaptive limit, to the one whose client holds the fewest
    /// slots (`PriorityQueue.next(fewestHeld:)`).
    @inlinable
    mutating func handOverOrFree(at now: Instant) -> Release {
        if isAdaptive { shedLate(at: now) }
        if let p = waiting.highest, taken <= cap(p) {
            if !isAdaptive, let next = waiting.next() { return .handedOver(next) }
            if let next = nextFairly() {
                count(SlotHolder(p, client: next.client), by: 1)
                return .handedOver(next.waiter)
            }
        }
        taken -= 1
        return .freed
    }

    @inlinable
    mutating func nextFairly() -> (waiter: Waiter, client: Int)? {
        let counts = held
        return waiting.next(fewestHeld: { counts[$0 & (Self.clientBuckets - 1)] })
    }

    /// A queued request gave up its place (its deadline came, its client
    /// left, drain answered it). True if it was in the queue.
    @inlinable @discardableResult
    public mutating func leave(_ waiter: Waiter) -> Bool { waiting.leave(waiter) }

    /// An answer held for `holder` streams past its head (an event stream,
    /// a gRPC call, a tunnel, an answer its client reads slower than it
    /// comes past the read-ahead): its slot leaves the limit (handed over
    /// as `release` would) and it counts among `streaming`, up to
    /// `configuration.maxStreams`. Nil: no room there (or a fixed limit):
    /// it keeps its slot. `streamEnded` when it ends.
    @inlinable
    public mutating func moveToStreams(_ holder: SlotHolder, at now: Instant) -> Release? {
        guard isAdaptive, streams < configuration.maxStreams else { return nil }
        streams += 1
        return release(holder, at: now)
    }

    /// A stream `moveToStreams` took ended.
    @inlinable public mutating func streamEnded() { streams -= 1 }

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
        guard isAdaptive else { return false }
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
        while let p = waiting.highest, taken < cap(p), let next = nextFairly() {
            taken += 1
            count(SlotHolder(p, client: next.client), by: 1)
            granted.append(next.waiter)
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

    /// CoDel's shedding of the late, except while tries of a lower priority
    /// than the lowest waiting hold slots: the next of those to end hands
    /// its slot to them (issue 44: a critical request is never shed while
    /// a sheddable try holds a slot it could take next).
    @inlinable
    mutating func shedLate(at now: Instant) {
        guard !waiting.isEmpty, let lowest = waiting.lowest, heldBelow(lowest) == 0 else { return }
        for w in waiting.shed(at: now) { outbox.append((w, lowest)) }
    }
}
