internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A TLS listener's connection before HTTP starts: the handshake, driven by
/// the socket's events and one deadline as its `TLSSessionStateMachine`
/// says (docs/tls.md).
extension HTTPConnection {
    /// The answer to a plain HTTP request on a TLS listener: 400, the problem
    /// shape, written once and unencrypted (the client reads it as HTTP).
    static let plainHTTPRefusal: String = {
        let body =
            Problem(
                .badRequest, requestID: "",
                detail: "This port speaks HTTPS: the request was sent as plain HTTP. Send it to https:// instead."
            ).json() + "\n"
        return "HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Connection: close\r\n\r\n" + body
    }()

    /// Until the handshake is done, the socket's events and the timer drive it.
    func handshake(_ a: TLSSessionStateMachine.Actions) {
        guard let tls else { return }
        if let arm = a.deadline, let timerEvent {
            var tv = timeval(server.limits.timeout)
            _ = arm ? event_add(timerEvent, &tv) : event_del(timerEvent)
        }
        if let watch = a.writeInterest, writeEvent != nil { _ = watch ? event_add(writeEvent, nil) : event_del(writeEvent) }
        switch a.step {
        case .none: break
        case .handshake: handshake(tls.machine.stepped(tls.handshake()))
        case let .startHTTP(version):
            server.delegate?.tlsHandshake(version: version)
            if tls.negotiatedH2, server.limits.http2 != nil {
                startHTTP2()
                return readAgainIfSessionHolds()
            }
            perform(machine.start())
            // The client's first request may have come with the handshake's last flight.
            readAgainIfSessionHolds()
        case let .close(reason):
            server.delegate?.tlsHandshakeFailed(reason: reason)
            tls.close(notify: false)
            // Plain HTTP on a TLS port gets a plain answer that says so (as nginx does).
            // What the request sent is read first, so the close does not reset the answer away.
            if reason == .httpRequest {
                _ = input.discard(from: fd, tls: nil)
                var answer = Self.plainHTTPRefusal
                answer.withUTF8 { _ = Glibc.write(fd, $0.baseAddress, $0.count) }
                shutdown(fd, Int32(SHUT_WR))
            }
            close()
        }
    }
}
