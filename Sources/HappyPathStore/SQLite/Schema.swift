import CSQLite

/// One rung of the schema ladder: a function that takes a store of schema
/// `version - 1` to `version`. It runs inside the transaction that also
/// sets `PRAGMA user_version`, so a step is applied whole or not at all.
struct SchemaMigration: Sendable {
    let version: Int
    /// What the step changes, for the reader of the ladder.
    let summary: String
    let apply: @Sendable (SQLiteConnection) throws(StoreError) -> Void
}

/// The store's schema: `PRAGMA user_version` says which rung of `ladder` a
/// file stands on (0: a new, empty file). The writer climbs the rest at
/// open, one transaction per step; a file from a newer happypath (a
/// version above the top) is refused and left untouched.
enum Schema {
    /// In order: the step to version n is `ladder[n - 1]`.
    static let ladder: [SchemaMigration] = [
        SchemaMigration(
            version: 1, summary: "the delivery table and its indexes (keys unique per upstream)",
            apply: { c throws(StoreError) in try c.execute(version1) }),
        SchemaMigration(
            version: 2,
            summary: "idem_scope and idem_fingerprint: a key is unique per scope, no longer per upstream",
            apply: migrateTo2),
        SchemaMigration(
            version: 3,
            summary: "interrupted: the starts in a row that found a round of the delivery in flight (a crash loop is set aside)",
            apply: { c throws(StoreError) in
                try c.execute("ALTER TABLE delivery ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0")
            }),
    ]

    /// The newest schema this build knows.
    static var version: Int { ladder.count }

    /// Takes the file on `c` to `target` (the newest by default), one
    /// transaction per step; refuses a file newer than this build knows.
    static func migrate(_ c: SQLiteConnection, path: String, to target: Int = version) throws(StoreError) {
        let found = Int(try c.integer("PRAGMA user_version"))
        guard found <= version else { throw StoreError(SQLITE_ERROR, tooNew(path: path, found: found)) }
        for step in ladder where step.version > found && step.version <= target {
            try c.execute("BEGIN IMMEDIATE")
            do {
                // Read again under the write lock: another connection may
                // have climbed this step meanwhile.
                if try c.integer("PRAGMA user_version") < Int64(step.version) {
                    try step.apply(c)
                    try c.execute("PRAGMA user_version = \(step.version)")
                }
                try c.execute("COMMIT")
            } catch {
                try? c.execute("ROLLBACK")
                throw error
            }
        }
    }

    /// What `serve` says about a store written by a newer happypath.
    static func tooNew(path: String, found: Int) -> String {
        "\(path) has delivery store schema version \(found), written by a newer happypath; this build supports "
            + "schema versions up to \(version). Run a happypath that supports version \(found), or point "
            + "storage.path at another file."
    }

    // MARK: - The steps

    /// Schema 1, as the first happypath with a store made it (later builds
    /// of schema 1 replaced `delivery_due` by the two indexes below, without
    /// a new version: step 2 puts either kind of file right).
    static let version1 = """
        CREATE TABLE IF NOT EXISTS delivery (
          seq INTEGER PRIMARY KEY,
          id TEXT NOT NULL UNIQUE,
          upstream TEXT NOT NULL,
          route TEXT NOT NULL,
          idem_key TEXT,
          request_id TEXT NOT NULL,
          method TEXT NOT NULL,
          target TEXT NOT NULL,
          headers BLOB,
          body BLOB,
          payload_bytes INTEGER NOT NULL,
          state INTEGER NOT NULL DEFAULT 0,
          attempts INTEGER NOT NULL DEFAULT 0,
          max_attempts INTEGER NOT NULL,
          next_attempt_at INTEGER NOT NULL,
          expires_at INTEGER NOT NULL,
          created_at INTEGER NOT NULL,
          updated_at INTEGER NOT NULL,
          last_status INTEGER,
          last_problem TEXT
        );
        CREATE UNIQUE INDEX IF NOT EXISTS delivery_idem ON delivery(upstream, idem_key) WHERE idem_key IS NOT NULL;
        CREATE INDEX IF NOT EXISTS delivery_due_by_upstream ON delivery(upstream, next_attempt_at) WHERE state = 0;
        CREATE INDEX IF NOT EXISTS delivery_expiry ON delivery(expires_at) WHERE state = 0;
        CREATE INDEX IF NOT EXISTS delivery_done ON delivery(updated_at) WHERE state >= 2;
        CREATE INDEX IF NOT EXISTS delivery_pending ON delivery(upstream, created_at) WHERE state < 2;
        """

    /// Schema 1 to 2, in place: the two columns are added (NULL in the rows
    /// already stored: their keys are matched by no new request, see
    /// docs/deliver-later.md) and the per-upstream key index is replaced.
    /// A first-cut file of schema 1 also gets the claim's per-upstream
    /// index and the expiry index in place of `delivery_due`.
    static func migrateTo2(_ c: SQLiteConnection) throws(StoreError) {
        let columns = try c.prepare("SELECT count(*) FROM pragma_table_info('delivery') WHERE name = 'idem_scope'")
        let missing = try columns.step() && columns.int(0) == 0
        columns.reset()
        if missing {
            try c.execute(
                """
                ALTER TABLE delivery ADD COLUMN idem_scope TEXT;
                ALTER TABLE delivery ADD COLUMN idem_fingerprint TEXT;
                """)
        }
        try c.execute(
            """
            DROP INDEX IF EXISTS delivery_idem;
            CREATE UNIQUE INDEX IF NOT EXISTS delivery_idem_scope ON delivery(idem_scope, idem_key) WHERE idem_key IS NOT NULL;
            DROP INDEX IF EXISTS delivery_due;
            CREATE INDEX IF NOT EXISTS delivery_due_by_upstream ON delivery(upstream, next_attempt_at) WHERE state = 0;
            CREATE INDEX IF NOT EXISTS delivery_expiry ON delivery(expires_at) WHERE state = 0;
            """)
    }

    // MARK: - Reading rows

    static let recordColumns = """
        seq, id, state, attempts, max_attempts, upstream, route, request_id, method, target, created_at, updated_at,
        next_attempt_at, expires_at, last_status, last_problem
        """

    static func record(_ s: Statement) -> DeliveryRecord {
        DeliveryRecord(
            cursor: s.int64(0), id: s.string(1) ?? "", state: DeliveryState(rawValue: s.int(2)) ?? .queued,
            attempts: s.int(3), maxAttempts: s.int(4), upstream: s.string(5) ?? "", route: s.string(6) ?? "",
            requestID: s.string(7) ?? "", method: s.string(8) ?? "", target: s.string(9) ?? "", createdAt: s.int64(10),
            updatedAt: s.int64(11), nextAttemptAt: s.int64(12), expiresAt: s.int64(13),
            lastStatus: s.isNull(14) ? nil : s.int(14), lastProblem: s.string(15))
    }
}
