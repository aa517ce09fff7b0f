import Synchronization

/// Parked commands in the whole process, bounded by `limits.max_parked`:
/// every worker's `ParkingLot` takes its places here. Atomics, so a worker
/// parks without a lock. The bound can change on a reload; a lower one than
/// the commands parked now only refuses new ones (nobody parked is turned out).
public final class ParkingCount: Sendable {
    private let bound: Atomic<Int>
    private let count = Atomic<Int>(0)

    public init(limit: Int) { bound = Atomic(limit) }

    /// `limits.max_parked`.
    public var limit: Int {
        get { bound.load(ordering: .relaxed) }
        set { bound.store(newValue, ordering: .relaxed) }
    }

    /// Places taken now.
    public var current: Int { count.load(ordering: .relaxed) }

    /// One place, unless `limit` are taken.
    public func tryTake() -> Bool {
        let after = count.wrappingAdd(1, ordering: .relaxed).newValue
        if after > bound.load(ordering: .relaxed) {
            count.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    public func give() { count.wrappingSubtract(1, ordering: .relaxed) }
}
