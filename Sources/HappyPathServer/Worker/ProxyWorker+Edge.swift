import HappyPathCore
import HappyPathIO
import Logging

/// The edge's events that are not requests: TLS handshakes, HTTP/2
/// connections and streams, refusals at the edge (HTTP/1.1 and HTTP/2), and
/// the listener's pauses. Each is counted; some are logged.
extension ProxyWorker {
    func tlsHandshake(version: Int) { metrics.tlsHandshake(version: version) }
    func tlsHandshakeFailed(reason: TLSHandshakeFailure) { metrics.tlsHandshakeFailed(reason: reason) }
    func silentConnectionClosed() { metrics.silentConnectionClosed() }

    // MARK: - HTTP/2 connections and streams (docs/http2.md)

    // The gauges are the process's (shared, read at scrape time, as
    // `happypath_tunnels_open`); the counters are kept per worker.

    func http2ConnectionOpened(tls: Bool) {
        shared.http2Connections.add(1)
        metrics.http2ConnectionOpened(tls: tls)
    }

    func http2ConnectionClosed(reason: HTTP2ConnectionStateMachine.Reason, sentGoaway: Bool) {
        shared.http2Connections.add(-1)
        metrics.http2ConnectionClosed(reason: reason, sentGoaway: sentGoaway)
    }

    func http2StreamOpened() {
        shared.http2Streams.add(1)
        metrics.http2StreamOpened()
    }

    func http2StreamClosed() { shared.http2Streams.add(-1) }

    func http2StreamReset(byClient: Bool, code: HTTP2ErrorCode) { metrics.http2StreamReset(byClient: byClient, code: code) }

    func http2GoawayReceived(code: HTTP2ErrorCode) { metrics.http2GoawayReceived(code: code) }

    func reject(_ request: HTTPRequest, reason: HTTP1Refusal) {
        let id = refused(request, .http1(reason))
        ProblemResponder.respond(request, ProblemResponder.problem(for: reason, requestID: id, limits: server.limits))
    }

    /// On its stream; the connection's other streams go on (docs/http2.md).
    func reject(_ request: HTTPRequest, refusal: HTTP2RequestRefusal) {
        let id = refused(request, refusal)
        ProblemResponder.respond(request, ProblemResponder.problem(for: refusal, requestID: id, limits: server.limits))
    }

    /// What both protocols do with a refusal before answering it: one
    /// debug line and `happypath_requests_refused_total` (an HTTP/1.1 rule
    /// counts in the same series on either). Returns the request's id.
    private func refused(_ request: HTTPRequest, _ refusal: HTTP2RequestRefusal) -> String {
        let id = requestID(of: request)
        logger.debug(
            "request refused",
            metadata: [
                "request_id": "\(id)", "reason": "\(refusal.label)", "protocol": "\(request.protocolName)",
                "peer": "\(request.peerAddress)",
            ])
        metrics.refused(refusal)
        return id
    }

    func acceptCapped(limit: Int) { listenerLog.acceptCapped(limit: limit, at: clock.now()) }

    func memoryPressureChanged(_ change: MemoryPressure.Change, holding bytes: Int, limit: Int) {
        shared.memoryPressureChanged(change, holding: bytes)
        listenerLog.memoryPressureChanged(change, holding: bytes, limit: limit)
    }

    func acceptPaused(errno code: Int32, pause: Duration) { listenerLog.acceptPaused(errno: code, pause: pause, at: clock.now()) }
}
