internal import CTLS
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// An https:// endpoint's TLS client context for the proxy's own HTTP/2
/// client: the upstream's `tls` settings (CA, verification, client
/// certificate for mTLS) read once per pool, ALPN offering only `h2`.
final class HTTP2TLSClientContext {
    let raw: OpaquePointer
    /// The origin's host: SNI (unless an IP address) and the certificate check.
    let host: String

    /// Whether sessions must agree to h2 by ALPN (false: no ALPN is offered, for Redis).
    let requiresH2: Bool

    init(_ tls: UpstreamTLS?, host: String, defaultCA: (file: String?, path: String?), h2: Bool = true) throws(TLSSetupError) {
        var error = [CChar](repeating: 0, count: 512)
        let made = hp_tls_client_new(
            tls?.ca, defaultCA.file, defaultCA.path, (tls?.verify ?? true) ? 1 : 0, tls?.clientCert, tls?.clientKey,
            &error, error.count)
        guard let made else { throw TLSSetupError(description: String(nulTerminated: error)) }
        raw = made
        self.host = host
        requiresH2 = h2
        if !h2 { hp_tls_client_no_alpn(made) }
    }

    deinit { hp_tls_client_free(raw) }
}

/// One upstream connection's TLS session on its socket. Reads and writes
/// keep the plain socket's conventions (a byte count; -1 with `errno`
/// EAGAIN for "not now", another errno for a failure; 0 for the end), so
/// the connection reads and writes through either the same way.
final class HTTP2UpstreamTLSSession {
    private var session: UnsafeMutableRawPointer?
    private let requiresH2: Bool
    /// A read needs the socket writable (rare: a TLS 1.3 key update while the send buffer is full).
    private(set) var readWantsWrite = false

    init?(_ context: HTTP2TLSClientContext, fd: Int32) {
        guard let made = hp_tls_client_session_new(context.raw, fd, context.host) else { return nil }
        session = made
        requiresH2 = context.requiresH2
    }

    deinit { hp_tls_session_free(session, 0) }

    enum Step {
        case done
        case wantRead
        case wantWrite
        case failed(String)
    }

    /// One handshake step. Done means ALPN chose h2 as well.
    func handshake() -> Step {
        guard let session else { return .failed("the TLS session was closed") }
        var error = [CChar](repeating: 0, count: 512)
        switch hp_tls_client_handshake(session, &error, error.count) {
        case Int32(HP_TLS_DONE):
            guard !requiresH2 || hp_tls_alpn_is_h2(session) != 0 else {
                return .failed(
                    "the upstream did not agree to HTTP/2 in the TLS handshake (ALPN h2): set `protocol: http1` for it")
            }
            return .done
        case Int32(HP_TLS_WANT_READ): return .wantRead
        case Int32(HP_TLS_WANT_WRITE): return .wantWrite
        default: return .failed(String(nulTerminated: error))
        }
    }

    /// What OpenSSL said when a read failed (an alert from the server).
    private(set) var readError: String?

    func read(_ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int {
        guard let session else { return -1 }
        var error = [CChar](repeating: 0, count: 256)
        let rc = hp_tls_client_read(session, buffer, Int32(clamping: count), &error, error.count)
        readWantsWrite = rc == Int32(HP_TLS_WANT_WRITE)
        if rc == Int32(HP_TLS_ERROR), error[0] != 0 { readError = String(nulTerminated: error) }
        return TLSSession.translate(rc)
    }

    func write(_ buffer: UnsafeRawPointer, _ count: Int) -> Int {
        guard let session else { return -1 }
        return TLSSession.translate(hp_tls_write(session, buffer, Int32(clamping: count)))
    }

    /// Bytes held inside the session, decrypted or not yet: the socket will not say so.
    var pending: Bool { session.map { hp_tls_pending($0) > 0 } ?? false }

    /// Ends the session (with close_notify if `notify`).
    func close(notify: Bool) {
        hp_tls_session_free(session, notify ? 1 : 0)
        session = nil
    }
}
