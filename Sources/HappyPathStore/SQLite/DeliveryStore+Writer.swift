import CSQLite
import HappyPathCore

// MARK: - The writer's connection

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
    func apply(_ op: WriterOp, now: Int64, retention: Duration, maxBytes: Int, tally: inout Tally)
        throws(StoreError) -> (() -> Void)?
    {
        switch op {
        case let .submit(d, _, reply):
            if let answer = try WriterOp.answerBeforeInsert(
                d, held: tally.held, maxBytes: maxBytes, storedWith: existing(scope:key:), reply)
            {
                return answer
            }
            let bytes = d.payloadBytes
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
                return WriterOp.repeated(existing, d, reply)
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
