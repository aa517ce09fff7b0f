internal import CLibevent
import CRedis
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// What a Redis connection tells its owner, on the loop's thread.
public protocol RedisConnectionDelegate: AnyObject {
    /// Ready (its greeting answered): `restored` after an outage.
    func redisUp(_ connection: RedisConnection, restored: Bool)
    /// Unreachable, slow, or refused: said once an outage.
    func redisDown(_ connection: RedisConnection, reason: String)
    /// A subscriber's message (`channel`, `payload`).
    func redisMessage(_ connection: RedisConnection, channel: String, payload: [UInt8])
}

/// One connection to Redis on a worker's loop: its socket (and TLS for
/// rediss://), hiredis's formatter and bounded reader (`CRedis`), and the
/// pipeline `RedisLinkStateMachine` keeps, with every step's deadline.
/// `send` either writes a command (its completion runs once: the reply, a
/// timeout or a failure) or refuses it at once when the link is not ready,
/// so a caller never waits on a link that is down.
///
/// Retention: the owner holds the connection until `close()`; the libevent
/// events and the timer point at it unretained and are freed in `close`.
public final class RedisConnection: LoopEventTarget {
    public let endpoint: RedisEndpoint
    public weak var delegate: RedisConnectionDelegate?
    private let loop: EventLoop
    private let clock: @Sendable () -> Instant
    private var machine: RedisLinkStateMachine
    /// The commands written on connecting, in order (AUTH, SELECT, SCRIPT LOAD or SUBSCRIBE).
    private let greeting: [[[UInt8]]]
    private let tlsContext: HTTP2TLSClientContext?
    private var tls: HTTP2UpstreamTLSSession?
    private var fd: Int32 = -1
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var writeWatched = false
    private var timer: LoopEvent?
    private var reader: RedisReplyReader?
    /// Where replies are read into, made once (zeroing a fresh buffer each read cost more than the read).
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: RedisConnection.readSize, alignment: 16)
    private var output: [UInt8] = []
    private var outputSent = 0
    private var handshaking = false
    private var resolving: OpaquePointer?
    private var resolvedAlready = false
    private var nextID: UInt64 = 1
    /// Inside `send`: a failure waits for the timer (`deferredFailure`).
    private var sending = false
    private var deferredFailure: String?
    /// Connect attempts made: a name's resolution answered for an older one is ignored.
    private var attempt: UInt64 = 0
    private var waiting: [UInt64: (RedisResult) -> Void] = [:]

    /// - Parameters:
    ///   - greeting: commands sent on every connect before the link is ready
    ///     (AUTH and SELECT are added from the endpoint).
    ///   - subscriber: after the greeting, the server sends messages.
    public init(
        loop: EventLoop, endpoint: RedisEndpoint, timeout: Duration, retry: Duration,
        clock: @escaping @Sendable () -> Instant, greeting: [[String]], subscriber: Bool = false,
        tls: UpstreamTLS? = nil
    ) throws(TLSSetupError) {
        self.loop = loop
        self.endpoint = endpoint
        self.clock = clock
        var commands: [[String]] = []
        if let password = endpoint.password {
            commands.append(endpoint.user.map { ["AUTH", $0, password.reveal] } ?? ["AUTH", password.reveal])
        }
        if endpoint.database != 0 { commands.append(["SELECT", String(endpoint.database)]) }
        commands += greeting
        self.greeting = commands.map { $0.map { Array($0.utf8) } }
        machine = RedisLinkStateMachine(timeout: timeout, retry: retry, greetingCount: commands.count, subscriber: subscriber)
        tlsContext =
            endpoint.tls
            ? try HTTP2TLSClientContext(tls, host: endpoint.host, defaultCA: UpstreamClient.libcurlDefaultCA, h2: false) : nil
    }

    deinit { readBuffer.deallocate() }

    public var isReady: Bool { machine.isReady }
    public var health: RedisLinkStateMachine.Health { machine.health }
    /// Commands waiting for their reply.
    public var pending: Int { machine.pending }

    /// Connects (and keeps connecting after every failure, `retry` apart) until `close`.
    public func start() {
        if timer == nil { timer = loop.takeEvent(target: self) }
        perform(machine.start(at: clock()))
    }

    /// Sends one command; `completion` runs once, later, on the loop. False
    /// (and `completion` never runs): the link is not ready, decide without it.
    @discardableResult
    public func send(_ arguments: [[UInt8]], _ completion: @escaping (RedisResult) -> Void) -> Bool {
        let id = nextID
        switch machine.send(id, at: clock()) {
        case .refused:
            return false
        case let .sent(arm):
            nextID &+= 1
            waiting[id] = completion
            append(arguments)
            if let arm { armTimer(arm) }
            // A write that fails here fails the connection on the timer's next
            // pass: no completion runs inside `send`, before its caller has
            // booked what it sent.
            sending = true
            flush()
            sending = false
            return true
        }
    }

    /// Fails the connection (and every command in flight) now: the server
    /// answered something that says this connection is not the one the link
    /// set up (a script cache emptied under it). It connects again after `retry`.
    public func drop(_ reason: String) { failed(reason) }

    /// Closes the link for good: commands in flight fail ("the link was closed").
    public func close() {
        perform(machine.stop())
        closeSocket()
        if let resolving { evdns_getaddrinfo_cancel(resolving) }
        resolving = nil
        timer?.recycle()
        timer = nil
    }

    public func loopEventFired(_ event: LoopEvent) {
        if let reason = deferredFailure {
            deferredFailure = nil
            return failed(reason)
        }
        perform(machine.timerFired(at: clock()))
    }

    // MARK: - Actions

    private func perform(_ actions: [RedisLinkStateMachine.Action]) {
        for action in actions {
            switch action {
            case .connect: open()
            case .sendGreeting:
                for command in greeting { append(command) }
                flush()
            case let .armTimer(at): armTimer(at)
            case .closeSocket: closeSocket()
            case let .timedOut(ids):
                for id in ids { waiting.removeValue(forKey: id)?(.timedOut) }
            case let .fail(ids, reason):
                for id in ids { waiting.removeValue(forKey: id)?(.failed(reason)) }
            case let .up(restored): delegate?.redisUp(self, restored: restored)
            case let .down(reason):
                // A server that echoed the AUTH command in its refusal must not put the password in a log.
                var said = "\(endpoint.address): \(reason)"
                if let password = endpoint.password?.reveal, !password.isEmpty {
                    said = said.replacing(password, with: "***")
                }
                delegate?.redisDown(self, reason: said)
            }
        }
    }

    private func armTimer(_ at: Instant) {
        let now = clock()
        timer?.arm(after: at > now ? at - now : .zero)
    }

    private func failed(_ reason: String) {
        guard !sending else {
            deferredFailure = deferredFailure ?? reason
            return armTimer(clock())
        }
        perform(machine.failed(reason, at: clock()))
    }

    // MARK: - Connecting

    private func open() {
        attempt &+= 1
        output.removeAll(keepingCapacity: true)
        outputSent = 0
        reader = RedisReplyReader()
        if let address = HTTP2Address(host: endpoint.host, port: endpoint.port) { return connect(to: address) }
        guard let dns = loop.resolver() else { return failed("could not resolve \(endpoint.host): no resolver") }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = EVUTIL_AI_ADDRCONFIG
        resolvedAlready = false
        // Retained until the callback runs (it runs once, also when cancelled), with the attempt it is for.
        let me = Unmanaged.passRetained(Resolution(self, attempt: attempt)).toOpaque()
        let request = evdns_getaddrinfo(dns, endpoint.host, String(endpoint.port), &hints, redisResolvedCallback, me)
        if !resolvedAlready { resolving = request }
    }

    fileprivate func resolved(_ result: Int32, _ list: UnsafeMutablePointer<addrinfo>?, attempt: UInt64) {
        defer { if let list { evutil_freeaddrinfo(list) } }
        // An answer for an attempt that failed since (it took longer than the timeout) opens nothing.
        guard attempt == self.attempt else { return }
        resolving = nil
        resolvedAlready = true
        guard machine.state == .connecting, fd < 0 else { return }
        guard result == 0 else {
            return failed("could not resolve \(endpoint.host): \(String(cString: evutil_gai_strerror(result)))")
        }
        var next = list
        while let entry = next {
            if let addr = entry.pointee.ai_addr, let address = HTTP2Address(addr, length: Int(entry.pointee.ai_addrlen)) {
                return connect(to: address)
            }
            next = entry.pointee.ai_next
        }
        failed("\(endpoint.host) resolved to no IP address")
    }

    private func connect(to address: HTTP2Address) {
        if fd >= 0 { closeSocket() }
        fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return failed(String(cString: strerror(errno))) }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        // A subscriber only reads: keepalive notices a peer that vanished
        // without a word (10 s idle, then 3 probes 5 s apart), not after the system's two hours.
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, socklen_t(MemoryLayout<Int32>.size))
        var idle: Int32 = 10
        var interval: Int32 = 5
        var count: Int32 = 3
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPIDLE, &idle, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPINTVL, &interval, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPCNT, &count, socklen_t(MemoryLayout<Int32>.size))
        let rc = address.withSockaddr { Glibc.connect(fd, $0, $1) }
        let connectError = errno
        // Alive: the owner holds this connection until `close`, which frees both events first.
        let me = Unmanaged.passUnretained(self).toOpaque()
        readEvent = event_new(loop.base, fd, Int16(EV_READ | EV_PERSIST), redisReadCallback, me)
        writeEvent = event_new(loop.base, fd, Int16(EV_WRITE | EV_PERSIST), redisWriteCallback, me)
        event_add(readEvent, nil)
        if rc == 0 { return socketConnected() }
        guard connectError == EINPROGRESS else { return failed("could not connect: \(String(cString: strerror(connectError)))") }
        watchWrite(true)
    }

    private func socketConnected() {
        guard let tlsContext else { return perform(machine.connected(at: clock())) }
        guard let session = HTTP2UpstreamTLSSession(tlsContext, fd: fd) else { return failed("could not start TLS") }
        tls = session
        handshaking = true
        stepHandshake()
    }

    private func stepHandshake() {
        guard let tls else { return }
        switch tls.handshake() {
        case .done:
            handshaking = false
            watchWrite(false)
            perform(machine.connected(at: clock()))
            if tls.pending { readable() }
        case .wantRead: watchWrite(false)
        case .wantWrite: watchWrite(true)
        case let .failed(why): failed("TLS: \(why)")
        }
    }

    private func closeSocket() {
        // A lookup still running belongs to an attempt that is over.
        if let resolving { evdns_getaddrinfo_cancel(resolving) }
        resolving = nil
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        readEvent = nil
        writeEvent = nil
        writeWatched = false
        tls?.close(notify: false)
        tls = nil
        handshaking = false
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
        output.removeAll(keepingCapacity: true)
        outputSent = 0
    }

    private func watchWrite(_ on: Bool) {
        guard let writeEvent, on != writeWatched else { return }
        writeWatched = on
        if on { event_add(writeEvent, nil) } else { event_del(writeEvent) }
    }

    // MARK: - Writing

    private func append(_ arguments: [[UInt8]]) {
        // hiredis's formatter (`*N\r\n` then `$len\r\narg\r\n` each), given
        // pointers into one copy of the arguments: one allocation, not one each.
        var joined: [UInt8] = []
        joined.reserveCapacity(arguments.reduce(0) { $0 + $1.count })
        var lengths: [Int] = []
        lengths.reserveCapacity(arguments.count)
        for argument in arguments {
            joined.append(contentsOf: argument)
            lengths.append(argument.count)
        }
        joined.withUnsafeBufferPointer { all in
            let base = UnsafeRawPointer(all.baseAddress ?? UnsafePointer(bitPattern: 1)!)
            var pointers: [UnsafePointer<CChar>?] = []
            pointers.reserveCapacity(arguments.count)
            var at = 0
            for length in lengths {
                pointers.append((base + at).assumingMemoryBound(to: CChar.self))
                at += length
            }
            var command: UnsafeMutablePointer<CChar>?
            let n = redisFormatCommandArgv(&command, Int32(arguments.count), &pointers, lengths)
            guard n > 0, let command else { return }
            UnsafeRawBufferPointer(start: command, count: Int(n)).withMemoryRebound(to: UInt8.self) { output.append(contentsOf: $0) }
            redisFreeCommand(command)
        }
    }

    private func flush() {
        guard fd >= 0, !handshaking, machine.state == .greeting || machine.state == .ready else { return }
        while outputSent < output.count {
            let n = output.withUnsafeBytes { b in
                let start = b.baseAddress! + outputSent
                let count = b.count - outputSent
                return tls.map { $0.write(start, count) } ?? Glibc.send(fd, start, count, Int32(MSG_NOSIGNAL))
            }
            if n > 0 {
                outputSent += n
                continue
            }
            if n < 0, errno == EAGAIN || errno == EWOULDBLOCK { return watchWrite(true) }
            return failed("could not write: \(String(cString: strerror(errno)))")
        }
        output.removeAll(keepingCapacity: true)
        outputSent = 0
        watchWrite(false)
    }

    fileprivate func writable() {
        if machine.state == .connecting, tls == nil {
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
            guard error == 0 else { return failed("could not connect: \(String(cString: strerror(error)))") }
            watchWrite(false)
            return socketConnected()
        }
        if handshaking { return stepHandshake() }
        flush()
        // A TLS read that needed the socket writable (a key update while the send buffer was full) goes on now.
        if tls?.readWantsWrite == true { readable() }
    }

    // MARK: - Reading

    /// Read at most this much a turn; the loop serves others between.
    static let readSize = 16 * 1024

    fileprivate func readable() {
        if handshaking { return stepHandshake() }
        guard fd >= 0, let reader else { return }
        let buffer = readBuffer
        for _ in 0..<4 {
            let n = tls.map { $0.read(buffer.baseAddress!, buffer.count) } ?? Glibc.recv(fd, buffer.baseAddress!, buffer.count, 0)
            if n == 0 { return failed("the server closed the connection") }
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK {
                    if tls?.readWantsWrite == true { watchWrite(true) }
                    return
                }
                return failed("could not read: \(String(cString: strerror(errno)))")
            }
            reader.feed(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
            guard drainReplies() else { return }
            if n < buffer.count, !(tls?.pending ?? false) { return }
        }
        // Four reads in a turn: what is left (in the socket, or decrypted inside
        // TLS where the socket will not say so) is read on the next turn.
        if fd >= 0, let readEvent { event_active(readEvent, Int32(EV_READ), 0) }
    }

    /// Every complete reply the reader holds, in order. False: the connection failed.
    private func drainReplies() -> Bool {
        while let reader, fd >= 0 {
            switch reader.next() {
            case let .failure(.unreadable(why)):
                failed("an unreadable reply: \(why)")
                return false
            case let .failure(.tooLarge(held)):
                failed("a reply over \(held / 1024) KiB")
                return false
            case .success(nil):
                return true
            case let .success(reply?):
                deliver(reply)
            }
        }
        return false
    }

    private func deliver(_ reply: RedisReply) {
        let error: String? = if case let .error(e) = reply { e } else { nil }
        switch machine.replied(error: error, at: clock()) {
        case let .answer(id, next):
            if let next { armTimer(next) }
            waiting.removeValue(forKey: id)?(.reply(reply))
        case let .greeting(actions):
            perform(actions)
        case .message:
            // ["message", channel, payload] (SUBSCRIBE's confirmations are greeting replies).
            guard let parts = reply.elements, parts.count == 3, parts[0].text == "message", let channel = parts[1].text,
                case let .string(payload) = parts[2]
            else { return }
            delegate?.redisMessage(self, channel: channel, payload: payload)
        case let .unexpected(actions):
            perform(actions)
        }
    }
}

private func redisReadCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<RedisConnection>.fromOpaque(arg!).takeUnretainedValue().readable()
}

private func redisWriteCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<RedisConnection>.fromOpaque(arg!).takeUnretainedValue().writable()
}

/// A name lookup's context: the connection (retained until the answer) and the attempt it is for.
private final class Resolution {
    let connection: RedisConnection
    let attempt: UInt64
    init(_ connection: RedisConnection, attempt: UInt64) {
        self.connection = connection
        self.attempt = attempt
    }
}

private func redisResolvedCallback(_ result: Int32, _ list: UnsafeMutablePointer<addrinfo>?, _ arg: UnsafeMutableRawPointer?) {
    let resolution = Unmanaged<Resolution>.fromOpaque(arg!).takeRetainedValue()
    resolution.connection.resolved(result, list, attempt: resolution.attempt)
}
