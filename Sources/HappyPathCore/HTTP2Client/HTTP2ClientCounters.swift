import Synchronization

/// What the proxy's own HTTP/2 client does for one upstream, over every
/// worker's pools and the health checks' (`happypath_upstream_h2_*`,
/// docs/operations.md). Owned by the upstream's guard, so it outlives a
/// reload that keeps the upstream; written by the pools on their loops,
/// read at a scrape.
public final class HTTP2ClientCounters: Sendable {
    /// Connections open now (connecting, ready or draining).
    public let connections = Atomic<Int>(0)
    /// Streams open now.
    public let streams = Atomic<Int>(0)
    /// Connections opened so far.
    public let opened = Atomic<Int>(0)
    /// Tries sent again inside the transport after a stream was refused
    /// unprocessed (REFUSED_STREAM, past a GOAWAY's last stream, never sent).
    public let replayed = Atomic<Int>(0)
    /// GOAWAY frames received.
    public let goaways = Atomic<Int>(0)

    public init() {}
}

extension Atomic where Value == Int {
    /// The value now, relaxed (a scrape's reading).
    public var now: Int { load(ordering: .relaxed) }
}
