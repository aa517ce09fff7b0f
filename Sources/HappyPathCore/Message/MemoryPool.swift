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

    public init() {}
}
