#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Work handed from any thread to threads of their own: the delivery
/// store's writer and readers (SQLite and PostgreSQL) and the trace
/// exporter. Producers `push` items and never wait; `count` named threads
/// (started by `start`) each run `work`, which loops on `take` until it
/// returns nil, keeping in its own locals what only its thread touches (a
/// connection, a curl handle).
///
/// Items are taken in the order they were pushed. The queue holds at most
/// `capacity` items: a push beyond it is refused (the producer decides
/// what that means: a span dropped and counted, a delivery not stored). A
/// push marked `reserved` may also use `reserve` places more, for the few
/// items that must not be refused when ordinary work fills the queue (a
/// delivery round's end): at most `capacity + reserve` wait, ever. `stop` refuses new items,
/// lets the threads take what is left (`take` returns nil once it is empty),
/// and joins them.
///
/// The mutex and the two conditions are allocated on the heap, where they
/// never move (the address of a class's stored property is not stable in
/// Swift), and are pthread ones so that ThreadSanitizer sees the critical
/// sections. Timed waits use the monotonic clock (`monotonicDeadline`): a
/// wall-clock step neither ends nor stretches them.
///
/// `@unchecked Sendable`: every `var` is read and written with `mutex`
/// held; the threads list is only touched by `start` and `stop`, under it too.
public final class JobQueue<Item: Sendable>: @unchecked Sendable {
    /// How `take` gathers a batch.
    public enum Gather: Sendable, Equatable {
        /// Waits for a first item (at most `idle` nanoseconds if given, then
        /// returns `[]`), then up to `linger` nanoseconds more while fewer
        /// than `max` wait (group commit: many writes share one fsync).
        case linger(Int64, idle: Int64? = nil)
        /// Waits until `max` items wait or `nanoseconds` passed since the
        /// call, and returns what there is then (`[]` if nothing: a timed flush).
        case fill(within: Int64)
    }

    /// Threads' names (`pthread_setname_np`: at most 15 bytes, a suffix
    /// `-1`, `-2`… for a pool of several).
    public let name: String
    public let capacity: Int
    /// Places only a `reserved` push may use, beyond `capacity`.
    public let reserve: Int

    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    /// Signalled when an item arrives and a `take` waits for a first one.
    private let arrived: UnsafeMutablePointer<pthread_cond_t>
    /// Signalled when as many items wait as a lingering `take` wants.
    private let filled: UnsafeMutablePointer<pthread_cond_t>

    private var items: [Item] = []
    private var stopping = false
    /// `take` hands nothing out until `release` (see `init`).
    private var held: Bool
    private var threads: [pthread_t] = []
    /// `take`s waiting for a first item.
    private var idleWaiters = 0
    /// `take`s waiting for a batch to fill, and the least any of them wants.
    private var fillWaiters = 0
    private var fillTarget = Int.max

    /// `capacity`: the most items waiting at once (at least 1). `reserve`:
    /// places beyond it that only a `reserved` push may take. `held`:
    /// `take` waits, whatever is pushed, until `release` (a store starts
    /// its writer thread as it opens, with the thread's state handed to it
    /// there, and lets it work from `start`); stopped before `release`,
    /// `take` returns nil at once and what was pushed is never handed out.
    public init(name: String, capacity: Int = .max, reserve: Int = 0, held: Bool = false) {
        self.name = name
        self.capacity = max(1, capacity)
        self.reserve = max(0, min(reserve, Int.max - self.capacity))
        self.held = held
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        arrived = .allocate(capacity: 1)
        arrived.initialize(to: pthread_cond_t())
        initMonotonicCondition(arrived)
        filled = .allocate(capacity: 1)
        filled.initialize(to: pthread_cond_t())
        initMonotonicCondition(filled)
    }

    deinit {
        for c in [arrived, filled] {
            pthread_cond_destroy(c)
            c.deinitialize(count: 1)
            c.deallocate()
        }
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    // MARK: - Threads

    /// Starts one thread running `work(self)`, which may own what it
    /// captures (`sending`: the caller keeps no other way to reach it).
    /// Does nothing once started or stopped.
    public func start(_ work: sending @escaping (JobQueue<Item>) -> Void) {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        guard threads.isEmpty, !stopping else { return }
        let threadName = name
        threads.append(
            startThread(threadName) { [self] in
                nameCurrentThread(threadName)
                work(self)
            })
    }

    /// Starts `count` threads, each running `work(self)`; what `work`
    /// captures lives until the threads end. Does nothing once started or stopped.
    public func start(threads count: Int, _ work: @escaping @Sendable (JobQueue<Item>) -> Void) {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        guard threads.isEmpty, !stopping else { return }
        for i in 1...max(1, count) {
            let threadName = count > 1 ? "\(name)-\(i)" : name
            threads.append(
                startThread(threadName) { [self] in
                    nameCurrentThread(threadName)
                    work(self)
                })
        }
    }

    /// Lets `take` hand items out (a queue made `held`).
    public func release() {
        pthread_mutex_lock(mutex)
        held = false
        pthread_mutex_unlock(mutex)
        pthread_cond_broadcast(arrived)
    }

    /// Refuses new items, lets the threads take what waits, and joins them.
    /// Safe to call more than once; never from one of the queue's threads.
    public func stop() {
        pthread_mutex_lock(mutex)
        stopping = true
        let all = threads
        threads = []
        pthread_mutex_unlock(mutex)
        pthread_cond_broadcast(arrived)
        pthread_cond_broadcast(filled)
        for t in all { pthread_join(t, nil) }
    }

    /// Stopped: `push` refuses everything.
    public var isStopped: Bool {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return stopping
    }

    // MARK: - Producers

    /// Hands `item` over; false (nothing kept) if the queue is full or
    /// stopped. `reserved`: `reserve`'s places count as room too.
    @discardableResult
    public func push(_ item: Item, reserved: Bool = false) -> Bool { offer(item, reserved: reserved) == .kept }

    /// What became of an item offered (`offer`): kept, or refused, and why.
    public enum Offer: Sendable, Equatable {
        case kept, full, stopped
    }

    /// `push`, saying why an item was refused, as one critical section: a
    /// producer that answers a refusal itself knows whether the queue was
    /// full or stopped at that moment.
    public func offer(_ item: Item, reserved: Bool = false) -> Offer {
        let kept = push(contentsOf: CollectionOfOne(item), room: reserved ? capacity + reserve : capacity)
        return kept == 1 ? .kept : kept < 0 ? .stopped : .full
    }

    /// Hands over as many of `newItems` as there is room for, the first
    /// ones; how many it kept (0 once stopped).
    @discardableResult
    public func push<C: Collection>(contentsOf newItems: C) -> Int where C.Element == Item {
        max(0, push(contentsOf: newItems, room: capacity))
    }

    /// How many of `newItems` were kept with at most `room` items waiting;
    /// -1 once stopped.
    private func push<C: Collection>(contentsOf newItems: C, room: Int) -> Int where C.Element == Item {
        pthread_mutex_lock(mutex)
        guard !stopping else {
            pthread_mutex_unlock(mutex)
            return -1
        }
        let waiting = items.count
        let taken = Swift.max(0, Swift.min(room - waiting, newItems.count))
        if taken == newItems.count {
            items.append(contentsOf: newItems)
        } else if taken > 0 {
            items.append(contentsOf: newItems.prefix(taken))
        }
        let now = waiting + taken
        let wakeIdle = taken > 0 && idleWaiters > 0
        let wakeFill = taken > 0 && fillWaiters > 0 && now >= fillTarget
        pthread_mutex_unlock(mutex)
        if wakeIdle { pthread_cond_signal(arrived) }
        if wakeFill { pthread_cond_signal(filled) }
        return taken
    }

    /// Items waiting now.
    public var waiting: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return items.count
    }

    // MARK: - Consumers (the queue's threads)

    /// Up to `max` items, oldest first, gathered as `gather` says. Nil once
    /// the queue is stopped and empty (the thread's cue to end); once
    /// stopped, what is left is returned at once, without lingering.
    public func take(max: Int, _ gather: Gather = .linger(0)) -> [Item]? {
        let max = Swift.max(1, max)
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        if held {
            idleWaiters += 1
            while held, !stopping { pthread_cond_wait(arrived, mutex) }
            idleWaiters -= 1
            if held { return nil }
        }
        switch gather {
        case let .linger(linger, idle):
            var until = idle.map(monotonicDeadline(after:)) ?? timespec()
            idleWaiters += 1
            while items.isEmpty, !stopping {
                if idle != nil {
                    if pthread_cond_timedwait(arrived, mutex, &until) == ETIMEDOUT { break }
                } else {
                    pthread_cond_wait(arrived, mutex)
                }
            }
            idleWaiters -= 1
            if items.isEmpty { return stopping ? nil : [] }
            if linger > 0 { waitToFill(max, until: monotonicDeadline(after: linger)) }
        case let .fill(within):
            waitToFill(max, until: monotonicDeadline(after: within))
            if stopping, items.isEmpty { return nil }
        }
        return removeFirst(Swift.min(items.count, max))
    }

    /// One item (a pool's thread takes its next job); nil once stopped and empty.
    public func takeOne() -> Item? {
        take(max: 1)?.first
    }

    /// Mutex held: waits until `max` items wait, the queue stops, or `deadline`.
    private func waitToFill(_ max: Int, until deadline: timespec) {
        var deadline = deadline
        fillWaiters += 1
        fillTarget = Swift.min(fillTarget, max)
        while items.count < max, !stopping {
            if pthread_cond_timedwait(filled, mutex, &deadline) == ETIMEDOUT { break }
        }
        fillWaiters -= 1
        if fillWaiters == 0 { fillTarget = .max }
    }

    /// Mutex held: the `n` oldest items, removed.
    private func removeFirst(_ n: Int) -> [Item] {
        if n == items.count {
            defer { items.removeAll(keepingCapacity: true) }
            return items
        }
        let batch = Array(items.prefix(n))
        items.removeFirst(n)
        return batch
    }
}
