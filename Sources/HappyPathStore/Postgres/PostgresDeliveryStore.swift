import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// `storage.url` and what goes with it: the shared store's settings.
public struct PostgresStoreSettings: Sendable {
    /// `postgres://user:password@host:port/db?sslmode=…` (or libpq's `key=value` form).
    public var url: String
    /// Connections: one for the writer thread, the rest for reader threads (at least one).
    public var pool: Int
    /// A claimed delivery whose replica stops renewing its lease (it died)
    /// goes back to the queue this long after the last renewal.
    public var lease: Duration
    public var maxBytes: Int
    public var retention: Duration
    /// After a lost connection, the first try again; then doubled up to `reconnectMax`.
    public var reconnectMin: Duration
    /// The longest wait between tries while the database is down. Kept
    /// short (1 s): a try against a server that is not there costs a
    /// refused connection, and `later` routes answer again within about a
    /// second of the database coming back (with a cap of 30 s, a restart
    /// that took 16 s left them refusing for 15 s more).
    public var reconnectMax: Duration
    /// How often the counts (and the bytes held) are counted again from the
    /// table, which every replica writes.
    public var recountEvery: Duration

    public init(
        url: String, pool: Int = 4, lease: Duration = .seconds(30), maxBytes: Int, retention: Duration,
        reconnectMin: Duration = .milliseconds(500), reconnectMax: Duration = .seconds(1), recountEvery: Duration = .seconds(2)
    ) {
        self.url = url
        self.pool = pool
        self.lease = lease
        self.maxBytes = maxBytes
        self.retention = retention
        self.reconnectMin = reconnectMin
        self.reconnectMax = reconnectMax
        self.recountEvery = recountEvery
    }

}

/// The shared delivery store: one PostgreSQL database that every replica
/// uses at once (docs/deliver-later.md, "Which store").
///
/// Writes go through one writer thread with its own connection and are
/// group-committed as in `DeliveryStore`: whatever is waiting (after a
/// millisecond's linger) goes in one transaction. Reads (status URLs,
/// listings, the oldest pending delivery) run on `pool - 1` reader threads,
/// each with a connection of its own. No event loop ever waits for the database.
///
/// Replicas share the queue: a claim takes due rows with `FOR UPDATE SKIP
/// LOCKED` and gives each a lease (`lease_until`); the writer renews the
/// leases of its rounds in flight every third of `lease`, and a round's end
/// is written only if the row is still that round's (same `attempts`). A
/// replica that dies (`kill -9`) leaves its leases to run out: any
/// replica's next claim puts those rows back in the queue. A replica that
/// stops cleanly puts its own back at once.
///
/// The counts and the bytes held are counted again from the table every
/// `recountEvery` (other replicas change them), and kept in step with this
/// replica's own commits in between; `storage.max_bytes` is enforced against them.
///
/// The database unreachable (at start or later): every write is refused
/// with `.failed` (the proxy answers 503 STORE_UNAVAILABLE), round ends are
/// kept and written once it is back, and the writer connects again after
/// 0.5 s, then every second. Nothing accepted is lost: a 202 was answered only
/// after its commit.
///
///
/// The writer thread owns its connection and state (`PostgresWriterLoop`);
/// what callers read is in `StoreShared`; each reader thread's connection
/// is its own (`PostgresReadPool`).
public final class PostgresDeliveryStore: DeliveryStoring, Sendable {
    public let settings: PostgresStoreSettings
    private let clock: Clock
    /// Operations for the writer thread, which is the queue's: started with
    /// the store, working (connecting first) from `start`.
    private let queue = JobQueue<WriterOp>.writer(name: "pg-writer")
    private let readers: PostgresReadPool
    /// What the writer publishes (bytes held, counts, failure), read by anyone.
    private let shared: StoreShared

    public init(settings: PostgresStoreSettings, clock: Clock, onWrite: @escaping @Sendable (Double) -> Void = { _ in }) {
        self.settings = settings
        self.clock = clock
        shared = StoreShared(onWrite: onWrite)
        readers = PostgresReadPool(url: settings.url, threads: max(1, settings.pool - 1))
        // Reads are answered from the start, as with SQLite: a status URL may
        // be asked before the writer starts (each reader connects on first use).
        readers.start()
        let loop = PostgresWriterLoop(settings: settings, clock: clock, shared: shared)
        queue.start { queue in loop.run(queue) }
    }

    deinit { close() }

    /// Rounds whose lease had run out (a replica gone) put back in the queue
    /// when this store first connected.
    public var recovered: Int { shared.recovered.withLock { $0 } }
    public var unavailable: StoreError? { shared.failure.withLock { $0 } }
    /// Connected, and the last write went in.
    public var writable: Bool { shared.connected.withLock { $0 } && unavailable == nil }
    public var heldBytes: Int { shared.held.withLock { $0 } }
    public var counts: DeliveryCounts { shared.kept.withLock { $0 } }
    public var maxBytes: Int { settings.maxBytes }

    public func observe(_ handler: @escaping @Sendable (StoreHealth) -> Void) { shared.observe(handler) }

    /// Lets the writer work (it connects first); the readers already do.
    public func start() {
        queue.release()
    }

    /// Commits what is waiting, puts this replica's rounds in flight back in
    /// the queue, and ends the threads. Safe to call more than once.
    public func close() {
        queue.stop()
        readers.stop()
        shared.forgetObserver()
    }

    // MARK: - Writes

    public func submit(_ delivery: NewDelivery, reply: @escaping @Sendable (SubmitResult) -> Void) {
        queue.hand(.submit(delivery, enqueued: clock.now(), reply: reply))
    }

    public func claim(
        limit: Int, skipping: [String],
        reply: @escaping @Sendable (_ claimed: [ClaimedDelivery], _ setAside: [SetAside]) -> Void
    ) {
        queue.hand(.claim(limit: limit, skipping: skipping, reply: reply))
    }

    public func finish(id: String, _ outcome: DeliveryOutcome, reply: (@Sendable () -> Void)? = nil) {
        queue.hand(.finish(id: id, outcome: outcome, reply: reply))
    }

    public func replay(id: String, expiresAt: Int64, reply: @escaping @Sendable (ReplayResult) -> Void) {
        queue.hand(.replay(id: id, expiresAt: expiresAt, reply: reply))
    }

    public func purge(reply: @escaping @Sendable (Int) -> Void) { queue.hand(.purge(reply: reply)) }

    public func wake(upstream: String) { queue.hand(.wake(upstream: upstream)) }

    /// Tests only: stops as a process killed with -9 would, its rounds left
    /// in flight under leases nobody renews.
    func crash() {
        shared.crashed.withLock { $0 = true }
        close()
    }

    /// Tests only: runs `sql` on the writer's connection, in a batch's transaction.
    func execute(_ sql: String, reply: @escaping @Sendable () -> Void) { queue.hand(.execute(sql: sql, reply: reply)) }

    // MARK: - Reads

    public func record(id: String, reply: @escaping @Sendable (Result<DeliveryRecord?, StoreError>) -> Void) {
        readers.read { r in
            reply(r.flatMap { c in Result { () throws(StoreError) in try PostgresReads.record(c, id: id) } })
        }
    }

    public func list(
        state: DeliveryState?, upstream: String?, after: Int64?, limit: Int,
        reply: @escaping @Sendable (Result<[DeliveryRecord], StoreError>) -> Void
    ) {
        readers.read { r in
            reply(
                r.flatMap { c in
                    Result { () throws(StoreError) in
                        try PostgresReads.list(c, state: state, upstream: upstream, after: after, limit: limit)
                    }
                })
        }
    }

    public func stats(reply: @escaping @Sendable (StoreStats) -> Void) {
        let maxBytes = settings.maxBytes
        readers.read { [self] r in
            var stats = StoreStats(counts: counts, heldBytes: heldBytes, maxBytes: maxBytes)
            if case let .failure(error) = r, error.isBusy { stats.readersBusy = true }
            if case let .success(c) = r {
                for (upstream, count) in stats.counts.pending {
                    guard let oldest = try? PostgresReads.oldestPending(c, upstream: upstream) else { continue }
                    stats.pending[upstream] = (count, oldest)
                }
            }
            reply(stats)
        }
    }

    static let notConnected = StoreError(PostgresConnection.connectFailed, "not connected to PostgreSQL yet")

    /// `happypath check --connect`: connects, and says which schema version
    /// the database holds (0: none yet; the proxy creates it at start).
    public static func probe(url: String) throws(StoreError) -> (found: Int, supported: Int) {
        let c = try PostgresConnection(url: url)
        return (try PostgresSchema.found(c), PostgresSchema.version)
    }
}
