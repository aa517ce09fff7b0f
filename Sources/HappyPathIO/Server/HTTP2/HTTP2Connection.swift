internal import CLibevent
import CNghttp2
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// What an HTTP/2 listener offers (docs/http2.md): the session's SETTINGS
/// and the connection's timers.
public struct HTTP2ServerSettings: Sendable, Equatable {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (Envoy's edge default).
    public var maxConcurrentStreams: Int
    /// SETTINGS_INITIAL_WINDOW_SIZE: request body a stream may send before it is read.
    public var initialStreamWindow: Int
    /// The connection's receive window.
    public var initialConnectionWindow: Int
    /// How long streams in flight may finish after a drain's GOAWAY.
    public var drainTimeout: Duration

    public init(
        maxConcurrentStreams: Int = 100, initialStreamWindow: Int = 64 * 1024,
        initialConnectionWindow: Int = 1024 * 1024, drainTimeout: Duration = .seconds(30)
    ) {
        self.maxConcurrentStreams = maxConcurrentStreams
        self.initialStreamWindow = initialStreamWindow
        self.initialConnectionWindow = initialConnectionWindow
        self.drainTimeout = drainTimeout
    }
}

/// An `HTTPConnection` after the client's HTTP/2 preface (or ALPN `h2`):
/// the driver of its `HTTP2Session` (nghttp2, which parses and writes
/// frames), its `HTTP2ConnectionStateMachine` (which decides: dispatch
/// turns, defences, timers, the end) and one `HTTP2Stream` per stream (each
/// the `ClientStream` of one request). It owns no socket or event of its
/// own: the connection's read, write and timer events come here, and its
/// bytes go through the connection's TLS session and output queue.
///
/// A loop turn: read once, feed the session, hand the machine the frames
/// and the streams their events, then dispatch ready streams (at most the
/// machine's share), then flush. Output a stream stages later (an upstream
/// callback) is flushed by a zero-delay event, once per loop pass however
/// many streams wrote.
///
/// Ownership: the connection holds this driver; it holds the connection
/// unowned (it never outlives it: `connectionClosed` ends it), the session
/// and the streams; a stream holds its request until the answer ends.
final class HTTP2Connection: HTTP2StreamOwner {
    typealias Machine = HTTP2ConnectionStateMachine

    /// Bytes read from the socket at a time.
    static let readSize = 16 * 1024
    /// Bytes taken from the session at a time into the output queue.
    static let produceChunk = 64 * 1024

    /// Alive: the connection's `http2` is the one strong reference to this
    /// driver (its streams hold it weak), so the driver dies with the connection.
    unowned let connection: HTTPConnection
    let session: HTTP2Session
    private(set) var machine: Machine
    private var streams: [Int32: HTTP2Stream] = [:]
    private let isSecure: Bool
    private let streamIdle: Duration
    private let peerAddress: String
    private let localAddress: String
    private let readBuffer: UnsafeMutableRawPointer
    private var staging = ByteBuffer(capacity: 16 * 1024)
    /// A zero-delay event: flush, and the next dispatch turn.
    private var turnEvent: OpaquePointer?
    private var turnScheduled = false
    /// Inside a read's turn: output is flushed at its end, not per stream.
    private var inTurn = false
    private var dispatchPending = false
    /// A stream filled the connection's staging bound: `holdFeeders` on the next turn.
    private var fullPending = false
    /// The machine's own deadline (idle, drain, linger).
    private var machineDeadline: Instant?
    private var armedDeadline: Instant?
    private var sentGoaway = false
    private var ended = false
    /// Each stream's receive window: how far a streamed body may run ahead of its reader.
    private let streamWindow: Int
    /// The stream windows offered now are shrunk (`limits.max_memory`'s overload action).
    private var windowsShrunk = false
    /// `limits.max_memory`'s overload action (nil: none), and the spool
    /// settings (`limits.read_ahead`, `body_in_memory`: atomics a reload
    /// moves), looked up once: not a copy of the server's limits per stream.
    private let memoryPressure: MemoryPressure?
    private let spool: Spool?
    /// Each stream's receive window while the overload action is on.
    static let shrunkStreamWindow = 16 * 1024

    init(connection: HTTPConnection, settings: HTTP2ServerSettings, isSecure: Bool) throws(HTTP2SessionError) {
        self.connection = connection
        let server = connection.server
        let sessionSettings = HTTP2SessionSettings(
            maxConcurrentStreams: UInt32(clamping: settings.maxConcurrentStreams),
            initialStreamWindow: Int32(clamping: settings.initialStreamWindow),
            initialConnectionWindow: Int32(clamping: settings.initialConnectionWindow),
            request: server.requestLimits)
        session = try HTTP2Session(settings: sessionSettings)
        session.stagedPool = server.limits.memory?.staged
        machine = Machine(limits: Machine.Limits(idle: server.limits.timeout, drainTimeout: settings.drainTimeout))
        self.isSecure = isSecure
        streamIdle = server.limits.timeout
        streamWindow = settings.initialStreamWindow
        memoryPressure = server.limits.memoryPressure
        spool = server.limits.spool
        peerAddress = connection.peerAddress
        localAddress = connection.localAddress
        readBuffer = UnsafeMutableRawPointer.allocate(byteCount: Self.readSize, alignment: 16)
    }

    deinit {
        readBuffer.deallocate()
        staging.deallocate()
        if let turnEvent { event_free(turnEvent) }
    }

    private var server: HTTPServer { connection.server }
    private var now: Instant { MonotonicClock().now() }

    /// Starts the session with the bytes the connection read already (the
    /// preface and whatever followed it).
    func start(with buffered: UnsafeRawBufferPointer) {
        // Alive: the connection's `http2` holds this driver for the connection's
        // life; `connectionClosed` deletes the event and deinit frees it.
        let me = Unmanaged.passUnretained(self).toOpaque()
        turnEvent = event_new(server.loop.base, -1, 0, http2TurnCallback, me)
        server.delegate?.http2ConnectionOpened(tls: isSecure)
        perform(machine.start(now: now))
        turn(buffered)
    }

    // MARK: - Events from the connection

    func readable() {
        guard !ended else { return }
        let n = connection.tls?.read(readBuffer, Self.readSize) ?? Glibc.read(connection.fd, readBuffer, Self.readSize)
        if n <= 0 {
            if n < 0, errno == EAGAIN || errno == EINTR { return }
            return perform(machine.connectionLost())
        }
        turn(UnsafeRawBufferPointer(start: readBuffer, count: n))
        if !ended { connection.readAgainIfSessionHolds() }
    }

    func writable() {
        guard !ended else { return }
        switch connection.output.flush(to: connection.fd, tls: connection.tls) {
        case .again: return
        case .failed: return perform(machine.connectionLost())
        case .progressed: break
        case .drained: if let e = connection.writeEvent { event_del(e) }
        }
        flush()
    }

    func timerFired() {
        guard !ended else { return }
        armedDeadline = nil
        let t = now
        if let deadline = machineDeadline, deadline <= t {
            machineDeadline = nil
            perform(machine.timerFired(now: t))
        }
        for stream in Array(streams.values) {
            if let deadline = stream.timerDeadline, deadline <= t { stream.timerFired() }
        }
        flush()
    }

    /// SIGTERM: GOAWAY naming the last stream; those open finish.
    func drain() {
        guard !ended else { return }
        perform(machine.drain(now: now))
        flush()
    }

    /// The connection closed (by us or the client): every request still
    /// carried is told its client left.
    func connectionClosed() {
        guard !ended else { return }
        ended = true
        if let turnEvent { event_del(turnEvent) }
        let reason: Machine.Reason
        if case let .closed(r) = machine.state { reason = r } else { reason = .clientClosed }
        let open = streams
        streams.removeAll()
        for stream in open.values {
            stream.connectionClosed()
            server.delegate?.http2StreamClosed()
        }
        session.closeSpools()
        server.delegate?.http2ConnectionClosed(reason: reason, sentGoaway: sentGoaway)
    }

    /// `limits.max_memory`'s overload action shrinks every stream's receive
    /// window (SETTINGS_INITIAL_WINDOW_SIZE) to 16 KiB while it is on, so
    /// request bodies arriving faster than their upstreams take them hold
    /// less; its end gives the configured window back. Seen at each turn:
    /// an atomic load while the action is off, a check of the budget while
    /// this connection's windows are shrunk (so their end is seen without a
    /// scrape or a new stream).
    private func followMemoryPressure() {
        guard let pressure = memoryPressure, streamWindow > Self.shrunkStreamWindow else { return }
        let active = windowsShrunk ? server.memoryUnderPressure() : pressure.active
        guard active != windowsShrunk else { return }
        windowsShrunk = active
        session.offerStreamWindow(active ? Self.shrunkStreamWindow : streamWindow)
    }

    // MARK: - A turn

    /// Bytes from the client through the session, then what they made ready, then the output.
    private func turn(_ bytes: UnsafeRawBufferPointer) {
        inTurn = true
        let result = session.receive(bytes)
        let t = now
        for frame in result.frames {
            perform(machine.frameReceived(frame, now: t))
            if ended { return }
        }
        route(result.events)
        if result.error != nil {
            inTurn = false
            return perform(machine.sessionFailed())
        }
        perform(machine.turnEnded(outboundQueue: session.outboundQueueSize, outputPending: connection.output.pending, now: t))
        dispatchReady()
        followMemoryPressure()
        inTurn = false
        flush()
    }

    private func route(_ events: [HTTP2SessionEvent]) {
        guard !events.isEmpty else { return }
        let t = now
        for event in events {
            switch event {
            case let .opened(id):
                // Over the high mark of limits.max_memory: the stream was
                // never processed, so the client may send it again (RFC 9113 section 8.7).
                if server.memoryUnderPressure() {
                    session.resetStream(id, code: HTTP2ErrorCode.refusedStream.rawValue)
                    continue
                }
                let actions = machine.streamOpened(id, now: t)
                if let refused = actions.refuse {
                    session.resetStream(refused, code: HTTP2ErrorCode.refusedStream.rawValue)
                    continue
                }
                let stream = HTTP2Stream(
                    session: session, id: id, peerAddress: peerAddress, localAddress: localAddress, isSecure: isSecure,
                    idle: streamIdle, now: { MonotonicClock().now() })  // a stream may outlive this driver
                stream.owner = self
                stream.dateHeader = server.dateHeader
                stream.streamAhead = streamWindow
                stream.stagingBound = server.limits.connectionBuffer
                stream.readAheadLimit = spool?.perAnswer ?? 0
                stream.bodyInMemory = spool?.bodyInMemory ?? Int.max
                streams[id] = stream
                server.delegate?.http2StreamOpened()
                perform(actions)
            case let .headComplete(id):
                guard let stream = streams[id] else { continue }
                stream.handle(event)
                // Trailers that came malformed in the same read: never handed
                // over, not even its head (the `malformed` event resets it).
                if !session.isMalformed(id) { screen(stream) }
            case let .resetByPeer(id, code):
                server.delegate?.http2StreamReset(byClient: true, code: HTTP2ErrorCode(rawValue: code) ?? .internalError)
                streams[id]?.handle(event)
                perform(machine.streamReset(id, now: t))
            case let .resetSent(_, code):
                server.delegate?.http2StreamReset(byClient: false, code: HTTP2ErrorCode(rawValue: code) ?? .internalError)
                perform(machine.resetSent(now: t))
            case let .closed(id, _):
                guard let stream = streams.removeValue(forKey: id) else { continue }
                stream.handle(event)
                session.forgetClosed(id)
                server.delegate?.http2StreamClosed()
                perform(machine.streamClosed(id, now: t))
            case let .goawayReceived(code, _):
                server.delegate?.http2GoawayReceived(code: HTTP2ErrorCode(rawValue: code) ?? .internalError)
            case .data, .requestEnded, .bodyTooLarge, .malformed:
                if let id = event.streamID { streams[id]?.handle(event) }
            }
            if ended { return }
        }
    }

    /// A head with a body still to come: the delegate may hold it (a rate
    /// limit judged at the head) before any of the body is kept.
    private func screen(_ stream: HTTP2Stream) {
        guard stream.head != nil, stream.machine.state == .body else { return }
        // A body comes: counted in its client's share, taken now (a
        // connection that sends none never takes an account).
        stream.budget = connection.bodyBudget()
        guard let delegate = server.delegate, let request = stream.hold() else { return }
        request.screened = true
        if delegate.holdsBody(request) {
            delegate.bodyHeld(request)
        } else if !session.requestEnded(stream.id), !lengthSatisfied(stream), delegate.streamsBody(request) {
            // Only a body still to come streams: the session has read this
            // read's frames already, so a request without a body (END_STREAM
            // on its HEADERS), or one whose body came whole with its head,
            // is served as before, with its body read whole. So is one whose
            // `content-length` is met already (0, or every byte came): it
            // is complete only at END_STREAM, and a DATA frame or a bad
            // trailer before that makes it malformed, never sent.
            stream.streamBody(for: request)
        } else {
            stream.resumeReading(for: request)
        }
    }

    /// The stream's `content-length` is met by what has arrived.
    private func lengthSatisfied(_ stream: HTTP2Stream) -> Bool {
        guard let length = stream.head?.contentLength else { return false }
        return session.bufferedBody(of: stream.id) >= length
    }

    func http2StreamReady(_ stream: HTTP2Stream) {
        machine.streamReady(stream.id)
        dispatchPending = true
        if !inTurn { scheduleTurn() }
    }

    func http2StreamHasOutput(_ stream: HTTP2Stream) {
        if !inTurn { scheduleTurn() }
    }

    func http2AnswerSpool(_ stream: HTTP2Stream) -> AnswerSpool? { connection.makeSpool() }

    func http2BodyMapping(capacity: Int) -> SpoolMapping? { connection.spoolMapping(capacity: capacity) }

    var tunnelServer: HTTPServer? { server }

    func http2ConnectionFull(_ stream: HTTP2Stream) {
        fullPending = true
        scheduleTurn()
    }

    /// The connection's staged answers reached `limits.connection_buffer`:
    /// every stream still fed waits (its transfer pauses) until there is room.
    private func holdFeeders() {
        fullPending = false
        guard session.stagedBytes >= server.limits.connectionBuffer else { return }
        for stream in Array(streams.values) { stream.connectionFull() }
    }

    /// Hands ready streams to their exchanges, as many as the machine allows this turn.
    private func dispatchReady() {
        dispatchPending = false
        while !ended {
            switch machine.nextDispatch() {
            case .done: return
            case .nextTurn:
                dispatchPending = true
                return scheduleTurn()
            case let .stream(id):
                guard let stream = streams[id], let request = stream.dispatch() else { continue }
                guard let delegate = server.delegate else {
                    request.reply(status: 503)
                    continue
                }
                if let refusal = stream.refusal {
                    delegate.reject(request, refusal: refusal)
                } else if stream.bodyTooLarge {
                    delegate.reject(request, refusal: .http1(.bodyTooLarge))
                } else {
                    delegate.serve(request)
                }
            }
        }
    }

    private func scheduleTurn() {
        guard !turnScheduled, !ended, let turnEvent else { return }
        turnScheduled = true
        event_active(turnEvent, 0, 0)
    }

    fileprivate func turnFired() {
        turnScheduled = false
        guard !ended else { return }
        if fullPending { holdFeeders() }
        if dispatchPending {
            inTurn = true
            perform(machine.turnEnded(outboundQueue: session.outboundQueueSize, outputPending: connection.output.pending, now: now))
            dispatchReady()
            inTurn = false
        }
        flush()
    }

    // MARK: - Output

    /// Takes what the session has to send into the connection's output
    /// queue while the queue is below its high water, then tells the streams
    /// and the machine.
    private func flush() {
        guard !ended else { return }
        let output = connection
        while output.output.pending < Machine.outputLowWater, session.wantsWrite {
            staging.count = 0
            session.produce(highWater: Self.produceChunk) { staging.append($0) }
            let produced = session.takeEvents()
            if produced.dataFramesSent > 0 { machine.dataFrameSent(count: produced.dataFramesSent) }
            route(produced.events)
            if ended { return }
            guard staging.count > 0 else { break }
            switch output.output.write([staging.bytes], to: output.fd, tls: output.tls) {
            case .written: continue
            case .queued:
                if let e = output.writeEvent { event_add(e, nil) }
            case .failed:
                return perform(machine.connectionLost())
            }
            break
        }
        if session.fatalError != nil { return perform(machine.sessionFailed()) }
        for stream in Array(streams.values) { stream.outputWritten() }
        if ended { return }
        perform(machine.outputChanged(outboundQueue: session.outboundQueueSize, outputPending: output.output.pending, now: now))
        if !ended, !session.wantsRead, !session.wantsWrite, output.output.pending == 0 {
            perform(machine.sessionFinished())
        }
        if !ended { rearm() }
    }

    // MARK: - The machine's actions

    private func perform(_ a: Machine.Actions) {
        if let id = a.refuse { session.resetStream(id, code: HTTP2ErrorCode.refusedStream.rawValue) }
        if let last = a.goaway {
            sentGoaway = true
            session.goaway(lastStreamID: last)
        }
        if let reason = a.terminate {
            sentGoaway = true
            session.terminate(code: reason.code.rawValue)
            if !inTurn { scheduleTurn() }
        }
        if let reading = a.reading, let e = connection.readEvent {
            _ = reading ? event_add(e, nil) : event_del(e)
            if reading { connection.readAgainIfSessionHolds() }
        }
        if let wait = a.timer {
            machineDeadline = now + wait
            rearm()
        }
        if a.close != nil {
            // The socket closes: the connection calls `connectionClosed`.
            connection.close()
        }
    }

    /// One timer for the machine's deadline and the streams' idle deadlines.
    private func rearm() {
        guard !ended, let timer = connection.timerEvent else { return }
        var earliest = machineDeadline
        for stream in streams.values {
            if let d = stream.timerDeadline, earliest.map({ d < $0 }) ?? true { earliest = d }
        }
        guard earliest != armedDeadline else { return }
        armedDeadline = earliest
        guard let earliest else { return _ = event_del(timer) }
        let t = now
        var tv = timeval(earliest > t ? earliest - t : .zero)
        event_add(timer, &tv)
    }
}

private func http2TurnCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    let driver = Unmanaged<HTTP2Connection>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(driver) { driver.turnFired() }
}
