import Foundation
import HappyPathCore
import PostgresTestServer
import Testing

@testable import HappyPathStore

/// What only the shared store does: replicas on one database, leases, and a
/// database that goes away and comes back. (What every store does is in
/// `DeliveryStoreTests`, run against both.) Real PostgreSQL servers.
@Suite("PostgreSQL delivery store", .needsPostgreSQL)
struct PostgresDeliveryStoreTests {
    typealias T = DeliveryStoreTests

    /// Replicas of one database on one manual clock.
    final class Replicas {
        let clock = ManualClock()
        let url: String
        let fixture = DeliveryStoreTests.Fixture(.postgres)

        init(url: String? = nil) throws { self.url = try url ?? PostgresServer.freshDatabase() }

        func open(lease: Duration = .seconds(30), health: DeliveryStoreTests.HealthLog? = nil) -> PostgresDeliveryStore {
            let store = PostgresDeliveryStore(
                settings: PostgresStoreSettings(url: url, pool: 2, lease: lease, maxBytes: 1 << 20, retention: .seconds(3600)),
                clock: clock)
            if let health { store.observe { health.record($0) } }
            store.start()
            return store
        }

        func delivery(_ id: String, key: String? = nil) -> NewDelivery {
            var d = fixture.delivery(id, key: key)
            d.expiresAt = clock.wallMilliseconds() + 3_600_000
            return d
        }
    }

    @Test func replicasShareOneQueueAndEachOneAnswersForAll() throws {
        let r = try Replicas()
        let a = r.open()
        let b = r.open()
        for i in 0..<10 { _ = T.submit(i % 2 == 0 ? a : b, r.delivery("d\(i)")) }
        let fromB = T.claim(b, limit: 4)
        let fromA = T.claim(a, limit: 100)
        #expect(fromB.count == 4 && fromA.count == 6)
        #expect(Set(fromA.map(\.id)).isDisjoint(with: fromB.map(\.id)), "no delivery is claimed by two replicas")
        #expect(T.claim(b).isEmpty)
        // A status, a listing and an Idempotency-Key from either replica.
        #expect(b.record(id: "d0")?.state == .inFlight)
        #expect(a.list(state: .inFlight, upstream: nil, after: nil, limit: 100).count == 10)
        guard case .stored("k1") = T.submit(a, r.delivery("k1", key: "same")),
            case .existing("k1", .queued) = T.submit(b, r.delivery("k2", key: "same"))
        else {
            Issue.record("a key stored through one replica was not found through the other")
            return
        }
        // A round's end is written by the replica that ran it.
        T.finish(b, fromB[0].id, .delivered(status: 200))
        #expect(a.record(id: fromB[0].id)?.state == .delivered)
        a.close()
        b.close()
    }

    @Test func aReplicaKilledMidRoundLeavesItsRoundsToAnotherWhenTheLeaseEnds() throws {
        let r = try Replicas()
        let a = r.open(lease: .seconds(30))
        let b = r.open(lease: .seconds(30))
        for i in 0..<3 { _ = T.submit(a, r.delivery("d\(i)")) }
        #expect(T.claim(a).count == 3)
        a.crash()
        #expect(T.claim(b).isEmpty, "a lease still running is respected")
        r.clock.advance(by: .seconds(31))
        let taken = T.claim(b)
        #expect(taken.count == 3)
        #expect(taken.allSatisfy { $0.attempts == 2 }, "the lost round counts as a round")
        for d in taken { T.finish(b, d.id, .delivered(status: 200)) }
        #expect(b.list(state: .delivered, upstream: nil, after: nil, limit: 10).count == 3)
        b.close()
    }

    /// A round whose lease ran out on a dead replica counts as one that
    /// crashed its proxy: the second in a row sets the delivery aside
    /// (dead, `crashed_the_proxy`) instead of sending it a third time.
    @Test func aRoundLostWithTwoDeadReplicasInARowIsSetAside() throws {
        let r = try Replicas()
        let a = r.open(lease: .seconds(30))
        _ = T.submit(a, r.delivery("boom"))
        #expect(T.claim(a).map(\.id) == ["boom"])
        a.crash()
        r.clock.advance(by: .seconds(31))
        let b = r.open(lease: .seconds(30))
        let second = T.claim(b)
        #expect(second.map(\.id) == ["boom"] && second.first?.attempts == 2)
        b.crash()
        r.clock.advance(by: .seconds(31))
        let c = r.open(lease: .seconds(30))
        let (claimed, setAside) = T.wait { reply in c.claim(limit: 10, skipping: []) { reply(($0, $1)) } }
        #expect(claimed.isEmpty)
        #expect(setAside.map(\.id) == ["boom"] && setAside.map(\.reason) == [.crashedTheProxy])
        let record = try #require(c.record(id: "boom"))
        #expect(record.state == .dead && record.attempts == 2)
        let problem = try #require(record.lastProblem)
        #expect(problem.contains("crashed the proxy") && problem.contains("\"request_id\":\"req-boom\""), "\(problem)")
        c.close()
    }

    @Test func aReplicaThatStopsCleanlyGivesItsRoundsBackAtOnce() throws {
        let r = try Replicas()
        let a = r.open()
        let b = r.open()
        for i in 0..<2 { _ = T.submit(a, r.delivery("d\(i)")) }
        #expect(T.claim(a).count == 2)
        a.close()
        #expect(T.claim(b).count == 2)
        b.close()
    }

    @Test func aLiveReplicaRenewsItsLeasesAndALostRoundsEndChangesNothing() throws {
        let r = try Replicas()
        let a = r.open(lease: .seconds(30))
        let b = r.open(lease: .seconds(30))
        _ = T.submit(a, r.delivery("kept"))
        #expect(T.claim(a).map(\.id) == ["kept"])
        // Past a third of the lease, the writer's next batch renews it (the
        // second submit runs after the renewal that followed the first).
        r.clock.advance(by: .seconds(20))
        _ = T.submit(a, r.delivery("x1"))
        _ = T.submit(a, r.delivery("x2"))
        r.clock.advance(by: .seconds(20))
        #expect(!T.claim(b, limit: 10).map(\.id).contains("kept"), "a renewed lease is respected")
        T.finish(a, "kept", .delivered(status: 200))
        #expect(b.record(id: "kept")?.state == .delivered)

        // A round whose lease ran out (its replica stalled longer than the
        // lease: made so here by hand) is another replica's now: the
        // stalled one's late end changes nothing.
        _ = T.submit(a, r.delivery("lost"))
        #expect(T.claim(a, limit: 10).map(\.id) == ["lost"])
        let _: Bool = T.wait { reply in b.execute("UPDATE happypath_delivery SET lease_until = 0 WHERE id = 'lost'") { reply(true) } }
        #expect(T.claim(b, limit: 10).map(\.id) == ["lost"])
        T.finish(a, "lost", .dead(status: 400, problem: "{}"))
        let record = try #require(b.record(id: "lost"))
        #expect(record.state == .inFlight && record.attempts == 2, "the second round is still running")
        a.close()
        b.close()
    }

    @Test func aDatabaseUnreachableAtStartRefusesWritesByName() throws {
        let health = DeliveryStoreTests.HealthLog()
        let r = try Replicas(url: "postgres://happypath:secret@127.0.0.1:\(PostgresServer.freePort())/none?connect_timeout=2")
        let store = r.open(health: health)
        guard case let .failed(error) = T.submit(store, r.delivery("d")) else {
            Issue.record("a write was accepted without a database")
            return
        }
        #expect(error.kind == .unreachable)
        #expect(!error.description.contains("secret"))
        #expect(store.unavailable != nil)
        #expect(health.all.first == "failed:unreachable")
        store.close()
    }

    @Test func aDatabaseThatStopsAndStartsAgainLosesNothing() throws {
        let server = try PostgresServer()
        let health = DeliveryStoreTests.HealthLog()
        let r = try Replicas(url: server.url)
        let store = r.open(health: health)
        for i in 0..<3 { _ = T.submit(store, r.delivery("d\(i)")) }
        let round = try #require(T.claim(store, limit: 1).first)
        server.stop()
        guard case let .failed(error) = T.submit(store, r.delivery("refused")) else {
            Issue.record("a write was accepted with the database down")
            return
        }
        #expect(error.kind == .unreachable)
        // The round ends while the database is down: kept, written once it is back.
        let ended = DispatchSemaphore(value: 0)
        store.finish(id: round.id, .delivered(status: 200)) { ended.signal() }
        try server.start()
        // The writer tries again after its backoff (on the test's clock).
        var stored = false
        for _ in 0..<60 where !stored {
            r.clock.advance(by: .seconds(2))
            if case .stored = T.submit(store, r.delivery("after-\(UUID().uuidString.prefix(6))")) { stored = true }
        }
        #expect(stored, "the store never connected again")
        ended.wait()
        #expect(store.record(id: round.id)?.state == .delivered)
        #expect(store.record(id: "refused") == nil)
        #expect(store.counts[.queued] == 3, "two left from before, one after")
        #expect(health.all.contains("failed:unreachable") && health.all.last == "writable:0")
        store.close()
    }
}
