internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// The proxy's own HTTP/2 client on one event loop (`protocol: h2` to an
/// http:// endpoint, with `h2_client: nghttp2`): a pool of multiplexed
/// connections per endpoint, driven by the loop. Nothing here blocks.
///
/// Retention: the client owns its pools, a pool its connections and the
/// tries waiting in it, a connection's session the tries it carries.
/// `shutdown` (by the owner, before letting go) ends them all.
public final class HTTP2UpstreamClient {
    let loop: EventLoop
    let clock: () -> Instant
    public var limits: HTTP2ClientLimits
    /// Connections per endpoint at most (the worker's share of `max_connections`).
    public var maxConnectionsPerEndpoint: Int
    /// A connection without a stream this long closes.
    public var idleTimeout: Duration
    /// A connection the server was silent on this long is asked a PING
    /// before it takes another stream (tests shorten it; pools made after
    /// a change take it).
    public var pingAfterSilence = Duration.seconds(10)
    /// Counts the response bytes streams hold for exchanges that did not
    /// take them (`happypath_memory_bytes{pool="upstream_h2"}`, in
    /// `limits.max_memory`): at most a stream window each.
    public var memory: MemoryPool?
    private struct PoolKey: Hashable {
        let origin: String
        let connectTo: String?
        let counters: ObjectIdentifier
    }
    private var pools: [PoolKey: HTTP2ConnectionPool] = [:]
    /// Counters of tries whose request names none (tests).
    private let unnamed = HTTP2ClientCounters()
    /// One read buffer for every connection of the loop (one read at a time).
    let readBuffer = UnsafeMutableRawPointer.allocate(byteCount: HTTP2UpstreamConnection.readSize, alignment: 16)
    private var nextTryID = 0
    private var soonStreams: [HTTP2UpstreamStream] = []
    private var soonFlushes: [HTTP2UpstreamConnection] = []
    private var soonEvent: OpaquePointer?
    private var isShutDown = false
    /// The loop's resolver (`EventLoop.resolver`: it outlives this client,
    /// whose cancelled lookups still call back on a later pass).
    func resolver() -> OpaquePointer? { isShutDown ? nil : loop.resolver() }

    public init(
        loop: EventLoop, clock: @escaping () -> Instant, limits: HTTP2ClientLimits = HTTP2ClientLimits(),
        maxConnectionsPerEndpoint: Int = 4, idleTimeout: Duration = .seconds(60)
    ) {
        self.loop = loop
        self.clock = clock
        self.limits = limits
        self.maxConnectionsPerEndpoint = maxConnectionsPerEndpoint
        self.idleTimeout = idleTimeout
        // Alive: points at `self` unretained; `shutdown()` (the owner's, or deinit) frees it.
        soonEvent = event_new(loop.base, -1, 0, h2ClientSoonCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        shutdown()
        readBuffer.deallocate()
    }

    /// Starts a try. Its handler hears nothing before `start` returns.
    public func start(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> HTTP2UpstreamStream {
        nextTryID &+= 1
        let stream = HTTP2UpstreamStream(request: request, handler: handler, client: self, tryID: nextTryID)
        guard !isShutDown, let pool = pool(for: request) else {
            stream.failedWaiting(
                isShutDown ? "the proxy is shutting down" : HTTP2ConnectFailure("not an http:// or https:// endpoint"))
            soon(stream)
            return stream
        }
        pool.start(stream)
        return stream
    }

    private func pool(for request: UpstreamRequest) -> HTTP2ConnectionPool? {
        // One pool per endpoint and upstream (two upstreams naming one endpoint count apart).
        let counters = request.h2Counters ?? unnamed
        let key = PoolKey(origin: request.origin, connectTo: request.connectTo, counters: ObjectIdentifier(counters))
        if let pool = pools[key] { return pool }
        guard let endpoint = HTTP2Endpoint(request, limits: limits) else { return nil }
        let pool = HTTP2ConnectionPool(
            client: self, endpoint: endpoint, counters: counters, maxConnections: maxConnectionsPerEndpoint,
            idleTimeout: idleTimeout)
        pools[key] = pool
        return pool
    }

    /// Ends every try without telling its handler, and closes every connection.
    public func shutdown() {
        guard !isShutDown else { return }
        isShutDown = true
        for pool in pools.values { pool.shutdown() }
        pools.removeAll()
        soonStreams.removeAll()
        soonFlushes.removeAll()
        if let soonEvent { event_free(soonEvent) }
        soonEvent = nil
    }

    // MARK: - The next pass

    /// `stream` has held bytes to hand over, or its end to tell: on the loop's next pass.
    func soon(_ stream: HTTP2UpstreamStream) {
        guard !stream.soon, !isShutDown else { return }
        stream.soon = true
        soonStreams.append(stream)
        wake()
    }

    /// `connection` has frames to write: on the loop's next pass (once per pass).
    func flushSoon(_ connection: HTTP2UpstreamConnection) {
        guard !isShutDown else { return }
        soonFlushes.append(connection)
        wake()
    }

    private func wake() {
        if soonStreams.count + soonFlushes.count == 1, let soonEvent { event_active(soonEvent, 0, 0) }
    }

    func runSoon() {
        while !soonStreams.isEmpty || !soonFlushes.isEmpty {
            let streams = soonStreams
            soonStreams.removeAll(keepingCapacity: true)
            for stream in streams { stream.runSoon() }
            let flushes = soonFlushes
            soonFlushes.removeAll(keepingCapacity: true)
            for connection in flushes where connection.flushQueued { connection.flush() }
        }
    }
}

private func h2ClientSoonCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<HTTP2UpstreamClient>.fromOpaque(arg!).takeUnretainedValue().runSoon()
}
