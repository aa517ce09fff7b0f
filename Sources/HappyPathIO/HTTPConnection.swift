internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// One client connection: the driver of its `HTTP1ServerConnectionStateMachine`
/// (HappyPathCore), which decides; this class performs what it decides on
/// the socket, the events and the timer, and owns the bytes (the read
/// buffer, the body being read, the output queue).
///
/// Events: a read event registered for the connection's life (level
/// triggered, so a read per wake-up and no epoll_ctl per request), a write
/// event added only while the kernel's send buffer is full, and one timer.
/// All three point at `self` unretained; the server retains the connection
/// until `close()`, which frees them.
final class HTTPConnection {
    typealias Machine = HTTP1ServerConnectionStateMachine

    /// The server owns the connection (its `connections`) until `close()`.
    let server: HTTPServer
    private(set) var fd: Int32
    private let peer: sockaddr_storage
    private var peerText: String?
    private var localText: String?
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var timerEvent: OpaquePointer?

    /// Decides; `HTTPRequest` reports the answer's head, bytes and end to it.
    var machine: Machine

    /// Read buffer: from `requestStart`, the current request's head (its fields are
    /// offsets into `requestBytes`), then what follows (body bytes,
    /// pipelined requests). Bytes before `requestStart` belong to answered
    /// requests; they are dropped when the buffer is full or empty, not per
    /// request.
    var input: ByteBuffer
    private var requestStart = 0
    private(set) var current: HTTPRequest?

    // The body being read: its storage (Content-Length) or its decoded bytes (chunked).
    private var body: RequestBody?
    private var bodyFilled = 0
    private var decoded: GrowingBody

    /// Bytes accepted for the client and not yet written.
    private var output = OutputQueue()

    // The response being written (staged head) lives here so its buffers
    // are reused from request to request.
    var response = ResponseState()

    init(server: HTTPServer, fd: Int32, peer: sockaddr_storage) {
        self.server = server
        self.fd = fd
        self.peer = peer
        machine = Machine(limits: server.connectionLimits)
        decoded = GrowingBody(budget: server.limits.bodyBudget)
        input = ByteBuffer(capacity: 4096)
    }

    deinit {
        input.deallocate()
        output.deallocate()
        decoded.discard()
        response.deallocate()
    }

    func start() {
        let me = Unmanaged.passUnretained(self).toOpaque()
        let base = server.loop.base
        readEvent = event_new(base, fd, Int16(EV_READ | EV_PERSIST), httpConnectionReadCallback, me)
        writeEvent = event_new(base, fd, Int16(EV_WRITE | EV_PERSIST), httpConnectionWriteCallback, me)
        timerEvent = event_new(base, -1, 0, httpConnectionTimerCallback, me)
        event_add(readEvent, nil)
        perform(machine.start())
    }

    /// The current request's bytes, from its first: what its head's offsets point into.
    var requestBytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: input.bytes[requestStart...]) }

    var head: RequestHead? { machine.head }

    var peerAddress: String {
        if let peerText { return peerText }
        peerText = SocketAddress.text(of: peer)
        return peerText!
    }

    /// The address this connection arrived at (what `getsockname` says):
    /// the listener's own address, or for a listener on `0.0.0.0` or `::`
    /// the interface address the client reached. Empty if it cannot be read.
    var localAddress: String {
        if let localText { return localText }
        localText = SocketAddress.local(of: fd)
        return localText!
    }

    // MARK: - Performing the machine's actions

    private func perform(_ a: Machine.Actions) {
        if let change = a.timer { setTimer(change) }
        if let reading = a.reading, readEvent != nil {
            if reading { event_add(readEvent, nil) } else { event_del(readEvent) }
        }
        if let watch = a.writeInterest, writeEvent != nil {
            if watch { event_add(writeEvent, nil) } else { event_del(writeEvent) }
        }
        switch a.step {
        case .none: break
        case .startBody: startBody()
        case .dispatch: dispatch()
        case let .refuse(reason): refuse(reason)
        case .askAdmission: askAdmission()
        case .writeContinue: write("HTTP/1.1 100 Continue\r\n\r\n")
        case .parseNext: event_active(readEvent, Int32(EV_READ), 0)
        case .halfClose: shutdown(fd, Int32(SHUT_WR))
        case .close: close()
        case .clientLost: current?.connectionLost()
        case .notifyDrained: current?.outputDrained()
        case .checkDrained: event_active(writeEvent, Int32(EV_WRITE), 0)
        }
    }

    private func setTimer(_ change: Machine.TimerChange) {
        guard let timerEvent else { return }
        switch change {
        case .cancel:
            event_del(timerEvent)
        case let .arm(wait):
            var tv = timeval(wait == .linger ? .seconds(2) : server.limits.timeout)
            event_add(timerEvent, &tv)
        }
    }

    // MARK: - Reading

    fileprivate func readable() {
        switch machine.readReady(buffered: input.count - requestStart) {
        case .ignore:
            return
        case .pause:
            event_del(readEvent)
        case .parseBuffered:
            process()
        case .discard:
            let n = read(fd, input.base, input.capacity)
            if n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) { perform(machine.readEnded()) }
        case let .body(remaining):
            // A Content-Length body goes straight into its own storage.
            let n = read(fd, body!.baseAddress! + bodyFilled, remaining)
            guard n > 0 else { return readFailed(n) }
            bodyFilled += n
            perform(machine.bodyRead(n))
        case .input:
            if input.room < 1024 { makeRoom() }
            let n = read(fd, input.end, input.room)
            guard n > 0 else { return readFailed(n) }
            input.count += n
            perform(machine.inputRead())
            process()
        }
    }

    /// Drops the answered requests' bytes before growing the buffer.
    private func makeRoom() {
        if requestStart > 0 {
            input.removeFirst(requestStart)
            requestStart = 0
        }
        if input.room < 1024 { input.reserve(max(4096, input.capacity)) }
    }

    private func readFailed(_ n: Int) {
        if n < 0, errno == EAGAIN || errno == EINTR { return }
        perform(machine.readEnded())
    }

    /// Parses what is buffered, as far as it goes.
    private func process() {
        if !machine.decodingChunked { perform(machine.parse(requestBytes)) }
        // A chunked body (perhaps of the head just parsed): decode what is buffered.
        if machine.decodingChunked { decodeChunked() }
    }

    private func startBody() {
        guard let head = machine.head else { return }
        current = HTTPRequest(connection: self)
        response.reset(version: head.version, isHead: head.isHead)
        var buffered = 0
        if case let .contentLength(n) = head.framing {
            // The whole body is kept (for retries and replays): it must fit
            // the process's budget, checked before the client is invited to send it.
            if let budget = server.limits.bodyBudget {
                guard let storage = RequestBody(count: n, budget: budget) else { return perform(machine.refused(.bodyOverBudget)) }
                body = storage
            } else {
                body = RequestBody(count: n)
            }
            buffered = min(n, input.count - requestStart - head.headLength)
            if buffered > 0 { body!.baseAddress!.copyMemory(from: input.base + requestStart + head.headLength, byteCount: buffered) }
            bodyFilled = buffered
        }
        perform(machine.bodyStarted(buffered: buffered))
    }

    private func askAdmission() {
        guard let request = current else { return }
        let granted = server.delegate?.admit(request) ?? true
        perform(machine.admission(granted))
    }

    private func decodeChunked() {
        let headLength = machine.head!.headLength
        let pending = UnsafeRawBufferPointer(rebasing: requestBytes[headLength...])
        let (consumed, actions) = machine.decodeChunked(pending) { decoded.append($0) }
        // Keep the head (its fields point into it); drop the decoded raw bytes.
        input.remove((requestStart + headLength)..<(requestStart + headLength + consumed))
        perform(actions)
    }

    private func dispatch() {
        if current == nil {
            current = HTTPRequest(connection: self)
            response.reset(version: machine.head!.version, isHead: machine.head!.isHead)
        }
        if case .chunked = machine.head!.framing { body = decoded.finish() }
        guard let request = current else { return }
        if let delegate = server.delegate { delegate.serve(request) } else { request.reply(status: 503) }
    }

    /// The body read, handed over once (the request keeps no copy).
    func takeBody() -> RequestBody {
        defer { body = nil }
        return body ?? .empty
    }

    /// A request the edge will not serve: the delegate answers it, then the
    /// connection closes.
    private func refuse(_ reason: HTTP1Refusal) {
        decoded.discard()
        body = nil
        if current == nil {
            current = HTTPRequest(connection: self)
            response.reset(version: .http11, isHead: false)
        }
        let request = current!
        if let delegate = server.delegate {
            delegate.reject(request, reason: reason)
        } else {
            request.reply(status: reason.status)
        }
    }

    // MARK: - Finishing a request

    /// The answer to `current` is written (or queued): move on to the next
    /// request, or close.
    func finished(_ request: HTTPRequest) {
        guard current === request else { return }
        current = nil
        body = nil
        let end = requestStart + machine.requestEnd
        let actions = machine.responseEnded(buffered: input.count - end, outputPending: pendingOutput > 0)
        if machine.state == .idle {
            requestStart = end
            if requestStart == input.count {
                input.count = 0
                requestStart = 0
                input.shrink(to: 16 * 1024)
            }
        }
        perform(actions)
    }

    /// Drain: close now if idle, else after the current answer.
    func drain() {
        perform(machine.drain(buffered: input.count - requestStart, outputPending: pendingOutput > 0))
    }

    /// Closes the socket now. Whoever answers `current` is told (unless it
    /// asked for the close).
    func close() {
        guard readEvent != nil else { return }
        _ = machine.closed()
        Glibc.close(forget())
        server.connectionClosed(self)
        if let request = current {
            current = nil
            request.connectionLost()
        }
    }

    /// Hands the socket to `request`'s code and forgets it (see
    /// `HTTPRequest.takeOverConnection`). Nil if the connection is gone.
    func detach(_ request: HTTPRequest) -> Int32? {
        guard readEvent != nil else { return nil }
        _ = machine.closed()
        let socket = forget()
        if current === request { current = nil }
        server.connectionClosed(self)
        return socket
    }

    /// Stops every event of the connection; returns the socket, which is
    /// the caller's to close or keep.
    private func forget() -> Int32 {
        decoded.discard()
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        if let timerEvent { event_free(timerEvent) }
        readEvent = nil
        writeEvent = nil
        timerEvent = nil
        let socket = fd
        fd = -1
        return socket
    }

    /// The request's own code gives up on it (`abort`): close without telling it.
    func abort(_ request: HTTPRequest) {
        if current === request { current = nil }
        close()
    }

    // MARK: - Writing

    var pendingOutput: Int { output.pending }

    /// Writes `pieces` in order, after anything already queued: directly
    /// when nothing is queued (one writev), and whatever the kernel does
    /// not take is queued, with a write event until it is gone. False if
    /// the connection is gone.
    @discardableResult
    func write(_ pieces: [UnsafeRawBufferPointer]) -> Bool {
        guard readEvent != nil else { return false }
        switch output.write(pieces, to: fd) {
        case .written: return true
        case .queued:
            perform(machine.outputQueued())
            return true
        case .failed:
            perform(machine.writeFailed())
            return false
        }
    }

    func write(_ literal: StaticString) {
        write([UnsafeRawBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount)])
    }

    fileprivate func writable() {
        guard readEvent != nil else { return }
        switch output.flush(to: fd) {
        case .again: return
        case .failed: perform(machine.writeFailed())
        case .progressed: perform(machine.outputProgressed())
        case .drained: perform(machine.outputDrained())
        }
    }

    /// Tells `current`'s observer when everything queued so far is written;
    /// on the next pass if it already is.
    func notifyWhenDrained() {
        perform(machine.notifyWhenDrained(outputPending: pendingOutput > 0))
    }

    fileprivate func timerFired() {
        perform(machine.timerFired())
    }
}

// MARK: - C callbacks (the connection comes back unretained; keep it alive for the call)

private func httpConnectionReadCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    let connection = Unmanaged<HTTPConnection>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.readable() }
}

private func httpConnectionWriteCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    let connection = Unmanaged<HTTPConnection>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.writable() }
}

private func httpConnectionTimerCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    let connection = Unmanaged<HTTPConnection>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.timerFired() }
}
