internal import CLibevent
import CNghttp2
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// The driver of one HTTP/2 connection to an upstream: its socket, its
/// read, write and timer events, and its nghttp2 client session. It
/// performs what `HTTP2ClientConnectionStateMachine` decides and tells its
/// pool what happened (ready, a stream's room back, GOAWAY, closed).
///
/// Retention: the pool holds the connection from `open` until `closed`;
/// the libevent events and the timer point at it unretained and are freed
/// (or recycled) in `close`, before the pool lets go of it.
final class HTTP2UpstreamConnection: LoopEventTarget, HTTP2StreamCarrier {
    /// Alive: the pool's `connections` holds this connection until `close`, and the client holds the
    /// pool until every connection is closed; after `close` the events and timers are gone, and every
    /// entry but the pool's own calls checks `isClosed` before it reaches `pool`.
    unowned let pool: HTTP2ConnectionPool
    let id: Int
    private var machine: HTTP2ClientConnectionStateMachine
    private var fd: Int32 = -1
    private(set) var session: HTTP2ClientSession?
    /// An https:// endpoint's TLS session (nil on h2c): reads and writes go through it.
    private var tls: HTTP2UpstreamTLSSession?
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var writeWatched = false
    private var timer: LoopEvent?
    /// Frames produced and not yet taken by the socket.
    private var output = ByteBuffer(capacity: 16 * 1024)
    private var outputSent = 0
    private var fields = HTTP2RequestFields()
    /// In the client's next pass already.
    var flushQueued = false

    /// Produce frames while less than this waits for the socket.
    static let outputHighWater = 64 * 1024
    /// Bytes read in one turn at most (then the loop serves others).
    static let readSize = 16 * 1024
    static let readsPerTurn = 4

    init(pool: HTTP2ConnectionPool, id: Int) {
        self.pool = pool
        self.id = id
        machine = HTTP2ClientConnectionStateMachine(connectTimeout: pool.connectTimeout)
    }

    deinit { output.deallocate() }

    var isClosed: Bool { machine.isClosed }

    // MARK: - Opening

    /// Starts the connect (non-blocking) to the endpoint's address, after
    /// resolving its name when it has one (within the same connect timeout).
    func open() {
        let now = pool.client.clock()
        _ = machine.start(at: now)
        armTimer(now: now)
        switch pool.endpoint.target {
        case let .address(address): connect(to: address)
        case let .name(host, port): resolve(host, port: port)
        }
    }

    /// The addresses a name resolved to, not tried yet (the next is tried
    /// when a connect fails, within the connect timeout).
    private var untried: [HTTP2Address] = []
    /// The resolver's request in flight (the connection is retained for it).
    private var resolving: OpaquePointer?
    private var resolvedAlready = false

    private func resolve(_ host: String, port: Int) {
        guard let dns = pool.client.resolver() else {
            return perform(machine.connectFailed("could not resolve \(host): no resolver (/etc/resolv.conf)"))
        }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = EVUTIL_AI_ADDRCONFIG
        resolvedAlready = false
        machine.resolving(host)
        // Retained until the callback runs (it runs once, also when cancelled).
        let me = Unmanaged.passRetained(self).toOpaque()
        let request = evdns_getaddrinfo(dns, host, String(port), &hints, h2UpstreamResolvedCallback, me)
        // nil: answered already (a literal or /etc/hosts), inside the call.
        if !resolvedAlready { resolving = request }
    }

    fileprivate func resolved(_ result: Int32, _ list: UnsafeMutablePointer<addrinfo>?) {
        resolving = nil
        resolvedAlready = true
        machine.resolved()
        defer { if let list { evutil_freeaddrinfo(list) } }
        guard !machine.isClosed else { return }  // closed (or cancelled) meanwhile
        guard case let .name(host, _) = pool.endpoint.target else { return }
        guard result == 0 else {
            let why = String(cString: evutil_gai_strerror(result))
            return perform(machine.connectFailed("could not resolve \(host): \(why)"))
        }
        var found: [HTTP2Address] = []
        var next = list
        while let entry = next {
            if let addr = entry.pointee.ai_addr, let address = HTTP2Address(addr, length: Int(entry.pointee.ai_addrlen)) {
                found.append(address)
            }
            next = entry.pointee.ai_next
        }
        guard !found.isEmpty else { return perform(machine.connectFailed("\(host) resolved to no IP address")) }
        untried = Array(found.dropFirst())
        connect(to: found[0])
    }

    private func connect(to address: HTTP2Address) {
        fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return connectFailed(errno) }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let rc = address.withSockaddr { Glibc.connect(fd, $0, $1) }
        let connectError = errno  // before libevent's calls touch it
        // Alive: the pool's `connections` holds this connection until `close`, which frees both
        // events (`closeSocket`) before it calls `pool.connectionClosed`.
        let me = Unmanaged.passUnretained(self).toOpaque()
        let base = pool.client.loop.base
        readEvent = event_new(base, fd, Int16(EV_READ | EV_PERSIST), h2UpstreamReadCallback, me)
        writeEvent = event_new(base, fd, Int16(EV_WRITE | EV_PERSIST), h2UpstreamWriteCallback, me)
        if rc == 0 { return connected() }
        guard connectError == EINPROGRESS else { return connectFailed(connectError) }
        watchWrite(true)
    }

    /// A connect failed: the next address the name resolved to, if any, else the connection fails.
    private func connectFailed(_ error: Int32) {
        guard !untried.isEmpty, !machine.isClosed else { return perform(machine.connectFailed(Self.errorText(error))) }
        closeSocket()
        connect(to: untried.removeFirst())
    }

    private func closeSocket() {
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        readEvent = nil
        writeEvent = nil
        writeWatched = false
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    private func connected() {
        perform(machine.connected(at: pool.client.clock(), tls: pool.endpoint.isTLS))
    }

    /// One step of the TLS handshake (the socket was ready, or it starts).
    private func stepHandshake() {
        guard let tls else { return }
        switch tls.handshake() {
        case .done:
            watchWrite(false)
            perform(machine.handshakeDone(at: pool.client.clock()))
            // The server's first frames may have come with its last handshake flight.
            if tls.pending, !machine.isClosed { event_active(readEvent, Int32(EV_READ), 0) }
        case .wantRead: watchWrite(false)
        case .wantWrite: watchWrite(true)
        case let .failed(why): perform(machine.handshakeFailed(why))
        }
    }

    /// A server that hangs up right after the TLS handshake often refused
    /// our certificate without saying so (TLS 1.3 checks it afterwards).
    private var afterHandshakeHint: String {
        guard tls != nil, case .awaitingSettings = machine.state else { return "" }
        return " right after the TLS handshake (does it require a client certificate? set tls.client_cert and tls.client_key)"
    }

    private var isHandshaking: Bool {
        if case .handshaking = machine.state { return true }
        return false
    }

    // MARK: - Streams (from the pool and the streams)

    /// Puts a try on the connection as a new stream.
    func submit(_ stream: HTTP2UpstreamStream) {
        stream.machine.assigned()
        // A try cancelled while it waited to be sent again is never sent.
        guard stream.machine.state == .open else { return pool.streamEnded(on: self) }
        guard let session, !machine.isClosed else {
            pool.streamEnded(on: self)
            return unsent(stream, "the upstream connection closed before the request was sent")
        }
        stream.connection = self
        stream.lastMoved = pool.client.clock()
        armSweep(stream.request.idleTimeout)
        if let error = session.submit(stream, scheme: pool.endpoint.scheme, authority: pool.endpoint.authority, scratch: &fields) {
            stream.connection = nil
            pool.streamEnded(on: self)
            // Stream ids used up (2^31 of them): nothing new on this one.
            if error.code == Int(NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE.rawValue) { perform(machine.goaway()) }
            return unsent(stream, "the request could not be submitted (\(error))")
        }
        flushSoon()
    }

    /// A try that never became a stream here: sent again, or told on the
    /// client's next pass (never inside `start`).
    private func unsent(_ stream: HTTP2UpstreamStream, _ why: String) {
        switch stream.connectionLost(why) {
        case .replay: pool.replay(stream)
        case .ended: pool.client.soon(stream)
        case .none: break
        }
    }

    func reset(_ stream: HTTP2UpstreamStream, code: UInt32) {
        session?.reset(stream.id, code: code)
        stream.connection = nil
        flushSoon()
    }

    func consume(_ stream: HTTP2UpstreamStream, _ n: Int) {
        session?.consume(stream.id, n)
        flushSoon()
    }

    func resumeData(_ stream: HTTP2UpstreamStream) {
        session?.resumeData(stream.id)
        flushSoon()
    }

    private func flushSoon() {
        guard !flushQueued, !machine.isClosed else { return }
        flushQueued = true
        pool.client.flushSoon(self)
    }

    /// The pool asks whether the server is still there (it was silent):
    /// a PING, answered within the connect timeout or the connection closes.
    func verify() {
        guard let session, !machine.isClosed else { return }
        let now = pool.client.clock()
        session.ping()
        machine.pingSent(at: now)
        armTimer(now: now)
        flushSoon()
    }

    /// The pool closes the connection (idle, drained, shutdown).
    func closeRequested() { perform(machine.closeRequested()) }

    // MARK: - Events

    fileprivate func readable() {
        if isHandshaking { return stepHandshake() }
        guard let session, !machine.isClosed else { return }
        session.now = pool.client.clock()
        let buffer = pool.client.readBuffer
        var turns = 0
        while turns < Self.readsPerTurn {
            turns += 1
            let n = tls.map { $0.read(buffer, Self.readSize) } ?? read(fd, buffer, Self.readSize)
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { break }
                if let alert = tls?.readError, alert.contains("alert"), case .awaitingSettings = machine.state {
                    // A TLS 1.3 server checks our certificate after the handshake: its alert comes here.
                    return perform(machine.failed(.tlsFailed("the upstream ended the TLS session: \(alert)")))
                }
                return perform(machine.failed(.peerClosed(Self.errorText(errno) + afterHandshakeHint)))
            }
            if n == 0 { return perform(machine.failed(.peerClosed("end of stream" + afterHandshakeHint))) }
            pool.heard(on: self, at: session.now)
            let result = session.receive(UnsafeRawBufferPointer(start: buffer, count: n))
            if result.pingAcked, machine.pingAnswered() {
                armTimer(now: session.now)
                pool.pingAnswered(on: self)
            }
            // The pool hears of SETTINGS and GOAWAY first: a try refused by the
            // GOAWAY goes to another connection, not back to this one.
            if let maxStreams = result.maxStreams { perform(machine.settings(maxStreams: maxStreams)) }
            if result.goaway != nil {
                pool.counters.goaways.wrappingAdd(1, ordering: .relaxed)
                perform(machine.goaway())
            }
            afterSession()
            if let why = session.endReason {
                flush()  // the GOAWAY (ENHANCE_YOUR_CALM for a flood), best effort
                return perform(machine.failed(.protocolError(why)))
            }
            if let error = result.error { return perform(machine.failed(.protocolError("\(error)"))) }
            if machine.isClosed { return }
            // TLS: a read returns one record at most; more may wait inside the session.
            if n < Self.readSize, !(tls?.pending ?? false) { break }
            if turns == Self.readsPerTurn, tls?.pending ?? false {
                // The socket will not wake for what the session holds: read again on a later pass.
                event_active(readEvent, Int32(EV_READ), 0)
            }
        }
        flush()
        if tls?.readWantsWrite ?? false {
            // The session must write before it reads on (a TLS 1.3 key update,
            // the send buffer full): no read event until the socket takes bytes.
            event_del(readEvent)
            watchWrite(true)
        }
    }

    fileprivate func writable() {
        if case .connecting = machine.state {
            watchWrite(false)
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
            return error == 0 ? connected() : connectFailed(error)
        }
        if isHandshaking { return stepHandshake() }
        if tls?.readWantsWrite ?? false {
            event_add(readEvent, nil)
            return readable()
        }
        flush()
    }

    func loopEventFired(_ event: LoopEvent) {
        let now = pool.client.clock()
        if event.tag == Self.sweepTag { return sweepIdle(at: now) }
        perform(machine.timer(at: now))
        if !machine.isClosed { armTimer(now: now) }
    }

    // MARK: - Idle streams

    static let sweepTag = 1
    private var sweep: LoopEvent?
    private var sweepArmed = false
    private var sweepInterval = Duration.seconds(1)

    /// Streams with no byte either way for their idle timeout
    /// (`limits.client_timeout`, as libcurl's stall check) are found by a
    /// sweep every second (a quarter of the timeout when that is shorter),
    /// run only while the connection has streams.
    private func armSweep(_ idleTimeout: Duration) {
        let interval = min(.seconds(1), max(.milliseconds(50), idleTimeout / 4))
        if sweepArmed, interval >= sweepInterval { return }
        sweepInterval = min(sweepInterval, interval)
        if sweep == nil { sweep = pool.client.loop.takeEvent(target: self, tag: Self.sweepTag) }
        sweepArmed = true
        sweep?.arm(after: sweepInterval)
    }

    private func sweepIdle(at now: Instant) {
        sweepArmed = false
        guard let session, !machine.isClosed else { return }
        var timedOut: [HTTP2UpstreamStream] = []
        for stream in session.streams.values where stream.idleCheck(at: now) { timedOut.append(stream) }
        for stream in timedOut.sorted(by: { $0.id < $1.id }) {
            session.reset(stream.id, code: HTTP2ErrorCode.cancel.rawValue)
            stream.connection = nil
            stream.tell()
        }
        if !session.streams.isEmpty {
            sweepArmed = true
            sweep?.arm(after: sweepInterval)
        }
        if !timedOut.isEmpty { flush() }
    }

    /// What the turn left behind, to the pool and the tries (`HTTP2ClientSession.settle`).
    private func afterSession() {
        session?.settle(
            room: { for _ in 0..<$0 { pool.streamEnded(on: self) } }, replay: { pool.replay($0) })
    }

    /// Produces frames and writes them while the socket takes them.
    func flush() {
        flushQueued = false
        guard let session, !machine.isClosed, fd >= 0 else { return }
        session.now = pool.client.clock()
        while true {
            if output.count - outputSent < Self.outputHighWater {
                compactOutput()
                session.produce(highWater: Self.outputHighWater) { output.append($0) }
                afterSession()
                if let error = session.fatalError { return perform(machine.failed(.protocolError("\(error)"))) }
                if machine.isClosed { return }
            }
            let pending = output.count - outputSent
            guard pending > 0 else { break }
            let n = tls.map { $0.write(output.base + outputSent, pending) } ?? write(fd, output.base + outputSent, pending)
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK { break }
                if errno == EINTR { continue }
                return perform(machine.failed(.peerClosed(Self.errorText(errno))))
            }
            outputSent += n
            if n < pending { break }
        }
        watchWrite(output.count > outputSent || (tls?.readWantsWrite ?? false))
        if !session.wantsRead, !session.wantsWrite, output.count == outputSent {
            perform(machine.failed(session.endReason.map { .protocolError($0) } ?? .peerClosed("the session ended")))
        }
    }

    private func compactOutput() {
        guard outputSent > 0 else { return }
        if outputSent == output.count {
            output.count = 0
        } else {
            output.removeFirst(outputSent)
        }
        outputSent = 0
    }

    // MARK: - Actions

    private func perform(_ action: HTTP2ClientConnectionStateMachine.Action) {
        switch action {
        case .none: break
        case .startHandshake:
            do {
                let context = try pool.tlsClientContext()
                guard let made = HTTP2UpstreamTLSSession(context, fd: fd) else {
                    return perform(machine.handshakeFailed("OpenSSL could not make a TLS session for \(context.host)"))
                }
                tls = made
            } catch {
                return perform(machine.handshakeFailed("the upstream's `tls` settings cannot be used: \(error)"))
            }
            event_add(readEvent, nil)
            armTimer(now: pool.client.clock())
            stepHandshake()
        case .startSession:
            do {
                session = try HTTP2ClientSession(limits: pool.endpoint.limits)
            } catch {
                return perform(machine.failed(.protocolError("nghttp2 could not make a session (\(error))")))
            }
            event_add(readEvent, nil)
            armTimer(now: pool.client.clock())
            flush()
        case let .ready(maxStreams):
            armTimer(now: pool.client.clock())
            pool.connectionReady(self, maxStreams: maxStreams)
        case let .capacityChanged(maxStreams):
            pool.capacityChanged(self, maxStreams: maxStreams)
        case .draining:
            pool.goaway(on: self)
        case let .close(reason):
            close(reason)
        }
    }

    private func close(_ reason: HTTP2ClientConnectionStateMachine.CloseReason) {
        if let resolving { evdns_getaddrinfo_cancel(resolving) }
        resolving = nil
        untried = []
        timer?.recycle()
        timer = nil
        sweep?.recycle()
        sweep = nil
        sweepArmed = false
        // close_notify only when the proxy chose to close a working connection.
        tls?.close(notify: reason == .closedByPool)
        tls = nil
        closeSocket()
        // The pool forgets the connection first (so nothing is sent again on
        // it); then every try still on it ends, those nghttp2 had ended
        // first, or goes to another stream if it was never sent.
        let ended = session?.takeEnded() ?? []
        let replays = session?.takeReplays() ?? []
        let open = session?.streams.values.sorted { $0.id < $1.id } ?? []
        let served = (session?.completedStreams ?? 0) > 0 || ended.contains { $0.outcome == .complete }
        session?.streams.removeAll()
        session = nil
        pool.connectionClosed(self, reason: reason, served: served)
        for stream in ended { stream.tell() }
        for stream in replays { pool.replay(stream) }
        let why = reason.failure
        let broken: Bool
        if case .protocolError = reason { broken = true } else { broken = false }
        for stream in open {
            switch stream.connectionLost(why, broken: broken) {
            case .ended: stream.tell()
            case .replay: pool.replay(stream)
            case .none: break
            }
        }
    }

    private func watchWrite(_ on: Bool) {
        guard on != writeWatched, let writeEvent else { return }
        writeWatched = on
        _ = on ? event_add(writeEvent, nil) : event_del(writeEvent)
    }

    private func armTimer(now: Instant) {
        guard let deadline = machine.deadline else {
            timer?.disarm()
            return
        }
        if timer == nil { timer = pool.client.loop.takeEvent(target: self) }
        timer?.arm(afterNanoseconds: max(0, (deadline - now).nanoseconds))
    }

    static func errorText(_ code: Int32) -> String { String(cString: strerror(code)) }
}

private func h2UpstreamReadCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<HTTP2UpstreamConnection>.fromOpaque(arg!).takeUnretainedValue().readable()
}

private func h2UpstreamWriteCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<HTTP2UpstreamConnection>.fromOpaque(arg!).takeUnretainedValue().writable()
}

private func h2UpstreamResolvedCallback(
    _ result: Int32, _ list: UnsafeMutablePointer<addrinfo>?, _ arg: UnsafeMutableRawPointer?
) {
    Unmanaged<HTTP2UpstreamConnection>.fromOpaque(arg!).takeRetainedValue().resolved(result, list)
}
