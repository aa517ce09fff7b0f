/// The shared store's schema in PostgreSQL, as a ladder of numbered steps
/// like SQLite's (`Schema`): each step is applied once, in a transaction of
/// its own, and the version reached is kept in `happypath_schema`. Several
/// replicas may start at once: the climb holds a session advisory lock, so
/// one climbs and the others find it done. A database whose version is
/// newer than this build is refused, not touched.
enum PostgresSchema {
    struct Step: Sendable {
        let version: Int
        let summary: String
        let sql: String
    }

    /// The advisory lock's key (any constant unique to happypath: "happypath" in ASCII, folded).
    static let lockKey: Int64 = 0x6861_7070_7970_6174

    static let ladder: [Step] = [
        Step(
            version: 1,
            summary: "the delivery table, with leases, and the indexes for claims, expiry and listings",
            sql: """
                CREATE TABLE happypath_delivery (
                  seq BIGSERIAL PRIMARY KEY,
                  id TEXT NOT NULL UNIQUE,
                  upstream TEXT NOT NULL,
                  route TEXT NOT NULL,
                  idem_scope TEXT,
                  idem_key TEXT,
                  idem_fingerprint TEXT,
                  request_id TEXT NOT NULL,
                  method TEXT NOT NULL,
                  target TEXT NOT NULL,
                  headers BYTEA NOT NULL,
                  body BYTEA NOT NULL,
                  payload_bytes BIGINT NOT NULL,
                  state SMALLINT NOT NULL DEFAULT 0,
                  attempts INTEGER NOT NULL DEFAULT 0,
                  max_attempts INTEGER NOT NULL,
                  next_attempt_at BIGINT NOT NULL,
                  expires_at BIGINT NOT NULL,
                  lease_until BIGINT,
                  created_at BIGINT NOT NULL,
                  updated_at BIGINT NOT NULL,
                  last_status INTEGER,
                  last_problem TEXT
                );
                CREATE UNIQUE INDEX happypath_delivery_idem ON happypath_delivery (idem_scope, idem_key)
                  WHERE idem_key IS NOT NULL;
                CREATE INDEX happypath_delivery_due ON happypath_delivery (upstream, next_attempt_at) WHERE state = 0;
                CREATE INDEX happypath_delivery_leases ON happypath_delivery (lease_until) WHERE state = 1;
                CREATE INDEX happypath_delivery_expiry ON happypath_delivery (expires_at) WHERE state = 0;
                CREATE INDEX happypath_delivery_done ON happypath_delivery (updated_at) WHERE state >= 2;
                CREATE INDEX happypath_delivery_pending ON happypath_delivery (upstream, created_at) WHERE state < 2;
                """),
        Step(
            version: 2,
            summary: "interrupted: rounds of the delivery cut short by a replica's death, in a row (a crash loop is set aside)",
            sql: "ALTER TABLE happypath_delivery ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0"),
    ]

    static var version: Int { ladder.count }

    /// The version the database holds (0: none of happypath's tables yet).
    static func found(_ c: PostgresConnection) throws(StoreError) -> Int {
        let exists = try c.execute("SELECT to_regclass('happypath_schema') IS NOT NULL")
        guard exists.text(0, 0) == "t" else { return 0 }
        return Int(try c.execute("SELECT coalesce(max(version), 0) FROM happypath_schema").int(0, 0) ?? 0)
    }

    /// Climbs to `target` under the advisory lock. Returns the steps applied
    /// by this call (none if another replica climbed first).
    @discardableResult
    static func migrate(_ c: PostgresConnection, to target: Int = version) throws(StoreError) -> [Int] {
        try c.execute("SELECT pg_advisory_lock($1)", [.int(lockKey)])
        defer { _ = try? c.execute("SELECT pg_advisory_unlock($1)", [.int(lockKey)]) }
        try c.execute(
            "CREATE TABLE IF NOT EXISTS happypath_schema (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now(), summary TEXT NOT NULL)"
        )
        let found = try found(c)
        guard found <= version else { throw StoreError(PostgresConnection.statementFailed, tooNew(found: found)) }
        var applied: [Int] = []
        for step in ladder where step.version > found && step.version <= target {
            try c.transaction { () throws(StoreError) in
                try c.execute(step.sql)
                try c.execute(
                    "INSERT INTO happypath_schema (version, summary) VALUES ($1, $2)", [.int(Int64(step.version)), .text(step.summary)])
            }
            applied.append(step.version)
        }
        return applied
    }

    static func tooNew(found: Int) -> String {
        "the database holds delivery store schema version \(found), written by a newer happypath; this build supports "
            + "versions up to \(version). Run a happypath that supports version \(found), or point storage.url at another database."
    }
}
