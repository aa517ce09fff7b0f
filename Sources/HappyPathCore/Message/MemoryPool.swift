import Synchronization

/// Bytes the whole process holds for someone in one kind of buffer (answer
/// bytes staged for HTTP/2 streams, output queued for slow clients), kept
/// by those buffers as they grow and shrink and read by the metrics
/// (`happypath_memory_bytes{pool}`) and the status page. Only changes are
/// counted: a write the kernel takes at once touches no pool.
public final class MemoryPool: Sendable {
    private let bytes = Atomic<Int>(0)

    public init() {}

    /// Bytes held now.
    public var current: Int { bytes.load(ordering: .relaxed) }

    /// A buffer grew (`delta` > 0) or shrank.
    @inlinable public func add(_ delta: Int) {
        if delta != 0 { _add(delta) }
    }

    @usableFromInline func _add(_ delta: Int) { bytes.wrappingAdd(delta, ordering: .relaxed) }
}

/// The pools the client connections of a process keep (one set per process,
/// shared by every worker's listeners).
public struct ConnectionMemory: Sendable {
    /// Answer bytes staged for HTTP/2 streams, not yet framed (`limits.connection_buffer`).
    public let staged = MemoryPool()
    /// Bytes queued for clients' sockets that the kernel has not taken yet
    /// (HTTP/1.1 answers, HTTP/2 frames, tunnels).
    public let output = MemoryPool()
    /// Bytes from tunnels' clients (WebSocket, `CONNECT`-like upgrades)
    /// that their upstreams' sockets have not taken yet.
    public let tunnels = MemoryPool()
    /// Response bytes the proxy's own HTTP/2 client holds for streams whose
    /// exchanges are not taking them (a slow client): a stream window each at most.
    public let upstreamH2 = MemoryPool()
    /// Answer bytes kept once for the members of coalesced groups that have
    /// not read them yet (`coalesce:`, `CoalescedAnswer`).
    public let coalesced = MemoryPool()

    public init() {}
}

/// The whole budget over what the process holds for clients
/// (`limits.max_memory`: request bodies, staged answers, queued output),
/// with the overload action's two marks, as Envoy's overload manager acts on
/// its resources: at `high` (90 %) the listeners stop accepting and new
/// HTTP/2 streams are refused (REFUSED_STREAM, safe for a client to retry);
/// below `low` (75 %) they resume. Checked where a client would add to it
/// (an accept, a new stream) and at each scrape: a few atomic loads, no
/// lock, no timer.
public final class MemoryPressure: Sendable {
    private let maximum: Atomic<Int>
    @usableFromInline let isHigh = Atomic<Bool>(false)
    /// What it sums: the request bodies, the connections' pools, and
    /// another listener's output (the admin listener's: event streams),
    /// each held apart (no copy of a `ConnectionMemory` per reading).
    private let bodies: BodyBudget?
    private let staged: MemoryPool?
    private let output: MemoryPool?
    private let tunnels: MemoryPool?
    private let upstreamH2: MemoryPool?
    private let coalesced: MemoryPool?
    private let other: MemoryPool?

    public init(limit: Int, bodies: BodyBudget? = nil, memory: ConnectionMemory? = nil, other: MemoryPool? = nil) {
        maximum = Atomic(limit)
        self.bodies = bodies
        staged = memory?.staged
        output = memory?.output
        tunnels = memory?.tunnels
        upstreamH2 = memory?.upstreamH2
        coalesced = memory?.coalesced
        self.other = other
    }

    /// What the process holds for clients now, as `limits.max_memory` counts it.
    public var total: Int {
        (bodies?.current ?? 0) + (staged?.current ?? 0) + (output?.current ?? 0) + (tunnels?.current ?? 0)
            + (upstreamH2?.current ?? 0) + (coalesced?.current ?? 0) + (other?.current ?? 0)
    }

    /// `limits.max_memory` (a reload may change it).
    public var limit: Int {
        get { maximum.load(ordering: .relaxed) }
        set { maximum.store(newValue, ordering: .relaxed) }
    }

    public var high: Int { limit / 10 * 9 }
    public var low: Int { limit / 4 * 3 }

    /// Above the high mark now (as last checked).
    @inlinable public var active: Bool { isHigh.load(ordering: .relaxed) }

    public enum Change: Sendable, Equatable {
        case began, ended
    }

    /// Checks against what is held now (`total`): whether the action is on,
    /// the change this check made, and the bytes it saw.
    public func check() -> (active: Bool, change: Change?, total: Int) {
        let held = total
        let (active, change) = check(total: held)
        return (active, change, held)
    }

    /// `total` is what the process holds now: whether the action is on, and
    /// the change this check made (exactly one checker sees each change).
    public func check(total: Int) -> (active: Bool, change: Change?) {
        let on = isHigh.load(ordering: .relaxed)
        if !on, total >= high {
            let won = isHigh.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged
            return (true, won ? .began : nil)
        }
        if on, total < low {
            let won = isHigh.compareExchange(expected: true, desired: false, ordering: .relaxed).exchanged
            return (false, won ? .ended : nil)
        }
        return (on, nil)
    }
}
