import HappyPathCore
import Testing

@testable import HappyPathServer

/// The exchange's one timer while a try is in flight on a hedging route:
/// when it is armed for, and what it means when it fires.
@Suite struct HedgeCoordinatorTests {
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    struct Row: CustomTestStringConvertible, Sendable {
        var name: String
        /// When the first hedge is due after the try went out (nil: none).
        var dueAfter: Duration?
        /// When the timer fires after the try went out (its limit is 3 s).
        var firedAfter: Duration
        var armedAfter: Duration
        var hedgeDue: Bool
        var limitReached: Bool
        var testDescription: String { name }
    }

    static let rows: [Row] = [
        Row(
            name: "no hedge due: armed for the limit", dueAfter: nil, firedAfter: .seconds(3), armedAfter: .seconds(3),
            hedgeDue: false, limitReached: true),
        Row(
            name: "a hedge due first: armed for it", dueAfter: .milliseconds(50), firedAfter: .milliseconds(50),
            armedAfter: .milliseconds(50), hedgeDue: true, limitReached: false),
        Row(
            name: "a hedge due after the limit: armed for the limit", dueAfter: .seconds(4), firedAfter: .seconds(3),
            armedAfter: .seconds(3), hedgeDue: false, limitReached: true),
        Row(
            name: "fired late, past both: the hedge and the limit", dueAfter: .milliseconds(50), firedAfter: .seconds(5),
            armedAfter: .milliseconds(50), hedgeDue: true, limitReached: true),
    ]

    @Test(arguments: rows)
    func theOneTimerWhileTrying(_ row: Row) {
        var books = HedgeCoordinator()
        books.trySent(at: Self.t0, limit: .seconds(3), hedgeDueAt: row.dueAfter.map { Self.t0 + $0 })
        #expect(books.timerAt == Self.t0 + row.armedAfter)
        let fired = books.timerFired(at: Self.t0 + row.firedAfter)
        #expect(fired == HedgeCoordinator.Fired(hedgeDue: row.hedgeDue, limitReached: row.limitReached))
        // A hedge due is due once: after it the timer is for the limit.
        if row.hedgeDue {
            #expect(books.dueAt == nil)
            #expect(books.timerAt == Self.t0 + .seconds(3))
        }
    }

    @Test func nothingHeldWithoutHedges() {
        var books = HedgeCoordinator()
        #expect(books.isIdle)
        #expect(books.removeAll().isEmpty)
        #expect(books.removeFirst() == nil)
        #expect(books.removeLosers().isEmpty)
    }
}
