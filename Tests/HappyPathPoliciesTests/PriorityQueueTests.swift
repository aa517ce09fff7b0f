import HappyPathCore
import HappyPathPolicies
import Testing

/// Waiting requests by priority, shed CoDel-style: critical first out,
/// nothing shed while the queue empties now and then, and once it stands,
/// the late of the lowest priority shed first.
@Suite struct PriorityQueueTests {
    final class W: CustomStringConvertible {
        let name: String
        init(_ name: String) { self.name = name }
        var description: String { name }
    }

    static func t(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

    @Test func aFreedSlotGoesToTheHighestPriorityThenTheLongestWaiting() {
        var q = PriorityQueue<W>()
        let (s1, n1, c1, n2) = (W("s1"), W("n1"), W("c1"), W("n2"))
        q.enqueue(s1, .sheddable, at: Self.t(0))
        q.enqueue(n1, .normal, at: Self.t(1))
        q.enqueue(c1, .critical, at: Self.t(2))
        q.enqueue(n2, .normal, at: Self.t(3))
        var order: [String] = []
        while let w = q.next() { order.append(w.name) }
        #expect(order == ["c1", "n1", "n2", "s1"])
        #expect(q.standingSince == nil)
    }

    @Test func aQueueThatEmptiesNowAndThenIsNeverShed() {
        var q = PriorityQueue<W>()
        for i in Int64(0)..<50 {
            let w = W("w\(i)")
            q.enqueue(w, .sheddable, at: Self.t(i * 10))
            let shed = q.shed(at: Self.t(i * 10 + 9))  // waited 9 ms, but the queue stood only 9 ms
            #expect(shed.isEmpty)
            let next = q.next()
            #expect(next === w)
        }
    }

    @Test func aStandingQueueShedsTheLateOfTheLowestPriorityWaitingOnly() {
        var q = PriorityQueue<W>()
        let c = W("c"), n = W("n"), s1 = W("s1"), s2 = W("s2")
        q.enqueue(c, .critical, at: Self.t(0))
        q.enqueue(n, .normal, at: Self.t(0))
        q.enqueue(s1, .sheddable, at: Self.t(0))
        let early = q.shed(at: Self.t(99))  // not standing for 100 ms yet
        #expect(early.isEmpty)
        q.enqueue(s2, .sheddable, at: Self.t(98))  // waited 2 ms at 100: not late
        let first = q.shed(at: Self.t(100))
        #expect(first.map(\.name) == ["s1"])
        // s2 waits, not late: nothing of a higher priority is shed meanwhile.
        let second = q.shed(at: Self.t(101))
        #expect(second.isEmpty)
        let third = q.shed(at: Self.t(104))  // s2 has waited 6 ms
        #expect(third.map(\.name) == ["s2"])
        let fourth = q.shed(at: Self.t(105))  // normal is now the lowest waiting
        #expect(fourth.map(\.name) == ["n"])
        let fifth = q.shed(at: Self.t(106))
        #expect(fifth.map(\.name) == ["c"])
        #expect(q.count == 0 && q.standingSince == nil)
    }

    @Test func aFullQueueDisplacesTheNewestOfALowerPriorityOnly() {
        var q = PriorityQueue<W>()
        let s1 = W("s1"), s2 = W("s2"), n = W("n")
        q.enqueue(s1, .sheddable, at: Self.t(0))
        q.enqueue(s2, .sheddable, at: Self.t(1))
        q.enqueue(n, .normal, at: Self.t(2))
        #expect(q.displace(below: .sheddable) == nil)
        #expect(q.displace(below: .critical) === s2)
        #expect(q.displace(below: .normal) === s1)
        #expect(q.displace(below: .normal) == nil)
        #expect(q.count == 1 && q.lowest == .normal)
    }

    @Test(arguments: [
        ("critical", RequestPriority.normal, RequestPriority.normal), ("sheddable", .normal, .sheddable),
        (" Sheddable ", .critical, .sheddable), ("NORMAL", .critical, .normal), ("bulk", .normal, .normal),
        ("", .sheddable, .sheddable), (String(repeating: "sheddable", count: 10), .normal, .normal),
    ])
    func aClientMayLowerItsPriorityNeverRaiseIt(header: String, route: RequestPriority, expected: RequestPriority) {
        #expect(RequestPriority.lowered(route, by: Array(header.utf8)) == expected)
    }

    @Test func aRequestThatLeavesIsForgotten() {
        var q = PriorityQueue<W>()
        let a = W("a"), b = W("b")
        q.enqueue(a, .normal, at: Self.t(0))
        q.enqueue(b, .critical, at: Self.t(0))
        let left = q.leave(b)
        let again = q.leave(b)
        #expect(left && !again)
        #expect(q.count(.critical) == 0 && q.count(.normal) == 1)
        let leftA = q.leave(a)
        #expect(leftA)
        #expect(q.standingSince == nil)
        let none = q.shed(at: Self.t(1000))
        #expect(none.isEmpty)
    }
}
