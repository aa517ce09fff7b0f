internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// One client connection: the driver of its `HTTP1ServerConnectionStateMachine`
/// (HappyPathCore), which decides; this class performs what it decides on
/// the socket, the events and the timer, and owns the bytes (`RequestInput`:
/// the read buffer and the body being read; `OutputQueue`).
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
    private var addresses: ConnectionAddresses
    // Internal (not private) for the TLS handshake's driving, in HTTPConnection+TLS.swift.
    var readEvent: OpaquePointer?
    var writeEvent: OpaquePointer?
    var timerEvent: OpaquePointer?

    /// Decides; the answer's head, bytes and end (HTTPConnection+ClientStream.swift) are reported to it.
    var machine: Machine

    var input: RequestInput
    var current: HTTPRequest?
    /// On a TLS listener: the session every byte goes through, and its handshake.
    var tls: TLSSession?
    /// After a `101`: the tunnel this connection is the client end of
    /// (HTTPConnection+Tunnel.swift). Its events go there, not to `machine`.
    var tunnel: Tunnel?
    /// After the client's HTTP/2 preface (or ALPN `h2`): the HTTP/2 driver.
    /// Its events go there, not to `machine`.
    var http2: HTTP2Connection?
    /// The first bytes may be the HTTP/2 preface (h2c by prior knowledge):
    /// looked at until a byte differs.
    private var sniffing: Bool

    /// Nothing read from the client yet: the connection is in its server's
    /// list of silent ones (oldest first, linked through these two), which
    /// at the connection cap gives up its oldest to make room.
    var isSilent = false
    var silentOlder: HTTPConnection?
    var silentNewer: HTTPConnection?

    /// Bytes accepted for the client and not yet written.
    var output = OutputQueue()
    /// Answer bytes read ahead of the client past `limits.connection_buffer`
    /// (`limits.read_ahead`): written after `output`, refilled from as it drains.
    var spool: AnswerSpool?
    /// The answer now may be read ahead (`permitReadAhead`: not an event
    /// stream); cleared when it ends.
    var readsAhead = false
    /// The client's share of `limits.max_spooled_bytes`, taken at the first spill.
    private var spoolAccount: BodyBudget?

    /// The client's share of the body budget (`limits.max_buffered_per_client`),
    /// taken when its first body needs it and given back at the close.
    private var clientAccount: BodyBudget?

    // The response being written (staged head) lives here so its buffers
    // are reused from request to request.
    var response = ResponseState()

    init(server: HTTPServer, fd: Int32, peer: sockaddr_storage, tls: TLSSession? = nil) {
        self.server = server
        self.tls = tls
        self.fd = fd
        addresses = ConnectionAddresses(peer: peer)
        machine = Machine(limits: server.connectionLimits)
        input = RequestInput(budget: server.limits.bodyBudget)
        output.pool = server.limits.memory?.output
        sniffing = tls == nil && server.limits.http2 != nil
    }

    deinit {
        input.deallocate()
        output.deallocate()
        response.deallocate()
    }

    func start() {
        // Alive: the server's `connections` holds this connection until `connectionClosed`,
        // which `close()` and `detach` call only after `forget()` freed all three events.
        let me = Unmanaged.passUnretained(self).toOpaque()
        let base = server.loop.base
        readEvent = event_new(base, fd, Int16(EV_READ | EV_PERSIST), httpConnectionReadCallback, me)
        writeEvent = event_new(base, fd, Int16(EV_WRITE | EV_PERSIST), httpConnectionWriteCallback, me)
        timerEvent = event_new(base, -1, 0, httpConnectionTimerCallback, me)
        event_add(readEvent, nil)
        if let tls {
            handshake(tls.machine.start())
            // The ClientHello came with the connection and OpenSSL has read it.
            if tls.started { server.spoke(self) }
            return
        }
        perform(machine.start())
    }

    /// The current request's bytes, from its first: what its head's offsets point into.
    var requestBytes: UnsafeRawBufferPointer { input.requestBytes }

    var head: RequestHead? { machine.head }

    var peerAddress: String { addresses.peerAddress() }
    /// The address this connection arrived at (see `ConnectionAddresses`).
    var localAddress: String { addresses.localAddress(of: fd) }

    // MARK: - Performing the machine's actions

    func perform(_ a: Machine.Actions) {
        if let change = a.timer { setTimer(change) }
        if let reading = a.reading, readEvent != nil {
            _ = reading ? event_add(readEvent, nil) : event_del(readEvent)
            if reading { readAgainIfSessionHolds() }
        }
        if let watch = a.writeInterest, writeEvent != nil { _ = watch ? event_add(writeEvent, nil) : event_del(writeEvent) }
        switch a.step {
        case .none: break
        case .startBody: startBody()
        case .dispatch: dispatch()
        case let .refuse(reason): refuse(reason)
        case .askAdmission: askAdmission()
        case .writeContinue: write("HTTP/1.1 100 Continue\r\n\r\n")
        case .parseNext: event_active(readEvent, Int32(EV_READ), 0)
        case .halfClose:
            tls?.shutdown()
            shutdown(fd, Int32(SHUT_WR))
        case .close: close()
        case .clientLost: current?.streamCancelled()
        case .notifyDrained: current?.streamDrained()
        case .checkDrained: event_active(writeEvent, Int32(EV_WRITE), 0)
        }
    }

    private func setTimer(_ change: Machine.TimerChange) {
        guard let timerEvent else { return }
        guard case let .arm(wait) = change else { return _ = event_del(timerEvent) }
        var tv = timeval(wait == .linger ? .seconds(2) : server.limits.timeout)
        event_add(timerEvent, &tv)
    }

    // MARK: - Reading

    fileprivate func readable() {
        if isSilent { server.spoke(self) }
        if let http2 { return http2.readable() }
        if let tunnel { return tunnel.clientReadable() }
        if let tls, !tls.machine.isEstablished { return handshake(tls.machine.socketReady()) }
        switch machine.readReady(buffered: input.buffered) {
        case .ignore:
            return
        case .pause:
            event_del(readEvent)
        case .parseBuffered:
            process()
        case .discard:
            let n = input.discard(from: fd, tls: tls)
            if n <= 0 { readFailed(n) }
        case let .body(remaining):
            // A Content-Length body goes straight into its own storage.
            let n = input.readBody(from: fd, remaining: remaining, tls: tls)
            guard n > 0 else { return readFailed(n) }
            perform(machine.bodyRead(n))
            readAgainIfSessionHolds()
        case .input:
            let n = input.read(from: fd, tls: tls)
            guard n > 0 else { return readFailed(n) }
            perform(machine.inputRead())
            process()
            readAgainIfSessionHolds()
        }
    }

    /// Bytes a TLS session already read from the socket wake no read
    /// event: look at them on the next pass.
    func readAgainIfSessionHolds() {
        if let tls, tls.pending, readEvent != nil { event_active(readEvent, Int32(EV_READ), 0) }
    }

    private func readFailed(_ n: Int) {
        if n < 0, errno == EAGAIN || errno == EINTR { return }
        perform(machine.readEnded())
    }

    /// Parses what is buffered, as far as it goes.
    private func process() {
        if sniffing {
            switch HTTP2Preface.match(input.requestBytes) {
            case .needMore: return
            case .http2: return startHTTP2()
            case .http1: sniffing = false
            }
        }
        if !machine.decodingChunked { perform(machine.parse(input.requestBytes)) }
        // A chunked body (perhaps of the head just parsed): decode what is buffered.
        if machine.decodingChunked { perform(input.decodeChunked(headLength: machine.head!.headLength, with: &machine)) }
    }

    private func startBody() {
        guard let head = machine.head else { return }
        let request = current ?? begin(head.version, isHead: head.isHead)
        if !request.screened, let delegate = server.delegate {
            request.screened = true
            if delegate.holdsBody(request) {
                // Judged at the head (a rate limit): nothing of the body is
                // read into storage, nor taken from the budget, until the
                // delegate lets it come (`HTTPRequest.readBody`, `resumeReading`) — or answers.
                perform(machine.holdBody())
                return delegate.bodyHeld(request)
            }
        }
        var buffered = 0
        if case let .contentLength(n) = head.framing {
            // The whole body is kept (for retries and replays): in a spool
            // file when it is large and the disk takes it, else in memory,
            // where it must fit the process's budget; checked before the
            // client is invited to send it.
            guard
                let moved = input.startBody(
                    length: n, headLength: head.headLength, budget: bodyBudget(), spooled: spooledBody(length: n))
            else { return perform(machine.refused(.bodyOverBudget)) }
            buffered = moved
        } else if let settings = server.limits.spool {
            input.countChunkedBody(in: bodyBudget(), inMemory: settings.bodyInMemory) { [weak self] in
                self?.spoolMapping(capacity: $0)
            }
        } else {
            input.countChunkedBody(in: bodyBudget())
        }
        perform(machine.bodyStarted(buffered: buffered))
    }

    private func askAdmission() {
        guard let request = current else { return }
        perform(machine.admission(server.delegate?.admit(request) ?? true))
    }

    /// A new request: the one this connection answers now.
    @discardableResult
    private func begin(_ version: HTTPVersion, isHead: Bool) -> HTTPRequest {
        let request = HTTPRequest(stream: self)
        current = request
        response.reset(version: version, isHead: isHead)
        return request
    }

    private func dispatch() {
        let head = machine.head!
        let request = current ?? begin(head.version, isHead: head.isHead)
        if case .chunked = head.framing { input.finishChunked() }
        if let delegate = server.delegate { delegate.serve(request) } else { request.reply(status: 503) }
    }

    /// A request the edge will not serve: the delegate answers it, then the
    /// connection closes.
    private func refuse(_ reason: HTTP1Refusal) {
        // The machine names the process's budget; the account knows whether it was the share.
        let reason = reason == .bodyOverBudget ? .bodyOver(clientAccount) : reason
        input.dropBody()
        let request = current ?? begin(.http11, isHead: false)
        if let delegate = server.delegate { delegate.reject(request, reason: reason) } else { request.reply(status: reason.status) }
    }

    /// Where this connection's request bodies are counted: its client's
    /// share of the process's budget, or the process's budget alone.
    func bodyBudget() -> BodyBudget? {
        guard let shares = server.limits.clientShares else { return server.limits.bodyBudget }
        if let clientAccount { return clientAccount }
        let account = shares.account(for: peerAddress)
        clientAccount = account
        return account
    }

    /// The connection is gone (closed or handed over): its client's account is given back.
    func leaveClientShare() {
        guard clientAccount != nil, let shares = server.limits.clientShares else { return }
        clientAccount = nil
        shares.leave(peerAddress)
    }

    // MARK: - HTTP/2

    /// The connection speaks HTTP/2 from here on: the HTTP/1.1 machine and
    /// its timer stop, and the driver takes the bytes read so far (the
    /// preface and what followed it).
    func startHTTP2() {
        sniffing = false
        guard let settings = server.limits.http2 else { return }
        _ = machine.closed()
        if let timerEvent { event_del(timerEvent) }
        let driver: HTTP2Connection
        do {
            driver = try HTTP2Connection(connection: self, settings: settings, isSecure: tls != nil)
        } catch {
            return close()  // nghttp2 could not make a session: out of memory
        }
        http2 = driver
        let buffered = Array(input.requestBytes)
        input.advance(by: input.buffered)
        buffered.withUnsafeBytes { driver.start(with: $0) }
    }

    // MARK: - Finishing a request

    /// The answer to `current` is written (or queued): move on to the next
    /// request, or close.
    func finished(_ request: HTTPRequest) {
        guard current === request else { return }
        current = nil
        readsAhead = false
        input.forgetBody()
        let end = machine.requestEnd
        let actions = machine.responseEnded(buffered: input.buffered - end, outputPending: pendingOutput > 0)
        if machine.state == .idle { input.advance(by: end) }
        perform(actions)
    }

    /// Drain: close now if idle, else after the current answer.
    func drain() {
        if let http2 { return http2.drain() }
        guard tunnel == nil else { return }  // tunnels close at drain_timeout (their owner's call)
        perform(machine.drain(buffered: input.buffered, outputPending: pendingOutput > 0))
    }

    /// Closes the socket now. Whoever answers `current` is told (unless it
    /// asked for the close).
    func close() {
        guard readEvent != nil else { return }
        if let tunnel { return tunnel.clientGone() }  // which closes this connection
        _ = machine.closed()
        tls?.close(notify: tls?.machine.isEstablished ?? false)
        Glibc.close(forget())
        server.connectionClosed(self)
        http2?.connectionClosed()
        if let request = current {
            current = nil
            request.streamCancelled()
        }
    }

    /// Hands the socket to `request`'s code and forgets it (see
    /// `HTTPRequest.takeOverConnection`). Nil if the connection is gone.
    func detach(_ request: HTTPRequest) -> Int32? {
        // A TLS connection's bytes are not the socket's: it cannot be handed over.
        guard readEvent != nil, tls == nil else { return nil }
        _ = machine.closed()
        let socket = forget()
        if current === request { current = nil }
        server.connectionClosed(self)
        return socket
    }

    /// Stops every event of the connection; returns the socket, which is
    /// the caller's to close or keep.
    func forget() -> Int32 {
        input.dropBody()
        leaveClientShare()
        dropSpool()
        for event in [readEvent, writeEvent, timerEvent] { if let event { event_free(event) } }
        (readEvent, writeEvent, timerEvent) = (nil, nil, nil)
        defer { fd = -1 }
        return fd
    }

    // MARK: - Writing

    /// Bytes for the client not written yet: queued, and read ahead into the spool.
    var pendingOutput: Int { output.pending + (spool?.held ?? 0) }

    /// Writes `pieces` in order, after anything already queued: directly
    /// when nothing is queued (one writev), and whatever the kernel does
    /// not take is queued, with a write event until it is gone. An answer
    /// read ahead (`readsAhead`) that would queue past `limits.connection_buffer`
    /// goes to the spool instead, and so does everything after it until the
    /// spool is empty. False if the connection is gone.
    @discardableResult
    func write(_ pieces: [UnsafeRawBufferPointer]) -> Bool {
        guard readEvent != nil else { return false }
        if let spool, !spool.isEmpty {
            spool.append(pieces)
            return true
        }
        if readsAhead, output.pending > 0, spills(pieces), let spool = answerSpool() {
            spool.append(pieces)
            return true
        }
        switch output.write(pieces, to: fd, tls: tls) {
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
        if let http2 { return http2.writable() }
        if let tunnel { return tunnelWritable(tunnel) }
        if let tls, !tls.machine.isEstablished { return handshake(tls.machine.socketReady()) }
        switch output.flush(to: fd, tls: tls) {
        case .again: return
        case .failed: perform(machine.writeFailed())
        case .progressed: perform(machine.outputProgressed())
        case .drained:
            if let spool, !spool.isEmpty { return refill(from: spool) }
            perform(machine.outputDrained())
        }
    }

    // MARK: - Reading ahead

    /// Whether `pieces` would queue past `limits.connection_buffer`.
    private func spills(_ pieces: [UnsafeRawBufferPointer]) -> Bool {
        var total = output.pending
        for p in pieces { total += p.count }
        return total > server.limits.connectionBuffer
    }

    /// Storage in a spool file for a body of `length` bytes larger than
    /// `limits.body_in_memory`, counted in the client's share of
    /// `limits.max_spooled_bytes`; nil (the body is kept in memory) for a
    /// smaller one, or when the share, the directory or the disk cannot take it.
    func spooledBody(length: Int) -> RequestBody? {
        guard let settings = server.limits.spool, length > settings.bodyInMemory else { return nil }
        return spoolMapping(capacity: length).map { RequestBody(mapping: $0, count: length) }
    }

    /// A spool file of `capacity` bytes for a request body kept for
    /// retries, counted in the client's share of `limits.max_spooled_bytes`;
    /// nil when the share, the directory or the disk cannot take it.
    func spoolMapping(capacity: Int) -> SpoolMapping? {
        guard let settings = server.limits.spool, readEvent != nil else { return nil }
        let account = spoolAccount ?? settings.shares.account(for: peerAddress)
        spoolAccount = account
        return SpoolMapping(capacity: capacity, budget: account, open: settings.openFile)
    }

    /// The connection's spool, made at its first spill (nil: no read-ahead).
    private func answerSpool() -> AnswerSpool? {
        if let spool { return spool }
        spool = makeSpool()
        return spool
    }

    /// A spool for one answer (this connection's, or an HTTP/2 stream's),
    /// drawing on the client's share of `limits.max_spooled_bytes`; nil
    /// without `limits.read_ahead`.
    func makeSpool() -> AnswerSpool? {
        guard let readAhead = server.limits.spool, readEvent != nil else { return nil }
        let account = spoolAccount ?? readAhead.shares.account(for: peerAddress)
        spoolAccount = account
        return AnswerSpool(
            account: account, limit: readAhead.perAnswer, pool: server.limits.memory?.output,
            open: readAhead.openAnswerFile, closed: readAhead.answerFileClosed)
    }

    /// Bytes the answer may still read ahead into the spool (0: none).
    var readAheadRoom: Int {
        guard readsAhead, let readAhead = server.limits.spool else { return 0 }
        return spool?.room ?? readAhead.perAnswer
    }

    /// The queue drained: the spool's front follows it, as far as the kernel takes it.
    private func refill(from spool: AnswerSpool) {
        var result = OutputQueue.WriteResult.written
        while result == .written, !spool.isEmpty {
            result = withUnsafeTemporaryAllocation(byteCount: Self.refillChunk, alignment: 16) { buffer in
                guard let n = spool.read(into: buffer.baseAddress!, max: buffer.count) else { return .failed }
                return output.write([UnsafeRawBufferPointer(rebasing: buffer[0..<n])], to: fd, tls: tls)
            }
        }
        switch result {
        case .written: perform(machine.outputDrained())
        case .queued: perform(machine.outputProgressed())
        case .failed: perform(machine.writeFailed())
        }
    }

    /// Bytes taken from the spool per refill.
    static let refillChunk = 64 * 1024

    /// Moves everything the spool holds into the output queue (at most
    /// `limits.read_ahead`, for a pipelined upgrade behind a spooled
    /// answer); false if the client is gone or the spool cannot be read.
    func unspool() -> Bool {
        guard let spool, !spool.isEmpty else { return true }
        while !spool.isEmpty {
            let result = withUnsafeTemporaryAllocation(byteCount: Self.refillChunk, alignment: 16) { buffer in
                guard let n = spool.read(into: buffer.baseAddress!, max: buffer.count) else { return OutputQueue.WriteResult.failed }
                return output.write([UnsafeRawBufferPointer(rebasing: buffer[0..<n])], to: fd, tls: tls)
            }
            if result == .failed { return false }
        }
        if output.pending > 0, let writeEvent { event_add(writeEvent, nil) }
        return true
    }

    /// The connection is gone: its spool file and its client's account go.
    private func dropSpool() {
        spool?.close()
        spool = nil
        readsAhead = false
        guard spoolAccount != nil, let readAhead = server.limits.spool else { return }
        spoolAccount = nil
        readAhead.shares.leave(peerAddress)
    }

    /// Tells `current`'s observer when everything queued so far is written;
    /// on the next pass if it already is.
    func notifyWhenDrained() {
        perform(machine.notifyWhenDrained(outputPending: pendingOutput > 0))
    }

    fileprivate func timerFired() {
        if let http2 { return http2.timerFired() }
        guard tunnel == nil else { return }
        if let tls, !tls.machine.isEstablished { return handshake(tls.machine.deadlinePassed()) }
        perform(machine.timerFired())
    }
}

// MARK: - C callbacks (the connection comes back unretained; keep it alive for the call)

@inline(__always)
private func withConnection(_ arg: UnsafeMutableRawPointer?, _ body: (HTTPConnection) -> Void) {
    let connection = Unmanaged<HTTPConnection>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(connection) { body(connection) }
}

private func httpConnectionReadCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withConnection(arg) { $0.readable() }
}

private func httpConnectionWriteCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withConnection(arg) { $0.writable() }
}

private func httpConnectionTimerCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withConnection(arg) { $0.timerFired() }
}
