import Synchronization

/// Bytes of request bodies held in memory by the whole process, bounded by
/// `limits.max_buffered_bytes`. A body is kept whole so that every retry
/// and every replay after parking sends exactly what the client sent; the
/// budget stops many large bodies at once from taking the machine's memory.
/// Shared by every worker; reservations are atomic. The same counting
/// bounds the client connections of the process (`ConnectionBudget`).
public final class BodyBudget: Sendable {
    private let used = Atomic<Int>(0)
    private let maximum: Atomic<Int>

    public init(limit: Int) { maximum = Atomic(limit) }

    /// Bytes reserved now.
    public var current: Int { used.load(ordering: .relaxed) }

    /// The budget (a reload may change it; reservations already made stay).
    public var limit: Int {
        get { maximum.load(ordering: .relaxed) }
        set { maximum.store(newValue, ordering: .relaxed) }
    }

    /// Takes `bytes` from the budget, or nothing if they do not fit.
    public func reserve(_ bytes: Int) -> Bool {
        guard bytes > 0 else { return true }
        let after = used.wrappingAdd(bytes, ordering: .relaxed).newValue
        if after > maximum.load(ordering: .relaxed) {
            used.wrappingSubtract(bytes, ordering: .relaxed)
            return false
        }
        return true
    }

    public func release(_ bytes: Int) {
        if bytes > 0 { used.wrappingSubtract(bytes, ordering: .relaxed) }
    }
}

/// Client connections open in the whole process, bounded by
/// `limits.max_connections`: a listener whose worker finds it full stops
/// accepting (the connections wait in the kernel's backlog) until one closes.
public typealias ConnectionBudget = BodyBudget
