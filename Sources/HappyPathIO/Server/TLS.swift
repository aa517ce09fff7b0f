internal import CTLS
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

public struct TLSSetupError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(description: String) { self.description = description }
}

/// A TLS listener's certificates, read once into OpenSSL server contexts
/// (one per certificate; SNI picks the first whose names cover the one the
/// client asks for, else the first). Private keys are read here and never
/// kept or logged anywhere else. Shared by every worker's listener:
/// OpenSSL's contexts are safe to start sessions from on any thread, and
/// nothing here changes after `init` (`@unchecked Sendable` for that). A
/// reload makes a new one; sessions keep the one they started with.
public final class TLSServerContext: @unchecked Sendable {
    let raw: OpaquePointer
    public let certificates: [CertificatePair]
    /// ALPN offers `h2` before `http/1.1` (the listener speaks HTTP/2).
    public let offersH2: Bool

    public init(certificates: [CertificatePair], minimumTLS13: Bool, offerH2: Bool = false) throws(TLSSetupError) {
        var error = [CChar](repeating: 0, count: 512)
        let made: OpaquePointer? = Self.withCStrings(certificates.map(\.cert)) { certs in
            Self.withCStrings(certificates.map(\.key)) { keys in
                hp_tls_server_new(
                    certs, keys, Int32(certificates.count), minimumTLS13 ? 1 : 0, offerH2 ? 1 : 0, &error, error.count)
            }
        }
        guard let made else { throw TLSSetupError(description: String(nulTerminated: error)) }
        raw = made
        self.certificates = certificates
        offersH2 = offerH2
    }

    deinit { hp_tls_server_free(raw) }

    /// When certificate `index` expires (Unix seconds), nil if unreadable.
    public func notAfter(_ index: Int) -> Int64? {
        let t = hp_tls_server_not_after(raw, Int32(index))
        return t < 0 ? nil : Int64(t)
    }

    /// Reads and checks a pair without keeping it (`happypath check`): its
    /// expiry (Unix seconds), or what is wrong with it.
    public static func check(_ pair: CertificatePair) -> Result<Int64, TLSSetupError> {
        var error = [CChar](repeating: 0, count: 512)
        var notAfter: Int64 = 0
        let rc = hp_tls_check_pair(pair.cert, pair.key, &notAfter, &error, error.count)
        return rc == 0 ? .success(notAfter) : .failure(TLSSetupError(description: String(nulTerminated: error)))
    }

    private static func withCStrings<R>(
        _ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R
    ) -> R {
        let copies = strings.map { strdup($0) }
        defer { for c in copies { free(c) } }
        let pointers = copies.map { UnsafePointer($0) }
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}

/// One client connection's TLS session: its handshake machine and the
/// OpenSSL session on the socket. Reads and writes keep the plain
/// socket's conventions (a byte count; -1 with `errno` EAGAIN for "not
/// now", another errno for a failure; 0 for the end), so the connection
/// reads and writes through either the same way.
///
/// OpenSSL's session is made only when the client's first bytes are there
/// and its ClientHello declares at most `maxClientHello` bytes: a
/// connection that says nothing costs no more than a plain one (docs/tls.md).
final class TLSSession {
    /// Held for the session's life (the SNI callback reads it mid-handshake).
    let context: TLSServerContext
    private let fd: Int32
    private var session: UnsafeMutableRawPointer?
    /// OpenSSL's session was made (it may since have been closed).
    private var opened = false
    /// The client's first bytes came and OpenSSL took over.
    var started: Bool { opened }
    /// The socket wakes only once a ClientHello's header is whole (SO_RCVLOWAT).
    private var lowered: Int32 = 0
    var machine = TLSSessionStateMachine()
    /// A read or handshake step needs the socket writable (rare: a TLS 1.3
    /// key update while the send buffer is full).
    private(set) var readWantsWrite = false

    /// The largest ClientHello accepted, 16 KiB. OpenSSL would make room
    /// for up to 131,396 bytes on a declared length alone; browsers send
    /// 0.5 to 2 KiB (a post-quantum key share included).
    static let maxClientHello = 16 * 1024

    init(context: TLSServerContext, fd: Int32) {
        self.context = context
        self.fd = fd
    }

    deinit { hp_tls_session_free(session, 0) }

    /// The handshake chose ALPN `h2`: the client speaks HTTP/2.
    var negotiatedH2: Bool { session.map { hp_tls_alpn_is_h2($0) != 0 } ?? false }

    func handshake() -> TLSSessionStateMachine.StepResult {
        if !opened {
            let checked = hp_tls_hello_check(fd, Self.maxClientHello, &lowered)
            guard checked == Int32(HP_TLS_DONE) else {
                return checked == Int32(HP_TLS_WANT_READ) ? .wantRead : .failed(Self.failure(Int32(HP_TLS_FAILED) - checked))
            }
            opened = true
            // Out of memory for a session: the connection fails as a protocol error.
            guard let made = hp_tls_session_new(context.raw, fd) else { return .failed(.protocol) }
            session = made
        }
        guard let session else { return .failed(.protocol) }
        let rc = hp_tls_handshake(session)
        switch rc {
        case Int32(HP_TLS_DONE): return .done(version: Int(hp_tls_version(session)))
        case Int32(HP_TLS_WANT_READ): return .wantRead
        case Int32(HP_TLS_WANT_WRITE): return .wantWrite
        default: return .failed(Self.failure(Int32(HP_TLS_FAILED) - rc))
        }
    }

    private static func failure(_ code: Int32) -> TLSHandshakeFailure {
        switch code {
        case Int32(HP_TLS_FAIL_HTTP_REQUEST): .httpRequest
        case Int32(HP_TLS_FAIL_VERSION): .version
        case Int32(HP_TLS_FAIL_NO_SHARED_CIPHER): .noSharedCipher
        case Int32(HP_TLS_FAIL_ALPN): .alpn
        case Int32(HP_TLS_FAIL_CLOSED): .closed
        case Int32(HP_TLS_FAIL_TOO_LARGE): .tooLarge
        default: .protocol
        }
    }

    func read(_ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int {
        guard let session else { return closedSocket() }
        let rc = hp_tls_read(session, buffer, Int32(clamping: count))
        readWantsWrite = rc == Int32(HP_TLS_WANT_WRITE)
        return Self.translate(rc)
    }

    func write(_ buffer: UnsafeRawPointer, _ count: Int) -> Int {
        guard let session else { return closedSocket() }
        return Self.translate(hp_tls_write(session, buffer, Int32(clamping: count)))
    }

    /// Decrypted bytes held inside the session: the socket will not say so.
    var pending: Bool { session.map { hp_tls_pending($0) > 0 } ?? false }

    /// Sends close_notify (the write side's end).
    func shutdown() { if let session { hp_tls_shutdown(session) } }

    /// Ends the session (with close_notify if `notify`); later reads and writes fail.
    func close(notify: Bool) {
        hp_tls_session_free(session, notify ? 1 : 0)
        session = nil
        opened = true
    }

    /// A session call's result in the socket's conventions.
    static func translate(_ rc: Int32) -> Int {
        if rc > 0 { return Int(rc) }
        switch rc {
        case Int32(HP_TLS_CLOSED): return 0
        case Int32(HP_TLS_WANT_READ), Int32(HP_TLS_WANT_WRITE):
            errno = EAGAIN
            return -1
        default:
            errno = ECONNRESET
            return -1
        }
    }

    private func closedSocket() -> Int {
        errno = EBADF
        return -1
    }
}
