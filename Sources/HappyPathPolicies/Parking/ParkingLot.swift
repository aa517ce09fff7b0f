import HappyPathCore

/// One upstream's parked requests on one worker (docs/reachability.md):
/// requests that wait, instead of failing, until the upstream is reachable
/// again, its circuit closes, its token is refreshed or its pause ends. A
/// pure value: the worker holds one per upstream and performs what it
/// returns (metrics, events, replaying the requests on its loop).
///
/// Every place is also one of the process's `max_parked` places, taken from
/// the shared `ParkingCount` when a request parks and given back when it
/// leaves, however it leaves (replayed, answered, or its client gone).
///
/// Replays go in arrival order: the order in which the requests reached the
/// proxy (the instant the caller passes to `park`), then the order they
/// parked. Generic over the waiter so it knows nothing of exchanges;
/// waiters are told apart by identity. Parking is off the hot path: a
/// request parks only when its upstream cannot take it.
public struct ParkingLot<Waiter: AnyObject> {
    public typealias Reason = ExchangeStateMachine.ParkReason

    /// What `park` decided.
    public enum Parking: Sendable, Equatable {
        /// Parked, and one of the process's places taken.
        case parked
        /// It was parked already (under the reason it parked with): nothing changed.
        case alreadyParked
        /// The process's `max_parked` places are all taken: refuse (OVERLOADED).
        case full
    }

    private struct Entry {
        let waiter: Waiter
        let reason: Reason
        let arrivedAt: Instant
        /// Ties between equal arrival instants go to the one parked first.
        let sequence: Int
    }

    private var entries: [ObjectIdentifier: Entry] = [:]
    private var parkedSoFar = 0

    public init() {}

    /// Requests parked here now.
    public var count: Int { entries.count }

    public var isEmpty: Bool { entries.isEmpty }

    /// Why `waiter` is parked (nil: it is not).
    public func reason(of waiter: Waiter) -> Reason? { entries[ObjectIdentifier(waiter)]?.reason }

    /// Parks `waiter` for `reason` if a place is free in `places`.
    /// `arrivedAt` is when the request reached the proxy, which orders the
    /// replays.
    public mutating func park(_ waiter: Waiter, reason: Reason, arrivedAt: Instant, places: ParkingCount) -> Parking {
        let key = ObjectIdentifier(waiter)
        if entries[key] != nil { return .alreadyParked }
        guard places.tryTake() else { return .full }
        entries[key] = Entry(waiter: waiter, reason: reason, arrivedAt: arrivedAt, sequence: parkedSoFar)
        parkedSoFar += 1
        return .parked
    }

    /// `waiter` leaves the lot (it is answered, or its client left) and its
    /// place goes back to `places`. Returns the reason it was parked for
    /// (nil: it was not parked).
    @discardableResult
    public mutating func unpark(_ waiter: Waiter, places: ParkingCount) -> Reason? {
        guard let entry = entries.removeValue(forKey: ObjectIdentifier(waiter)) else { return nil }
        places.give()
        return entry.reason
    }

    /// Takes out every request parked for one of `reasons` (the upstream
    /// recovered, its pause ended, its token was refreshed) that `leaves`
    /// lets go (a pause may still hold some: their client's own), gives
    /// their places back and returns them in arrival order, to be replayed.
    public mutating func takeAll(
        for reasons: Set<Reason>, places: ParkingCount, where leaves: (Waiter) -> Bool = { _ in true }
    ) -> [Waiter] {
        let leaving = ordered(entries.values.filter { reasons.contains($0.reason) && leaves($0.waiter) })
        for entry in leaving {
            entries[ObjectIdentifier(entry.waiter)] = nil
            places.give()
        }
        return leaving.map(\.waiter)
    }

    /// Takes out everything parked (a reload that changed the upstream, or
    /// shutdown), in arrival order, and gives the places back.
    public mutating func takeAll(places: ParkingCount) -> [Waiter] {
        let leaving = ordered(Array(entries.values))
        for _ in leaving { places.give() }
        entries.removeAll()
        return leaving.map(\.waiter)
    }

    /// The half-open probe: the first arrived of the requests parked while
    /// the circuit was open, taken out (its place given back) to be sent as
    /// the one try the breaker lets through. Nil when none waits.
    public mutating func takeProbe(places: ParkingCount) -> Waiter? {
        var first: Entry?
        for entry in entries.values where entry.reason == .circuitOpen {
            if let f = first, !Self.before(entry, f) { continue }
            first = entry
        }
        guard let first else { return nil }
        entries[ObjectIdentifier(first.waiter)] = nil
        places.give()
        return first.waiter
    }

    /// The requests parked for `reason`, in arrival order, left in the lot
    /// (the caller answers them; each leaves through `unpark` as it ends).
    public func waiters(for reason: Reason) -> [Waiter] {
        ordered(entries.values.filter { $0.reason == reason }).map(\.waiter)
    }

    private func ordered(_ list: [Entry]) -> [Entry] { list.sorted(by: Self.before) }

    private static func before(_ a: Entry, _ b: Entry) -> Bool {
        a.arrivedAt != b.arrivedAt ? a.arrivedAt < b.arrivedAt : a.sequence < b.sequence
    }
}
