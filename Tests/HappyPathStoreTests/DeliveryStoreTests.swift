import CSQLite
import Foundation
import HappyPathCore
import SmallDisk
import PostgresTestServer
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@testable import HappyPathStore

/// Which store a test runs against: what every store must do is proven on both.
enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
    /// The kinds this machine runs: PostgreSQL only where there is a
    /// server (where there is none, the PostgreSQL suites are skipped
    /// and say why: `PostgresServer.skipReason`).
    static let here: [StoreKind] = PostgresServer.skipReason == nil ? allCases : [.sqlite]
}

/// The store on a real SQLite file in a fresh directory, or in a fresh
/// database of a real PostgreSQL server (`PostgresServer.shared`), on a manual clock.
@Suite("Delivery store")
struct DeliveryStoreTests {
    final class Fixture {
        let kind: StoreKind
        let directory: String
        let clock = ManualClock()
        var path: String { directory + "/deliveries.db" }
        /// `postgres`: this test's own database.
        private(set) var url = ""

        init(_ kind: StoreKind = .sqlite) {
            self.kind = kind
            directory = NSTemporaryDirectory() + "happypath-store-" + UUID().uuidString
            try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }

        deinit { try? FileManager.default.removeItem(atPath: directory) }

        /// The store of `kind`: the same file or database each time it is opened.
        func openAny(maxBytes: Int = 1 << 20, retention: Duration = .seconds(3600)) throws -> any DeliveryStoring {
            switch kind {
            case .sqlite: return try open(maxBytes: maxBytes, retention: retention)
            case .postgres:
                if url.isEmpty { url = try PostgresServer.freshDatabase() }
                let store = PostgresDeliveryStore(
                    settings: PostgresStoreSettings(url: url, pool: 2, maxBytes: maxBytes, retention: retention), clock: clock)
                store.start()
                return store
            }
        }

        func open(
            maxBytes: Int = 1 << 20, retention: Duration = .seconds(3600), health: HealthLog? = nil
        ) throws -> DeliveryStore {
            let store = try DeliveryStore(
                settings: StoreSettings(path: path, sync: .full, maxBytes: maxBytes, retention: retention), clock: clock)
            if let health { store.observe { health.record($0) } }
            store.start()
            return store
        }

        func delivery(_ id: String, key: String? = nil, body: String = "{\"n\":1}", upstream: String = "hooks")
            -> NewDelivery
        {
            NewDelivery(
                id: id, upstream: upstream, route: "/hooks", idempotencyKey: key, requestID: "req-\(id)", method: "POST",
                target: "/hooks/x?y=1", headers: Array("content-type: application/json\r\n".utf8),
                body: RequestBody(Array(body.utf8)), maxAttempts: 5,
                expiresAt: clock.wallMilliseconds() + 3_600_000)
        }
    }

    /// What the store reported through `observe`, in order.
    final class HealthLog: Sendable {
        private let events = Locked<[String]>([])
        func record(_ health: StoreHealth) {
            let text =
                switch health {
                case let .failed(error): "failed:\(error.kind.rawValue)"
                case let .writable(requeued): "writable:\(requeued)"
                }
            events.withLock { $0.append(text) }
        }
        var all: [String] { events.withLock { $0 } }
    }

    /// Waits for one reply of an asynchronous store call.
    static func wait<T: Sendable>(_ call: (@escaping @Sendable (T) -> Void) -> Void) -> T {
        let result = Locked<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        call { value in
            result.withLock { $0 = value }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }

    static func submit(_ store: any DeliveryStoring, _ d: NewDelivery) -> SubmitResult {
        wait { store.submit(d, reply: $0) }
    }

    static func claim(_ store: any DeliveryStoring, limit: Int = 100, skipping: [String] = []) -> [ClaimedDelivery] {
        let (claimed, _) = wait { reply in store.claim(limit: limit, skipping: skipping) { reply(($0, $1)) } }
        return claimed
    }

    static func finish(_ store: any DeliveryStoring, _ id: String, _ outcome: DeliveryOutcome) {
        let _: Bool = wait { reply in store.finish(id: id, outcome) { reply(true) } }
    }

    static func execute(_ store: DeliveryStore, _ sql: String) {
        let _: Bool = wait { reply in store.execute(sql) { reply(true) } }
    }

    /// The rows by upstream and state, counted from the file itself.
    static func countedInTheFile(_ path: String) throws -> DeliveryCounts {
        let c = try SQLiteConnection(path: path, readOnly: true)
        let s = try c.prepare("SELECT upstream, state, count(*) FROM delivery GROUP BY upstream, state")
        var counts = DeliveryCounts()
        while try s.step() { counts.add(s.int(2), DeliveryState(rawValue: s.int(1))!, upstream: s.string(0)!) }
        return counts
    }

    // MARK: - A disk that refuses writes

    /// SQLITE_FULL from below (here SQLite's page limit, as a full
    /// filesystem would give it) is a store error, not `storage.max_bytes`:
    /// the write is refused, what was stored stays, and the next write
    /// tries again and works once there is room.
    @Test func aWriteTheDiskRefusesFailsAsADiskErrorAndTheNextOneTriesAgain() throws {
        let f = Fixture()
        let health = HealthLog()
        let store = try f.open(maxBytes: 8 << 20, health: health)
        guard case .stored = Self.submit(store, f.delivery("kept")) else {
            Issue.record("not stored")
            return
        }
        // No page beyond those the file has: a body that needs new pages cannot be written.
        Self.execute(store, "PRAGMA max_page_count = 1")
        let big = String(repeating: "b", count: 256 * 1024)
        let refused = Self.submit(store, f.delivery("big", body: big))
        guard case let .failed(error) = refused else {
            Issue.record("expected a store error, got \(refused)")
            return
        }
        #expect(error.kind == .full && error.isDiskError)
        #expect(store.unavailable?.kind == .full)
        #expect(health.all == ["failed:full"])
        #expect(store.record(id: "big") == nil)
        #expect(store.record(id: "kept")?.state == .queued, "what was stored stays")

        Self.execute(store, "PRAGMA max_page_count = 1000000")
        guard case .stored = Self.submit(store, f.delivery("big", body: big)) else {
            Issue.record("the write after the disk has room again was refused")
            return
        }
        #expect(store.unavailable == nil)
        #expect(health.all == ["failed:full", "writable:0"])
        #expect(Set(Self.claim(store).map(\.id)) == ["kept", "big"])
        store.close()
    }

    /// How a failure is counted: SQLite's code, and for I/O errors the errno
    /// (SQLite reports ENOSPC as an I/O error from some calls).
    /// Extended codes, spelled out (Swift does not import these macros).
    static let ioerrWrite = SQLITE_IOERR | (3 << 8)
    static let ioerrFsync = SQLITE_IOERR | (4 << 8)
    static let ioerrShmSize = SQLITE_IOERR | (19 << 8)

    @Test(arguments: [
        (SQLITE_FULL, Int32(0), StoreErrorKind.full),
        (ioerrWrite, ENOSPC, .full),
        (ioerrShmSize, ENOSPC, .full),
        (ioerrWrite, EDQUOT, .full),
        (ioerrFsync, EIO, .io),
        (SQLITE_IOERR, 0, .io),
        (SQLITE_CANTOPEN, ENOSPC, .full),
        (SQLITE_CANTOPEN, EACCES, .other),
        (SQLITE_CORRUPT, 0, .other),
        (SQLITE_BUSY, 0, .other),
    ])
    func failuresAreSortedByKind(code: Int32, systemErrno: Int32, kind: StoreErrorKind) {
        let error = StoreError(code, "x", systemErrno: systemErrno)
        #expect(error.kind == kind)
        #expect(error.isDiskError == (kind != .other))
    }

    /// A round's end the disk refuses is not dropped (its row would stay
    /// `in_flight` until a restart): it is written again once there is
    /// room, and only then is the round reported recorded.
    @Test func aRoundEndTheDiskRefusesIsWrittenLaterNotLost() throws {
        let f = Fixture()
        let store = try f.open(maxBytes: 8 << 20)
        _ = Self.submit(store, f.delivery("r"))
        #expect(Self.claim(store).map(\.id) == ["r"])
        Self.execute(store, "PRAGMA max_page_count = 1")
        // A problem large enough to need pages the file does not have.
        let problem = "{\"detail\":\"" + String(repeating: "p", count: 256 * 1024) + "\"}"
        let recorded = Locked(false)
        store.finish(id: "r", .dead(status: 500, problem: problem)) { recorded.withLock { $0 = true } }
        Self.execute(store, "SELECT 1")  // the finish's batch has been through the writer
        #expect(!recorded.withLock { $0 }, "reported recorded although the disk refused it")
        #expect(store.record(id: "r")?.state == .inFlight)

        Self.execute(store, "PRAGMA max_page_count = 1000000")
        f.clock.advance(by: DeliveryStore.defaultReopenInterval)
        Self.execute(store, "SELECT 1")  // wakes the writer: the deferred end goes first
        #expect(recorded.withLock { $0 })
        let record = try #require(store.record(id: "r"))
        #expect(record.state == .dead && record.lastStatus == 500 && record.lastProblem == problem)
        store.close()
    }

    /// On a disk that is full when the store opens (its -shm file cannot be
    /// made), the store opens anyway, refuses writes, keeps what the file
    /// holds, and opens for real at its next try after the disk has room.
    @Test func aStoreOpenedOnAFullDiskWaitsForRoomAndLosesNothing() throws {
        guard let disk = SmallDisk(bytes: 2 << 20) else { return }
        let clock = ManualClock()
        let settings = StoreSettings(
            path: disk.path + "/deliveries.db", sync: .full, maxBytes: 1 << 20, retention: .seconds(3600),
            reopenInterval: .seconds(5))
        let f = Fixture()
        do {
            let store = try DeliveryStore(settings: settings, clock: clock)
            store.start()
            for id in ["old1", "old2"] {
                guard case .stored = Self.submit(store, f.delivery(id)) else {
                    Issue.record("not stored before the disk filled")
                    return
                }
            }
            store.close()
        }
        disk.fill()

        let health = HealthLog()
        let store = try DeliveryStore(settings: settings, clock: clock)
        let opening = try #require(store.unavailable, "the store opened as if the disk took writes")
        #expect(opening.kind == .full, "\(opening) errno \(opening.systemErrno)")
        store.observe { health.record($0) }
        store.start()
        guard case let .failed(error) = Self.submit(store, f.delivery("new")) else {
            Issue.record("a write was accepted on a full disk")
            return
        }
        #expect(error.isDiskError)

        disk.free()
        // Not tried again before its time (nothing happens per request).
        guard case .failed = Self.submit(store, f.delivery("new")) else {
            Issue.record("the store reopened before reopen_interval")
            return
        }
        clock.advance(by: .seconds(5))
        guard case .stored = Self.submit(store, f.delivery("new")) else {
            Issue.record("the store did not reopen once the disk had room")
            return
        }
        #expect(health.all.last == "writable:0")
        #expect(store.unavailable == nil)
        #expect(Set(Self.claim(store).map(\.id)) == ["old1", "old2", "new"], "nothing stored was lost")
        store.close()
    }

    @Test(arguments: StoreKind.here) func storedRequestComesBackWhole(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        guard case .stored("d1") = Self.submit(store, f.delivery("d1", body: "hello")) else {
            Issue.record("not stored")
            return
        }
        #expect(store.record(id: "d1")?.state == .queued)
        let claimed = Self.claim(store)
        #expect(claimed.count == 1)
        let c = try #require(claimed.first)
        #expect(c.method == "POST" && c.target == "/hooks/x?y=1" && c.requestID == "req-d1" && c.attempts == 1)
        #expect(c.body.bytes == Array("hello".utf8))
        #expect(c.headers == Array("content-type: application/json\r\n".utf8))
        #expect(store.record(id: "d1")?.state == .inFlight)
        #expect(Self.claim(store).isEmpty, "a delivery in flight is not claimed twice")
        Self.finish(store, "d1", .delivered(status: 204))
        let record = try #require(store.record(id: "d1"))
        #expect(record.state == .delivered && record.lastStatus == 204 && record.attempts == 1)
        store.close()
    }

    @Test(arguments: StoreKind.here) func sameIdempotencyKeyGivesTheSameDelivery(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        guard case .stored("a") = Self.submit(store, f.delivery("a", key: "k1")) else {
            Issue.record("not stored")
            return
        }
        guard case .existing("a", .queued) = Self.submit(store, f.delivery("b", key: "k1")) else {
            Issue.record("a second delivery was stored for the same key")
            return
        }
        // Another upstream's key space is its own.
        guard case .stored("c") = Self.submit(store, f.delivery("c", key: "k1", upstream: "other")) else {
            Issue.record("not stored")
            return
        }
        #expect(store.record(id: "b") == nil)
        #expect(store.counts[.queued] == 2)
    }

    // MARK: - Idempotency-Key scope and fingerprint

    func keyed(_ f: Fixture, _ id: String, key: String, scope: String, body: String = "{\"n\":1}") -> NewDelivery {
        var d = f.delivery(id, key: key, body: body)
        d.idempotencyScope = scope
        d.fingerprint = IdempotencyScope.fingerprint(
            method: d.method, target: d.target,
            body: UnsafeRawBufferPointer(start: d.body.baseAddress, count: d.body.count))
        return d
    }

    @Test(arguments: StoreKind.here) func twoScopesWithTheSameKeyEachGetTheirOwnDelivery(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        guard case .stored("alice") = Self.submit(store, keyed(f, "alice", key: "k", scope: "scope-a")),
            case .stored("bob") = Self.submit(store, keyed(f, "bob", key: "k", scope: "scope-b"))
        else {
            Issue.record("a second client's key was taken as the first one's")
            return
        }
        guard case .existing("bob", .queued) = Self.submit(store, keyed(f, "bob2", key: "k", scope: "scope-b")) else {
            Issue.record("the same request in the same scope was not recognized")
            return
        }
        #expect(store.counts[.queued] == 2)
    }

    @Test(arguments: StoreKind.here) func theSameKeyWithAnotherBodyIsRefusedAndStoresNothing(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        _ = Self.submit(store, keyed(f, "first", key: "k", scope: "s", body: "one"))
        guard case .keyReused = Self.submit(store, keyed(f, "second", key: "k", scope: "s", body: "two")) else {
            Issue.record("a different request with the same key was not refused")
            return
        }
        var otherTarget = keyed(f, "third", key: "k", scope: "s", body: "one")
        otherTarget.target = "/hooks/other"
        otherTarget.fingerprint = IdempotencyScope.fingerprint(
            method: "POST", target: "/hooks/other", body: UnsafeRawBufferPointer(start: nil, count: 0))
        guard case .keyReused = Self.submit(store, otherTarget) else {
            Issue.record("a different target with the same key was not refused")
            return
        }
        #expect(store.record(id: "second") == nil && store.record(id: "third") == nil)
        guard case .existing("first", _) = Self.submit(store, keyed(f, "again", key: "k", scope: "s", body: "one")) else {
            Issue.record("the original request sent again was not recognized")
            return
        }
    }

    /// A file written by schema 1 (keys unique per upstream, no scope or
    /// fingerprint columns) opens, is migrated in place, and keeps every row.
    @Test func aFileOfTheFirstSchemaIsMigratedAndLosesNothing() throws {
        let f = Fixture()
        do {
            let c = try SQLiteConnection(path: f.path, readOnly: false)
            try c.execute("PRAGMA journal_mode = WAL")
            try c.execute(Self.schema1 + "PRAGMA user_version = 1;")
            for (i, state) in [(0, 0), (1, 3), (2, 2)] {
                try c.execute(
                    """
                    INSERT INTO delivery (id, upstream, route, idem_key, request_id, method, target, headers, body,
                      payload_bytes, state, max_attempts, next_attempt_at, expires_at, created_at, updated_at)
                    VALUES ('old\(i)', 'hooks', '/hooks', 'legacy-\(i)', 'req-\(i)', 'POST', '/hooks/x', X'', X'6869',
                      10, \(state), 5, 0, \(f.clock.wallMilliseconds() + 3_600_000), 0, 0)
                    """)
            }
        }
        let store = try f.open()
        #expect(store.record(id: "old0")?.state == .queued)
        #expect(store.record(id: "old1")?.state == .dead)
        #expect(store.record(id: "old2")?.state == .delivered)
        #expect(store.heldBytes == 30)
        // The same key as a row of the old schema: that row has no scope, so
        // no client can be handed its delivery; the new request is stored.
        guard case .stored("new") = Self.submit(store, keyed(f, "new", key: "legacy-0", scope: "s")) else {
            Issue.record("not stored next to a row of the old schema")
            return
        }
        let claimed = Self.claim(store)
        #expect(Set(claimed.map(\.id)) == ["old0", "new"])
        #expect(claimed.first { $0.id == "old0" }?.body.bytes == Array("hi".utf8))
        store.close()
        let c = try SQLiteConnection(path: f.path, readOnly: true)
        #expect(try c.integer("PRAGMA user_version") == Int64(Schema.version))
        #expect(try c.integer("SELECT count(*) FROM sqlite_master WHERE name = 'delivery_idem'") == 0)
        #expect(try c.integer("SELECT count(*) FROM sqlite_master WHERE name = 'delivery_idem_scope'") == 1)
        #expect(try c.integer("SELECT count(*) FROM delivery") == 4)
    }

    /// Schema 1, as happypath wrote it before keys had a scope.
    static let schema1 = """
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

    @Test(arguments: StoreKind.here) func sameKeyInOneBatchIsStoredOnce(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        let results = Locked<[SubmitResult]>([])
        let done = DispatchSemaphore(value: 0)
        for i in 0..<20 {
            store.submit(f.delivery("x\(i)", key: "same")) { r in
                results.withLock { $0.append(r) }
                done.signal()
            }
        }
        for _ in 0..<20 { done.wait() }
        let stored = results.withLock { $0.filter { if case .stored = $0 { true } else { false } } }
        #expect(stored.count == 1)
        #expect(store.counts[.queued] == 1)
    }

    @Test(arguments: StoreKind.here) func fullStoreRefusesAndKeepsWhatItHas(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny(maxBytes: 4096)
        let big = String(repeating: "x", count: 1500)
        var stored = 0
        var full = 0
        for i in 0..<5 {
            switch Self.submit(store, f.delivery("f\(i)", body: big)) {
            case .stored: stored += 1
            case .full: full += 1
            default: Issue.record("unexpected result")
            }
        }
        #expect(stored == 2 && full == 3)
        #expect(store.heldBytes <= 4096)
        // Delivering one makes room for another.
        let claimed = Self.claim(store, limit: 1)
        Self.finish(store, claimed[0].id, .delivered(status: 200))
        guard case .stored = Self.submit(store, f.delivery("g", body: big)) else {
            Issue.record("room was not given back")
            return
        }
        #expect(store.counts[.queued] == 2)
    }

    @Test(arguments: StoreKind.here) func retryWaitsForItsTimeAndDeadKeepsTheProblem(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        _ = Self.submit(store, f.delivery("r"))
        let first = Self.claim(store)
        #expect(first.count == 1)
        let at = f.clock.wallMilliseconds() + 5000
        Self.finish(store, "r", .retry(at: at, status: 503, problem: "{\"code\":\"UPSTREAM_UNAVAILABLE\"}"))
        #expect(Self.claim(store).isEmpty, "not due yet")
        f.clock.advance(by: .seconds(5))
        let second = Self.claim(store)
        #expect(second.first?.attempts == 2)
        Self.finish(store, "r", .dead(status: 422, problem: "{\"code\":\"CLIENT_ERROR\"}"))
        let record = try #require(store.record(id: "r"))
        #expect(record.state == .dead && record.lastStatus == 422 && record.lastProblem == "{\"code\":\"CLIENT_ERROR\"}")
        // Replayed: queued again, rounds from zero.
        let replayed: ReplayResult = Self.wait { store.replay(id: "r", expiresAt: at + 3_600_000, reply: $0) }
        guard case .replayed = replayed else {
            Issue.record("not replayed")
            return
        }
        #expect(store.record(id: "r")?.state == .queued && store.record(id: "r")?.attempts == 0)
        let again: ReplayResult = Self.wait { store.replay(id: "r", expiresAt: at, reply: $0) }
        guard case .notDead(.queued) = again else {
            Issue.record("a queued delivery was replayed")
            return
        }
    }

    @Test(arguments: StoreKind.here) func pastMaxAgeIsDeadWithAProblem(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        var d = f.delivery("old")
        d.expiresAt = f.clock.wallMilliseconds() + 1000
        _ = Self.submit(store, d)
        f.clock.advance(by: .seconds(2))
        let (claimed, expired) = Self.wait { reply in store.claim(limit: 10, skipping: []) { reply(($0, $1)) } }
        #expect(claimed.isEmpty)
        #expect(expired.map(\.id) == ["old"])
        let record = try #require(store.record(id: "old"))
        #expect(record.state == .dead)
        let problem = try #require(record.lastProblem)
        #expect(problem.contains("\"request_id\":\"req-old\"") && problem.contains("UPSTREAM_UNREACHABLE"))
    }

    @Test(arguments: StoreKind.here) func skippedUpstreamsAreNotClaimedAndWakeMakesThemDue(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        _ = Self.submit(store, f.delivery("h1"))
        _ = Self.submit(store, f.delivery("o1", upstream: "other"))
        #expect(Self.claim(store, skipping: ["hooks"]).map(\.id) == ["o1"])
        #expect(Self.claim(store, skipping: ["hooks"]).isEmpty)
        let h = Self.claim(store)
        Self.finish(store, "h1", .retry(at: f.clock.wallMilliseconds() + 600_000, status: nil, problem: "{}"))
        #expect(h.count == 1)
        #expect(Self.claim(store).isEmpty)
        store.wake(upstream: "hooks")
        #expect(Self.claim(store).map(\.id) == ["h1"])
    }

    @Test func reopeningPutsRoundsInFlightBackAndKeepsEverything() throws {
        let f = Fixture()
        var store: DeliveryStore? = try f.open()
        for i in 0..<10 { _ = Self.submit(store!, f.delivery("p\(i)")) }
        #expect(Self.claim(store!, limit: 4).count == 4)
        // No close: the process "ends" with four rounds in flight.
        store = nil
        let reopened = try f.open()
        #expect(reopened.recovered == 4 || reopened.recovered == 0)
        #expect(reopened.counts[.queued] == 10)
        #expect(Self.claim(reopened).count == 10)
    }

    /// A delivery whose round was in flight when the process died, at two
    /// starts in a row, is set aside (dead, `crashed_the_proxy`) instead of
    /// being sent a third time; a round that ends between two crashes, a
    /// replay or a clean stop starts the count again.
    @Test func aRoundInFlightAtTwoCrashesInARowIsSetAside() throws {
        let f = Fixture()
        do {
            let store = try f.open()
            _ = Self.submit(store, f.delivery("boom"))
            _ = Self.submit(store, f.delivery("calm"))
            #expect(Self.claim(store).count == 2)
            store.crash()
        }
        // After the first crash both are queued again and sent again.
        do {
            let store = try f.open()
            #expect(store.recovered == 2)
            let second = Self.claim(store)
            #expect(Set(second.map(\.id)) == ["boom", "calm"] && second.allSatisfy { $0.attempts == 2 })
            // calm's second round ends: its next crash is a first one again.
            Self.finish(store, "calm", .retry(at: f.clock.wallMilliseconds(), status: 503, problem: "{}"))
            #expect(Self.claim(store).map(\.id) == ["calm"])
            store.crash()
        }
        // The second crash in a row during a round of boom.
        let store = try f.open()
        #expect(store.recovered == 1, "calm only")
        let (claimed, setAside) = Self.wait { reply in store.claim(limit: 10, skipping: []) { reply(($0, $1)) } }
        #expect(claimed.map(\.id) == ["calm"])
        #expect(setAside.map(\.id) == ["boom"] && setAside.map(\.reason) == [.crashedTheProxy])
        #expect(store.counts[.dead] == 1 && store.counts[.inFlight] == 1)
        let record = try #require(store.record(id: "boom"))
        #expect(record.state == .dead && record.attempts == 2)
        let problem = try #require(record.lastProblem)
        #expect(problem.contains("crashed the proxy") && problem.contains("\"request_id\":\"req-boom\""), "\(problem)")
        // Replayed, it starts again from nothing; a clean stop does too.
        let replayed = Self.wait { store.replay(id: "boom", expiresAt: f.clock.wallMilliseconds() + 60_000, reply: $0) }
        guard case .replayed = replayed else {
            Issue.record("not replayed: \(replayed)")
            return
        }
        #expect(Self.claim(store).map(\.id) == ["boom"])
        store.close()
        do {
            let store = try f.open()
            #expect(store.recovered == 0 && store.counts[.queued] == 2)
            #expect(Self.claim(store).count == 2)
            store.crash()
        }
        let reopened = try f.open()
        #expect(reopened.recovered == 2 && reopened.counts[.dead] == 0, "one crash each since the count began again")
        reopened.close()
    }

    @Test(arguments: StoreKind.here) func purgeDropsOnlyFinishedPastRetention(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny(retention: .seconds(60))
        _ = Self.submit(store, f.delivery("done"))
        _ = Self.submit(store, f.delivery("waiting"))
        let claimed = Self.claim(store, limit: 1)
        Self.finish(store, claimed[0].id, .delivered(status: 200))
        f.clock.advance(by: .seconds(61))
        let purged: Int = Self.wait { store.purge(reply: $0) }
        #expect(purged == 1)
        #expect(store.record(id: claimed[0].id) == nil)
        #expect(store.counts[.queued] == 1)
    }

    @Test(arguments: StoreKind.here) func listsPageNewestFirstAndFilter(kind: StoreKind) throws {
        let f = Fixture(kind)
        let store = try f.openAny()
        for i in 0..<5 { _ = Self.submit(store, f.delivery("l\(i)", upstream: i % 2 == 0 ? "hooks" : "other")) }
        let page1 = store.list(state: nil, upstream: nil, after: nil, limit: 2)
        #expect(page1.map(\.id) == ["l4", "l3"])
        let page2 = store.list(state: nil, upstream: nil, after: page1.last?.cursor, limit: 2)
        #expect(page2.map(\.id) == ["l2", "l1"])
        #expect(store.list(state: .queued, upstream: "other", after: nil, limit: 10).map(\.id) == ["l3", "l1"])
        #expect(store.list(state: .dead, upstream: nil, after: nil, limit: 10).isEmpty)
    }

    @Test func unwritableDirectoryIsAClearError() {
        #expect(throws: StoreError.self) {
            _ = try DeliveryStore(
                settings: StoreSettings(
                    path: "/proc/happypath-cannot-write-here/d.db", sync: .full, maxBytes: 1 << 20,
                    retention: .seconds(60)), clock: ManualClock())
        }
    }
}

extension DeliveryStoring {
    /// Tests: `id`'s record, read on the reader thread and waited for (nil
    /// also when the store cannot be read).
    func record(id: String) -> DeliveryRecord? {
        let found: Result<DeliveryRecord?, StoreError> = DeliveryStoreTests.wait { record(id: id, reply: $0) }
        return (try? found.get()) ?? nil
    }

    /// Tests: a page of the listing, waited for.
    func list(state: DeliveryState?, upstream: String?, after: Int64?, limit: Int) -> [DeliveryRecord] {
        let page: Result<[DeliveryRecord], StoreError> = DeliveryStoreTests.wait {
            list(state: state, upstream: upstream, after: after, limit: limit, reply: $0)
        }
        return (try? page.get()) ?? []
    }
}

/// The writer's queue is bounded (`WriterOp.queueCapacity`): past it a
/// submit is refused at once with `StoreError.writerBusy` (answered 503
/// STORE_UNAVAILABLE), while a round's end still finds a reserved place.
@Suite struct WriterQueueBoundTests {
    @Test func aFullWriterQueueRefusesSubmitsButNotRoundEnds() {
        // Held: nothing is taken, as a writer stuck on a slow disk would take nothing.
        let queue = JobQueue<WriterOp>.writer(name: "test-writer")
        defer { queue.stop() }
        let delivery = NewDelivery(
            id: "d", upstream: "hooks", route: "/hooks", idempotencyKey: nil, requestID: "r", method: "POST",
            target: "/hooks", headers: [], body: RequestBody(Array("{}".utf8)), maxAttempts: 1, expiresAt: 0)
        let answers = Locked<[String]>([])
        for _ in 0..<WriterOp.queueCapacity {
            queue.hand(.submit(delivery, enqueued: Instant(nanoseconds: 0), reply: { _ in answers.withLock { $0.append("early") } }))
        }
        #expect(answers.withLock { $0 }.isEmpty, "everything up to the capacity waits for the writer")
        queue.hand(
            .submit(delivery, enqueued: Instant(nanoseconds: 0)) { result in
                if case let .failed(error) = result, error.code == StoreError.writerBusy {
                    answers.withLock { $0.append("busy: \(error.message)") }
                }
            })
        #expect(answers.withLock { $0 } == ["busy: the store's writer has 4096 operations waiting"])
        queue.hand(.finish(id: "d", outcome: .delivered(status: 200), reply: { answers.withLock { $0.append("finish refused") } }))
        #expect(queue.waiting == WriterOp.queueCapacity + 1, "the round's end took a reserved place")
        queue.hand(.claim(limit: 5, skipping: []) { claimed, _ in answers.withLock { $0.append("claimed \(claimed.count)") } })
        #expect(answers.withLock { $0 }.last == "claimed 0", "a claim past the capacity finds nothing this time")
        // An operator's replay and purge take reserved places too: answered by the writer, not refused.
        queue.hand(.replay(id: "d", expiresAt: 0) { _ in answers.withLock { $0.append("replay refused") } })
        queue.hand(.purge { _ in answers.withLock { $0.append("purge refused") } })
        #expect(queue.waiting == WriterOp.queueCapacity + 3)
        #expect(!answers.withLock { $0 }.contains { $0.hasSuffix("refused") })
    }

    @Test func aReadPastTheReadersQueueIsBusyAndOneAfterCloseIsNotOpen() {
        let queue: JobQueue<@Sendable (Result<Int, StoreError>) -> Void> = StoreReadQueue.make(name: "test-reads")
        let answers = Locked<[String]>([])
        let job: @Sendable (Result<Int, StoreError>) -> Void = { r in
            if case let .failure(e) = r { answers.withLock { $0.append(e.isBusy ? "busy" : "closed") } }
        }
        for _ in 0..<StoreReadQueue.capacity { StoreReadQueue.read(job, on: queue, notOpen: StoreError(1, "closed")) }
        #expect(answers.withLock { $0 }.isEmpty, "every read up to the capacity waits")
        StoreReadQueue.read(job, on: queue, notOpen: StoreError(1, "closed"))
        queue.stop()
        StoreReadQueue.read(job, on: queue, notOpen: StoreError(1, "closed"))
        #expect(answers.withLock { $0 }.suffix(2) == ["busy", "closed"])
    }
}
