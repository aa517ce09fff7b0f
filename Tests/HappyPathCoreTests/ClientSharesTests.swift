import HappyPathCore
import Testing

/// `ClientShares` and a `BodyBudget` with a parent: a client's bytes count in
/// its share and in the process's budget, a reservation must fit both, and a
/// refusal says which one refused.
@Suite struct ClientSharesTests {
    @Test func aClientsConnectionsShareOneAccountAndBothLimitsHold() {
        let process = BodyBudget(limit: 1000)
        let shares = ClientShares(process: process, perClient: 400)
        let a1 = shares.account(for: "10.0.0.1")
        let a2 = shares.account(for: "10.0.0.1")
        let b = shares.account(for: "10.0.0.2")
        #expect(a1 === a2)
        #expect(a1.reserve(300))
        #expect(!a2.reserve(101), "the client's share: 300 + 101 > 400")
        #expect(a2.lastRefusalWasOwn)
        #expect(a2.reserve(100))
        #expect(shares.held(by: "10.0.0.1") == 400)
        #expect(b.reserve(400))
        let c = shares.account(for: "10.0.0.3")
        #expect(c.reserve(200))
        #expect(!c.reserve(1), "the process's budget: 1000 held")
        #expect(!c.lastRefusalWasOwn)
        #expect(process.current == 1000)
        a1.release(400)
        b.release(400)
        c.release(200)
        #expect(process.current == 0)
    }

    @Test func anAccountStaysWhileABodyHoldsBytesAndGoesAfter() {
        let shares = ClientShares(process: BodyBudget(limit: 1000), perClient: 100)
        let a = shares.account(for: "a")
        #expect(a.reserve(60))
        shares.leave("a")  // the connection closed; a parked body still holds 60
        #expect(shares.clients == 1)
        let again = shares.account(for: "a")
        #expect(again === a, "reconnecting does not give a fresh share")
        #expect(!again.reserve(41))
        a.release(60)
        shares.leave("a")
        #expect(shares.clients == 0)
        #expect(shares.held(by: "a") == 0)
    }

    @Test func aReloadChangesEveryShare() {
        let shares = ClientShares(process: BodyBudget(limit: 1000), perClient: 100)
        let a = shares.account(for: "a")
        #expect(!a.reserve(150))
        shares.limit = 200
        #expect(a.reserve(150))
        #expect(shares.account(for: "b").limit == 200)
    }

    /// A share as large as the process's budget: a refusal is the process's.
    @Test func aShareAsLargeAsTheBudgetNamesTheBudget() {
        let shares = ClientShares(process: BodyBudget(limit: 100), perClient: 100)
        let a = shares.account(for: "a")
        #expect(!a.reserve(101))
        #expect(!a.lastRefusalWasOwn)
    }
}

/// `MemoryPressure`: on at 90 % of the limit, off below 75 %, each change
/// seen by exactly one checker.
@Suite struct MemoryPressureTests {
    /// (what is held at each check, the action after it, the change it made).
    @Test func theMarksAndTheirHysteresis() {
        let p = MemoryPressure(limit: 1000)
        let steps: [(Int, Bool, MemoryPressure.Change?)] = [
            (0, false, nil), (899, false, nil), (900, true, .began), (950, true, nil), (800, true, nil),
            (750, true, nil), (749, false, .ended), (899, false, nil), (1200, true, .began),
        ]
        for (total, active, change) in steps {
            let r = p.check(total: total)
            #expect(r.active == active && r.change == change, "at \(total): \(r)")
            #expect(p.active == active)
        }
    }

    /// `check()` sums what `limits.max_memory` counts: bodies, staged answers, queued output.
    @Test func itSumsTheBodiesAndTheConnectionsPools() {
        let bodies = BodyBudget(limit: 10_000)
        let memory = ConnectionMemory()
        let p = MemoryPressure(limit: 1000, bodies: bodies, memory: memory)
        #expect(bodies.reserve(400))
        memory.staged.add(300)
        #expect(p.check() == (false, nil, 700))
        memory.output.add(200)
        #expect(p.check() == (true, .began, 900))
        bodies.release(400)
        #expect(p.check() == (false, .ended, 500))
    }

    @Test func aReloadMovesTheMarks() {
        let p = MemoryPressure(limit: 1000)
        #expect(p.check(total: 500).change == nil)
        p.limit = 500
        #expect(p.check(total: 500).change == .began)
    }
}
