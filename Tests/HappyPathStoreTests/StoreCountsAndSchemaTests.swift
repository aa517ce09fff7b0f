import CSQLite
import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@testable import HappyPathStore

/// The counts the writer keeps, checked against the file after every kind
/// of change of state; the reads' own thread.
@Suite("Delivery store counts and reads")
struct DeliveryCountsTests {
    typealias T = DeliveryStoreTests

    /// The kept counts equal a `GROUP BY` over the file.
    static func expectExact(
        _ store: DeliveryStore, _ path: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let truth = try T.countedInTheFile(path)
        #expect(store.counts == truth, "after \(what)", sourceLocation: sourceLocation)
    }

    @Test func countsStayExactThroughEveryChangeOfState() throws {
        let f = T.Fixture()
        let store = try f.open(maxBytes: 8 << 20, retention: .seconds(60))
        #expect(store.counts[.queued] == 0)
        for i in 0..<4 { _ = T.submit(store, f.delivery("h\(i)")) }
        _ = T.submit(store, f.delivery("o0", upstream: "other"))
        try Self.expectExact(store, f.path, "submits")
        #expect(store.counts[.queued] == 5 && store.counts.pending(upstream: "hooks") == 4)

        // The same key again: nothing new.
        _ = T.submit(store, f.delivery("k", key: "key"))
        _ = T.submit(store, f.delivery("k2", key: "key"))
        try Self.expectExact(store, f.path, "a duplicate")
        #expect(store.counts[.queued] == 6)

        let claimed = T.claim(store, limit: 4, skipping: ["other"])
        #expect(claimed.count == 4)
        try Self.expectExact(store, f.path, "a claim")
        #expect(store.counts[.inFlight] == 4)

        T.finish(store, claimed[0].id, .delivered(status: 200))
        try Self.expectExact(store, f.path, "delivered")
        T.finish(store, claimed[1].id, .retry(at: f.clock.wallMilliseconds() + 60_000, status: 503, problem: "{}"))
        try Self.expectExact(store, f.path, "a retry")
        T.finish(store, claimed[2].id, .dead(status: 404, problem: "{}"))
        try Self.expectExact(store, f.path, "dead")
        T.finish(store, claimed[3].id, .postpone(at: f.clock.wallMilliseconds() + 60_000))
        try Self.expectExact(store, f.path, "postponed")
        // A round's end for a delivery no longer in flight changes nothing.
        T.finish(store, claimed[0].id, .dead(status: 500, problem: "{}"))
        try Self.expectExact(store, f.path, "a stale round end")
        #expect(store.counts[.delivered] == 1 && store.counts[.dead] == 1 && store.counts[.inFlight] == 0)

        let replayed: ReplayResult = T.wait { store.replay(id: claimed[2].id, expiresAt: 1, reply: $0) }
        guard case .replayed = replayed else {
            Issue.record("not replayed")
            return
        }
        try Self.expectExact(store, f.path, "a replay")
        #expect(store.counts[.dead] == 0)

        // Past max_age (the replay gave it expiresAt 1): dead at the next claim.
        let (_, expired) = T.wait { reply in store.claim(limit: 0, skipping: []) { reply(($0, $1)) } }
        #expect(expired.map(\.id) == [claimed[2].id])
        try Self.expectExact(store, f.path, "an expiry")
        #expect(store.counts[.dead] == 1)

        f.clock.advance(by: .seconds(61))
        let purged: Int = T.wait { store.purge(reply: $0) }
        #expect(purged == 2)
        try Self.expectExact(store, f.path, "a purge")
        #expect(store.counts[.delivered] == 0 && store.counts[.dead] == 0)

        // A batch the disk refuses is rolled back, and so are its counts.
        T.execute(store, "PRAGMA max_page_count = 1")
        guard case .failed = T.submit(store, f.delivery("big", body: String(repeating: "b", count: 256 * 1024))) else {
            Issue.record("the write was not refused")
            return
        }
        try Self.expectExact(store, f.path, "a refused write")
        T.execute(store, "PRAGMA max_page_count = 1000000")

        // Closing puts rounds in flight back to queued.
        #expect(T.claim(store, limit: 2).count == 2)
        store.close()
        #expect(store.counts[.inFlight] == 0)
        try Self.expectExact(store, f.path, "close")
    }

    /// After `kill -9` the file holds rounds still in flight and the counts
    /// died with the process: the next open counts again, with the
    /// recovered rounds queued.
    @Test func countsAreExactAfterACrash() throws {
        let f = T.Fixture()
        do {
            let store = try f.open()
            for i in 0..<6 { _ = T.submit(store, f.delivery("c\(i)", upstream: i < 4 ? "hooks" : "other")) }
            store.close()
        }
        // What a crash in the middle of three rounds leaves in the file.
        let c = try SQLiteConnection(path: f.path, readOnly: false)
        try c.execute("UPDATE delivery SET state = 1 WHERE id IN ('c0', 'c1', 'c4')")
        let store = try f.open()
        #expect(store.recovered == 3)
        #expect(store.counts[.queued] == 6 && store.counts[.inFlight] == 0)
        #expect(store.counts.pending == ["hooks": 4, "other": 2])
        try Self.expectExact(store, f.path, "reopening")
        store.close()
    }

    /// A read is answered on the store's reader thread, not on the thread
    /// that asked (an event loop hops back with `execute`).
    @Test func readsAreAnsweredOnTheReaderThread() throws {
        let f = T.Fixture()
        let store = try f.open()
        _ = T.submit(store, f.delivery("r"))
        let caller = pthread_self()
        let answeredOn: pthread_t = T.wait { reply in store.record(id: "r") { _ in reply(pthread_self()) } }
        #expect(pthread_equal(caller, answeredOn) == 0)
        let stats: StoreStats = T.wait { store.stats(reply: $0) }
        #expect(stats.counts[.queued] == 1)
        #expect(stats.pending["hooks"]?.count == 1)
        #expect(stats.pending["hooks"]?.oldest == f.clock.wallMilliseconds())
        store.close()
        // After close: answered at once, with an error, never left hanging.
        let closed: Result<DeliveryRecord?, StoreError> = T.wait { store.record(id: "r", reply: $0) }
        #expect(throws: StoreError.self) { try closed.get() }
    }
}

/// The schema ladder: each step on a file of the version before it, a new
/// file climbing all of them, a newer file refused.
@Suite("Store schema ladder")
struct SchemaLadderTests {
    typealias T = DeliveryStoreTests

    static func version(_ path: String) throws -> Int64 {
        try SQLiteConnection(path: path, readOnly: true).integer("PRAGMA user_version")
    }

    static func has(_ c: SQLiteConnection, index name: String) throws -> Bool {
        try c.integer("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = '\(name)'") == 1
    }

    static func has(_ c: SQLiteConnection, column name: String) throws -> Bool {
        try c.integer("SELECT count(*) FROM pragma_table_info('delivery') WHERE name = '\(name)'") == 1
    }

    @Test func theLadderIsNumberedFromOneWithoutGaps() {
        #expect(Schema.ladder.map(\.version) == Array(1...Schema.version))
        #expect(Schema.version == 3)
    }

    @Test func stepOneMakesTheFirstSchemaInAnEmptyFile() throws {
        let f = T.Fixture()
        let c = try SQLiteConnection(path: f.path, readOnly: false)
        try Schema.migrate(c, path: f.path, to: 1)
        #expect(try c.integer("PRAGMA user_version") == 1)
        #expect(try Self.has(c, index: "delivery_idem"))
        #expect(try Self.has(c, index: "delivery_due_by_upstream"))
        #expect(try !Self.has(c, column: "idem_scope"))
        #expect(try c.integer("SELECT count(*) FROM delivery") == 0)
    }

    /// Schema 1 as the first build wrote it (one due index over every
    /// upstream, no expiry index) and as later builds of schema 1 did.
    static let firstCut = DeliveryStoreTests.schema1
        .replacingOccurrences(
            of: "CREATE INDEX IF NOT EXISTS delivery_due_by_upstream ON delivery(upstream, next_attempt_at) WHERE state = 0;",
            with: "CREATE INDEX IF NOT EXISTS delivery_due ON delivery(next_attempt_at) WHERE state = 0;"
        )
        .replacingOccurrences(
            of: "CREATE INDEX IF NOT EXISTS delivery_expiry ON delivery(expires_at) WHERE state = 0;", with: "")

    @Test(arguments: [firstCut, DeliveryStoreTests.schema1])
    func stepTwoGivesKeysAScopeAndKeepsEveryRow(schema1: String) throws {
        let f = T.Fixture()
        let c = try SQLiteConnection(path: f.path, readOnly: false)
        try c.execute(schema1 + "PRAGMA user_version = 1;")
        try c.execute(
            """
            INSERT INTO delivery (id, upstream, route, idem_key, request_id, method, target, headers, body,
              payload_bytes, state, max_attempts, next_attempt_at, expires_at, created_at, updated_at)
            VALUES ('a', 'hooks', '/hooks', 'k', 'req-a', 'POST', '/hooks/x', X'', X'6869', 10, 0, 5, 0, 9, 0, 0),
                   ('b', 'hooks', '/hooks', NULL, 'req-b', 'POST', '/hooks/y', X'', X'', 8, 3, 5, 0, 9, 0, 0)
            """)
        try Schema.migrate(c, path: f.path, to: 2)
        #expect(try c.integer("PRAGMA user_version") == 2)
        #expect(try Self.has(c, column: "idem_scope") && Self.has(c, column: "idem_fingerprint"))
        #expect(try !Self.has(c, index: "delivery_idem") && Self.has(c, index: "delivery_idem_scope"))
        #expect(try !Self.has(c, index: "delivery_due"))
        #expect(try Self.has(c, index: "delivery_due_by_upstream") && Self.has(c, index: "delivery_expiry"))
        #expect(try c.integer("SELECT count(*) FROM delivery") == 2)
        #expect(try c.integer("SELECT count(*) FROM delivery WHERE idem_scope IS NULL AND idem_key = 'k'") == 1)
    }

    @Test func aNewFileClimbsEveryStep() throws {
        let f = T.Fixture()
        let store = try f.open()
        store.close()
        #expect(try Self.version(f.path) == Int64(Schema.version))
        #expect(try Self.has(SQLiteConnection(path: f.path, readOnly: true), column: "interrupted"))
    }

    /// A store from a newer happypath is refused before anything is written
    /// to it, with a message that says what to do.
    @Test func aFileFromANewerHappypathIsRefusedAndLeftAsItIs() throws {
        let f = T.Fixture()
        do {
            let c = try SQLiteConnection(path: f.path, readOnly: false)
            try c.execute("CREATE TABLE future (x); PRAGMA user_version = \(Schema.version + 1);")
        }
        var message = ""
        do {
            _ = try f.open()
            Issue.record("a newer schema was opened")
        } catch {
            message = "\(error)"
        }
        #expect(message.contains("schema version \(Schema.version + 1)"), "\(message)")
        #expect(message.contains("up to \(Schema.version)"), "\(message)")
        #expect(message.contains("newer happypath") && message.contains("storage.path"), "\(message)")
        #expect(try Self.version(f.path) == Int64(Schema.version + 1))
        let c = try SQLiteConnection(path: f.path, readOnly: true)
        #expect(try c.integer("SELECT count(*) FROM sqlite_master WHERE name = 'delivery'") == 0)
    }

    /// A step that fails leaves the file at the version before it.
    @Test func aStepThatFailsIsRolledBackWhole() throws {
        let f = T.Fixture()
        let c = try SQLiteConnection(path: f.path, readOnly: false)
        try Schema.migrate(c, path: f.path, to: 1)
        // An index of that name in the way of step 2's.
        try c.execute("CREATE TABLE delivery_idem_scope (x)")
        #expect(throws: StoreError.self) { try Schema.migrate(c, path: f.path) }
        #expect(try c.integer("PRAGMA user_version") == 1)
        #expect(try !Self.has(c, column: "idem_scope"), "half a step was kept")
    }
}
