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
/// `@unchecked Sendable`: its `var`s are the writer thread's (set before that
/// thread starts, then touched only there); what callers read is in
/// `Locked`, and operations reach the writer through a `JobQueue`.
public final class PostgresDeliveryStore: DeliveryStoring, @unchecked Sendable {
    public let settings: PostgresStoreSettings
    private let clock: Clock
    private let onWrite: @Sendable (Double) -> Void
    /// Operations for the writer thread, which is the queue's.
    private let queue = JobQueue<WriterOp>(name: "pg-writer")
    private let readers: PostgresReadPool

    // Writer-thread state.
    private var writer: PostgresWriter?
    private var nextConnect: Instant
    private var backoff: Duration
    private var nextRenew: Instant
    private var nextRecount: Instant
    /// Round ends written while the database was unreachable: written again once it is back.
    private var deferred: [WriterOp] = []
    /// This replica's rounds in flight: the round (`attempts`) each lease is for, and its payload bytes.
    private var claims: [String: PostgresWriter.Claim] = [:]

    private let held = Locked(0)
    private let kept = Locked(DeliveryCounts())
    private let failure = Locked<StoreError?>(nil)
    private let takenBack = Locked(0)
    private let crashed = Locked(false)
    private let connected = Locked(false)
    private var onHealth: @Sendable (StoreHealth) -> Void = { _ in }

    public init(settings: PostgresStoreSettings, clock: Clock, onWrite: @escaping @Sendable (Double) -> Void = { _ in }) {
        self.settings = settings
        self.clock = clock
        self.onWrite = onWrite
        let now = clock.now()
        nextConnect = now
        backoff = settings.reconnectMin
        nextRenew = now
        nextRecount = now
        readers = PostgresReadPool(url: settings.url, threads: max(1, settings.pool - 1))
        // Reads are answered from the start, as with SQLite: a status URL may
        // be asked before the writer starts (each reader connects on first use).
        readers.start()
    }

    deinit { close() }

    /// Rounds whose lease had run out (a replica gone) put back in the queue
    /// when this store first connected.
    public var recovered: Int { takenBack.withLock { $0 } }
    public var unavailable: StoreError? { failure.withLock { $0 } }
    /// Connected, and the last write went in.
    public var writable: Bool { connected.withLock { $0 } && unavailable == nil }
    public var heldBytes: Int { held.withLock { $0 } }
    public var counts: DeliveryCounts { kept.withLock { $0 } }
    public var maxBytes: Int { settings.maxBytes }

    public func observe(_ handler: @escaping @Sendable (StoreHealth) -> Void) { onHealth = handler }

    /// Starts the writer (which connects first) and the readers.
    public func start() {
        queue.start { [self] _ in runWriter() }
    }

    /// Commits what is waiting, puts this replica's rounds in flight back in
    /// the queue, and ends the threads. Safe to call more than once.
    public func close() {
        queue.stop()
        readers.stop()
        onHealth = { _ in }
    }

    // MARK: - Writes

    public func submit(_ delivery: NewDelivery, reply: @escaping @Sendable (SubmitResult) -> Void) {
        queue.push(.submit(delivery, enqueued: clock.now(), reply: reply))
    }

    public func claim(
        limit: Int, skipping: [String],
        reply: @escaping @Sendable (_ claimed: [ClaimedDelivery], _ setAside: [SetAside]) -> Void
    ) {
        queue.push(.claim(limit: limit, skipping: skipping, reply: reply))
    }

    public func finish(id: String, _ outcome: DeliveryOutcome, reply: (@Sendable () -> Void)? = nil) {
        queue.push(.finish(id: id, outcome: outcome, reply: reply))
    }

    public func replay(id: String, expiresAt: Int64, reply: @escaping @Sendable (ReplayResult) -> Void) {
        queue.push(.replay(id: id, expiresAt: expiresAt, reply: reply))
    }

    public func purge(reply: @escaping @Sendable (Int) -> Void) { queue.push(.purge(reply: reply)) }

    public func wake(upstream: String) { queue.push(.wake(upstream: upstream)) }

    /// Tests only: stops as a process killed with -9 would, its rounds left
    /// in flight under leases nobody renews.
    func crash() {
        crashed.withLock { $0 = true }
        close()
    }

    /// Tests only: runs `sql` on the writer's connection, in a batch's transaction.
    func execute(_ sql: String, reply: @escaping @Sendable () -> Void) { queue.push(.execute(sql: sql, reply: reply)) }

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
            if case let .success(c) = r {
                for (upstream, count) in stats.counts.pending {
                    guard let oldest = try? PostgresReads.oldestPending(c, upstream: upstream) else { continue }
                    stats.pending[upstream] = (count, oldest)
                }
            }
            reply(stats)
        }
    }

    // MARK: - The writer thread

    private func runWriter() {
        while true {
            let now = clock.now()
            var wake = writer == nil ? nextConnect : nextRecount
            if writer != nil, !claims.isEmpty { wake = min(wake, nextRenew) }
            let wait = max(0, (wake - now).nanoseconds)
            guard var batch = queue.take(max: DeliveryStore.maxBatch, .linger(DeliveryStore.lingerNanoseconds, idle: wait))
            else { break }
            if writer == nil, clock.now() >= nextConnect { connect() }
            if writer != nil, !deferred.isEmpty {
                batch = deferred + batch
                deferred = []
            }
            // Leases first: a claim in this batch must not take back this
            // replica's own rounds for want of a renewal.
            if writer != nil { maintain() }
            if !batch.isEmpty { commit(batch) }
            if writer != nil { maintain() }
        }
        // Stopping: this replica's rounds in flight go back to the queue now
        // rather than when their leases end.
        if let writer, !claims.isEmpty, !crashed.withLock({ $0 }) {
            _ = try? writer.release(Array(claims.keys), now: clock.wallMilliseconds())
            claims = [:]
        }
        writer = nil
    }

    private func connect() {
        do {
            let w = try PostgresWriter(settings: settings)
            // Rounds that ran on through the outage keep their leases, if
            // no other replica took them back meanwhile.
            if !claims.isEmpty { try w.renew(Array(claims.keys), until: clock.wallMilliseconds() + w.leaseMilliseconds) }
            let returned = try w.takeBackExpiredLeases(now: clock.wallMilliseconds()).requeued.count
            let (counts, bytes) = try w.count()
            writer = w
            connected.withLock { $0 = true }
            backoff = settings.reconnectMin
            held.withLock { $0 = bytes }
            kept.withLock { $0 = counts }
            nextRecount = clock.now() + settings.recountEvery
            nextRenew = clock.now()
            takenBack.withLock { $0 += returned }
            let wasFailing = failure.withLock { f in
                defer { f = nil }
                return f != nil
            }
            if wasFailing || returned > 0 { onHealth(.writable(requeued: returned)) }
        } catch {
            lost(error)
        }
    }

    /// The connection failed or could not be made: no writer until the next try.
    private func lost(_ error: StoreError) {
        writer = nil
        connected.withLock { $0 = false }
        nextConnect = clock.now() + backoff
        backoff = min(backoff * 2, settings.reconnectMax)
        failed(error)
    }

    private func failed(_ error: StoreError) {
        failure.withLock { $0 = error }
        onHealth(.failed(error))
    }

    /// Renews this replica's leases and counts the table again, when due.
    private func maintain() {
        guard let writer else { return }
        let now = clock.now()
        do {
            if !claims.isEmpty, now >= nextRenew {
                try writer.renew(Array(claims.keys), until: clock.wallMilliseconds() + writer.leaseMilliseconds)
                nextRenew = now + settings.lease / 3
            }
            if now >= nextRecount {
                let (counts, bytes) = try writer.count()
                held.withLock { $0 = bytes }
                kept.withLock { $0 = counts }
                nextRecount = now + settings.recountEvery
            }
        } catch where error.kind == .unreachable {
            lost(error)
        } catch {
            failed(error)
        }
    }

    private func commit(_ batch: [WriterOp]) {
        guard let writer else { return refuse(batch, unavailable ?? Self.notConnected) }
        let now = clock.wallMilliseconds()
        var work = PostgresWriter.Work(tally: Tally(held: heldBytes, counts: counts), claims: claims)
        var replies: [() -> Void] = []
        do {
            replies = try writer.transaction(batch, now: now, settings: settings, work: &work)
            published(work)
        } catch {
            if error.kind == .unreachable {
                lost(error)
                return refuse(batch, error)
            }
            failed(error)
            // A statement refused: the submits in the batch are refused;
            // the rest (round ends, claims, replays) is tried on its own.
            var rest: [WriterOp] = []
            for op in batch {
                guard case let .submit(_, _, reply) = op else {
                    rest.append(op)
                    continue
                }
                replies.append { reply(.failed(error)) }
            }
            if !rest.isEmpty {
                work = PostgresWriter.Work(tally: Tally(held: heldBytes, counts: counts), claims: claims)
                do {
                    replies += try writer.transaction(rest, now: now, settings: settings, work: &work)
                    published(work)
                } catch {
                    if error.kind == .unreachable { lost(error) } else { failed(error) }
                    refuse(rest, error)
                }
            }
        }
        let committed = clock.now()
        for op in batch {
            if case let .submit(_, enqueued, _) = op { onWrite(Double((committed - enqueued).nanoseconds) / 1e9) }
        }
        for reply in replies { reply() }
    }

    /// A batch committed: its counts, bytes and claims become the store's.
    private func published(_ work: PostgresWriter.Work) {
        claims = work.claims
        held.withLock { $0 = work.tally.held }
        kept.withLock { $0 = work.tally.counts }
        let wasFailing = failure.withLock { f in
            defer { f = nil }
            return f != nil
        }
        if wasFailing { onHealth(.writable(requeued: 0)) }
    }

    /// Ops that could not be written. A round's end waits for the database
    /// (its lease is renewed meanwhile, if it comes back in time); the rest
    /// are answered as failed.
    private func refuse(_ ops: [WriterOp], _ error: StoreError) {
        for op in ops {
            if case .finish = op, error.kind == .unreachable {
                deferred.append(op)
                continue
            }
            op.fail(error)
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
