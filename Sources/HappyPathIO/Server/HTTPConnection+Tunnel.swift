internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A connection after a `101 Switching Protocols`: the client end of a
/// `Tunnel` (docs/websocket.md). HTTP is over on it: its events go to the
/// tunnel, its bytes pass through its TLS session as before, and the
/// connection's own timer is off (the tunnel has its idle timer).
extension HTTPConnection: TunnelClient {
    /// Writes `head` (the `101`) and makes the connection the client end of
    /// a tunnel to `upstream`. Nil if `request` is no longer the one it answers.
    func startTunnel(
        _ request: HTTPRequest, head: UnsafeRawBufferPointer, upstream: UpstreamUpgrade, limits: Tunnel.Machine.Limits,
        now: @escaping () -> Instant
    ) -> Tunnel? {
        guard readEvent != nil, current === request else { return nil }
        current = nil
        // Bytes the client sent after its upgrade request belong to the tunnel.
        let end = machine.requestEnd
        let fromClient = end < input.buffered ? Array(input.requestBytes[end...]) : []
        input.dropBody()
        _ = machine.closed()
        if let timerEvent { event_del(timerEvent) }
        // A pipelined upgrade behind an answer still in the spool: the rest
        // of that answer goes to the output queue first, in order (the
        // tunnel writes to the queue only).
        guard unspool() else {
            close()
            return nil
        }
        if output.pending == 0, let writeEvent { event_del(writeEvent) }
        guard tunnelWrite(head) else {
            close()  // the client is gone; the upstream end stays the caller's
            return nil
        }
        let tunnel = Tunnel(connection: self, upstream: upstream, limits: limits, now: now)
        self.tunnel = tunnel
        let fromUpstream = upstream.takeLeftover()
        fromClient.withUnsafeBytes { c in fromUpstream.withUnsafeBytes { u in tunnel.start(fromClient: c, fromUpstream: u) } }
        return tunnel
    }

    /// Reads tunnel bytes from the client: > 0 bytes, 0 at its end, < 0 with `errno`.
    func tunnelRead(into buffer: UnsafeMutableRawPointer, count: Int) -> Int {
        guard readEvent != nil else { return 0 }
        return tls?.read(buffer, count) ?? Glibc.read(fd, buffer, count)
    }

    /// Writes tunnel bytes toward the client, queueing what the socket does
    /// not take. False if the client is gone.
    func tunnelWrite(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard readEvent != nil else { return false }
        switch output.write([bytes], to: fd, tls: tls) {
        case .written: return true
        case .queued:
            event_add(writeEvent, nil)
            return true
        case .failed: return false
        }
    }

    func tunnelWritable(_ tunnel: Tunnel) {
        switch output.flush(to: fd, tls: tls) {
        case .again: return
        case .failed:
            event_del(writeEvent)
            tunnel.clientFlushed(pending: output.pending, failed: true)
        case .progressed:
            tunnel.clientFlushed(pending: output.pending, failed: false)
        case .drained:
            event_del(writeEvent)
            tunnel.clientFlushed(pending: 0, failed: false)
        }
    }

    func tunnelReading(_ on: Bool) {
        guard let readEvent else { return }
        if on {
            event_add(readEvent, nil)
            readAgainIfSessionHolds()
        } else {
            event_del(readEvent)
        }
    }

    /// No more bytes toward the client (a half-close; close_notify first on TLS).
    func tunnelEndWrite() {
        guard readEvent != nil else { return }
        tls?.shutdown()
        shutdown(fd, Int32(SHUT_WR))
    }

    /// The tunnel is over: the connection closes.
    func tunnelClosed() {
        tunnel = nil
        close()
    }
}
