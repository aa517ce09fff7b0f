import HappyPathCore

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
    func transaction(_ ops: [WriterOp], now: Int64, settings: PostgresStoreSettings, work: inout Work)
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

    func apply(_ op: WriterOp, now: Int64, settings: PostgresStoreSettings, work: inout Work)
        throws(StoreError) -> (() -> Void)?
    {
        switch op {
        case let .submit(d, _, reply):
            if let answer = try WriterOp.answerBeforeInsert(
                d, held: work.tally.held, maxBytes: settings.maxBytes, storedWith: existing(scope:key:), reply)
            {
                return answer
            }
            let bytes = d.payloadBytes
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
                return WriterOp.repeated(existing, d, reply)
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
}
