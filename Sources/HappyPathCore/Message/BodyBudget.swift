import Synchronization

/// Bytes of request bodies held in memory by the whole process, bounded by
/// `limits.max_buffered_bytes`. A body is kept whole so that every retry
/// and every replay after parking sends exactly what the client sent; the
/// budget stops many large bodies at once from taking the machine's memory.
/// Shared by every worker; reservations are atomic. The same counting
/// bounds the client connections of the process (`ConnectionBudget`).
///
/// A budget may draw from a `parent` as well: one client's share
/// (`ClientShares`, `limits.max_buffered_per_client`) is a budget of its
/// own whose bytes also count in the process's, so a reservation must fit
/// both, and one client filling its share leaves the rest to the others.
public final class BodyBudget: Sendable {
    private let used = Atomic<Int>(0)
    private let maximum: Atomic<Int>
    /// The budget this one's bytes also count in (nil: the process's own).
    public let parent: BodyBudget?
    /// The last refused reservation was refused by this budget's own limit,
    /// not its parent's (which problem detail a refusal gets).
    private let refusedHere = Atomic<Bool>(false)

    public init(limit: Int, parent: BodyBudget? = nil) {
        maximum = Atomic(limit)
        self.parent = parent
    }

    /// Bytes reserved now.
    public var current: Int { used.load(ordering: .relaxed) }

    /// The budget (a reload may change it; reservations already made stay).
    public var limit: Int {
        get { maximum.load(ordering: .relaxed) }
        set { maximum.store(newValue, ordering: .relaxed) }
    }

    /// Bytes a reservation could take now: what is left here and in the parent.
    public var available: Int {
        let own = limit - current
        guard let parent else { return max(0, own) }
        return max(0, min(own, parent.available))
    }

    /// Takes `bytes` from the budget (and its parent), or nothing if they do not fit.
    public func reserve(_ bytes: Int) -> Bool {
        guard bytes > 0 else { return true }
        let after = used.wrappingAdd(bytes, ordering: .relaxed).newValue
        if after > maximum.load(ordering: .relaxed) {
            used.wrappingSubtract(bytes, ordering: .relaxed)
            refusedHere.store(true, ordering: .relaxed)
            return false
        }
        if let parent, !parent.reserve(bytes) {
            used.wrappingSubtract(bytes, ordering: .relaxed)
            refusedHere.store(false, ordering: .relaxed)
            return false
        }
        return true
    }

    public func release(_ bytes: Int) {
        guard bytes > 0 else { return }
        used.wrappingSubtract(bytes, ordering: .relaxed)
        parent?.release(bytes)
    }

    /// The last refusal was this budget's own limit (a client's share), not
    /// its parent's (the process's).
    /// A share as large as the whole budget refuses nothing of its own.
    public var lastRefusalWasOwn: Bool {
        guard let parent, refusedHere.load(ordering: .relaxed) else { return false }
        return limit < parent.limit
    }
}

/// Client connections open in the whole process, bounded by
/// `limits.max_connections`: a listener whose worker finds it full stops
/// accepting (the connections wait in the kernel's backlog) until one closes.
public typealias ConnectionBudget = BodyBudget
