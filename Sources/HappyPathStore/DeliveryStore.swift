import CSQLite
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// Where a stored delivery is in its life.
public enum DeliveryState: Int, Sendable, CaseIterable {
    case queued = 0
    case inFlight = 1
    case delivered = 2
    case dead = 3

    public var name: String {
        switch self {
        case .queued: "queued"
        case .inFlight: "in_flight"
        case .delivered: "delivered"
        case .dead: "dead"
        }
    }

    public init?(name: String) {
        guard let s = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = s
    }
}

/// A request to store: everything needed to send it later, as it will go upstream.
public struct NewDelivery: Sendable {
    public var id: String
    public var upstream: String
    /// The route's label when it was accepted (for listings; delivery routes again).
    public var route: String
    public var idempotencyKey: String?
    /// Whose key it is: a hash of the route and the client's identity
    /// (`IdempotencyScope`); the key is looked up only within its scope.
    public var idempotencyScope: String?
    /// A hash of the method, target and body: the same key with another
    /// fingerprint is another request (`keyReused`).
    public var fingerprint: String?
    public var requestID: String
    public var method: String
    /// The client's path and query, routed again at delivery.
    public var target: String
    /// `name: value\r\n` lines, as forwarded (see `HeaderBlock.lines`).
    public var headers: [UInt8]
    public var body: RequestBody
    public var maxAttempts: Int
    /// Wall clock, milliseconds since 1970.
    public var expiresAt: Int64

    public init(
        id: String, upstream: String, route: String, idempotencyKey: String?, idempotencyScope: String? = nil,
        fingerprint: String? = nil, requestID: String, method: String, target: String, headers: [UInt8],
        body: RequestBody, maxAttempts: Int, expiresAt: Int64
    ) {
        self.id = id
        self.upstream = upstream
        self.route = route
        self.idempotencyKey = idempotencyKey
        self.idempotencyScope = idempotencyScope ?? (idempotencyKey == nil ? nil : upstream)
        self.fingerprint = fingerprint
        self.requestID = requestID
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.maxAttempts = maxAttempts
        self.expiresAt = expiresAt
    }

    /// What it counts against `storage.max_bytes`.
    var payloadBytes: Int { headers.count + body.count + target.utf8.count + method.utf8.count }
}

/// A delivery taken for one round: it is `in_flight` in the store until `finish`.
public struct ClaimedDelivery: Sendable {
    public let id: String
    public let upstream: String
    public let requestID: String
    public let method: String
    public let target: String
    public let headers: [UInt8]
    public let body: RequestBody
    /// Rounds started, this one included.
    public let attempts: Int
    public let maxAttempts: Int
    public let expiresAt: Int64
}

/// A delivery as the status URL and the admin API show it.
public struct DeliveryRecord: Sendable, Equatable {
    public let cursor: Int64
    public let id: String
    public let state: DeliveryState
    public let attempts: Int
    public let maxAttempts: Int
    public let upstream: String
    public let route: String
    public let requestID: String
    public let method: String
    public let target: String
    public let createdAt: Int64
    public let updatedAt: Int64
    public let nextAttemptAt: Int64
    public let expiresAt: Int64
    /// The upstream's status in the last round (nil: none answered).
    public let lastStatus: Int?
    /// The last round's problem, as problem+json (kept once dead).
    public let lastProblem: String?
}

public enum SubmitResult: Sendable {
    /// Stored durably (the commit is on disk, per `storage.sync`).
    case stored(id: String)
    /// The same `Idempotency-Key` in the same scope, for the same request
    /// (fingerprint), is already stored.
    case existing(id: String, state: DeliveryState)
    /// The same `Idempotency-Key` in the same scope is stored for another
    /// request (another method, target or body): nothing was stored.
    case keyReused
    /// `storage.max_bytes` reached: nothing was stored.
    case full(heldBytes: Int, maxBytes: Int)
    /// The store could not write (the disk is full or failing, or the store
    /// could not be opened yet): nothing was stored.
    case failed(StoreError)
}

/// The store's ability to write changed; reported on the writer thread.
public enum StoreHealth: Sendable {
    /// A write (or opening the store) failed. Reported for every failure.
    case failed(StoreError)
    /// A write succeeded after failures, or the store opened after it could
    /// not at start; `requeued` rounds found in flight went back to `queued`.
    case writable(requeued: Int)
}

/// How one delivery round ended.
public enum DeliveryOutcome: Sendable {
    case delivered(status: Int)
    /// Queued again for `at` (wall ms), with what went wrong.
    case retry(at: Int64, status: Int?, problem: String)
    case dead(status: Int?, problem: String)
    /// Not tried (no room to run it now): queued again, the round not counted.
    case postpone(at: Int64)
}

/// Why the store itself made a delivery dead (a round's own end is
/// `DeliveryPolicy`'s to decide).
public enum SetAsideReason: String, Sendable {
    /// Its `delivery.max_age` passed while it waited.
    case maxAge = "max_age"
    /// A round of it was in flight when the process died (with the shared
    /// store: its lease ran out on a replica that died) at two starts in a
    /// row: it may be what kills the proxy, so it is not sent a third time.
    case crashedTheProxy = "crashed_the_proxy"
}

/// A delivery the store made dead, reported by the next claim.
public typealias SetAside = (id: String, upstream: String, reason: SetAsideReason)

public enum ReplayResult: Sendable {
    case replayed
    case notDead(DeliveryState)
    case unknown
}

public struct StoreSettings: Sendable {
    public var path: String
    public var sync: StorageSync
    public var maxBytes: Int
    /// Delivered and dead deliveries are kept this long (status, Idempotency-Key).
    public var retention: Duration
    /// While the store cannot be opened (a full or failing disk at start),
    /// how often the writer tries again.
    public var reopenInterval: Duration

    public init(
        path: String, sync: StorageSync, maxBytes: Int, retention: Duration,
        reopenInterval: Duration = DeliveryStore.defaultReopenInterval
    ) {
        self.path = path
        self.sync = sync
        self.maxBytes = maxBytes
        self.retention = retention
        self.reopenInterval = reopenInterval
    }
}

/// Counts for `/metrics`: the kept counts, and the oldest pending delivery
/// of each upstream (read on the reader thread).
public struct StoreStats: Sendable {
    public var counts = DeliveryCounts()
    /// Per upstream: deliveries not yet delivered or dead, and the oldest one's creation (wall ms).
    public var pending: [String: (count: Int, oldest: Int64)] = [:]
    public var heldBytes = 0
    public var maxBytes = 0
}

/// The durable store of deliver-later requests: one SQLite file in WAL mode.
///
/// Every write goes through one writer thread, which takes whatever is
/// waiting (after lingering up to a millisecond for more) and commits it in
/// one transaction: many requests share one fsync (group commit). Replies
/// run on the writer thread after the commit; callers hop back to their own
/// loop. Reads (status, listings) go the same way to a reader thread with a
/// read-only connection of its own (`StoreReader`), which WAL lets run
/// beside the writer: no caller's thread ever runs SQLite. The counts by
/// upstream and state are kept by the writer (`DeliveryCounts`) and read
/// without SQLite.
///
/// Payload bytes (headers, body, target) of deliveries not yet delivered
/// count against `maxBytes`, and a delivered one's leftover row counts
/// `deliveredRowBytes`; a request that does not fit is refused, and nothing
/// stored is ever dropped to make room.
///
/// A disk that refuses writes (full, or I/O errors) does not stop the store:
/// each write that fails is refused with `.failed` and reported through
/// `onHealth`, and the next one tries again. If the file cannot even be
/// opened for writing at start, the store starts without its writer
/// connection, refuses every write, and tries to open it again every
/// `reopenInterval`; what the file holds stays there until it can.
/// `@unchecked Sendable`: its `var`s are the writer thread's (set before
/// that thread starts, then touched only there); what callers read is in
/// `Locked` or atomics, and operations reach the writer through `WriterQueue`.
public final class DeliveryStore: @unchecked Sendable {
    public static let lingerNanoseconds: Int64 = 1_000_000
    public static let maxBatch = 256
    public static let defaultReopenInterval: Duration = .seconds(1)
    /// Starts in a row that found a round of one delivery in flight (its
    /// process died during it) before it is set aside, not sent again.
    public static let interruptedRoundsBeforeSetAside = 2
    /// What a delivered delivery's row (id, key, times, status) is counted as.
    static let deliveredRowBytes = 256

    public let settings: StoreSettings
    private let clock: Clock
    /// Called on the writer thread with each stored request's write latency (seconds).
    private let onWrite: @Sendable (Double) -> Void

    private let queue = WriterQueue()
    private var thread: pthread_t?
    /// Writer-thread state: the connection and its statements (nil while
    /// the file cannot be opened for writing).
    private var writer: Writer?
    /// Writer-thread state: when to try opening the writer again (or to
    /// write the deferred round ends again).
    private var nextReopen: Instant
    /// Writer-thread state: round ends the disk refused. Each is written
    /// again every `reopenInterval` until it goes in, so a round's end is not
    /// lost (its row would stay `in_flight` until the next start); their
    /// replies (a round slot freed) wait for it.
    private var deferred: [WriterQueue.Op] = []
    /// The reads' thread and its read-only connection.
    private let reader: StoreReader
    /// Payload bytes held, kept by the writer, read by anyone.
    private let held: Locked<Int>
    /// Rows by upstream and state, kept by the writer, read by anyone.
    private let kept = Locked(DeliveryCounts())
    /// The last write's failure, cleared once a write succeeds.
    private let failure = Locked<StoreError?>(nil)
    /// Told when writes start failing or work again (set before `start`).
    private var onHealth: @Sendable (StoreHealth) -> Void = { _ in }
    /// Tests only (`crash`): `close` leaves the file as `kill -9` would.
    private var crashed = false
    /// Rows put back from `in_flight` to `queued` when the store opened
    /// (those set aside instead are not counted: the next claim reports them).
    public private(set) var recovered = 0

    /// Throws if the store cannot be used at all (its directory cannot be
    /// made, the file is not a store, or a newer schema). A disk that
    /// refuses writes is not such an error: the store starts unavailable
    /// (`failure` says why) and opens itself once the disk takes writes.
    public init(settings: StoreSettings, clock: Clock, onWrite: @escaping @Sendable (Double) -> Void = { _ in })
        throws(StoreError)
    {
        self.settings = settings
        self.clock = clock
        self.onWrite = onWrite
        nextReopen = clock.now() + settings.reopenInterval
        try Self.createDirectory(containing: settings.path)
        // The file holds clients' headers (credentials among them): readable
        // by this user only. SQLite gives its -wal and -shm files the same mode.
        let fd = open(settings.path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        if fd >= 0 {
            fchmod(fd, 0o600)
            Glibc.close(fd)
        }
        held = Locked(0)
        reader = StoreReader(path: settings.path)
        do {
            try openWriter()
        } catch where error.isDiskError {
            let refused = error
            failure.withLock { $0 = refused }
        }
        reader.start()
    }

    /// Opens the writer connection: recovers rounds left in flight, counts
    /// what is held. On the caller's thread at init, then on the writer thread.
    private func openWriter() throws(StoreError) {
        let writer = try Writer(settings: settings)
        recovered = try writer.recover(now: clock.wallMilliseconds())
        let bytes = try writer.heldBytes()
        let counts = try writer.countRows()
        held.withLock { $0 = bytes }
        kept.withLock { $0 = counts }
        self.writer = writer
    }

    /// Why the store cannot write now (nil: the last write succeeded).
    public var unavailable: StoreError? { failure.withLock { $0 } }

    /// `handler` hears, on the writer thread, when writes fail and when they
    /// work again. Set it before `start`.
    public func observe(_ handler: @escaping @Sendable (StoreHealth) -> Void) {
        onHealth = handler
    }

    deinit { close() }

    /// The store's directory, made (0750, with its parents) if it is missing.
    static func createDirectory(containing path: String) throws(StoreError) {
        guard let slash = path.lastIndex(of: "/"), slash != path.startIndex else { return }
        let directory = String(path[..<slash])
        var made = directory.hasPrefix("/") ? "" : "."
        for part in directory.split(separator: "/") {
            made += "/" + part
            if mkdir(made, 0o750) != 0, errno != EEXIST {
                throw StoreError(SQLITE_CANTOPEN, "cannot create the directory \(made): \(String(cString: strerror(errno)))")
            }
        }
    }

    /// Starts the writer thread.
    public func start() {
        guard thread == nil else { return }
        thread = startThread("the store's writer thread") { self.runWriter() }
    }

    /// Commits what is waiting, puts rounds in flight back to `queued`, and
    /// ends the writer thread. Safe to call more than once.
    public func close() {
        if let thread {
            queue.stop()
            pthread_join(thread, nil)
            self.thread = nil
        }
        reader.stop()
        if let writer {
            if !crashed, (try? writer.requeueAtStop(now: clock.wallMilliseconds())) != nil {
                kept.withLock { $0.requeueInFlight() }
            }
            if !crashed { try? writer.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
            self.writer = nil
        }
        // The observer is usually its owner (Deliveries holds the store, the
        // handler holds Deliveries): let go of it, or the two keep each
        // other alive after the proxy stopped (LeakSanitizer saw the cycle).
        onHealth = { _ in }
    }

    public var heldBytes: Int { held.withLock { $0 } }

    /// Rows by upstream and state as of the last commit: a copy of a value
    /// behind a lock, no SQLite (all zero while the store could not be opened).
    public var counts: DeliveryCounts { kept.withLock { $0 } }

    // MARK: - Writes (group-committed on the writer thread)

    public func submit(_ delivery: NewDelivery, reply: @escaping @Sendable (SubmitResult) -> Void) {
        queue.push(.submit(delivery, enqueued: clock.now(), reply: reply))
    }

    /// Takes up to `limit` queued deliveries that are due (`next_attempt_at`
    /// passed), leaving those of `skipping` upstreams (whose rows it never
    /// reads: each upstream's queue is its own index range); first marks dead the
    /// queued ones past their `max_age`. The reply gets both.
    public func claim(
        limit: Int, skipping: [String],
        reply: @escaping @Sendable (_ claimed: [ClaimedDelivery], _ setAside: [SetAside]) -> Void
    ) {
        queue.push(.claim(limit: limit, skipping: skipping, reply: reply))
    }

    public func finish(id: String, _ outcome: DeliveryOutcome, reply: (@Sendable () -> Void)? = nil) {
        queue.push(.finish(id: id, outcome: outcome, reply: reply))
    }

    /// A dead delivery goes back to `queued` with its rounds counted from zero and a new `max_age`.
    public func replay(id: String, expiresAt: Int64, reply: @escaping @Sendable (ReplayResult) -> Void) {
        queue.push(.replay(id: id, expiresAt: expiresAt, reply: reply))
    }

    /// Deletes delivered and dead deliveries last changed before `retention` ago.
    public func purge(reply: @escaping @Sendable (Int) -> Void) {
        queue.push(.purge(reply: reply))
    }

    /// Queued deliveries of `upstream` become due now (it recovered).
    public func wake(upstream: String) {
        queue.push(.wake(upstream: upstream))
    }

    /// Tests only: stops as a process killed with -9 would, its rounds left
    /// `in_flight` in the file (a clean stop puts them back in the queue).
    func crash() {
        crashed = true
        close()
    }

    /// Tests only: runs `sql` on the writer's connection (such as `PRAGMA
    /// max_page_count`, to make the next write fail as on a full disk).
    func execute(_ sql: String, reply: @escaping @Sendable () -> Void) {
        queue.push(.execute(sql: sql, reply: reply))
    }

    // MARK: - Reads (on the reader thread)

    /// `id`'s record (nil: there is none), or why the store cannot be read
    /// (opened on a full disk, the file may not be readable yet: not knowing
    /// is not "no such delivery"). `reply` runs on the reader thread.
    public func record(id: String, reply: @escaping @Sendable (Result<DeliveryRecord?, StoreError>) -> Void) {
        reader.read { r in reply(r.flatMap { reader in Result { () throws(StoreError) in try reader.record(id: id) } }) }
    }

    /// Newest first; `after` is the `cursor` of the last record of the
    /// previous page. `reply` runs on the reader thread.
    public func list(
        state: DeliveryState?, upstream: String?, after: Int64?, limit: Int,
        reply: @escaping @Sendable (Result<[DeliveryRecord], StoreError>) -> Void
    ) {
        reader.read { r in
            reply(
                r.flatMap { reader in
                    Result { () throws(StoreError) in
                        try reader.list(state: state, upstream: upstream, after: after, limit: limit)
                    }
                })
        }
    }

    /// The counts, held bytes, and each upstream's pending deliveries with
    /// the oldest one's time (one indexed look-up per upstream that has
    /// some). `reply` runs on the reader thread; without a readable file,
    /// the pending deliveries are left out.
    public func stats(reply: @escaping @Sendable (StoreStats) -> Void) {
        let maxBytes = settings.maxBytes
        reader.read { [self] r in
            var stats = StoreStats(counts: counts, heldBytes: heldBytes, maxBytes: maxBytes)
            if case let .success(reader) = r {
                for (upstream, count) in stats.counts.pending {
                    guard let oldest = try? reader.oldestPending(upstream: upstream) else { continue }
                    stats.pending[upstream] = (count, oldest)
                }
            }
            reply(stats)
        }
    }

    // MARK: - The writer thread

    private func runWriter() {
        while true {
            // Without a writer connection, wake up to try opening it again
            // even when nothing is waiting.
            let wait = writer == nil || !deferred.isEmpty ? max(0, (nextReopen - clock.now()).nanoseconds) : nil
            guard var batch = queue.take(linger: Self.lingerNanoseconds, max: Self.maxBatch, wait: wait) else { return }
            if writer == nil, clock.now() >= nextReopen { reopen() }
            if writer != nil, !deferred.isEmpty, clock.now() >= nextReopen {
                nextReopen = clock.now() + settings.reopenInterval
                batch = deferred + batch
                deferred = []
            }
            if !batch.isEmpty { commit(batch) }
        }
    }

    /// Writer thread: one more try at opening the store.
    private func reopen() {
        nextReopen = clock.now() + settings.reopenInterval
        do {
            try openWriter()
            failure.withLock { $0 = nil }
            onHealth(.writable(requeued: recovered))
        } catch {
            writer = nil
            failure.withLock { $0 = error }
            onHealth(.failed(error))
        }
    }

    /// Writer thread: a write failed (every failure is reported).
    private func failed(_ error: StoreError) {
        failure.withLock { $0 = error }
        onHealth(.failed(error))
    }

    private func commit(_ batch: [WriterQueue.Op]) {
        guard let writer else {
            // Not open (the disk refused it): nothing can be written.
            let error = unavailable ?? StoreError(SQLITE_CANTOPEN, "the store is not open")
            for op in batch { Self.failedReply(op, error)() }
            return
        }
        let now = clock.wallMilliseconds()
        let before = Tally(held: heldBytes, counts: counts)
        var tally = before
        var replies: [() -> Void]
        let changesBefore = writer.connection.totalChanges
        var wrote = false
        do {
            replies = try transaction(batch, writer: writer, now: now, tally: &tally)
            wrote = writer.connection.totalChanges > changesBefore
        } catch {
            tally = before
            failed(error)
            // Nothing new was stored: every submit in the batch is refused;
            // the rest (finishes, claims, replays) is tried again on its own.
            replies = []
            var rest: [WriterQueue.Op] = []
            for op in batch {
                guard case let .submit(_, _, reply) = op else {
                    rest.append(op)
                    continue
                }
                replies.append { reply(.failed(error)) }
            }
            if !rest.isEmpty {
                do {
                    replies += try transaction(rest, writer: writer, now: now, tally: &tally)
                } catch {
                    tally = before
                    failed(error)
                    for op in rest {
                        if case .finish = op, error.isDiskError {
                            if deferred.isEmpty { nextReopen = clock.now() + settings.reopenInterval }
                            deferred.append(op)
                        } else {
                            replies.append(Self.failedReply(op, error))
                        }
                    }
                }
            }
        }
        // Only a commit that changed rows shows the disk takes writes again
        // (the dispatcher's claims commit every 100 ms, mostly changing nothing).
        if wrote, failure.withLock({ $0 }) != nil {
            failure.withLock { $0 = nil }
            onHealth(.writable(requeued: 0))
        }
        held.withLock { $0 = tally.held }
        if tally.counts != before.counts { kept.withLock { $0 = tally.counts } }
        let committed = clock.now()
        for op in batch {
            if case let .submit(_, enqueued, _) = op {
                onWrite(Double((committed - enqueued).nanoseconds) / 1e9)
            }
        }
        for reply in replies { reply() }
    }

    /// `ops` in one transaction; their replies, to run once it is committed.
    /// Rolled back (and `tally` left to the caller) if any of them fails.
    private func transaction(_ ops: [WriterQueue.Op], writer: Writer, now: Int64, tally: inout Tally)
        throws(StoreError) -> [() -> Void]
    {
        var replies: [() -> Void] = []
        do {
            try writer.begin.run()
            for op in ops {
                if let reply = try writer.apply(
                    op, now: now, retention: settings.retention, maxBytes: settings.maxBytes, tally: &tally)
                {
                    replies.append(reply)
                }
            }
            try writer.commit.run()
        } catch {
            try? writer.rollback.run()
            throw error
        }
        return replies
    }

    private static func failedReply(_ op: WriterQueue.Op, _ error: StoreError) -> () -> Void {
        switch op {
        case let .submit(_, _, reply): { reply(.failed(error)) }
        case let .claim(_, _, reply): { reply([], []) }
        case let .finish(_, _, reply): { reply?() }
        case let .replay(_, _, reply): { reply(.unknown) }
        case let .purge(reply): { reply(0) }
        case .wake: {}
        case let .execute(_, reply): { reply() }
        }
    }
}

// MARK: - The writer's inbox

/// Operations waiting for the writer thread, behind a pthread mutex and condition.
/// `@unchecked Sendable`: every access to its `var`s holds that mutex.
final class WriterQueue: @unchecked Sendable {
    enum Op {
        case submit(NewDelivery, enqueued: Instant, reply: @Sendable (SubmitResult) -> Void)
        case claim(
            limit: Int, skipping: [String],
            reply: @Sendable ([ClaimedDelivery], [SetAside]) -> Void)
        case finish(id: String, outcome: DeliveryOutcome, reply: (@Sendable () -> Void)?)
        case replay(id: String, expiresAt: Int64, reply: @Sendable (ReplayResult) -> Void)
        case purge(reply: @Sendable (Int) -> Void)
        case wake(upstream: String)
        /// Tests: a statement on the writer's connection, in the batch's transaction.
        case execute(sql: String, reply: @Sendable () -> Void)
    }

    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var ops: [Op] = []
    private var stopping = false

    init() {
        pthread_mutex_init(&mutex, nil)
        initMonotonicCondition(&condition)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func push(_ op: Op) {
        pthread_mutex_lock(&mutex)
        ops.append(op)
        let wake = ops.count == 1 || ops.count >= DeliveryStore.maxBatch
        pthread_mutex_unlock(&mutex)
        if wake { pthread_cond_signal(&condition) }
    }

    func stop() {
        pthread_mutex_lock(&mutex)
        stopping = true
        pthread_mutex_unlock(&mutex)
        pthread_cond_signal(&condition)
    }

    /// Waits for work, then lingers up to `linger` for more (unless `max`
    /// are waiting or the queue is stopping). Nil once stopped and empty.
    /// With `wait` (nanoseconds), empty once that passed with nothing to do.
    func take(linger: Int64, max: Int, wait: Int64? = nil) -> [Op]? {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        var until = wait.map(monotonicDeadline(after:)) ?? timespec()
        while ops.isEmpty {
            if stopping { return nil }
            if wait != nil {
                if pthread_cond_timedwait(&condition, &mutex, &until) == ETIMEDOUT, ops.isEmpty {
                    return stopping ? nil : []
                }
            } else {
                pthread_cond_wait(&condition, &mutex)
            }
        }
        if !stopping, ops.count < max {
            var deadline = monotonicDeadline(after: linger)
            while !stopping, ops.count < max {
                if pthread_cond_timedwait(&condition, &mutex, &deadline) == ETIMEDOUT { break }
            }
        }
        let n = Swift.min(ops.count, max)
        let batch = Array(ops.prefix(n))
        ops.removeFirst(n)
        return batch
    }
}

/// What a batch changes besides rows: the bytes held and the counts, kept
/// aside until its commit (a rollback leaves them as they were).
struct Tally: Equatable {
    var held: Int
    var counts: DeliveryCounts
}

/// The writer thread's connection and its prepared statements.
final class Writer {
    let connection: SQLiteConnection
    let begin, commit, rollback: Statement
    let insert, findByKey, expire, claim, delivered, requeue, dead, postpone, replay, purge, wake: Statement
    let payloadOfRound, stateOf: Statement
    /// Every upstream name a stored delivery was accepted for: the claims
    /// look at each one's queue (a name that left the configuration
    /// included: its deliveries are routed again when they are sent).
    private(set) var upstreams: Set<String> = []
    private var claimRotation = 0
    /// Deliveries set aside when the store opened, for the next claim to report.
    private var setAside: [SetAside] = []

    init(settings: StoreSettings) throws(StoreError) {
        let c = try SQLiteConnection(path: settings.path, readOnly: false)
        connection = c
        try c.execute("PRAGMA journal_mode = WAL")
        try c.execute("PRAGMA synchronous = \(settings.sync == .full ? "FULL" : "NORMAL")")
        // The WAL file shrinks back to this after a checkpoint.
        try c.execute("PRAGMA journal_size_limit = 8388608")
        try c.execute("PRAGMA secure_delete = OFF")
        // Sorts and temporary indexes in memory: no temporary files (a read-only root in a container).
        try c.execute("PRAGMA temp_store = MEMORY")
        try Schema.migrate(c, path: settings.path)
        // A backstop below the disk: SQLite itself refuses to grow past about
        // twice max_bytes (the store refuses new requests at max_bytes).
        let pageSize = try c.integer("PRAGMA page_size")
        let pages = (Int64(settings.maxBytes) * 2 + 64 << 20) / max(512, pageSize)
        try c.execute("PRAGMA max_page_count = \(pages)")

        begin = try c.prepare("BEGIN IMMEDIATE")
        commit = try c.prepare("COMMIT")
        rollback = try c.prepare("ROLLBACK")
        insert = try c.prepare(
            """
            INSERT INTO delivery (id, upstream, route, idem_key, request_id, method, target, headers, body,
              payload_bytes, max_attempts, next_attempt_at, expires_at, created_at, updated_at, idem_scope,
              idem_fingerprint)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?12, ?12, ?14, ?15)
            ON CONFLICT DO NOTHING
            """)
        findByKey = try c.prepare(
            "SELECT id, state, idem_fingerprint FROM delivery WHERE idem_scope = ?1 AND idem_key = ?2")
        expire = try c.prepare(
            """
            UPDATE delivery SET state = 3, updated_at = ?1, last_problem = CASE
                WHEN last_problem IS NULL THEN json_set(?2, '$.request_id', request_id)
                ELSE json_set(last_problem, '$.detail', ?3 || coalesce(json_extract(last_problem, '$.detail'), '')) END
            WHERE state = 0 AND expires_at <= ?1 RETURNING id, upstream
            """)
        // One upstream at a time, through its own index range: the rows of
        // an upstream being skipped are never read (a long outage's backlog
        // costs nothing until it recovers).
        claim = try c.prepare(
            """
            UPDATE delivery SET state = 1, attempts = attempts + 1, updated_at = ?1
            WHERE seq IN (SELECT seq FROM delivery WHERE state = 0 AND upstream = ?2 AND next_attempt_at <= ?1
                          ORDER BY next_attempt_at LIMIT ?3)
            RETURNING id, upstream, request_id, method, target, headers, body, attempts, max_attempts, expires_at
            """)
        delivered = try c.prepare(
            """
            UPDATE delivery SET state = 2, updated_at = ?2, last_status = ?3, last_problem = NULL, interrupted = 0,
              headers = NULL, body = NULL, payload_bytes = \(DeliveryStore.deliveredRowBytes)
            WHERE id = ?1 AND state = 1 RETURNING upstream
            """)
        requeue = try c.prepare(
            """
            UPDATE delivery SET state = 0, updated_at = ?2, next_attempt_at = ?3, last_status = ?4, last_problem = ?5,
              interrupted = 0
            WHERE id = ?1 AND state = 1 RETURNING upstream
            """)
        dead = try c.prepare(
            """
            UPDATE delivery SET state = 3, updated_at = ?2, last_status = ?3, last_problem = ?4, interrupted = 0
            WHERE id = ?1 AND state = 1 RETURNING upstream
            """)
        postpone = try c.prepare(
            """
            UPDATE delivery SET state = 0, attempts = attempts - 1, updated_at = ?2, next_attempt_at = ?3, interrupted = 0
            WHERE id = ?1 AND state = 1 RETURNING upstream
            """)
        replay = try c.prepare(
            """
            UPDATE delivery SET state = 0, attempts = 0, updated_at = ?2, next_attempt_at = ?2, expires_at = ?3,
              interrupted = 0
            WHERE id = ?1 AND state = 3 RETURNING upstream
            """)
        purge = try c.prepare(
            "DELETE FROM delivery WHERE state >= 2 AND updated_at < ?1 RETURNING payload_bytes, upstream, state")
        payloadOfRound = try c.prepare("SELECT payload_bytes FROM delivery WHERE id = ?1 AND state = 1")
        stateOf = try c.prepare("SELECT state FROM delivery WHERE id = ?1")
        let names = try c.prepare("SELECT DISTINCT upstream FROM delivery")
        while try names.step() { if let name = names.string(0) { upstreams.insert(name) } }
        wake = try c.prepare("UPDATE delivery SET next_attempt_at = ?2 WHERE state = 0 AND upstream = ?1 AND next_attempt_at > ?2")
    }

    /// At open: rounds still in flight were cut short by the process's
    /// death (`kill -9`, a crash). Each such start counts in the row's
    /// `interrupted`; at `interruptedRoundsBeforeSetAside` in a row the
    /// delivery is set aside (dead: it may be what kills the proxy), the
    /// others go back to `queued`, due now. Returns those queued again.
    func recover(now: Int64) throws(StoreError) -> Int {
        try connection.execute("BEGIN IMMEDIATE")
        do {
            let s = try connection.prepare(
                """
                UPDATE delivery SET state = 3, updated_at = ?1, interrupted = interrupted + 1,
                  last_problem = json_set(?2, '$.request_id', request_id)
                WHERE state = 1 AND interrupted + 1 >= ?3 RETURNING id, upstream
                """)
            s.bind(1, now)
            s.bind(2, DeliveryProblems.crashedTheProxy)
            s.bind(3, DeliveryStore.interruptedRoundsBeforeSetAside)
            while try s.step() { setAside.append((s.string(0) ?? "", s.string(1) ?? "", .crashedTheProxy)) }
            s.reset()
            try connection.execute(
                "UPDATE delivery SET state = 0, next_attempt_at = \(now), interrupted = interrupted + 1 WHERE state = 1")
            let requeued = connection.changes
            try connection.execute("COMMIT")
            return requeued
        } catch {
            try? connection.execute("ROLLBACK")
            throw error
        }
    }

    /// At a clean stop: rounds still in flight go back to `queued`. They did
    /// not crash the proxy, so their count of interrupted rounds starts again.
    func requeueAtStop(now: Int64) throws(StoreError) {
        try connection.execute("UPDATE delivery SET state = 0, next_attempt_at = \(now), interrupted = 0 WHERE state = 1")
    }

    func heldBytes() throws(StoreError) -> Int {
        Int(try connection.integer("SELECT coalesce(sum(payload_bytes), 0) FROM delivery"))
    }

    /// The rows by upstream and state, counted from the table: once when
    /// the writer opens (one scan), after which the writer keeps them.
    func countRows() throws(StoreError) -> DeliveryCounts {
        let s = try connection.prepare("SELECT upstream, state, count(*) FROM delivery GROUP BY upstream, state")
        var counts = DeliveryCounts()
        while try s.step() {
            guard let state = DeliveryState(rawValue: s.int(1)) else { continue }
            counts.add(s.int(2), state, upstream: s.string(0) ?? "")
        }
        return counts
    }

    /// Runs `s` (bound) to its end; each row's first column is the upstream
    /// of a row that went from `old` to `new`.
    private func moved(_ s: Statement, from old: DeliveryState, to new: DeliveryState, _ counts: inout DeliveryCounts)
        throws(StoreError) -> Int
    {
        defer { s.reset() }
        var n = 0
        while try s.step() {
            counts.move(upstream: s.string(0) ?? "", from: old, to: new)
            n += 1
        }
        return n
    }

    /// One operation inside the open transaction; its reply, to run after the commit.
    func apply(_ op: WriterQueue.Op, now: Int64, retention: Duration, maxBytes: Int, tally: inout Tally)
        throws(StoreError) -> (() -> Void)?
    {
        switch op {
        case let .submit(d, _, reply):
            if let key = d.idempotencyKey, let existing = try existing(scope: d.idempotencyScope, key: key) {
                return Self.repeated(existing, d, reply)
            }
            let bytes = d.payloadBytes
            if tally.held + bytes > maxBytes {
                let before = tally.held
                return { reply(.full(heldBytes: before, maxBytes: maxBytes)) }
            }
            let s = insert
            s.bind(1, d.id)
            s.bind(2, d.upstream)
            s.bind(3, d.route)
            s.bind(4, d.idempotencyKey)
            s.bind(5, d.requestID)
            s.bind(6, d.method)
            s.bind(7, d.target)
            d.headers.withUnsafeBytes { s.bind(8, bytes: $0) }
            s.bind(9, bytes: UnsafeRawBufferPointer(start: d.body.baseAddress, count: d.body.count))
            s.bind(10, bytes)
            s.bind(11, d.maxAttempts)
            s.bind(12, now)
            s.bind(13, d.expiresAt)
            s.bind(14, d.idempotencyScope)
            s.bind(15, d.fingerprint)
            try s.run()
            let inserted = connection.changes > 0
            if !inserted, let key = d.idempotencyKey, let existing = try existing(scope: d.idempotencyScope, key: key) {
                return Self.repeated(existing, d, reply)
            }
            if inserted {
                tally.held += bytes
                tally.counts.add(1, .queued, upstream: d.upstream)
            }
            upstreams.insert(d.upstream)
            let id = d.id
            return { reply(.stored(id: id)) }

        case let .claim(limit, skipping, reply):
            var expired = setAside
            setAside = []
            do {
                let s = expire
                defer { s.reset() }
                s.bind(1, now)
                s.bind(2, DeliveryProblems.expiredUnsent)
                s.bind(3, DeliveryProblems.expiredPrefix)
                while try s.step() {
                    let upstream = s.string(1) ?? ""
                    expired.append((s.string(0) ?? "", upstream, .maxAge))
                    tally.counts.move(upstream: upstream, from: .queued, to: .dead)
                }
            }
            var claimed: [ClaimedDelivery] = []
            // Each upstream's turn to go first moves on, so a busy one cannot take every round.
            let eligible = upstreams.filter { !skipping.contains($0) }.sorted()
            let first = eligible.isEmpty ? 0 : claimRotation % eligible.count
            claimRotation &+= 1
            for upstream in eligible[first...] + eligible[..<first] where claimed.count < limit {
                let s = claim
                defer { s.reset() }
                s.bind(1, now)
                s.bind(2, upstream)
                s.bind(3, limit - claimed.count)
                while try s.step() {
                    tally.counts.move(upstream: s.string(1) ?? "", from: .queued, to: .inFlight)
                    let body = s.bytes(6)
                    claimed.append(
                        ClaimedDelivery(
                            id: s.string(0) ?? "", upstream: s.string(1) ?? "", requestID: s.string(2) ?? "",
                            method: s.string(3) ?? "GET", target: s.string(4) ?? "/", headers: s.bytes(5),
                            body: body.isEmpty ? .empty : RequestBody(body), attempts: s.int(7),
                            maxAttempts: s.int(8), expiresAt: s.int64(9)))
                }
            }
            return { reply(claimed, expired) }

        case let .finish(id, outcome, reply):
            switch outcome {
            case let .delivered(status):
                // The row keeps its id, key and times (status URL, Idempotency-Key) but not the request.
                let before = try payloadBytes(id: id)
                let s = delivered
                s.bind(1, id)
                s.bind(2, now)
                s.bind(3, status)
                if try moved(s, from: .inFlight, to: .delivered, &tally.counts) > 0, let before {
                    tally.held += DeliveryStore.deliveredRowBytes - before
                }
            case let .retry(at, status, problem):
                let s = requeue
                s.bind(1, id)
                s.bind(2, now)
                s.bind(3, at)
                s.bind(4, status)
                s.bind(5, problem)
                _ = try moved(s, from: .inFlight, to: .queued, &tally.counts)
            case let .dead(status, problem):
                let s = dead
                s.bind(1, id)
                s.bind(2, now)
                s.bind(3, status)
                s.bind(4, problem)
                _ = try moved(s, from: .inFlight, to: .dead, &tally.counts)
            case let .postpone(at):
                let s = postpone
                s.bind(1, id)
                s.bind(2, now)
                s.bind(3, at)
                _ = try moved(s, from: .inFlight, to: .queued, &tally.counts)
            }
            return reply.map { r in { r() } }

        case let .replay(id, expiresAt, reply):
            let s = replay
            s.bind(1, id)
            s.bind(2, now)
            s.bind(3, expiresAt)
            if try moved(s, from: .dead, to: .queued, &tally.counts) > 0 { return { reply(.replayed) } }
            let state = try self.state(id: id)
            return { reply(state.map(ReplayResult.notDead) ?? .unknown) }

        case let .purge(reply):
            let s = purge
            defer { s.reset() }
            s.bind(1, now - retention.nanoseconds / 1_000_000)
            var count = 0
            while try s.step() {
                tally.held -= s.int(0)
                if let state = DeliveryState(rawValue: s.int(2)) { tally.counts.add(-1, state, upstream: s.string(1) ?? "") }
                count += 1
            }
            return { reply(count) }

        case let .wake(upstream):
            let s = wake
            s.bind(1, upstream)
            s.bind(2, now)
            try s.run()
            return nil

        case let .execute(sql, reply):
            try connection.execute(sql)
            // Tests: the statement may have changed any row.
            tally.counts = try countRows()
            return { reply() }
        }
    }

    private func existing(scope: String?, key: String) throws(StoreError)
        -> (id: String, state: DeliveryState, fingerprint: String?)?
    {
        let s = findByKey
        defer { s.reset() }
        s.bind(1, scope)
        s.bind(2, key)
        guard try s.step() else { return nil }
        return (s.string(0) ?? "", DeliveryState(rawValue: s.int(1)) ?? .queued, s.string(2))
    }

    /// A key already stored in this scope: the same request gets the
    /// stored delivery; another request with that key is refused, and
    /// learns nothing of the first.
    private static func repeated(
        _ existing: (id: String, state: DeliveryState, fingerprint: String?), _ d: NewDelivery,
        _ reply: @escaping @Sendable (SubmitResult) -> Void
    ) -> () -> Void {
        if existing.fingerprint != d.fingerprint { return { reply(.keyReused) } }
        let (id, state) = (existing.id, existing.state)
        return { reply(.existing(id: id, state: state)) }
    }


    private func payloadBytes(id: String) throws(StoreError) -> Int? {
        let s = payloadOfRound
        defer { s.reset() }
        s.bind(1, id)
        return try s.step() ? s.int(0) : nil
    }

    private func state(id: String) throws(StoreError) -> DeliveryState? {
        let s = stateOf
        defer { s.reset() }
        s.bind(1, id)
        return try s.step() ? DeliveryState(rawValue: s.int(0)) : nil
    }
}

/// Problems the store itself writes: a delivery past its `max_age`.
enum DeliveryProblems {
    /// No round ever ended (its upstream stayed unreachable or its circuit open).
    static let expiredUnsent = Problem(
        .upstreamUnreachable, requestID: "",
        detail: "Not delivered within its delivery.max_age: no delivery round was started "
            + "(the upstream stayed unreachable or its circuit breaker open)."
    ).json()
    /// Put before the last round's own detail.
    static let expiredPrefix = "Not delivered within its delivery.max_age. The last round: "
    /// The same, as it is written inside a JSON string (it holds nothing to escape).
    static let expiredPrefixJSON = String(JSON.quote(expiredPrefix).dropFirst().dropLast())
    /// Set aside: a round of it was in flight at two deaths of the proxy in a row.
    static let crashedTheProxy = Problem(
        .badGateway, requestID: "",
        detail: "Set aside: it crashed the proxy. A round of this delivery was in flight when the proxy stopped "
            + "without warning (kill -9, a crash, a replica lost with its lease) at two starts in a row, so it is "
            + "not sent a third time by itself. Look for the cause in the proxy's log before those starts, then "
            + "replay it."
    ).json()
}
