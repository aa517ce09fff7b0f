internal import CLibevent
internal import CShims
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// Bounds on what a client may send, and how long it may take.
public struct HTTPServerLimits: Sendable {
    public var maxHeaderBytes: Int
    public var maxBodyBytes: Int
    /// The request head must arrive in full within this, counted from its
    /// first byte (else 408); a body, a kept-alive connection between
    /// requests and a client reading its response may each stall this long.
    public var timeout: Duration
    /// Header fields in a head (and in a chunked body's trailers).
    public var maxFields: Int
    /// Request bodies held by the whole process (nil: no budget). A body
    /// that does not fit is refused `.bodyOverBudget` before it is read.
    public var bodyBudget: BodyBudget?
    /// How request paths are normalized (normalize.merge_slashes, limits.encoded_slashes).
    public var path: PathNormalization
    /// Client connections of the whole process (nil: no cap). At the cap
    /// the listener stops accepting until a connection closes.
    public var connections: ConnectionBudget?
    /// HTTP/2 on this listener (nil: HTTP/1.1 only): by prior knowledge
    /// on a cleartext listener, by ALPN `h2` on a TLS one.
    public var http2: HTTP2ServerSettings?
    /// Answer bytes staged for one client connection and not yet taken by
    /// it, all its streams together (`limits.connection_buffer`): past it
    /// the upstream transfers feeding the connection pause until it drains.
    public var connectionBuffer = 256 * 1024
    /// Each client's share of `bodyBudget` (`limits.max_buffered_per_client`;
    /// nil: none, every body counts in the process's budget only).
    public var clientShares: ClientShares?
    /// Where the process counts what its client connections hold (nil: not counted).
    public var memory: ConnectionMemory?
    /// `limits.max_memory` over request bodies and `memory` (nil: none).
    public var memoryPressure: MemoryPressure?
    /// Answers read ahead of slow clients into spool files (`limits.read_ahead`;
    /// nil: none, a slow client's answer waits in its upstream transfer).
    public var spool: Spool?

    public init(
        maxHeaderBytes: Int, maxBodyBytes: Int, timeout: Duration, maxFields: Int = 100, bodyBudget: BodyBudget? = nil,
        path: PathNormalization = PathNormalization(), connections: ConnectionBudget? = nil,
        http2: HTTP2ServerSettings? = nil
    ) {
        self.http2 = http2
        self.maxHeaderBytes = maxHeaderBytes
        self.maxBodyBytes = maxBodyBytes
        self.timeout = timeout
        self.maxFields = maxFields
        self.bodyBudget = bodyBudget
        self.path = path
        self.connections = connections
    }

    var request: RequestLimits {
        RequestLimits(maxHeadBytes: maxHeaderBytes, maxFields: maxFields, maxBodyBytes: maxBodyBytes, path: path)
    }
}

/// Receives requests on the server's loop thread. Each request passed to
/// `serve` or `reject` must be answered exactly once (a reply, a streamed
/// reply ended with `endReply`, or `abort()`).
public protocol HTTPServerDelegate: AnyObject {
    /// A complete request, body included.
    func serve(_ request: HTTPRequest)
    /// A request the edge refused (RFC 9112 rules and limits): answer it;
    /// the connection closes after the answer.
    func reject(_ request: HTTPRequest, reason: HTTP1Refusal)
    /// A request with `Expect: 100-continue`, before its body is read: false
    /// if the delegate answered it already (the client is then not invited
    /// to send the body, and the connection closes after the answer).
    func admit(_ request: HTTPRequest) -> Bool
    /// A request head with a body, before any of the body is kept or its
    /// size taken from the body budget: true if the delegate holds it
    /// (`bodyHeld` follows at once).
    func holdsBody(_ request: HTTPRequest) -> Bool
    /// A head the delegate holds: it answers it (the connection closes
    /// after the answer; the body is never read), or calls
    /// `request.readBody()`, now or later, and is handed the request by
    /// `serve` once its body is read. The client waits are off meanwhile.
    func bodyHeld(_ request: HTTPRequest)
    /// An HTTP/2 request head with a body still to come, not held: true if
    /// the request goes to `serve` now and its body streams to the exchange
    /// as it arrives (`HTTPRequest.takeBodyStream`), false to read it whole first.
    func streamsBody(_ request: HTTPRequest) -> Bool
    /// Accepting stopped for `pause` because the process is out of file
    /// descriptors (EMFILE/ENFILE) or memory; it resumes by itself.
    func acceptPaused(errno: Int32, pause: Duration)
    /// Accepting stopped because the process holds `limit` client
    /// connections (`limits.max_connections`); it resumes when one closes.
    func acceptCapped(limit: Int)
    /// What the process holds for clients passed the high mark of
    /// `limits.max_memory` (`.began`: accepting stops, new HTTP/2 streams
    /// are refused) or fell below the low one (`.ended`). Told once per change.
    func memoryPressureChanged(_ change: MemoryPressure.Change, holding bytes: Int, limit: Int)
    /// A TLS handshake completed (version 12 or 13).
    func tlsHandshake(version: Int)
    /// A TLS handshake failed; the connection is closed.
    func tlsHandshakeFailed(reason: TLSHandshakeFailure)
    /// At the connection cap, a connection that never sent a byte was
    /// closed to make room for a new one.
    func silentConnectionClosed()

    // MARK: HTTP/2 (docs/http2.md)

    /// An HTTP/2 request the edge refused (RFC 9113 rules and limits):
    /// answer it on its stream (the connection and its other streams go on).
    func reject(_ request: HTTPRequest, refusal: HTTP2RequestRefusal)
    /// A connection began speaking HTTP/2 (its preface read; `tls`: over TLS by ALPN).
    func http2ConnectionOpened(tls: Bool)
    /// An HTTP/2 connection ended, and why (`reason.code` is the code of
    /// the GOAWAY we sent, if any: `sentGoaway`).
    func http2ConnectionClosed(reason: HTTP2ConnectionStateMachine.Reason, sentGoaway: Bool)
    /// A stream opened (the client's first HEADERS) or closed.
    func http2StreamOpened()
    func http2StreamClosed()
    /// A stream was reset: by the client (`byClient`) or by us, with `code`.
    func http2StreamReset(byClient: Bool, code: HTTP2ErrorCode)
    /// The client sent GOAWAY with `code`.
    func http2GoawayReceived(code: HTTP2ErrorCode)
}

extension HTTPServerDelegate {
    public func admit(_ request: HTTPRequest) -> Bool { true }
    public func holdsBody(_ request: HTTPRequest) -> Bool { false }
    public func bodyHeld(_ request: HTTPRequest) { request.readBody() }
    public func streamsBody(_ request: HTTPRequest) -> Bool { false }
    public func acceptPaused(errno: Int32, pause: Duration) {}
    public func acceptCapped(limit: Int) {}
    public func memoryPressureChanged(_ change: MemoryPressure.Change, holding bytes: Int, limit: Int) {}
    public func tlsHandshake(version: Int) {}
    public func tlsHandshakeFailed(reason: TLSHandshakeFailure) {}
    public func silentConnectionClosed() {}
    public func reject(_ request: HTTPRequest, refusal: HTTP2RequestRefusal) {
        if case let .http1(reason) = refusal { return reject(request, reason: reason) }
        request.reply(status: refusal.status)
    }
    public func http2ConnectionOpened(tls: Bool) {}
    public func http2ConnectionClosed(reason: HTTP2ConnectionStateMachine.Reason, sentGoaway: Bool) {}
    public func http2StreamOpened() {}
    public func http2StreamClosed() {}
    public func http2StreamReset(byClient: Bool, code: HTTP2ErrorCode) {}
    public func http2GoawayReceived(code: HTTP2ErrorCode) {}
}

public enum SocketError: Error, CustomStringConvertible {
    case cannotBind(address: String, errno: Int32)
    case badAddress(String)

    public var description: String {
        switch self {
        case let .cannotBind(address, e): "cannot listen on \(address): \(String(cString: strerror(e)))"
        case let .badAddress(a): "cannot resolve listen address \(a)"
        }
    }
}

/// The HTTP/1.1 server of one event loop: a listening socket read by an
/// accept event, and per-connection read events that stay registered for
/// the connection's life (no epoll_ctl per request). With `reusePort`,
/// several servers on several loops share one port (SO_REUSEPORT) and the
/// kernel spreads connections across them.
public final class HTTPServer {
    public let limits: HTTPServerLimits
    public private(set) var port: Int = 0
    /// The delegate owns the server; `close()` drops this reference, which
    /// ends the cycle. (Not weak: a weak reference would put the delegate's
    /// reference counts in a side table, slowing each retain and release.)
    var delegate: HTTPServerDelegate?
    let loop: EventLoop
    let requestLimits: RequestLimits
    let connectionLimits: HTTP1ServerConnectionStateMachine.Limits
    fileprivate var listenFD: Int32 = -1
    private var acceptEvent: OpaquePointer?
    /// Re-arms the accept event after an EMFILE pause.
    private var resumeEvent: OpaquePointer?
    /// Open connections, retained here until they close.
    private var connections: [ObjectIdentifier: HTTPConnection] = [:]
    /// Draining: no new connections; idle ones close, busy ones close after their answer.
    private(set) var draining = false
    /// How long accepting pauses when descriptors run out (as nginx does).
    public static let acceptPause: Duration = .milliseconds(500)
    /// At the connection cap, how often a listener looks again (a
    /// connection another worker closed frees a place it is not told of).
    public static let capRecheck: Duration = .milliseconds(50)
    /// Connections accepted per wake-up of the listening socket at most (the
    /// rest wait for the next pass): one busy listener cannot starve the loop.
    static let acceptBatch = 64
    /// Accepting stopped at the connection cap (not for lack of descriptors).
    private var capped = false
    /// The connections that have not sent a byte, oldest first (a list
    /// linked through the connections): at the cap the oldest is closed to
    /// make room for a client waiting in the backlog.
    fileprivate var silentOldest: HTTPConnection?
    fileprivate var silentNewest: HTTPConnection?
    /// A TLS listener's certificates (nil: plain HTTP). A reload swaps them:
    /// new connections use the new ones, open ones keep theirs.
    public var tls: TLSServerContext?
    let dateHeader = DateHeaderCache()
    /// Where this server's tunnels read (one at a time, on its loop):
    /// allocated by the first tunnel, kept for the server's life.
    var tunnelScratch: UnsafeMutableRawPointer {
        if let scratch { return scratch }
        let made = UnsafeMutableRawPointer.allocate(byteCount: Tunnel.readSize, alignment: 16)
        scratch = made
        return made
    }
    private var scratch: UnsafeMutableRawPointer?

    deinit { scratch?.deallocate() }

    public init(
        loop: EventLoop, host: String, port: Int, reusePort: Bool, limits: HTTPServerLimits,
        delegate: HTTPServerDelegate, tls: TLSServerContext? = nil
    ) throws(SocketError) {
        self.loop = loop
        self.tls = tls
        self.limits = limits
        requestLimits = limits.request
        connectionLimits = .init(request: requestLimits)
        self.delegate = delegate

        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let info = result else {
            throw .badAddress("\(host):\(port)")
        }
        defer { freeaddrinfo(result) }
        let fd = socket(
            info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .cannotBind(address: "\(host):\(port)", errno: errno) }
        var one: Int32 = 1
        let size = socklen_t(MemoryLayout<Int32>.size)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size)
        if reusePort { setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, size) }
        // Accepted sockets inherit TCP_NODELAY from the listener on Linux: a
        // response must not wait for the client's delayed ACK (Nagle).
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, size)
        guard bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0, listen(fd, 1024) == 0 else {
            let e = errno
            Glibc.close(fd)
            throw .cannotBind(address: "\(host):\(port)", errno: e)
        }
        listenFD = fd
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &len) }
        }
        self.port = withUnsafeBytes(of: &storage) { raw in
            Int(UInt16(bigEndian: raw.load(fromByteOffset: 2, as: UInt16.self)))  // sin_port and sin6_port sit at offset 2
        }
        // Alive: both events point at `self` unretained; the delegate holds the server (ProxyWorker's
        // `servers`, AdminServer, DemoUpstream) until after `close()`, which frees both.
        let me = Unmanaged.passUnretained(self).toOpaque()
        acceptEvent = event_new(loop.base, fd, Int16(EV_READ | EV_PERSIST), httpServerAcceptCallback, me)
        resumeEvent = event_new(loop.base, -1, 0, httpServerResumeCallback, me)
        event_add(acceptEvent, nil)
    }

    /// Stops accepting new connections and closes idle ones; busy ones
    /// close after their current answer. On the loop's thread.
    public func stopAccepting() {
        draining = true
        closeListener()
        for connection in Array(connections.values) { connection.drain() }
    }

    /// Stops accepting and closes every connection. On the loop's thread.
    public func close() {
        delegate = nil
        closeListener()
        for connection in Array(connections.values) { connection.close() }
        connections.removeAll()
        if let resumeEvent { event_free(resumeEvent) }
        resumeEvent = nil
    }

    private func closeListener() {
        if let acceptEvent { event_free(acceptEvent) }
        acceptEvent = nil
        if let resumeEvent { event_del(resumeEvent) }
        if listenFD >= 0 { Glibc.close(listenFD) }
        listenFD = -1
    }

    // MARK: - Accepting

    fileprivate func acceptReady() {
        // Over the high mark of limits.max_memory: clients wait in the
        // backlog until what the process holds falls below the low one.
        if memoryUnderPressure() {
            event_del(acceptEvent)
            var tv = timeval(Self.capRecheck)
            event_add(resumeEvent, &tv)
            return
        }
        // A bounded batch per wake-up, so one busy listener cannot starve the loop.
        for _ in 0..<Self.acceptBatch {
            if let budget = limits.connections, !budget.reserve(1),
                // At the cap, a connection that has never sent a byte gives
                // its place to a client waiting in the backlog.
                !(backlogWaiting() && closeOldestSilent() && budget.reserve(1))
            {
                // At the cap: the connection stays in the kernel's backlog.
                capped = true
                event_del(acceptEvent)
                var tv = timeval(Self.capRecheck)
                event_add(resumeEvent, &tv)
                delegate?.acceptCapped(limit: budget.limit)
                return
            }
            var storage = sockaddr_storage()
            var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let fd = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { hp_accept(listenFD, $0, &len) }
            }
            if fd < 0 {
                let e = errno
                limits.connections?.release(1)
                switch e {
                case EINTR, ECONNABORTED: continue
                case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                    // Out of descriptors: the pending connection stays queued and
                    // the listener stays readable, so a level-triggered accept
                    // would spin. Stop listening for a while instead.
                    event_del(acceptEvent)
                    var tv = timeval(Self.acceptPause)
                    event_add(resumeEvent, &tv)
                    delegate?.acceptPaused(errno: e, pause: Self.acceptPause)
                    return
                default: return  // EAGAIN: nothing more to accept
                }
            }
            let session = tls.map { TLSSession(context: $0, fd: fd) }
            let connection = HTTPConnection(server: self, fd: fd, peer: storage, tls: session)
            connections[ObjectIdentifier(connection)] = connection
            joinSilent(connection)
            connection.start()
            if draining { connection.drain() }
        }
    }

    /// The memory overload action is on (the delegate hears each change).
    func memoryUnderPressure() -> Bool {
        guard let pressure = limits.memoryPressure else { return false }
        let (active, change, total) = pressure.check()
        if let change { delegate?.memoryPressureChanged(change, holding: total, limit: pressure.limit) }
        return active
    }

    fileprivate func resumeAccepting() {
        capped = false
        if let acceptEvent, listenFD >= 0 { event_add(acceptEvent, nil) }
    }

    func connectionClosed(_ connection: HTTPConnection) {
        guard connections.removeValue(forKey: ObjectIdentifier(connection)) != nil else { return }
        leaveSilent(connection)
        limits.connections?.release(1)
        if capped {
            // A place is free: accept again now rather than at the next recheck.
            if let resumeEvent { event_del(resumeEvent) }
            resumeAccepting()
        }
    }
}

// MARK: - Connections that never sent a byte

extension HTTPServer {
    /// A connection just accepted: silent until its first byte is read.
    fileprivate func joinSilent(_ connection: HTTPConnection) {
        connection.isSilent = true
        connection.silentOlder = silentNewest
        silentNewest?.silentNewer = connection
        silentNewest = connection
        if silentOldest == nil { silentOldest = connection }
    }

    /// The connection sent its first byte (or closed): never closed to make room.
    func spoke(_ connection: HTTPConnection) { leaveSilent(connection) }

    fileprivate func leaveSilent(_ connection: HTTPConnection) {
        guard connection.isSilent else { return }
        connection.isSilent = false
        if let older = connection.silentOlder { older.silentNewer = connection.silentNewer } else { silentOldest = connection.silentNewer }
        if let newer = connection.silentNewer { newer.silentOlder = connection.silentOlder } else { silentNewest = connection.silentOlder }
        (connection.silentOlder, connection.silentNewer) = (nil, nil)
    }

    /// Closes the oldest connection that has sent nothing: nothing read and
    /// nothing waiting in its socket (bytes there, whose read event has not
    /// run yet, take a connection off the list instead). False if none is left.
    fileprivate func closeOldestSilent() -> Bool {
        while let oldest = silentOldest {
            leaveSilent(oldest)
            var byte: UInt8 = 0
            let n = recv(oldest.fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
            if n > 0 { continue }
            oldest.close()
            delegate?.silentConnectionClosed()
            return true
        }
        return false
    }

    /// A client waits in the listener's backlog (checked before a silent
    /// connection is closed for it).
    fileprivate func backlogWaiting() -> Bool {
        guard listenFD >= 0, silentOldest != nil else { return false }
        var p = pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0)
        return poll(&p, 1, 0) == 1 && p.revents & Int16(POLLIN) != 0
    }
}

private func httpServerAcceptCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    let server = Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(server) { server.acceptReady() }
}

private func httpServerResumeCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue().resumeAccepting()
}

/// The `Date` header value, formatted once a second (RFC 9110 section 6.6.1).
final class DateHeaderCache {
    private var second = 0
    private var text = ByteBuffer(capacity: 64)

    deinit { text.deallocate() }

    /// `Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n`
    func withLine<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        let now = time(nil)
        if now != second || text.count == 0 {
            second = now
            var t = now
            var parts = tm()
            gmtime_r(&t, &parts)
            var scratch = [CChar](repeating: 0, count: 64)
            let n = strftime(&scratch, 64, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &parts)
            text.count = 0
            scratch.withUnsafeBytes { text.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
        return body(text.bytes)
    }

    /// The value alone (`Sun, 06 Nov 1994 08:49:37 GMT`), for an HTTP/2 `date` field.
    func withValue<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        withLine { line in body(UnsafeRawBufferPointer(rebasing: line[Self.namePrefix..<(line.count - 2)])) }
    }

    /// `Date: `, before the value in `withLine`'s line (which ends in CRLF).
    private static let namePrefix = 6
}
