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
///
/// The writer thread owns its connection and state (`SQLiteWriterLoop`);
/// what callers read is in `StoreShared`; the reader thread's connection
/// is its own (`StoreReader`).
public final class DeliveryStore: Sendable {
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
    /// Operations for the writer thread, which is the queue's: started as
    /// the store opens, working from `start`.
    private let queue = JobQueue<WriterOp>.writer(name: "store-writer")
    /// The reads' thread and its read-only connection.
    private let reader: StoreReader
    /// What the writer publishes (bytes held, counts, failure), read by anyone.
    private let shared: StoreShared

    /// Throws if the store cannot be used at all (its directory cannot be
    /// made, the file is not a store, or a newer schema). A disk that
    /// refuses writes is not such an error: the store starts unavailable
    /// (`failure` says why) and opens itself once the disk takes writes.
    public init(settings: StoreSettings, clock: Clock, onWrite: @escaping @Sendable (Double) -> Void = { _ in })
        throws(StoreError)
    {
        self.settings = settings
        self.clock = clock
        shared = StoreShared(onWrite: onWrite)
        try Self.createDirectory(containing: settings.path)
        // The file holds clients' headers (credentials among them): readable
        // by this user only. SQLite gives its -wal and -shm files the same mode.
        let fd = open(settings.path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        if fd >= 0 {
            fchmod(fd, 0o600)
            Glibc.close(fd)
        }
        reader = StoreReader(path: settings.path)
        let loop = SQLiteWriterLoop(settings: settings, clock: clock, shared: shared)
        do {
            try loop.open()
        } catch where error.isDiskError {
            shared.failure.withLock { $0 = error }
        }
        reader.start()
        queue.start { queue in loop.run(queue) }
    }

    /// Rows put back from `in_flight` to `queued` when the store opened
    /// (those set aside instead are not counted: the next claim reports them).
    public var recovered: Int { shared.recovered.withLock { $0 } }

    /// Why the store cannot write now (nil: the last write succeeded).
    public var unavailable: StoreError? { shared.failure.withLock { $0 } }

    /// `handler` hears, on the writer thread, when writes fail and when they
    /// work again. Set it before `start`.
    public func observe(_ handler: @escaping @Sendable (StoreHealth) -> Void) {
        shared.observe(handler)
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

    /// Lets the writer thread work (it was started as the store opened).
    public func start() {
        queue.release()
    }

    /// Commits what is waiting, puts rounds in flight back to `queued`, and
    /// ends the writer thread (which does both). Safe to call more than once.
    public func close() {
        // The reader's connection closes first, so that the writer's last
        // checkpoint finds no reader.
        reader.stop()
        queue.stop()
        shared.forgetObserver()
    }

    public var heldBytes: Int { shared.held.withLock { $0 } }

    /// Rows by upstream and state as of the last commit: a copy of a value
    /// behind a lock, no SQLite (all zero while the store could not be opened).
    public var counts: DeliveryCounts { shared.kept.withLock { $0 } }

    // MARK: - Writes (group-committed on the writer thread)

    public func submit(_ delivery: NewDelivery, reply: @escaping @Sendable (SubmitResult) -> Void) {
        queue.hand(.submit(delivery, enqueued: clock.now(), reply: reply))
    }

    /// Takes up to `limit` queued deliveries that are due (`next_attempt_at`
    /// passed), leaving those of `skipping` upstreams (whose rows it never
    /// reads: each upstream's queue is its own index range); first marks dead the
    /// queued ones past their `max_age`. The reply gets both.
    public func claim(
        limit: Int, skipping: [String],
        reply: @escaping @Sendable (_ claimed: [ClaimedDelivery], _ setAside: [SetAside]) -> Void
    ) {
        queue.hand(.claim(limit: limit, skipping: skipping, reply: reply))
    }

    public func finish(id: String, _ outcome: DeliveryOutcome, reply: (@Sendable () -> Void)? = nil) {
        queue.hand(.finish(id: id, outcome: outcome, reply: reply))
    }

    /// A dead delivery goes back to `queued` with its rounds counted from zero and a new `max_age`.
    public func replay(id: String, expiresAt: Int64, reply: @escaping @Sendable (ReplayResult) -> Void) {
        queue.hand(.replay(id: id, expiresAt: expiresAt, reply: reply))
    }

    /// Deletes delivered and dead deliveries last changed before `retention` ago.
    public func purge(reply: @escaping @Sendable (Int) -> Void) {
        queue.hand(.purge(reply: reply))
    }

    /// Queued deliveries of `upstream` become due now (it recovered).
    public func wake(upstream: String) {
        queue.hand(.wake(upstream: upstream))
    }

    /// Tests only: stops as a process killed with -9 would, its rounds left
    /// `in_flight` in the file (a clean stop puts them back in the queue).
    func crash() {
        shared.crashed.withLock { $0 = true }
        close()
    }

    /// Tests only: runs `sql` on the writer's connection (such as `PRAGMA
    /// max_page_count`, to make the next write fail as on a full disk).
    func execute(_ sql: String, reply: @escaping @Sendable () -> Void) {
        queue.hand(.execute(sql: sql, reply: reply))
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
    /// some). `reply` runs on the reader thread (or at once on the caller's,
    /// when the readers are busy or the store closed); without a readable
    /// file, the pending deliveries are left out (busy readers: `readersBusy`).
    public func stats(reply: @escaping @Sendable (StoreStats) -> Void) {
        let maxBytes = settings.maxBytes
        reader.read { [self] r in
            var stats = StoreStats(counts: counts, heldBytes: heldBytes, maxBytes: maxBytes)
            if case let .failure(error) = r, error.isBusy { stats.readersBusy = true }
            if case let .success(reader) = r {
                for (upstream, count) in stats.counts.pending {
                    guard let oldest = try? reader.oldestPending(upstream: upstream) else { continue }
                    stats.pending[upstream] = (count, oldest)
                }
            }
            reply(stats)
        }
    }
}
