#if canImport(Glibc)
    import Glibc
#endif

/// A request body whose length is learned as it arrives (chunked), written
/// once, into the storage that becomes the `RequestBody`: no second buffer
/// and no copy at the end. The storage grows by doubling (`realloc`), and
/// what it holds, its capacity, is what the process's body budget counts,
/// so the budget bounds the real memory.
///
/// Past `inMemory` bytes (`limits.body_in_memory`) the body moves to a spool
/// file (`spill`, counted in the client's share of `limits.max_spooled_bytes`
/// instead of the budget) and grows there; a disk or share that cannot take
/// more sends it back to memory, within the budget.
public struct GrowingBody {
    private var base: UnsafeMutableRawPointer?
    private var capacity = 0
    public private(set) var count = 0
    private var budget: BodyBudget?
    private var inMemory = Int.max
    private var spill: SpoolMapping.Maker?
    /// The spool file `base` maps, once the body moved there.
    private var mapping: SpoolMapping?

    public init(budget: BodyBudget?) { self.budget = budget }

    /// Counts the next body in `budget` (a client's account, known once the
    /// first body needs it), and moves it to `spill`'s file past `inMemory`
    /// bytes. Only while nothing is held.
    public mutating func count(
        in budget: BodyBudget?, inMemory: Int = .max, spill: SpoolMapping.Maker? = nil
    ) {
        guard base == nil, capacity == 0 else { return }
        self.budget = budget
        self.inMemory = inMemory
        self.spill = spill
    }

    /// The body is in a spool file.
    public var isSpooled: Bool { mapping != nil }

    /// Appends `data`; false (and nothing appended) if the storage it needs
    /// fits neither the budget nor a spool file.
    public mutating func append(_ data: UnsafeRawBufferPointer) -> Bool {
        guard data.count > 0 else { return true }
        let needed = count + data.count
        if mapping == nil, needed > inMemory { moveToFile(needing: needed) }
        if mapping == nil, needed > capacity, !growInMemory(needed) {
            // Memory refuses: the file may still take it.
            moveToFile(needing: needed)
            guard mapping != nil else { return false }
        }
        if let mapping {
            if mapping.grow(toHold: needed) {
                base = mapping.base
                capacity = mapping.capacity
            } else {
                guard moveToMemory(needing: needed) else { return false }
            }
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
        if let mapping {
            mapping.trim(to: count)
            return RequestBody(mapping: mapping, count: count)
        }
        if capacity > count {
            base = realloc(base, count)!
            budget?.release(capacity - count)
        }
        return RequestBody(adopting: base, count: count, budget: budget)
    }

    /// Frees the storage and gives its bytes back to the budget.
    public mutating func discard() {
        if mapping == nil {
            free(base)
            budget?.release(capacity)
        }
        mapping = nil
        base = nil
        capacity = 0
        count = 0
    }

    /// Grows the memory storage to hold `needed` bytes: doubled, or
    /// exactly `needed` when the doubled storage would not fit the budget;
    /// false (nothing changed) when even that does not fit.
    private mutating func growInMemory(_ needed: Int) -> Bool {
        var grown = max(needed, capacity * 2, 4096)
        if let budget, !budget.reserve(grown - capacity) {
            grown = needed
            guard budget.reserve(grown - capacity) else { return false }
        }
        base = realloc(base, grown)!
        capacity = grown
        return true
    }

    /// The bytes so far move to a spool file with room for `needed` (or
    /// twice that), their memory and reservation given back. Stays in
    /// memory when no file can be had.
    private mutating func moveToFile(needing needed: Int) {
        guard let spill,
            let file = SpoolMapping.holding(
                UnsafeRawBufferPointer(start: base, count: count), room: needed, preferred: SpoolMapping.doubled(needed),
                from: spill)
        else { return }
        free(base)
        budget?.release(capacity)
        base = file.base
        capacity = file.capacity
        mapping = file
    }

    /// The spool file cannot grow: the bytes come back to memory, which the
    /// budget must take; false (and the file kept) if it does not.
    private mutating func moveToMemory(needing needed: Int) -> Bool {
        guard budget?.reserve(needed) ?? true else { return false }
        let moved = malloc(needed)!
        if count > 0 { moved.copyMemory(from: base!, byteCount: count) }
        base = moved
        capacity = needed
        mapping = nil
        spill = nil
        return true
    }
}
