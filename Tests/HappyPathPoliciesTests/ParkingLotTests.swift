import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct ParkingLotTests {
    final class Waiter {
        let id: Int
        init(_ id: Int) { self.id = id }
    }

    typealias Lot = ParkingLot<Waiter>
    typealias Reason = Lot.Reason

    enum Event {
        /// Time passes on the manual clock (a request that arrives later).
        case advance(milliseconds: Int)
        /// A request that arrived now parks (it may have arrived earlier:
        /// `arrivedBefore` milliseconds before now).
        case park(Int, Reason, arrivedBefore: Int = 0)
        case unpark(Int)
        /// The upstream recovered, its pause ended or its token came: replay.
        case replay(Set<Reason>)
        /// The half-open probe's turn.
        case probe
        /// A reload changed the upstream, or shutdown: everything leaves.
        case takeAll
        /// The refresh failed: who is answered AUTH_FAILED (they stay until they end).
        case waiters(Reason)
    }

    enum Decision: Equatable {
        case parking(Lot.Parking)
        case unparked(Reason?)
        /// Taken out, in this order.
        case out([Int])
        case none
    }

    struct Step {
        let event: Event
        let decision: Decision
        /// Parked in this lot, and places taken in the process, after the event.
        let parked: Int
        let places: Int

        init(_ event: Event, _ decision: Decision, parked: Int, places: Int? = nil) {
            self.event = event
            self.decision = decision
            self.parked = parked
            self.places = places ?? parked
        }
    }

    struct Scenario: CustomTestStringConvertible {
        let name: String
        let maxParked: Int
        let steps: [Step]
        var testDescription: String { name }

        init(_ name: String, maxParked: Int = 100, _ steps: [Step]) {
            self.name = name
            self.maxParked = maxParked
            self.steps = steps
        }
    }

    /// Computed, not stored: LeakSanitizer does not follow the pointers of
    /// a stored table of multi-payload enums (their tags sit in spare bits)
    /// and reports its arrays as leaked.
    static var scenarios: [Scenario] {
        [
        Scenario(
            "max_parked bounds the lot; a place given back can be taken again", maxParked: 2,
            [
                Step(.park(1, .unreachable), .parking(.parked), parked: 1),
                Step(.park(2, .circuitOpen), .parking(.parked), parked: 2),
                Step(.park(3, .unreachable), .parking(.full), parked: 2),
                Step(.park(1, .unreachable), .parking(.alreadyParked), parked: 2),
                Step(.unpark(1), .unparked(.unreachable), parked: 1),
                Step(.unpark(1), .unparked(nil), parked: 1),
                Step(.park(3, .unreachable), .parking(.parked), parked: 2),
            ]),
        Scenario(
            "a replay takes the requests parked for its reasons, in arrival order, and leaves the others",
            [
                Step(.advance(milliseconds: 30), .none, parked: 0),
                Step(.park(3, .unreachable), .parking(.parked), parked: 1),
                Step(.park(1, .circuitOpen, arrivedBefore: 20), .parking(.parked), parked: 2),
                Step(.park(4, .auth, arrivedBefore: 25), .parking(.parked), parked: 3),
                Step(.park(2, .unreachable, arrivedBefore: 10), .parking(.parked), parked: 4),
                Step(.park(5, .paused), .parking(.parked), parked: 5),
                Step(.replay([.unreachable, .circuitOpen]), .out([1, 2, 3]), parked: 2),
                Step(.replay([.unreachable, .circuitOpen]), .out([]), parked: 2),
                Step(.replay([.auth]), .out([4]), parked: 1),
                Step(.replay([.paused]), .out([5]), parked: 0),
            ]),
        Scenario(
            "the pause's end replays by arrival, not by the order the requests parked",
            [
                Step(.park(1, .unreachable), .parking(.parked), parked: 1),
                Step(.advance(milliseconds: 10), .none, parked: 1),
                Step(.park(20, .paused), .parking(.parked), parked: 2),
                Step(.advance(milliseconds: 10), .none, parked: 2),
                Step(.park(30, .paused), .parking(.parked), parked: 3),
                Step(.park(10, .paused, arrivedBefore: 15), .parking(.parked), parked: 4),
                Step(.park(21, .paused, arrivedBefore: 10), .parking(.parked), parked: 5),
                Step(.replay([.paused]), .out([10, 20, 21, 30]), parked: 1),
            ]),
        Scenario(
            "the probe is the first arrived request parked while the circuit was open, one at a time",
            [
                Step(.park(1, .unreachable, arrivedBefore: 0), .parking(.parked), parked: 1),
                Step(.advance(milliseconds: 20), .none, parked: 1),
                Step(.park(3, .circuitOpen), .parking(.parked), parked: 2),
                Step(.park(2, .circuitOpen, arrivedBefore: 10), .parking(.parked), parked: 3),
                Step(.probe, .out([2]), parked: 2),
                Step(.probe, .out([3]), parked: 1),
                Step(.probe, .out([]), parked: 1),
            ]),
        Scenario(
            "a failed refresh names the auth waiters, who leave the lot as each is answered",
            [
                Step(.park(2, .auth, arrivedBefore: 0), .parking(.parked), parked: 1),
                Step(.park(1, .auth, arrivedBefore: 5), .parking(.parked), parked: 2),
                Step(.park(3, .unreachable), .parking(.parked), parked: 3),
                Step(.waiters(.auth), .out([1, 2]), parked: 3),
                Step(.unpark(1), .unparked(.auth), parked: 2),
                Step(.unpark(2), .unparked(.auth), parked: 1),
                Step(.waiters(.auth), .out([]), parked: 1),
            ]),
        Scenario(
            "a reload or shutdown takes everything out and gives every place back", maxParked: 3,
            [
                Step(.park(1, .paused), .parking(.parked), parked: 1),
                Step(.park(2, .auth), .parking(.parked), parked: 2),
                Step(.park(3, .circuitOpen), .parking(.parked), parked: 3),
                Step(.takeAll, .out([1, 2, 3]), parked: 0),
                Step(.unpark(2), .unparked(nil), parked: 0),
                Step(.park(4, .unreachable), .parking(.parked), parked: 1),
            ]),
        ]
    }

    @Test(arguments: scenarios)
    func parkAndReplay(_ scenario: Scenario) {
        let clock = ManualClock()
        let places = ParkingCount(limit: scenario.maxParked)
        var lot = Lot()
        var waiters: [Int: Waiter] = [:]
        func waiter(_ id: Int) -> Waiter {
            if let w = waiters[id] { return w }
            let w = Waiter(id)
            waiters[id] = w
            return w
        }
        for (i, step) in scenario.steps.enumerated() {
            let decision: Decision
            switch step.event {
            case let .advance(ms):
                clock.advance(by: .milliseconds(ms))
                decision = .none
            case let .park(id, reason, before):
                let arrived = clock.now() - .milliseconds(before)
                decision = .parking(lot.park(waiter(id), reason: reason, arrivedAt: arrived, places: places))
            case let .unpark(id):
                decision = .unparked(lot.unpark(waiter(id), places: places))
            case let .replay(reasons):
                decision = .out(lot.takeAll(for: reasons, places: places).map(\.id))
            case .probe:
                decision = .out(lot.takeProbe(places: places).map { [$0.id] } ?? [])
            case .takeAll:
                decision = .out(lot.takeAll(places: places).map(\.id))
            case let .waiters(reason):
                decision = .out(lot.waiters(for: reason).map(\.id))
            }
            #expect(decision == step.decision, "step \(i)")
            #expect(lot.count == step.parked, "step \(i)")
            #expect(places.current == step.places, "step \(i)")
        }
    }

    /// `max_parked` is the process's: every worker's lot takes its places
    /// from the one count.
    @Test func theBoundIsSharedByEveryLot() {
        let places = ParkingCount(limit: 2)
        var a = Lot()
        var b = Lot()
        let (w1, w2, w3) = (Waiter(1), Waiter(2), Waiter(3))
        let t = ManualClock().now()
        #expect(a.park(w1, reason: .unreachable, arrivedAt: t, places: places) == .parked)
        #expect(b.park(w2, reason: .unreachable, arrivedAt: t, places: places) == .parked)
        #expect(a.park(w3, reason: .unreachable, arrivedAt: t, places: places) == .full)
        #expect(b.unpark(w2, places: places) == .unreachable)
        #expect(a.park(w3, reason: .unreachable, arrivedAt: t, places: places) == .parked)
        #expect(a.reason(of: w3) == .unreachable)
        #expect(b.reason(of: w3) == nil)
        #expect(places.current == 2)
    }

    /// A reload that lowers `max_parked` below what is parked turns nobody
    /// out; it only refuses new requests until enough have left.
    @Test func aLowerBoundRefusesNewRequestsOnly() {
        let places = ParkingCount(limit: 3)
        var lot = Lot()
        let w = (0..<4).map(Waiter.init)
        let t = ManualClock().now()
        for i in 0..<3 { #expect(lot.park(w[i], reason: .unreachable, arrivedAt: t, places: places) == .parked) }
        places.limit = 1
        #expect(lot.count == 3)
        #expect(lot.park(w[3], reason: .unreachable, arrivedAt: t, places: places) == .full)
        lot.unpark(w[0], places: places)
        lot.unpark(w[1], places: places)
        #expect(lot.park(w[3], reason: .unreachable, arrivedAt: t, places: places) == .full)
        lot.unpark(w[2], places: places)
        #expect(lot.park(w[3], reason: .unreachable, arrivedAt: t, places: places) == .parked)
    }
}
