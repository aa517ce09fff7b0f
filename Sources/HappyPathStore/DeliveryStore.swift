import CSQLite
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

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
/// `Locked` or atomics, and operations reach the writer through a `JobQueue`.
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

    /// Operations for the writer thread, which is the queue's.
    private let queue = JobQueue<WriterOp>(name: "store-writer")
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
    private var deferred: [WriterOp] = []
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
        queue.start { [self] _ in runWriter() }
    }

    /// Commits what is waiting, puts rounds in flight back to `queued`, and
    /// ends the writer thread. Safe to call more than once.
    public func close() {
        queue.stop()
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
            guard var batch = queue.take(max: Self.maxBatch, .linger(Self.lingerNanoseconds, idle: wait)) else { return }
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

    private func commit(_ batch: [WriterOp]) {
        guard let writer else {
            // Not open (the disk refused it): nothing can be written.
            let error = unavailable ?? StoreError(SQLITE_CANTOPEN, "the store is not open")
            for op in batch { op.fail(error) }
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
            var rest: [WriterOp] = []
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
                            replies.append { op.fail(error) }
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
    private func transaction(_ ops: [WriterOp], writer: Writer, now: Int64, tally: inout Tally)
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
}
