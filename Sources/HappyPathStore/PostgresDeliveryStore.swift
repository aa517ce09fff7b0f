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
/// `Locked`, and operations reach the writer through `WriterQueue`.
public final class PostgresDeliveryStore: DeliveryStoring, @unchecked Sendable {
    public let settings: PostgresStoreSettings
    private let clock: Clock
    private let onWrite: @Sendable (Double) -> Void
    private let queue = WriterQueue()
    private var thread: pthread_t?
    private let readers: PostgresReadPool

    // Writer-thread state.
    private var writer: PostgresWriter?
    private var nextConnect: Instant
    private var backoff: Duration
    private var nextRenew: Instant
    private var nextRecount: Instant
    /// Round ends written while the database was unreachable: written again once it is back.
    private var deferred: [WriterQueue.Op] = []
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
        guard thread == nil else { return }
        thread = startThread("the store's writer thread") { self.runWriter() }
    }

    /// Commits what is waiting, puts this replica's rounds in flight back in
    /// the queue, and ends the threads. Safe to call more than once.
    public func close() {
        if let thread {
            queue.stop()
            pthread_join(thread, nil)
            self.thread = nil
        }
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
            guard var batch = queue.take(linger: DeliveryStore.lingerNanoseconds, max: DeliveryStore.maxBatch, wait: wait)
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

    private func commit(_ batch: [WriterQueue.Op]) {
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
            var rest: [WriterQueue.Op] = []
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
    private func refuse(_ ops: [WriterQueue.Op], _ error: StoreError) {
        for op in ops {
            if case .finish = op, error.kind == .unreachable {
                deferred.append(op)
                continue
            }
            switch op {
            case let .submit(_, _, reply): reply(.failed(error))
            case let .claim(_, _, reply): reply([], [])
            case let .finish(_, _, reply): reply?()
            case let .replay(_, _, reply): reply(.unknown)
            case let .purge(reply): reply(0)
            case .wake: break
            case let .execute(_, reply): reply()
            }
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

// MARK: - The writer's connection

/// The writer thread's connection and what it runs.
final class PostgresWriter {
    struct Claim {
        let attempts: Int
        let payloadBytes: Int
    }

    /// What a batch changes besides rows, kept aside until its commit.
    struct Work {
        var tally: Tally
        var claims: [String: Claim]
    }

    let connection: PostgresConnection
    let leaseMilliseconds: Int64
    /// The upstreams with queued rows, as of the last claim: the claims
    /// look at each one's queue.
    private(set) var upstreams: Set<String> = []
    private var claimRotation = 0
    /// Deliveries set aside when leases were taken back, for the next claim to report.
    private var setAside: [SetAside] = []

    init(settings: PostgresStoreSettings) throws(StoreError) {
        connection = try PostgresConnection(url: settings.url)
        try PostgresSchema.migrate(connection)
        leaseMilliseconds = max(1, settings.lease.nanoseconds / 1_000_000)
    }

    static let columns = "seq, id, state, attempts, max_attempts, upstream, route, request_id, method, target, created_at, updated_at, next_attempt_at, expires_at, last_status, last_problem"

    /// The rows by upstream and state, and the payload bytes they hold.
    func count() throws(StoreError) -> (DeliveryCounts, Int) {
        let rows = try connection.execute(
            "SELECT upstream, state, count(*), coalesce(sum(payload_bytes), 0) FROM happypath_delivery GROUP BY upstream, state"
        )
        var counts = DeliveryCounts()
        var bytes = 0
        for i in 0..<rows.count {
            let upstream = rows.text(i, 0) ?? ""
            bytes += Int(rows.int(i, 3) ?? 0)
            guard let state = DeliveryState(rawValue: Int(rows.int(i, 1) ?? -1)) else { continue }
            counts.add(Int(rows.int(i, 2) ?? 0), state, upstream: upstream)
        }
        return (counts, bytes)
    }

    /// The upstreams with queued rows, whichever replica stored them: one
    /// index probe per upstream (a loose scan of `happypath_delivery_due`),
    /// not a pass over the queue, however long a backlog is.
    func refreshUpstreams() throws(StoreError) {
        let rows = try connection.execute(
            """
            WITH RECURSIVE u AS (
              (SELECT upstream FROM happypath_delivery WHERE state = 0 ORDER BY upstream LIMIT 1)
              UNION ALL
              SELECT (SELECT d.upstream FROM happypath_delivery d WHERE d.state = 0 AND d.upstream > u.upstream
                      ORDER BY d.upstream LIMIT 1)
              FROM u WHERE u.upstream IS NOT NULL)
            SELECT upstream FROM u WHERE upstream IS NOT NULL
            """)
        upstreams = Set((0..<rows.count).compactMap { rows.text($0, 0) })
    }

    /// Rows whose lease ran out (their replica stopped renewing it: it died)
    /// go back to the queue, due now; the upstreams of those rows. A lease
    /// lost counts as a round interrupted by a crash, as in the SQLite store:
    /// at `interruptedRoundsBeforeSetAside` in a row the delivery is set
    /// aside (dead) instead, reported by the next claim. Needs a transaction
    /// (a claim's), or runs as two.
    func takeBackExpiredLeases(now: Int64) throws(StoreError) -> (requeued: [String], setAside: [String]) {
        let dead = try connection.execute(
            """
            UPDATE happypath_delivery SET state = 3, updated_at = $1, lease_until = NULL, interrupted = interrupted + 1,
              last_problem = replace($2, '"request_id":""', '"request_id":' || to_json(request_id)::text)
            WHERE state = 1 AND lease_until <= $1 AND interrupted + 1 >= $3 RETURNING id, upstream
            """,
            [
                .int(now), .text(DeliveryProblems.crashedTheProxy),
                .int(Int64(DeliveryStore.interruptedRoundsBeforeSetAside)),
            ])
        for i in 0..<dead.count { setAside.append((dead.text(i, 0) ?? "", dead.text(i, 1) ?? "", .crashedTheProxy)) }
        let rows = try connection.execute(
            """
            UPDATE happypath_delivery SET state = 0, next_attempt_at = $1, lease_until = NULL, interrupted = interrupted + 1
            WHERE state = 1 AND lease_until <= $1 RETURNING upstream
            """, [.int(now)])
        return ((0..<rows.count).map { rows.text($0, 0) ?? "" }, (0..<dead.count).map { dead.text($0, 1) ?? "" })
    }

    func renew(_ ids: [String], until: Int64) throws(StoreError) {
        try connection.execute(
            "UPDATE happypath_delivery SET lease_until = $1 WHERE state = 1 AND id = ANY($2::text[])",
            [.int(until), .textArray(ids)])
    }

    func release(_ ids: [String], now: Int64) throws(StoreError) -> Int {
        try connection.execute(
            """
            UPDATE happypath_delivery SET state = 0, next_attempt_at = $1, lease_until = NULL, interrupted = 0
            WHERE state = 1 AND id = ANY($2::text[])
            """, [.int(now), .textArray(ids)]
        ).changed
    }

    /// `ops` in one transaction; their replies, to run once it is committed.
    func transaction(_ ops: [WriterQueue.Op], now: Int64, settings: PostgresStoreSettings, work: inout Work)
        throws(StoreError) -> [() -> Void]
    {
        var replies: [() -> Void] = []
        var staged = work
        defer { pending = [] }
        try connection.transaction { () throws(StoreError) in
            for op in ops {
                if case let .submit(d, _, _) = op, d.idempotencyKey == nil {
                } else {
                    try flushInserts(now: now, work: &staged)
                }
                if let reply = try apply(op, now: now, settings: settings, work: &staged) { replies.append(reply) }
            }
            try flushInserts(now: now, work: &staged)
        }
        work = staged
        return replies
    }

    /// A stored request's fate, known once its batch's `INSERT` ran.
    final class Inserted {
        var yes = true
    }

    /// Requests without an `Idempotency-Key` waiting to go in, together, in
    /// one multi-row `INSERT` (one round trip to the database for the lot).
    private var pending: [(delivery: NewDelivery, bytes: Int, outcome: Inserted)] = []
    static let insertColumns = 15

    private func flushInserts(now: Int64, work: inout Work) throws(StoreError) {
        guard !pending.isEmpty else { return }
        var values: [String] = []
        var parameters: [PostgresValue] = []
        parameters.reserveCapacity(pending.count * Self.insertColumns)
        for (d, bytes, _) in pending {
            let n = parameters.count
            values.append("(" + (1...Self.insertColumns).map { "$\(n + $0)" }.joined(separator: ", ") + ", $\(n + 14), $\(n + 14))")
            parameters += Self.insertValues(d, bytes: bytes, now: now)
        }
        let rows = try connection.execute(
            """
            INSERT INTO happypath_delivery (id, upstream, route, idem_scope, idem_key, idem_fingerprint, request_id,
              method, target, headers, body, payload_bytes, max_attempts, next_attempt_at, expires_at, created_at, updated_at)
            VALUES \(values.joined(separator: ", ")) ON CONFLICT DO NOTHING RETURNING id
            """, parameters)
        let inserted = Set((0..<rows.count).compactMap { rows.text($0, 0) })
        for (d, bytes, outcome) in pending where !inserted.contains(d.id) {
            // Another row has this id (never in practice: 128 random bits).
            outcome.yes = false
            work.tally.held -= bytes
            work.tally.counts.add(-1, .queued, upstream: d.upstream)
        }
        pending = []
    }

    static func insertValues(_ d: NewDelivery, bytes: Int, now: Int64) -> [PostgresValue] {
        let body = d.body.count == 0 ? [] : Array(UnsafeRawBufferPointer(start: d.body.baseAddress, count: d.body.count))
        return [
            .text(d.id), .text(d.upstream), .text(d.route), .optional(d.idempotencyScope), .optional(d.idempotencyKey),
            .optional(d.fingerprint), .text(d.requestID), .text(d.method), .text(d.target), .bytes(d.headers),
            .bytes(body), .int(Int64(bytes)), .int(Int64(d.maxAttempts)), .int(now), .int(d.expiresAt),
        ]
    }

    /// Runs an `UPDATE … RETURNING upstream`; each row moved from `old` to `new`.
    private func moved(
        _ sql: String, _ parameters: [PostgresValue], from old: DeliveryState, to new: DeliveryState,
        _ counts: inout DeliveryCounts
    ) throws(StoreError) -> Int {
        let rows = try connection.execute(sql, parameters)
        for i in 0..<rows.count { counts.move(upstream: rows.text(i, 0) ?? "", from: old, to: new) }
        return rows.count
    }

    func apply(_ op: WriterQueue.Op, now: Int64, settings: PostgresStoreSettings, work: inout Work)
        throws(StoreError) -> (() -> Void)?
    {
        switch op {
        case let .submit(d, _, reply):
            if let key = d.idempotencyKey, let existing = try existing(scope: d.idempotencyScope, key: key) {
                return Self.repeated(existing, d, reply)
            }
            let bytes = d.payloadBytes
            if work.tally.held + bytes > settings.maxBytes {
                let before = work.tally.held
                let max = settings.maxBytes
                return { reply(.full(heldBytes: before, maxBytes: max)) }
            }
            let id = d.id
            if d.idempotencyKey == nil {
                // With the others of its batch, in one INSERT (`flushInserts`).
                let outcome = Inserted()
                pending.append((d, bytes, outcome))
                work.tally.held += bytes
                work.tally.counts.add(1, .queued, upstream: d.upstream)
                return {
                    reply(
                        outcome.yes
                            ? .stored(id: id)
                            : .failed(StoreError(PostgresConnection.statementFailed, "a delivery with the id \(id) is already stored")))
                }
            }
            let inserted = try connection.execute(
                """
                INSERT INTO happypath_delivery (id, upstream, route, idem_scope, idem_key, idem_fingerprint, request_id,
                  method, target, headers, body, payload_bytes, max_attempts, next_attempt_at, expires_at, created_at, updated_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $14, $14)
                ON CONFLICT DO NOTHING
                """, Self.insertValues(d, bytes: bytes, now: now)
            ).changed > 0
            if !inserted, let key = d.idempotencyKey, let existing = try existing(scope: d.idempotencyScope, key: key) {
                return Self.repeated(existing, d, reply)
            }
            if inserted {
                work.tally.held += bytes
                work.tally.counts.add(1, .queued, upstream: d.upstream)
            }
            return { reply(.stored(id: id)) }

        case let .claim(limit, skipping, reply):
            let takenBack = try takeBackExpiredLeases(now: now)
            for upstream in takenBack.requeued { work.tally.counts.move(upstream: upstream, from: .inFlight, to: .queued) }
            for upstream in takenBack.setAside { work.tally.counts.move(upstream: upstream, from: .inFlight, to: .dead) }
            var expired = setAside
            setAside = []
            let rows = try connection.execute(
                """
                UPDATE happypath_delivery SET state = 3, updated_at = $1, last_problem = CASE
                    WHEN last_problem IS NULL THEN replace($2, '"request_id":""', '"request_id":' || to_json(request_id)::text)
                    ELSE replace(last_problem, '"detail":"', '"detail":"' || $3) END
                WHERE state = 0 AND expires_at <= $1 RETURNING id, upstream
                """, [.int(now), .text(DeliveryProblems.expiredUnsent), .text(DeliveryProblems.expiredPrefixJSON)])
            for i in 0..<rows.count {
                let upstream = rows.text(i, 1) ?? ""
                expired.append((rows.text(i, 0) ?? "", upstream, .maxAge))
                work.tally.counts.move(upstream: upstream, from: .queued, to: .dead)
            }
            try refreshUpstreams()
            var claimed: [ClaimedDelivery] = []
            let eligible = upstreams.filter { !skipping.contains($0) }.sorted()
            let first = eligible.isEmpty ? 0 : claimRotation % eligible.count
            claimRotation &+= 1
            for upstream in eligible[first...] + eligible[..<first] where claimed.count < limit {
                // Rows another replica is claiming right now are skipped, not
                // waited for. The rows are picked once, in a CTE (a subquery
                // under `IN` may run again and pick more than the limit).
                let rows = try connection.execute(
                    """
                    WITH picked AS (
                      SELECT seq FROM happypath_delivery WHERE state = 0 AND upstream = $2 AND next_attempt_at <= $1
                      ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED)
                    UPDATE happypath_delivery d SET state = 1, attempts = d.attempts + 1, updated_at = $1, lease_until = $4
                    FROM picked WHERE d.seq = picked.seq
                    RETURNING d.id, d.upstream, d.request_id, d.method, d.target, d.headers, d.body, d.attempts,
                      d.max_attempts, d.expires_at, d.payload_bytes
                    """,
                    [.int(now), .text(upstream), .int(Int64(limit - claimed.count)), .int(now + leaseMilliseconds)])
                for i in 0..<rows.count {
                    let id = rows.text(i, 0) ?? ""
                    let attempts = Int(rows.int(i, 7) ?? 1)
                    work.tally.counts.move(upstream: rows.text(i, 1) ?? "", from: .queued, to: .inFlight)
                    work.claims[id] = Claim(attempts: attempts, payloadBytes: Int(rows.int(i, 10) ?? 0))
                    let body = rows.bytes(i, 6) ?? []
                    claimed.append(
                        ClaimedDelivery(
                            id: id, upstream: rows.text(i, 1) ?? "", requestID: rows.text(i, 2) ?? "",
                            method: rows.text(i, 3) ?? "GET", target: rows.text(i, 4) ?? "/", headers: rows.bytes(i, 5) ?? [],
                            body: body.isEmpty ? .empty : RequestBody(body), attempts: attempts,
                            maxAttempts: Int(rows.int(i, 8) ?? 1), expiresAt: rows.int(i, 9) ?? 0))
                }
            }
            return { reply(claimed, expired) }

        case let .finish(id, outcome, reply):
            // Only this replica's round of it: after a lease ran out, the row is another round's.
            guard let claim = work.claims.removeValue(forKey: id) else { return reply.map { r in { r() } } }
            let round: [PostgresValue] = [.text(id), .int(now), .int(Int64(claim.attempts))]
            let mine = "id = $1 AND state = 1 AND attempts = $3"
            switch outcome {
            case let .delivered(status):
                // The row keeps its id, key and times (status URL, Idempotency-Key) but not the request.
                if try moved(
                    """
                    UPDATE happypath_delivery SET state = 2, updated_at = $2, last_status = $4, last_problem = NULL,
                      interrupted = 0, headers = ''::bytea, body = ''::bytea, payload_bytes = \(DeliveryStore.deliveredRowBytes), lease_until = NULL
                    WHERE \(mine) RETURNING upstream
                    """, round + [.int(Int64(status))], from: .inFlight, to: .delivered, &work.tally.counts) > 0
                {
                    work.tally.held += DeliveryStore.deliveredRowBytes - claim.payloadBytes
                }
            case let .retry(at, status, problem):
                _ = try moved(
                    """
                    UPDATE happypath_delivery SET state = 0, updated_at = $2, next_attempt_at = $4, last_status = $5,
                      last_problem = $6, lease_until = NULL, interrupted = 0
                    WHERE \(mine) RETURNING upstream
                    """, round + [.int(at), .optional(status), .text(problem)], from: .inFlight, to: .queued,
                    &work.tally.counts)
            case let .dead(status, problem):
                _ = try moved(
                    """
                    UPDATE happypath_delivery SET state = 3, updated_at = $2, last_status = $4, last_problem = $5,
                      lease_until = NULL, interrupted = 0
                    WHERE \(mine) RETURNING upstream
                    """, round + [.optional(status), .text(problem)], from: .inFlight, to: .dead, &work.tally.counts)
            case let .postpone(at):
                _ = try moved(
                    """
                    UPDATE happypath_delivery SET state = 0, attempts = attempts - 1, updated_at = $2, next_attempt_at = $4,
                      lease_until = NULL, interrupted = 0
                    WHERE \(mine) RETURNING upstream
                    """, round + [.int(at)], from: .inFlight, to: .queued, &work.tally.counts)
            }
            return reply.map { r in { r() } }

        case let .replay(id, expiresAt, reply):
            if try moved(
                """
                UPDATE happypath_delivery SET state = 0, attempts = 0, updated_at = $2, next_attempt_at = $2, expires_at = $3,
                  interrupted = 0
                WHERE id = $1 AND state = 3 RETURNING upstream
                """, [.text(id), .int(now), .int(expiresAt)], from: .dead, to: .queued, &work.tally.counts) > 0
            {
                return { reply(.replayed) }
            }
            let rows = try connection.execute("SELECT state FROM happypath_delivery WHERE id = $1", [.text(id)])
            let state = rows.count > 0 ? rows.int(0, 0).flatMap { DeliveryState(rawValue: Int($0)) } : nil
            return { reply(state.map(ReplayResult.notDead) ?? .unknown) }

        case let .purge(reply):
            let rows = try connection.execute(
                "DELETE FROM happypath_delivery WHERE state >= 2 AND updated_at < $1 RETURNING payload_bytes, upstream, state",
                [.int(now - settings.retention.nanoseconds / 1_000_000)])
            for i in 0..<rows.count {
                work.tally.held -= Int(rows.int(i, 0) ?? 0)
                if let state = DeliveryState(rawValue: Int(rows.int(i, 2) ?? -1)) {
                    work.tally.counts.add(-1, state, upstream: rows.text(i, 1) ?? "")
                }
            }
            let count = rows.count
            return { reply(count) }

        case let .wake(upstream):
            try connection.execute(
                "UPDATE happypath_delivery SET next_attempt_at = $2 WHERE state = 0 AND upstream = $1 AND next_attempt_at > $2",
                [.text(upstream), .int(now)])
            return nil

        case let .execute(sql, reply):
            try connection.execute(sql)
            let (counts, bytes) = try count()
            work.tally = Tally(held: bytes, counts: counts)
            return { reply() }
        }
    }

    private func existing(scope: String?, key: String) throws(StoreError)
        -> (id: String, state: DeliveryState, fingerprint: String?)?
    {
        let rows = try connection.execute(
            "SELECT id, state, idem_fingerprint FROM happypath_delivery WHERE idem_scope IS NOT DISTINCT FROM $1 AND idem_key = $2",
            [.optional(scope), .text(key)])
        guard rows.count > 0 else { return nil }
        return (rows.text(0, 0) ?? "", DeliveryState(rawValue: Int(rows.int(0, 1) ?? 0)) ?? .queued, rows.text(0, 2))
    }

    /// A key already stored in this scope: the same request gets the stored
    /// delivery; another request with that key is refused, and learns nothing of the first.
    private static func repeated(
        _ existing: (id: String, state: DeliveryState, fingerprint: String?), _ d: NewDelivery,
        _ reply: @escaping @Sendable (SubmitResult) -> Void
    ) -> () -> Void {
        if existing.fingerprint != d.fingerprint { return { reply(.keyReused) } }
        let (id, state) = (existing.id, existing.state)
        return { reply(.existing(id: id, state: state)) }
    }
}

// MARK: - Reads

/// The reads, on a reader thread's connection. Before the writer has
/// created the table (a replica's first seconds on a new database), there
/// is nothing to read, which is no error.
enum PostgresReads {
    static let undefinedTable = "42P01"

    static func record(_ c: PostgresConnection, id: String) throws(StoreError) -> DeliveryRecord? {
        let rows: PostgresRows
        do {
            rows = try c.execute("SELECT \(PostgresWriter.columns) FROM happypath_delivery WHERE id = $1", [.text(id)])
        } catch where error.sqlState == undefinedTable {
            return nil
        }
        return rows.count > 0 ? record(rows, 0) : nil
    }

    static func list(_ c: PostgresConnection, state: DeliveryState?, upstream: String?, after: Int64?, limit: Int)
        throws(StoreError) -> [DeliveryRecord]
    {
        var conditions: [String] = []
        var parameters: [PostgresValue] = []
        if let state {
            parameters.append(.int(Int64(state.rawValue)))
            conditions.append("state = $\(parameters.count)")
        }
        if let upstream {
            parameters.append(.text(upstream))
            conditions.append("upstream = $\(parameters.count)")
        }
        if let after {
            parameters.append(.int(after))
            conditions.append("seq < $\(parameters.count)")
        }
        parameters.append(.int(Int64(limit)))
        let filter = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        let rows: PostgresRows
        do {
            rows = try c.execute(
                "SELECT \(PostgresWriter.columns) FROM happypath_delivery \(filter) ORDER BY seq DESC LIMIT $\(parameters.count)",
                parameters)
        } catch where error.sqlState == undefinedTable {
            return []
        }
        return (0..<rows.count).map { record(rows, $0) }
    }

    static func oldestPending(_ c: PostgresConnection, upstream: String) throws(StoreError) -> Int64? {
        try c.execute("SELECT min(created_at) FROM happypath_delivery WHERE upstream = $1 AND state < 2", [.text(upstream)])
            .int(0, 0)
    }

    static func record(_ rows: PostgresRows, _ i: Int) -> DeliveryRecord {
        DeliveryRecord(
            cursor: rows.int(i, 0) ?? 0, id: rows.text(i, 1) ?? "",
            state: DeliveryState(rawValue: Int(rows.int(i, 2) ?? 0)) ?? .queued, attempts: Int(rows.int(i, 3) ?? 0),
            maxAttempts: Int(rows.int(i, 4) ?? 0), upstream: rows.text(i, 5) ?? "", route: rows.text(i, 6) ?? "",
            requestID: rows.text(i, 7) ?? "", method: rows.text(i, 8) ?? "", target: rows.text(i, 9) ?? "",
            createdAt: rows.int(i, 10) ?? 0, updatedAt: rows.int(i, 11) ?? 0, nextAttemptAt: rows.int(i, 12) ?? 0,
            expiresAt: rows.int(i, 13) ?? 0, lastStatus: rows.int(i, 14).map { Int($0) }, lastProblem: rows.text(i, 15))
    }
}

/// Reader threads, each with a connection of its own (made on first use,
/// and again after one is lost), taking reads from one queue in order.
/// `@unchecked Sendable`: the queue is behind a pthread mutex and
/// condition; each connection is its thread's only.
final class PostgresReadPool: @unchecked Sendable {
    typealias Job = @Sendable (Result<PostgresConnection, StoreError>) -> Void

    private let url: String
    private let count: Int
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var jobs: [Job] = []
    private var running = false
    private var stopping = false
    private var threads: [pthread_t] = []

    init(url: String, threads: Int) {
        self.url = url
        count = threads
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func start() {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        guard threads.isEmpty, !stopping else { return }
        for _ in 0..<count {
            threads.append(startThread("the store's reader threads") { self.run() })
        }
        running = true
    }

    /// Answers the reads already handed over, then ends the threads.
    func stop() {
        pthread_mutex_lock(&mutex)
        stopping = true
        let all = threads
        threads = []
        pthread_mutex_unlock(&mutex)
        pthread_cond_broadcast(&condition)
        for t in all { pthread_join(t, nil) }
    }

    func read(_ job: @escaping Job) {
        pthread_mutex_lock(&mutex)
        guard running, !stopping else {
            pthread_mutex_unlock(&mutex)
            return job(.failure(StoreError(PostgresConnection.connectFailed, "the delivery store is not open")))
        }
        jobs.append(job)
        pthread_mutex_unlock(&mutex)
        pthread_cond_signal(&condition)
    }

    private func run() {
        var connection: PostgresConnection?
        while let job = take() {
            if connection == nil || connection?.isUsable == false {
                do throws(StoreError) {
                    connection = try PostgresConnection(url: url)
                } catch {
                    connection = nil
                    job(.failure(error))
                    continue
                }
            }
            job(.success(connection!))
        }
    }

    private func take() -> Job? {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        while jobs.isEmpty {
            if stopping {
                running = false
                return nil
            }
            pthread_cond_wait(&condition, &mutex)
        }
        return jobs.removeFirst()
    }
}
