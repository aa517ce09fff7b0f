import Foundation
import HappyPathCore
import PostgresTestServer
import Testing

@testable import HappyPathStore

/// The libpq layer and the schema ladder against a real PostgreSQL server
/// (each test starts its own: `PostgresServer`).
@Suite(.serialized, .needsPostgreSQL) struct PostgresConnectionTests {
    @Test func valuesGoAsParametersAndComeBackWhole() throws {
        let server = try PostgresServer()
        let c = try PostgresConnection(url: server.url)
        let everyByte = (0...255).map { UInt8($0) } + [0, 0, 0x5C, 0x78]
        let rows = try c.execute(
            "SELECT $1::text, $2::bigint, $3::bytea, $4::text, length($3::bytea)",
            [.text("'; DROP TABLE x; -- é"), .int(-9_000_000_000), .bytes(everyByte), .null])
        #expect(rows.count == 1)
        #expect(rows.text(0, 0) == "'; DROP TABLE x; -- é", "a value is never spliced into the SQL")
        #expect(rows.int(0, 1) == -9_000_000_000)
        #expect(rows.bytes(0, 2) == everyByte)
        #expect(rows.text(0, 3) == nil)
        #expect(rows.int(0, 4) == Int64(everyByte.count))
        #expect(try c.execute("SELECT ''::bytea").bytes(0, 0) == [])
    }

    @Test func aTransactionThatThrowsIsRolledBack() throws {
        let server = try PostgresServer()
        let c = try PostgresConnection(url: server.url)
        try c.execute("CREATE TABLE t (n INTEGER PRIMARY KEY)")
        #expect(throws: StoreError.self) {
            try c.transaction { () throws(StoreError) in
                try c.execute("INSERT INTO t VALUES (1)")
                try c.execute("INSERT INTO t VALUES (1)")  // a duplicate key
            }
        }
        #expect(try c.execute("SELECT count(*) FROM t").int(0, 0) == 0)
        try c.transaction { () throws(StoreError) in try c.execute("INSERT INTO t VALUES (2)") }
        #expect(try c.execute("SELECT count(*) FROM t").int(0, 0) == 1)
    }

    @Test func aRefusedStatementSaysWhyWithItsSQLState() throws {
        let server = try PostgresServer()
        let c = try PostgresConnection(url: server.url)
        do {
            try c.execute("SELECT * FROM nowhere")
            Issue.record("no error")
        } catch {
            #expect(error.sqlState == "42P01")
            #expect(error.description.contains("relation \"nowhere\" does not exist"), "\(error)")
            #expect(error.code == PostgresConnection.statementFailed)
        }
        #expect(c.isUsable, "a refused statement leaves the connection usable")
    }

    @Test func aServerThatIsDownIsAConnectFailureWithoutThePassword() throws {
        let port = PostgresServer.freePort()
        do {
            _ = try PostgresConnection(url: "postgres://u:sup3rsecret@127.0.0.1:\(port)/db?connect_timeout=2")
            Issue.record("connected to nothing")
        } catch {
            #expect(error.code == PostgresConnection.connectFailed)
            #expect(error.description.hasPrefix("cannot connect to PostgreSQL: "), "\(error)")
            #expect(!error.description.contains("sup3rsecret"))
        }
    }

    @Test func aServerThatStopsLeavesTheConnectionUnusable() throws {
        let server = try PostgresServer()
        let c = try PostgresConnection(url: server.url)
        server.stop()
        #expect(throws: StoreError.self) { try c.execute("SELECT 1") }
        #expect(!c.isUsable)
        try server.start()
        #expect(try PostgresConnection(url: server.url).execute("SELECT 1").int(0, 0) == 1, "a new connection works again")
    }

    @Test func theSchemaIsClimbedOnceWhenReplicasStartTogether() throws {
        let server = try PostgresServer()
        // Eight replicas migrate at once: one climbs, the others wait on the
        // advisory lock and find it done.
        let applied = Locked<[[Int]]>([])
        let failures = Locked<[String]>([])
        let url = server.url
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            do {
                let c = try PostgresConnection(url: url)
                let steps = try PostgresSchema.migrate(c)
                applied.withLock { $0.append(steps) }
            } catch {
                failures.withLock { $0.append("\(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        let all = applied.withLock { $0 }
        #expect(all.count == 8)
        #expect(all.filter { !$0.isEmpty } == [Array(1...PostgresSchema.version)], "one replica climbed every step")
        let c = try PostgresConnection(url: server.url)
        #expect(try PostgresSchema.found(c) == PostgresSchema.version)
        #expect(try c.execute("SELECT count(*) FROM happypath_schema").int(0, 0) == Int64(PostgresSchema.version))
        // The claim, expiry and lease indexes are there.
        let indexes = try c.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'happypath_delivery' ORDER BY 1")
        let names = (0..<indexes.count).compactMap { indexes.text($0, 0) }
        for name in ["happypath_delivery_due", "happypath_delivery_expiry", "happypath_delivery_leases", "happypath_delivery_idem"] {
            #expect(names.contains(name), "\(names)")
        }
    }

    @Test func aNewerSchemaIsRefusedAndLeftAlone() throws {
        let server = try PostgresServer()
        let c = try PostgresConnection(url: server.url)
        try PostgresSchema.migrate(c)
        try c.execute("INSERT INTO happypath_schema (version, summary) VALUES (99, 'from the future')")
        do {
            try PostgresSchema.migrate(c)
            Issue.record("a newer schema was accepted")
        } catch {
            #expect(error.description.contains("schema version 99, written by a newer happypath"), "\(error)")
        }
        #expect(try PostgresSchema.found(c) == 99)
    }
}
