internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// One client connection: reads requests with the strict parser, hands each
/// complete one to the delegate, and writes its answer. Requests on one
/// connection are answered in order: the next pipelined request is parsed
/// only once the previous answer is written.
///
/// Events: a read event registered for the connection's life (level
/// triggered, so a read per wake-up and no epoll_ctl per request), a write
/// event added only while the kernel's send buffer is full, and one timer.
/// All three point at `self` unretained; the server retains the connection
/// until `close()`, which frees them.
final class HTTPConnection {
    /// The server owns the connection (its `connections`) until `close()`.
    let server: HTTPServer
    private(set) var fd: Int32
    private let peer: sockaddr_storage
    private var peerText: String?
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var timerEvent: OpaquePointer?

    enum Phase {
        /// Between requests: nothing of the next one has arrived.
        case idle
        /// Part of a request head arrived.
        case head
        /// Reading the body of `current`.
        case body
        /// `current` is with the delegate.
        case dispatched
        /// The answer is written and the write side shut: reading what the
        /// client still sends, so its unread bytes do not turn our close
        /// into a reset that destroys the answer in flight.
        case lingering
        case closed
    }
    private(set) var phase = Phase.idle

    /// Read buffer: the current request's head (its fields point into it),
    /// then bytes of what follows (body parts, pipelined requests).
    var input: ByteBuffer
    /// Where the current request ends in `input` (set once its body is read).
    private var requestEnd = 0
    private var scanner = RequestHeadScanner()
    var fields: [HTTP1Field] = []
    private(set) var head: RequestHead?
    /// The head's path once normalized, when it differs from the one sent.
    private(set) var normalizedPath: String?
    private(set) var current: HTTPRequest?

    // Body being read.
    private var body: RequestBody?
    private var bodyFilled = 0
    private var chunkedDecoder: ChunkedDecoder?
    private var chunkedBody: ByteBuffer?
    /// Bytes of the chunked body being decoded, taken from the body budget.
    private var chunkedReserved = 0
    /// The chunked body outgrew the budget: refused once decoding returns.
    private var chunkedOverBudget = false

    /// Bytes accepted for the client and not yet written (from `outputSent`).
    private var output: ByteBuffer
    private var outputSent = 0
    private var writeRegistered = false
    /// Reading stopped: too many pipelined bytes wait, or the peer closed.
    private var readPaused = false
    /// The client closed its side (or reset) while a request was answered.
    private var peerClosed = false
    /// The request that finished left bytes to parse: do it on the next pass.
    private var parsePending = false
    /// Tell `current`'s observer once everything queued is written.
    private var drainNotifyPending = false
    /// Close (lingering) once the output is written.
    private var closeWhenWritten = false
    /// After the current answer, close instead of reading the next request.
    var closeAfterResponse = false

    // The response being written (staged head, framing) lives here so its
    // buffers are reused from request to request.
    var response = ResponseState()

    private enum TimerUse { case none, idle, head, body, writeStall, linger }
    private var timerUse = TimerUse.none

    /// Pipelined bytes read ahead while a request is being answered, at most.
    private var readAheadLimit: Int { server.requestLimits.maxHeadBytes + 16 * 1024 }

    init(server: HTTPServer, fd: Int32, peer: sockaddr_storage) {
        self.server = server
        self.fd = fd
        self.peer = peer
        input = ByteBuffer(capacity: 4096)
        output = ByteBuffer(capacity: 1024)
    }

    deinit {
        input.deallocate()
        output.deallocate()
        chunkedBody?.deallocate()
        response.deallocate()
    }

    func start() {
        let me = Unmanaged.passUnretained(self).toOpaque()
        let base = server.loop.base
        readEvent = event_new(base, fd, Int16(EV_READ | EV_PERSIST), httpConnectionReadCallback, me)
        writeEvent = event_new(base, fd, Int16(EV_WRITE | EV_PERSIST), httpConnectionWriteCallback, me)
        timerEvent = event_new(base, -1, 0, httpConnectionTimerCallback, me)
        event_add(readEvent, nil)
        arm(.idle)
    }

    var peerAddress: String {
        if let peerText { return peerText }
        let result = Self.text(of: peer)
        peerText = result
        return result
    }

    /// The address this connection arrived at (what `getsockname` says):
    /// the listener's own address, or for a listener on `0.0.0.0` or `::`
    /// the interface address the client reached. Empty if it cannot be read.
    var localAddress: String {
        if let localText { return localText }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        let result = rc == 0 ? Self.text(of: storage) : ""
        localText = result
        return result
    }
    private var localText: String?

    private static func text(of address: sockaddr_storage) -> String {
        var storage = address
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let family = Int32(storage.ss_family)
        withUnsafeMutableBytes(of: &storage) { raw in
            if family == AF_INET6 {
                _ = inet_ntop(AF_INET6, raw.baseAddress! + 8, &text, socklen_t(text.count))
            } else {
                _ = inet_ntop(AF_INET, raw.baseAddress! + 4, &text, socklen_t(text.count))
            }
        }
        return String(cString: text)
    }

    // MARK: - Reading

    fileprivate func readable() {
        if parsePending {
            parsePending = false
            if phase == .idle || phase == .head {
                process()
                return
            }
        }
        switch phase {
        case .closed: return
        case .lingering:
            let n = read(fd, input.base, input.capacity)  // discarded
            if n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) { close() }
            return
        case .body where body != nil:
            // A Content-Length body goes straight into its own storage.
            let remaining = body!.count - bodyFilled
            let n = read(fd, body!.baseAddress! + bodyFilled, remaining)
            guard n > 0 else { return readFailed(n) }
            bodyFilled += n
            if bodyFilled == body!.count {
                requestEnd = input.count
                dispatch()
            } else {
                arm(.body)
            }
            return
        default: break
        }
        if phase == .dispatched, input.count >= readAheadLimit {
            pauseReading()
            return
        }
        if input.room < 1024 { input.reserve(max(4096, input.capacity)) }
        let n = read(fd, input.end, input.room)
        guard n > 0 else { return readFailed(n) }
        input.count += n
        if phase == .body { arm(.body) }
        process()
    }

    private func readFailed(_ n: Int) {
        if n < 0, errno == EAGAIN || errno == EINTR { return }
        // End of stream or a reset. Mid-request there is nobody left to
        // answer. While an answer is being prepared, its code is told (as
        // nginx does, a client that closes its side is taken to have left);
        // if it answers anyway, the connection closes after that answer.
        if phase == .dispatched, let current {
            peerClosed = true
            pauseReading()
            current.connectionLost()
            return
        }
        close()
    }

    /// Parses what is buffered, as far as it goes.
    private func process() {
        while true {
            switch phase {
            case .idle, .head:
                let result = scanner.scan(input.bytes, limits: server.requestLimits)
                if phase == .idle, scanner.started {
                    phase = .head
                    arm(.head)  // the whole head must arrive within the timeout, counted from here
                }
                switch result {
                case .incomplete:
                    return
                case let .refused(reason):
                    return refuse(reason)
                case let .complete(start, end):
                    let parsed = RequestHeadParser.parse(
                        input.bytes, requestStart: start, end: end, limits: server.requestLimits, fields: &fields,
                        normalizedPath: &normalizedPath, requestLine: scanner.requestLine)
                    switch parsed {
                    case let .failure(reason):
                        return refuse(reason)
                    case let .success(h):
                        head = h
                        beginBody(h)
                        if phase == .body { continue }
                        return
                    }
                }
            case .body:
                guard chunkedDecoder != nil else { return }
                return decodeChunked()
            default:
                return
            }
        }
    }

    private func beginBody(_ h: RequestHead) {
        let request = HTTPRequest(connection: self)
        current = request
        response.reset(version: h.version, isHead: h.isHead)
        switch h.framing {
        case .none:
            requestEnd = h.headLength
            dispatch()
        case let .contentLength(n):
            let buffered = min(n, input.count - h.headLength)
            // The whole body is kept (for retries and replays): it must fit
            // the process's budget, checked before the client is invited to send it.
            let budgeted: RequestBody?
            if let budget = server.limits.bodyBudget {
                budgeted = RequestBody(count: n, budget: budget)
                if budgeted == nil { return refuse(.bodyOverBudget) }
            } else {
                budgeted = nil
            }
            if buffered == 0, h.expectsContinue, !inviteBody(request) { return }
            let storage = budgeted ?? RequestBody(count: n)
            if buffered > 0 { storage.baseAddress!.copyMemory(from: input.base + h.headLength, byteCount: buffered) }
            body = storage
            bodyFilled = buffered
            if buffered == n {
                requestEnd = h.headLength + n
                dispatch()
            } else {
                phase = .body
                arm(.body)
            }
        case .chunked:
            if input.count == h.headLength, h.expectsContinue, !inviteBody(request) { return }
            chunkedDecoder = ChunkedDecoder(limits: server.requestLimits)
            if chunkedBody == nil { chunkedBody = ByteBuffer(capacity: 4096) }
            chunkedBody!.count = 0
            releaseChunkedReservation()
            phase = .body
            arm(.body)
        }
    }

    /// `Expect: 100-continue`: the client waits for an invitation before it
    /// sends the body. Only a request that will be served is invited.
    private func inviteBody(_ request: HTTPRequest) -> Bool {
        // The delegate may answer from inside admit: the body it did not
        // invite may or may not follow, so the connection closes after that.
        let wasClosing = closeAfterResponse
        closeAfterResponse = true
        phase = .dispatched
        if let delegate = server.delegate, !delegate.admit(request) { return false }
        closeAfterResponse = wasClosing
        phase = .head
        write("HTTP/1.1 100 Continue\r\n\r\n")
        return true
    }

    private func decodeChunked() {
        let start = head!.headLength
        let pending = UnsafeRawBufferPointer(rebasing: input.bytes[start...])
        let budget = server.limits.bodyBudget
        let step = chunkedDecoder!.decode(pending) { data in
            if let budget {
                guard !chunkedOverBudget, budget.reserve(data.count) else {
                    chunkedOverBudget = true
                    return
                }
                chunkedReserved += data.count
            }
            chunkedBody!.append(data)
        }
        if chunkedOverBudget { return refuse(.bodyOverBudget) }
        switch step {
        case let .needMore(consumed):
            // Keep the head (its fields point into it); drop the decoded bytes.
            input.remove(start..<(start + consumed))
        case let .done(consumed):
            input.remove(start..<(start + consumed))
            let decoded = chunkedBody!
            let storage: RequestBody
            if let budget {
                // The body takes over the bytes reserved while decoding.
                storage = RequestBody(count: decoded.count, budget: budget, reserved: chunkedReserved)!
                chunkedReserved = 0
            } else {
                storage = RequestBody(count: decoded.count)
            }
            if decoded.count > 0 { storage.baseAddress!.copyMemory(from: decoded.base, byteCount: decoded.count) }
            body = storage
            bodyFilled = decoded.count
            chunkedDecoder = nil
            chunkedBody!.count = 0
            chunkedBody!.shrink(to: 64 * 1024)
            requestEnd = start
            dispatch()
        case let .refused(reason):
            refuse(reason)
        }
    }

    private func dispatch() {
        phase = .dispatched
        arm(.none)
        guard let request = current else { return }
        if let delegate = server.delegate { delegate.serve(request) } else { request.reply(status: 503) }
    }

    /// The body read so far, handed over once (the request keeps no copy).
    func takeBody() -> RequestBody {
        defer { body = nil }
        return body ?? .empty
    }

    /// A request the edge will not serve: the delegate answers it, then the
    /// connection closes.
    /// Gives back what a chunked body being decoded took from the budget.
    private func releaseChunkedReservation() {
        server.limits.bodyBudget?.release(chunkedReserved)
        chunkedReserved = 0
        chunkedOverBudget = false
    }

    private func refuse(_ reason: HTTP1Refusal) {
        closeAfterResponse = true
        chunkedDecoder = nil
        releaseChunkedReservation()
        body = nil
        let request = current ?? HTTPRequest(connection: self)
        if current == nil {
            head = nil
            response.reset(version: .http11, isHead: false)
        }
        current = request
        phase = .dispatched
        arm(.none)
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
        // The answer said `Connection: close` (the client asked for it, or
        // HTTP/1.0 without keep-alive): nothing after it may be served
        // (RFC 9112 section 9.6).
        let keepAlive = head?.keepAlive ?? false
        current = nil
        head = nil
        body = nil
        drainNotifyPending = false
        if !keepAlive || closeAfterResponse || server.draining || peerClosed {
            return closeAfterWriting()
        }
        input.removeFirst(requestEnd)
        requestEnd = 0
        scanner.reset()
        input.shrink(to: 16 * 1024)
        phase = .idle
        arm(.idle)
        if readPaused { resumeReading() }
        if input.count > 0 {
            // A pipelined request is waiting. Parse it on the next loop pass,
            // not from inside the code that answered this one.
            parsePending = true
            event_active(readEvent, Int32(EV_READ), 0)
        }
    }

    /// Drain: close now if idle, else after the current answer.
    func drain() {
        if phase == .idle, input.count == 0, output.count == outputSent {
            close()
        } else {
            closeAfterResponse = true
        }
    }

    private func closeAfterWriting() {
        if output.count > outputSent {
            closeWhenWritten = true
        } else {
            linger()
        }
    }

    private func linger() {
        guard phase != .closed else { return }
        shutdown(fd, Int32(SHUT_WR))
        phase = .lingering
        if readPaused { resumeReading() }
        arm(.linger)
    }

    /// Closes the socket now. Whoever answers `current` is told (unless it
    /// asked for the close).
    func close() {
        guard phase != .closed else { return }
        let socket = forget()
        Glibc.close(socket)
        server.connectionClosed(self)
        if let request = current {
            current = nil
            request.connectionLost()
        }
    }

    /// Hands the socket to `request`'s code and forgets it (see
    /// `HTTPRequest.takeOverConnection`). Nil if the connection is gone.
    func detach(_ request: HTTPRequest) -> Int32? {
        guard phase != .closed else { return nil }
        let socket = forget()
        if current === request { current = nil }
        server.connectionClosed(self)
        return socket
    }

    /// Stops every event of the connection and marks it closed; returns the
    /// socket, which is the caller's to close or keep.
    private func forget() -> Int32 {
        phase = .closed
        releaseChunkedReservation()
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

    // MARK: - Read pressure

    private func pauseReading() {
        guard !readPaused else { return }
        readPaused = true
        event_del(readEvent)
    }

    private func resumeReading() {
        guard readPaused, phase != .closed else { return }
        readPaused = false
        event_add(readEvent, nil)
    }

    // MARK: - Writing

    var pendingOutput: Int { output.count - outputSent }

    /// Writes `pieces` in order, after anything already queued: directly
    /// when nothing is queued (one writev), and whatever the kernel does
    /// not take is queued, with a write event until it is gone. False if
    /// the connection is gone.
    @discardableResult
    func write(_ pieces: [UnsafeRawBufferPointer]) -> Bool {
        guard phase != .closed else { return false }
        var total = 0
        for p in pieces { total += p.count }
        guard total > 0 else { return true }
        var written = 0
        if output.count == outputSent {
            written = withUnsafeTemporaryAllocation(of: iovec.self, capacity: pieces.count) { iov in
                var k = 0
                for p in pieces where p.count > 0 {
                    iov[k] = iovec(iov_base: UnsafeMutableRawPointer(mutating: p.baseAddress), iov_len: p.count)
                    k += 1
                }
                return writev(fd, iov.baseAddress, Int32(k))
            }
            if written < 0 {
                if errno != EAGAIN && errno != EINTR {
                    broken()
                    return false
                }
                written = 0
            }
            if written == total { return true }
            output.count = 0
            outputSent = 0
        }
        // Queue the rest, skipping what was written.
        var skip = written
        for p in pieces {
            if skip >= p.count {
                skip -= p.count
                continue
            }
            output.append(UnsafeRawBufferPointer(rebasing: p[skip...]))
            skip = 0
        }
        if !writeRegistered {
            event_add(writeEvent, nil)
            writeRegistered = true
            arm(.writeStall)
        }
        return true
    }

    func write(_ literal: StaticString) {
        write([UnsafeRawBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount)])
    }

    fileprivate func writable() {
        guard phase != .closed else { return }
        if output.count > outputSent {
            let n = Glibc.write(fd, output.base + outputSent, output.count - outputSent)
            if n < 0 {
                if errno == EAGAIN || errno == EINTR { return }
                return broken()
            }
            outputSent += n
            if output.count > outputSent {
                arm(.writeStall)
                return
            }
        }
        // Everything is written.
        output.count = 0
        outputSent = 0
        output.shrink(to: 64 * 1024)
        if writeRegistered {
            event_del(writeEvent)
            writeRegistered = false
        }
        if timerUse == .writeStall { arm(.none) }
        if closeWhenWritten {
            closeWhenWritten = false
            return linger()
        }
        if drainNotifyPending, let current {
            drainNotifyPending = false
            current.outputDrained()
        }
    }

    /// Tells `current`'s observer when everything queued so far is written;
    /// at once (on the next pass) if it already is.
    func notifyWhenDrained() {
        drainNotifyPending = true
        if output.count == outputSent, phase != .closed { event_active(writeEvent, Int32(EV_WRITE), 0) }
    }

    /// A write failed (the client reset the connection).
    private func broken() {
        close()
    }

    // MARK: - Timer

    private func arm(_ use: TimerUse) {
        guard let timerEvent else { return }
        timerUse = use
        if use == .none {
            event_del(timerEvent)
            return
        }
        var tv = timeval(use == .linger ? .seconds(2) : server.limits.timeout)
        event_add(timerEvent, &tv)
    }

    fileprivate func timerFired() {
        switch timerUse {
        case .none: break
        case .idle, .linger: close()
        case .head: refuse(.headTimeout)
        case .body: refuse(.bodyTimeout)
        case .writeStall: close()  // the client stopped reading its answer
        }
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
