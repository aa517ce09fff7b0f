import Synchronization

/// Each client's share of a process budget: of request bodies in memory
/// (`limits.max_buffered_per_client`), and of spool files
/// (`limits.max_spooled_bytes`, `Spool.shares`). A client, by its address,
/// may hold at most this many bytes, all its connections and workers
/// together; past it only that client's new bodies are refused (503
/// OVERLOADED naming its share) or its answers stop reading ahead, and the
/// other clients keep the rest.
///
/// A connection asks for its client's account when its first body needs
/// one (`account`), and gives it back when it closes (`leave`). An account
/// stays while a connection uses it or a body (a parked command, a retry's
/// copy) still holds bytes in it, so a client cannot win a fresh share by
/// reconnecting. Shared by every worker: one lock, taken once per
/// connection that sends a body, never per byte.
public final class ClientShares: Sendable {
    private struct Entry {
        let budget: BodyBudget
        var users: Int
    }

    // `Locked` (a pthread mutex), not `Mutex`: ThreadSanitizer sees the one and not the other.
    private let entries = Locked<[String: Entry]>([:])
    private let perClient: Atomic<Int>
    /// The process's budget every account draws from as well.
    public let process: BodyBudget
    /// Entries at the last sweep of unused ones (sweeps run as the map doubles).
    private let swept = Atomic<Int>(64)

    public init(process: BodyBudget, perClient: Int) {
        self.process = process
        self.perClient = Atomic(perClient)
    }

    /// Bytes one client may hold (a reload may change it; accounts take it on their next use).
    public var limit: Int {
        get { perClient.load(ordering: .relaxed) }
        set {
            perClient.store(newValue, ordering: .relaxed)
            entries.withLock { map in for e in map.values { e.budget.limit = newValue } }
        }
    }

    /// Clients with an account now.
    public var clients: Int { entries.withLock { $0.count } }

    /// The client's account, shared with its other connections; give it
    /// back with `leave` when the connection closes.
    public func account(for client: String) -> BodyBudget {
        entries.withLock { map in
            if var entry = map[client] {
                entry.users += 1
                map[client] = entry
                return entry.budget
            }
            if map.count >= 2 * swept.load(ordering: .relaxed) {
                map = map.filter { $0.value.users > 0 || $0.value.budget.current > 0 }
                swept.store(max(64, map.count), ordering: .relaxed)
            }
            let budget = BodyBudget(limit: perClient.load(ordering: .relaxed), parent: process)
            map[client] = Entry(budget: budget, users: 1)
            return budget
        }
    }

    /// A connection of `client` closed. The account goes once no
    /// connection uses it and no body holds bytes in it (else at a later sweep).
    public func leave(_ client: String) {
        entries.withLock { map in
            guard var entry = map[client] else { return }
            entry.users -= 1
            if entry.users <= 0, entry.budget.current == 0 {
                map[client] = nil
            } else {
                map[client] = entry
            }
        }
    }

    /// The bytes `client` holds now (0 without an account).
    public func held(by client: String) -> Int {
        entries.withLock { $0[client]?.budget.current ?? 0 }
    }
}
