import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// An HTTP/2 stream that carries a tunnel (RFC 8441, docs/websocket.md):
/// an extended CONNECT answered `200`, after which the stream's DATA is the
/// tunnel's bytes both ways. The client's bytes arrive in the request's
/// streamed body (`RequestBodyStream`: the client's window opens only as the
/// tunnel takes them, so a slow upstream stops the client at its window);
/// bytes toward the client are the answer's body (staged within the
/// connection's `limits.connection_buffer`, the stream's window pacing
/// them). Each side ends on its own: END_STREAM passes a half-close, a
/// reset ends both.
extension HTTP2Stream {
    /// Answers `200` with `fields` and makes the stream the client end of a
    /// tunnel to `upstream`. Nil if the request is not this stream's now, or
    /// its body does not stream (the caller closes `upstream` then).
    func startTunnel(
        _ request: HTTPRequest, fields: [HTTPField], upstream: UpstreamUpgrade, limits: Tunnel.Machine.Limits,
        now: @escaping () -> Instant
    ) -> Tunnel? {
        guard current === request, let body = takeBodyStream(of: request), let server = owner?.tunnelServer else {
            return nil
        }
        clearStagedFields(for: request)
        for field in fields {
            var name = field.name
            var value = field.value
            name.withUTF8 { n in
                value.withUTF8 { v in stageField(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v), for: request) }
            }
        }
        writeHead(status: 200, contentLength: nil, reason: nil, for: request)
        becomeTunnel()
        let end = HTTP2TunnelEnd(stream: self, request: request, body: body, server: server)
        let tunnel = Tunnel(connection: end, upstream: upstream, limits: limits, now: now)
        end.tunnel = tunnel
        request.observer = end
        let fromUpstream = upstream.takeLeftover()
        fromUpstream.withUnsafeBytes { tunnel.start(fromClient: UnsafeRawBufferPointer(start: nil, count: 0), fromUpstream: $0) }
        return tunnel
    }
}

/// The client end of a tunnel on an HTTP/2 stream (`HTTP2Stream.startTunnel`).
/// It holds the request while the tunnel lives; the tunnel holds it.
final class HTTP2TunnelEnd: TunnelClient, HTTPRequestObserver {
    private let stream: HTTP2Stream
    private let request: HTTPRequest
    private let body: RequestBodyStream
    let server: HTTPServer
    /// Alive: the tunnel holds this end (`connection`) until it closes.
    weak var tunnel: Tunnel?
    private var reading = false
    /// Our END_STREAM went (or is staged): nothing more is written.
    private var writeEnded = false
    private var closed = false
    /// The client's END_STREAM was read: its side is over.
    private var clientEnded = false
    /// A read scheduled for the next loop pass (bytes wait in the body).
    private var readScheduled = false

    init(stream: HTTP2Stream, request: HTTPRequest, body: RequestBodyStream, server: HTTPServer) {
        self.stream = stream
        self.request = request
        self.body = body
        self.server = server
        body.onAvailable = { [weak self] in self?.available() }
    }

    func tunnelRead(into buffer: UnsafeMutableRawPointer, count: Int) -> Int {
        switch body.read(into: buffer, max: count) {
        case let .bytes(n):
            if n > 0 { return n }
            errno = EAGAIN
            return -1
        case .wait:
            errno = EAGAIN
            return -1
        case .end:
            clientEnded = true
            return 0
        case .failed:
            errno = ECONNRESET
            return -1
        }
    }

    func tunnelWrite(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !closed, !writeEnded, stream.current === request else { return false }
        stream.writeBodyPart(bytes, notifyWhenDrained: true, for: request)
        return true
    }

    /// What waits toward the client; a connection at its bound counts as
    /// full whatever this stream staged, so the upstream stops being read.
    var pendingOutput: Int {
        guard !writeEnded else { return 0 }
        let pending = request.pendingOutput
        return request.outputRoom <= 0 ? max(pending, Int(Int32.max)) : pending
    }

    func tunnelReading(_ on: Bool) {
        reading = on
        if on { readAgainIfSessionHolds() }
    }

    /// Bytes may wait in the body already (they came while the tunnel did
    /// not read): the tunnel reads them on the next pass. With none, the
    /// body calls back (`onAvailable`) when some arrive.
    func readAgainIfSessionHolds() {
        guard reading, !readScheduled, !closed else { return }
        var probe: UInt8 = 0
        if case .wait = body.read(into: &probe, max: 0) { return }
        readScheduled = true
        server.loop.schedule(after: .zero) { [weak self] in
            guard let self else { return }
            readScheduled = false
            if reading, !closed { tunnel?.clientReadable() }
        }
    }

    private func available() {
        guard reading, !closed else { return }
        tunnel?.clientReadable()
    }

    func tunnelEndWrite() {
        guard !writeEnded, !closed else { return }
        writeEnded = true
        _ = stream.end(request)
    }

    func tunnelClosed() {
        guard !closed else { return }
        closed = true
        body.onAvailable = nil
        request.observer = nil
        // Both sides ended: the stream closes by itself. Else (an error, a
        // shutdown, the idle timeout) it is reset.
        if !writeEnded || !clientEnded { stream.resetTunnel() }
    }

    // MARK: - HTTPRequestObserver

    func requestClientClosed(_ request: HTTPRequest) { tunnel?.clientGone() }

    func requestOutputDrained(_ request: HTTPRequest) {
        tunnel?.clientFlushed(pending: pendingOutput, failed: false)
    }

    func requestOutputMustWait(_ request: HTTPRequest) {
        tunnel?.clientFlushed(pending: pendingOutput, failed: false)
    }
}
