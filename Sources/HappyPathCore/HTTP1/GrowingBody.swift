#if canImport(Glibc)
    import Glibc
#endif

/// A request body whose length is learned as it arrives (chunked), written
/// once, into the storage that becomes the `RequestBody`: no second buffer
/// and no copy at the end. The storage grows by doubling (`realloc`), and
/// what it holds, its capacity, is what the process's body budget counts,
/// so the budget bounds the real memory.
public struct GrowingBody {
    private var base: UnsafeMutableRawPointer?
    private var capacity = 0
    public private(set) var count = 0
    private var budget: BodyBudget?

    public init(budget: BodyBudget?) { self.budget = budget }

    /// Counts the next body in `budget` (a client's account, known once the
    /// first body needs it). Only while nothing is held.
    public mutating func count(in budget: BodyBudget?) {
        guard base == nil, capacity == 0 else { return }
        self.budget = budget
    }

    /// Appends `data`; false (and nothing appended) if the storage it needs
    /// does not fit the budget.
    public mutating func append(_ data: UnsafeRawBufferPointer) -> Bool {
        guard data.count > 0 else { return true }
        let needed = count + data.count
        if needed > capacity {
            // Double, but settle for exactly what is needed when the
            // doubled storage would not fit the budget.
            var grown = max(needed, capacity * 2, 4096)
            if let budget, !budget.reserve(grown - capacity) {
                grown = needed
                guard budget.reserve(grown - capacity) else { return false }
            }
            base = realloc(base, grown)!
            capacity = grown
        }
        (base! + count).copyMemory(from: data.baseAddress!, byteCount: data.count)
        count = needed
        return true
    }

    /// The body, its storage trimmed to its length (the rest given back to
    /// the budget). The builder is empty afterwards.
    public mutating func finish() -> RequestBody {
        defer { self = GrowingBody(budget: budget) }
        guard count > 0 else {
            discard()
            return RequestBody(count: 0)
        }
        if capacity > count {
            base = realloc(base, count)!
            budget?.release(capacity - count)
        }
        return RequestBody(adopting: base, count: count, budget: budget)
    }

    /// Frees the storage and gives its bytes back to the budget.
    public mutating func discard() {
        free(base)
        budget?.release(capacity)
        base = nil
        capacity = 0
        count = 0
    }
}
