internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A tunnel's client end: an HTTP/1.1 connection after its `101`
/// (`HTTPConnection+Tunnel`), or an HTTP/2 stream after an extended
/// CONNECT's `200` (`HTTP2TunnelEnd`, RFC 8441). On the loop's thread.
protocol TunnelClient: AnyObject {
    /// The server whose loop, memory pools and read scratch the tunnel uses.
    var server: HTTPServer { get }
    /// Reads bytes from the client: > 0 bytes, 0 at its end, < 0 with `errno` (`EAGAIN`: none now).
    func tunnelRead(into buffer: UnsafeMutableRawPointer, count: Int) -> Int
    /// Writes bytes toward the client, queueing what it does not take. False if the client is gone.
    func tunnelWrite(_ bytes: UnsafeRawBufferPointer) -> Bool
    /// Bytes queued toward the client and not yet taken.
    var pendingOutput: Int { get }
    /// Starts or stops reading the client (`Tunnel.clientReadable` hears when there is more).
    func tunnelReading(_ on: Bool)
    /// After a read that did not drain the client: look again soon if bytes wait
    /// where no socket event will say so (a TLS session's buffer, a stream's body).
    func readAgainIfSessionHolds()
    /// No more bytes toward the client (a half-close).
    func tunnelEndWrite()
    /// The tunnel is over: the client end closes (or is reset, if it had not ended).
    func tunnelClosed()
}

/// A tunnel after a `101 Switching Protocols`: the driver of its
/// `TunnelStateMachine` (HappyPathCore), between the client's connection
/// (through its TLS session, if any) and the upstream's (an
/// `UpstreamUpgrade`, through libcurl). Bytes go across unchanged; what a
/// side's socket does not take at once is queued (toward the client in the
/// connection's output queue, toward the upstream here), and the machine
/// decides when a side is read, ended, or closed.
///
/// The client end and the upstream end are the tunnel's from `start` until
/// it closes; then `onClose` hears why, with the bytes each way.
public final class Tunnel {
    public typealias Machine = TunnelStateMachine
    public typealias Side = TunnelStateMachine.Side

    /// What a closed tunnel reports.
    public struct Summary: Sendable {
        public var reason: TunnelStateMachine.CloseReason
        /// Bytes from the client to the upstream, and back.
        public var bytesToUpstream: Int
        public var bytesToClient: Int
        public var duration: Duration
    }

    private let connection: any TunnelClient
    private let upstream: UpstreamUpgrade
    private var machine: Machine
    private let now: () -> Instant
    private let openedAt: Instant
    private var upstreamRead: OpaquePointer?
    private var upstreamWrite: OpaquePointer?
    private var timer: OpaquePointer?
    /// Bytes for the upstream that its socket has not taken yet.
    private var towardUpstream = ByteBuffer(capacity: 256)
    private var towardUpstreamSent = 0
    /// What `pool` counts of `towardUpstream` now (`happypath_memory_bytes{pool="tunnels"}`).
    private var counted = 0
    private let pool: MemoryPool?
    private var bytesToUpstream = 0
    private var bytesToClient = 0
    /// Told once, when the tunnel closes.
    public var onClose: ((Summary) -> Void)?

    /// How much one read takes from a side.
    static let readSize = 32 * 1024

    init(connection: any TunnelClient, upstream: UpstreamUpgrade, limits: Machine.Limits, now: @escaping () -> Instant) {
        self.connection = connection
        self.upstream = upstream
        self.now = now
        pool = connection.server.limits.memory?.tunnels
        openedAt = now()
        machine = Machine(limits: limits, now: openedAt)
    }

    deinit {
        towardUpstream.deallocate()
        pool?.add(-counted)
    }

    /// The pool counts what waits for the upstream now.
    private func countPending() {
        let pending = pendingTowardUpstream
        pool?.add(pending - counted)
        counted = pending
    }

    public var isClosed: Bool { machine.isClosed }

    /// Opens the tunnel: `fromClient` came after the upgrade request,
    /// `fromUpstream` after the `101` head.
    func start(fromClient: UnsafeRawBufferPointer, fromUpstream: UnsafeRawBufferPointer) {
        // Alive: the connection (`tunnel`) and the worker's `tunnels` hold the tunnel until `close`,
        // which frees all three events before `connection.tunnelClosed()` and `onClose` let go of it.
        let me = Unmanaged.passUnretained(self).toOpaque()
        let base = connection.server.loop.base
        upstreamRead = event_new(base, upstream.socket, Int16(EV_READ | EV_PERSIST), tunnelUpstreamReadCallback, me)
        upstreamWrite = event_new(base, upstream.socket, Int16(EV_WRITE | EV_PERSIST), tunnelUpstreamWriteCallback, me)
        timer = event_new(base, -1, 0, tunnelTimerCallback, me)
        if !fromClient.isEmpty {
            bytesToUpstream += fromClient.count
            queueTowardUpstream(fromClient)
        }
        if !fromUpstream.isEmpty {
            bytesToClient += fromUpstream.count
            guard connection.tunnelWrite(fromUpstream) else { return perform(machine.failed(.client)) }
        }
        perform(
            machine.start(
                queuedTowardClient: connection.pendingOutput, queuedTowardUpstream: pendingTowardUpstream, now: now()))
    }

    /// The proxy stops: close now.
    public func shutdown() { perform(machine.shutdown()) }

    // MARK: - Performing the machine's actions

    private func perform(_ a: Machine.Actions) {
        if let on = a.readClient { connection.tunnelReading(on) }
        if let on = a.readUpstream, let upstreamRead {
            if on {
                event_add(upstreamRead, nil)
                // Bytes libcurl's TLS layer already holds wake no event.
                event_active(upstreamRead, Int32(EV_READ), 0)
            } else {
                event_del(upstreamRead)
            }
        }
        if let side = a.endWrite {
            if side == .client { connection.tunnelEndWrite() } else { upstream.endWrite() }
        }
        if let wait = a.timer, let timer {
            var tv = timeval(wait)
            event_add(timer, &tv)
        }
        if let reason = a.close { close(reason) }
    }

    private func close(_ reason: TunnelStateMachine.CloseReason) {
        guard upstreamRead != nil else { return }
        for event in [upstreamRead, upstreamWrite, timer] { if let event { event_free(event) } }
        (upstreamRead, upstreamWrite, timer) = (nil, nil, nil)
        upstream.close()
        connection.tunnelClosed()
        let summary = Summary(
            reason: reason, bytesToUpstream: bytesToUpstream, bytesToClient: bytesToClient, duration: now() - openedAt)
        let onClose = self.onClose
        self.onClose = nil
        onClose?(summary)
    }

    // MARK: - Client → upstream

    /// The client's socket is readable (or its TLS session holds bytes).
    func clientReadable() {
        guard upstreamRead != nil else { return }
        let scratch = connection.server.tunnelScratch
        while machine.isReading(.client) {
            let n = connection.tunnelRead(into: scratch, count: Self.readSize)
            if n < 0 {
                if errno == EAGAIN || errno == EINTR { return }
                // A reset (or a TLS close without close_notify) ends the
                // client's bytes: what is queued toward the upstream still goes.
                return perform(machine.ended(.client, now: now()))
            }
            if n == 0 { return perform(machine.ended(.client, now: now())) }
            bytesToUpstream += n
            let bytes = UnsafeRawBufferPointer(start: scratch, count: n)
            if pendingTowardUpstream == 0 {
                switch upstream.send(bytes) {
                case let .bytes(sent): if sent < n { queueTowardUpstream(UnsafeRawBufferPointer(rebasing: bytes[sent...])) }
                default: return perform(machine.failed(.upstream))
                }
            } else {
                queueTowardUpstream(bytes)
            }
            perform(machine.moved(from: .client, queued: pendingTowardUpstream, now: now()))
            if n < Self.readSize { break }
        }
        // Only while reading: a paused client's TLS bytes wait for the resume
        // (which looks again), or this would wake itself forever.
        if machine.isReading(.client) { connection.readAgainIfSessionHolds() }
    }

    private var pendingTowardUpstream: Int { towardUpstream.count - towardUpstreamSent }

    /// Drops the bytes already sent once they outweigh those waiting, so a
    /// queue that never quite empties (a steady stream to a slightly slower
    /// upstream) stays the size of what waits, not of all that passed.
    /// (The upstream's TLS allows a moved buffer between tries.)
    private func compactTowardUpstream() {
        guard towardUpstreamSent >= 64 * 1024, towardUpstreamSent >= pendingTowardUpstream else { return }
        towardUpstream.removeFirst(towardUpstreamSent)
        towardUpstreamSent = 0
    }

    private func queueTowardUpstream(_ bytes: UnsafeRawBufferPointer) {
        if pendingTowardUpstream == 0 {
            towardUpstream.count = 0
            towardUpstreamSent = 0
        }
        towardUpstream.append(bytes)
        compactTowardUpstream()
        countPending()
        if let upstreamWrite { event_add(upstreamWrite, nil) }
    }

    /// The upstream's socket takes bytes again.
    fileprivate func upstreamWritable() {
        guard upstreamRead != nil else { return }
        while pendingTowardUpstream > 0 {
            let rest = UnsafeRawBufferPointer(rebasing: towardUpstream.bytes[towardUpstreamSent...])
            guard case let .bytes(sent) = upstream.send(rest) else { return perform(machine.failed(.upstream)) }
            if sent == 0 { break }
            towardUpstreamSent += sent
        }
        if pendingTowardUpstream == 0 {
            if let upstreamWrite { event_del(upstreamWrite) }
            towardUpstream.count = 0
            towardUpstreamSent = 0
            // A burst leaves a large buffer: give it back.
            towardUpstream.shrink(to: 256)
        } else {
            compactTowardUpstream()
        }
        countPending()
        perform(machine.flushed(toward: .upstream, queued: pendingTowardUpstream, now: now()))
    }

    // MARK: - Upstream → client

    fileprivate func upstreamReadable() {
        guard upstreamRead != nil else { return }
        let scratch = connection.server.tunnelScratch
        while machine.isReading(.upstream) {
            switch upstream.receive(into: scratch, count: Self.readSize) {
            case .again:
                return
            case .ended, .failed:
                // A read error (often a TLS close without close_notify) ends
                // the upstream's bytes like an EOF: what is queued still goes.
                return perform(machine.ended(.upstream, now: now()))
            case let .bytes(n):
                bytesToClient += n
                guard connection.tunnelWrite(UnsafeRawBufferPointer(start: scratch, count: n)) else {
                    return perform(machine.failed(.client))
                }
                perform(machine.moved(from: .upstream, queued: connection.pendingOutput, now: now()))
            }
        }
    }

    /// Writing to the client progressed (`pending` bytes still queued), or failed.
    func clientFlushed(pending: Int, failed: Bool) {
        guard upstreamRead != nil else { return }
        if failed { return perform(machine.failed(.client)) }
        perform(machine.flushed(toward: .client, queued: pending, now: now()))
    }

    /// The client's connection closed under the tunnel (the server is stopping).
    func clientGone() {
        guard upstreamRead != nil else { return }
        perform(machine.failed(.client))
    }

    fileprivate func timerFired() {
        guard upstreamRead != nil else { return }
        perform(machine.timerFired(now: now()))
    }
}

// MARK: - C callbacks (the tunnel comes back unretained; keep it alive for the call)

@inline(__always)
private func withTunnel(_ arg: UnsafeMutableRawPointer?, _ body: (Tunnel) -> Void) {
    let tunnel = Unmanaged<Tunnel>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(tunnel) { body(tunnel) }
}

private func tunnelUpstreamReadCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withTunnel(arg) { $0.upstreamReadable() }
}

private func tunnelUpstreamWriteCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withTunnel(arg) { $0.upstreamWritable() }
}

private func tunnelTimerCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withTunnel(arg) { $0.timerFired() }
}
