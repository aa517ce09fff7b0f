import CNghttp2
import HappyPathCore

/// One try carried on the proxy's own HTTP/2 client (`UpstreamTry` on
/// nghttp2): it waits in its endpoint's pool, becomes a stream of one of
/// its connections, hands the response to its handler as libcurl's
/// transfers do (status, fields, 1xx, body, trailers, then the end), and
/// follows `HTTP2ClientStreamStateMachine` for what to hold and when to end.
///
/// Retention: the exchange holds the try; the pool holds it while it waits
/// (`pool`, strong, let go when it is assigned or withdrawn), the session's
/// `streams` while it is a stream; it holds its connection (`connection`)
/// until it ends, and its handler until it ends, is detached or cancelled.
/// What a stream asks of the connection it is on (the connection driver;
/// a session alone in tests).
protocol HTTP2StreamCarrier: AnyObject {
    /// RST_STREAM with `code`.
    func reset(_ stream: HTTP2UpstreamStream, code: UInt32)
    /// `n` bytes of the stream's window back to the server.
    func consume(_ stream: HTTP2UpstreamStream, _ n: Int)
    /// The stream's deferred request body has bytes again.
    func resumeData(_ stream: HTTP2UpstreamStream)
}

public final class HTTP2UpstreamStream: UpstreamTry {
    let request: UpstreamRequest
    var handler: UpstreamResponseHandler?
    /// Alive: read only in init and `resume()`; the client's owner (a worker's or the health checker's
    /// transports) cancels its exchanges' or probes' tries before it shuts the client down and lets go.
    unowned let client: HTTP2UpstreamClient
    var machine = HTTP2ClientStreamStateMachine()
    /// The pool while the try waits for a stream.
    var pool: HTTP2ConnectionPool?
    var connection: (any HTTP2StreamCarrier)?
    /// The pool's number for it.
    let tryID: Int
    var id: Int32 = -1
    var outcome: HTTP2ClientStreamStateMachine.Outcome?
    /// Waits in the client's next pass (held bytes, or its end).
    var soon = false

    // MARK: The response as it is read
    enum Phase { case awaitingHead, informational, finalHead, body }
    var phase = Phase.awaitingHead
    var informational = 0
    var informationalFields: [UInt8] = []
    var informationalCount = 0
    /// 1xx heads received (forwarded or not), bounded: a server that sends
    /// them without end would hold the stream while looking alive.
    var informationalHeads = 0
    static let maxInformationalHeads = 32
    var headBytes = 0
    var headFields = 0
    var trailerBytes = 0
    /// Why the head was refused (past the limits, or by the handler).
    var refusal: String?
    var resetByPeer = false
    /// nghttp2 produced the request's HEADERS (it may have reached the upstream).
    var headersProduced = false
    /// The response's END_STREAM came.
    var endStreamReceived = false
    /// When a byte last moved either way on the stream (the idle sweep's reading).
    var lastMoved = Instant(nanoseconds: 0)
    /// DATA the handler did not take yet (at most the stream's window).
    private(set) var held: [UInt8] = []
    /// Where held bytes are counted (the client's, taken at the start: the
    /// stream may outlive its client's shutdown).
    private let memory: MemoryPool?

    // MARK: The request body
    var wholeBody: UnsafeRawBufferPointer?
    var bodyOffset = 0
    var contentLength: Int?
    /// This try reads `request.bodyStream` as it comes.
    var readsBody = false
    /// The data provider said DEFERRED: resume on the body's next bytes.
    var deferred = false

    init(request: UpstreamRequest, handler: UpstreamResponseHandler, client: HTTP2UpstreamClient, tryID: Int) {
        self.request = request
        self.handler = handler
        self.client = client
        self.tryID = tryID
        memory = client.memory
    }

    deinit { dropHeld() }

    // MARK: - UpstreamTry

    public func resume() {
        switch machine.resume() {
        case .deliverHeldSoon: client.soon(self)
        case let .finish(outcome):
            self.outcome = outcome
            client.soon(self)
        default: break
        }
    }

    public func pauseReceiving() { machine.pause() }

    public func detach() { handler = nil }

    public func cancel() {
        handler = nil
        switch machine.cancel() {
        case .withdraw:
            pool?.withdraw(self)
            pool = nil
        case let .reset(code, _):
            connection?.reset(self, code: code)
        default: break
        }
        letGoOfBody()
        dropHeld()
    }

    // MARK: - The response (from the session's callbacks)

    /// One field of a head, 1xx head or trailers. False: past the limits
    /// (nghttp2 resets the stream; the try ends as a bad response).
    func field(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, limits: HTTP2ClientLimits) -> Bool {
        guard machine.state == .open else { return true }
        let size = name.count &+ value.count &+ 32
        if phase == .body {
            // Trailers: bounded as a head is; past the bound the rest are dropped.
            trailerBytes = trailerBytes &+ size
            if trailerBytes <= limits.maxHeadBytes, Self.isPassedTrailer(name, value) {
                handler?.upstreamTrailer(name: name, value: value)
            }
            return true
        }
        headBytes = headBytes &+ size
        headFields &+= 1
        if headBytes > limits.maxHeadBytes || headFields > limits.maxHeadFields {
            refusal = "The upstream's response head is larger than limits.max_header_bytes or has more than limits.max_headers fields."
            return false
        }
        if name.count == 7, name.first == UInt8(ascii: ":") {
            // ":status": three digits (nghttp2 checked it).
            guard HTTPBytes.equals(name, ":status"), value.count == 3 else { return true }
            let status = value.reduce(0) { $0 * 10 + Int($1 &- 0x30) }
            if status < 200 {
                informationalHeads &+= 1
                guard informationalHeads <= Self.maxInformationalHeads else {
                    refusal = "The upstream sent more than \(Self.maxInformationalHeads) informational (1xx) heads before its answer."
                    return false
                }
                phase = .informational
                let forward = status >= 102 && informationalCount < UpstreamTransfer.maxInformational
                informational = forward ? status : 0
                informationalFields.removeAll(keepingCapacity: true)
            } else {
                phase = .finalHead
                handler?.upstreamStatus(status, reason: UnsafeRawBufferPointer(start: nil, count: 0))
            }
            return true
        }
        switch phase {
        case .finalHead: handler?.upstreamHeader(name: name, value: value)
        case .informational where informational != 0: addInformationalField(name, value)
        default: break
        }
        return true
    }

    /// A HEADERS frame (and its CONTINUATIONs) ended. True: the handler
    /// refused the head, the try has ended (`outcome`), the stream is to be reset.
    func headersFrameEnded() -> Bool {
        switch phase {
        case .informational:
            if informational != 0 {
                informationalCount += 1
                informationalFields.withUnsafeBytes { handler?.upstreamInformational(informational, fields: $0) }
            }
            headBytes = 0
            headFields = 0
            phase = .awaitingHead
        case .finalHead:
            phase = .body
            let refused = handler?.upstreamHeadersComplete()
            if case let .reset(_, outcome) = machine.headEnded(refusal: refused) {
                refusal = refused
                self.outcome = outcome
                return true
            }
        default: break
        }
        return false
    }

    /// Body bytes: how many were taken (their window goes back now).
    /// Bytes past the stream's window are dropped and the try ends as a
    /// bad response: nghttp2 resets such a stream (FLOW_CONTROL_ERROR) but
    /// hands over what came in the same read first, which would be held past
    /// the bound (found by `FuzzHTTP2Client`).
    func data(_ bytes: UnsafeRawBufferPointer, window: Int32) -> Int {
        if held.count &+ bytes.count > max(Int(window), 65_535) {
            if refusal == nil { refusal = "The upstream sent past the stream's flow-control window." }
            return bytes.count
        }
        switch machine.data(bytes.count) {
        case .deliver:
            let taken = handler?.upstreamBody(bytes) ?? true
            if case .consume = machine.delivered(bytes.count, taken: taken) { return bytes.count }
            hold(bytes)
            return 0
        case .hold:
            hold(bytes)
            return 0
        default:
            return bytes.count
        }
    }

    /// Keeps bytes the handler did not take, counted in the client's memory
    /// pool (`happypath_memory_bytes{pool="upstream_h2"}`).
    private func hold(_ bytes: UnsafeRawBufferPointer) {
        held.append(contentsOf: bytes)
        memory?.add(bytes.count)
    }

    /// Lets go of the held bytes (handed over, or the try ended).
    private func dropHeld() {
        guard !held.isEmpty else { return }
        memory?.add(-held.count)
        held = []
    }

    /// What a stream's close means for its try.
    enum End { case none, ended, replay }

    /// nghttp2 closed the stream with `code`.
    func closed(code: UInt32) -> End {
        let outcome: HTTP2ClientStreamStateMachine.Outcome
        if let refusal {
            outcome = .badResponse(refusal)
        } else if code == HTTP2ErrorCode.refusedStream.rawValue {
            outcome = .refused
        } else if resetByPeer, !(code == 0 && endStreamReceived && phase == .body) {
            // (A whole response, then RST_STREAM NO_ERROR to stop our request: complete.)
            outcome = .resetByPeer(code)
        } else if code != 0 {
            outcome = .badResponse("The upstream's HTTP/2 response was malformed (\(Self.codeName(code))).")
        } else if phase != .body {
            outcome = .badResponse("The upstream ended the stream before its response head.")
        } else {
            outcome = .complete
        }
        return end(machine.closed(outcome, canResend: canResend))
    }

    /// The response ended while the stream stays open for the rest of our
    /// request (RFC 9113 section 8.1): the answer is complete. True: the
    /// try ended now (tell it). The driver resets the stream NO_ERROR.
    func remoteEnded() -> Bool {
        guard phase == .body else { return false }  // no final head: nghttp2 resets it itself
        letGoOfBody()
        return end(machine.closed(.complete)) == .ended
    }

    /// The connection went under the stream (before its HEADERS were
    /// produced: never sent, so sent again elsewhere). `broken`: the
    /// upstream broke the protocol (a flood, a window overflow): the try
    /// ends as a bad response, not a dropped connection.
    func connectionLost(_ why: String, broken: Bool = false) -> End {
        let lost: HTTP2ClientStreamStateMachine.Outcome = broken ? .badResponse(why) : .connectionLost(why)
        return end(machine.closed(headersProduced ? lost : .unsent(why), canResend: canResend))
    }

    private func end(_ action: HTTP2ClientStreamStateMachine.Action) -> End {
        switch action {
        case let .finish(o):
            outcome = o
            return .ended
        case .replay:
            prepareReplay()
            return .replay
        default: return .none
        }
    }

    /// Nothing of the response reached the handler, and the body can be
    /// sent again from its first byte.
    private var canResend: Bool {
        guard phase == .awaitingHead, informationalCount == 0 else { return false }
        return !readsBody || request.bodyStream?.replayable == true
    }

    /// Back to how `start` made it, for another stream.
    private func prepareReplay() {
        id = -1
        connection = nil
        phase = .awaitingHead
        informational = 0
        informationalFields.removeAll()
        headBytes = 0
        headFields = 0
        trailerBytes = 0
        refusal = nil
        resetByPeer = false
        dropHeld()
        headersProduced = false
        endStreamReceived = false
        deferred = false
        bodyOffset = 0
        if readsBody, let stream = request.bodyStream {
            stream.onAvailable = nil
            _ = stream.rewind()
        }
        readsBody = false
        wholeBody = nil
        contentLength = nil
    }

    /// The connection's idle sweep: true when the try timed out now (the
    /// stream is to be reset; tell it).
    func idleCheck(at now: Instant) -> Bool {
        guard machine.state == .open, now - lastMoved >= request.idleTimeout,
            case let .reset(_, outcome?) = machine.idle()
        else { return false }
        self.outcome = outcome
        return true
    }

    /// The pool could not give the try a connection.
    func failedWaiting(_ why: HTTP2ConnectFailure) {
        pool = nil
        if case let .finish(o) = machine.failedWaiting(why) { outcome = o }
    }

    /// The client's pass: held bytes to the handler, or the end told.
    func runSoon() {
        soon = false
        if machine.state == .finished {
            if outcome != nil { tell() }
            return
        }
        guard !held.isEmpty else { return }
        // A copy of the reference (no bytes copied): a handler that ends the
        // try meanwhile lets go of `held` without touching what it reads.
        let chunk = held
        let taken = chunk.withUnsafeBytes { handler?.upstreamBody($0) ?? true }
        let n = held.count
        switch machine.heldDelivered(taken: taken) {
        case .consume:
            dropHeld()
            connection?.consume(self, n)
        case let .finish(o):
            dropHeld()
            outcome = o
            tell()
        default: break
        }
    }

    /// Tells the handler the try ended (once), and lets go of everything.
    func tell() {
        guard let outcome else { return }
        self.outcome = nil
        let handler = self.handler
        self.handler = nil
        connection = nil
        pool = nil
        dropHeld()
        letGoOfBody()
        handler?.upstreamFinished(Self.failure(outcome))
    }

    static func failure(_ outcome: HTTP2ClientStreamStateMachine.Outcome) -> UpstreamFailure? {
        switch outcome {
        case .complete: nil
        // Never processed (RFC 9113 section 8.7): as safe to send again as a request that never left.
        case .refused: .connectFailed("The upstream refused the stream (REFUSED_STREAM): it was not processed.")
        case let .resetByPeer(code): .streamReset("The upstream reset the stream (\(codeName(code))).")
        case let .badResponse(why): .badResponse(why)
        case let .connectionLost(why): .reset(why)
        case let .noConnection(why), let .unsent(why): .connectFailed(why)
        case let .tlsFailed(why): .tls(why)
        case .timedOut: .timeout
        }
    }

    static func codeName(_ code: UInt32) -> String {
        HTTP2ErrorCode(rawValue: code).map { $0.label.uppercased() } ?? "error code \(code)"
    }

    // MARK: - Fields

    /// A trailer that passes: a token name, a valid value, not hop-by-hop or framing.
    static func isPassedTrailer(_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Bool {
        name.allSatisfy({ HTTPBytes.isToken($0) }) && value.allSatisfy({ HTTPBytes.isFieldValue($0) })
            && !HopByHop.isHopByHop(name) && !HTTPBytes.equals(name, "content-length")
    }

    /// A field of a forwarded 1xx answer, as `Name: value\r\n` (checked as libcurl's path checks them).
    private func addInformationalField(_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        guard name.allSatisfy({ HTTPBytes.isToken($0) }), value.allSatisfy({ HTTPBytes.isFieldValue($0) }) else {
            informational = 0
            return
        }
        if HopByHop.isHopByHop(name) || HTTPBytes.equals(name, "content-length")
            || HTTPBytes.equals(name, "transfer-encoding")
        {
            return
        }
        guard informationalFields.count + name.count + value.count + 4 <= UpstreamTransfer.maxInformationalBytes else {
            informational = 0
            return
        }
        informationalFields.append(contentsOf: name)
        informationalFields.append(contentsOf: [0x3A, 0x20])
        informationalFields.append(contentsOf: value)
        informationalFields.append(contentsOf: [0x0D, 0x0A])
    }

    // MARK: - The request body

    /// Gets the body ready to send. True: a data provider follows the HEADERS.
    func prepareBody() -> Bool {
        if request.method == "HEAD" { return false }
        if let stream = request.bodyStream {
            if let whole = stream.completeBody {
                wholeBody = whole
                contentLength = whole.count
                return whole.count > 0
            }
            readsBody = true
            contentLength = stream.declaredLength
            // Alive: every end of the try (cancel, tell, a replay, the answer complete) clears this
            // (`letGoOfBody`, `prepareReplay`) while whoever ends it still holds the try.
            stream.onAvailable = { [unowned self] in self.bodyAvailable() }
            return true
        }
        guard request.sendsBody else { return false }
        wholeBody = UnsafeRawBufferPointer(start: request.body.baseAddress, count: request.body.count)
        contentLength = request.body.count
        return request.body.count > 0
    }

    /// nghttp2 asks for body bytes (the data provider's read callback).
    func readBody(into buffer: UnsafeMutablePointer<UInt8>?, max: Int, flags: UnsafeMutablePointer<UInt32>?) -> Int {
        if let whole = wholeBody {
            let n = Swift.min(max, whole.count - bodyOffset)
            if n > 0, let buffer, let base = whole.baseAddress {
                UnsafeMutableRawPointer(buffer).copyMemory(from: base + bodyOffset, byteCount: n)
                bodyOffset += n
            }
            if bodyOffset >= whole.count { flags?.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
            return Swift.max(0, n)
        }
        guard readsBody, let stream = request.bodyStream, let buffer else {
            return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
        }
        switch stream.read(into: UnsafeMutableRawPointer(buffer), max: max) {
        case let .bytes(n): return n
        case .end:
            flags?.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        case .failed: return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
        case .wait:
            deferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
    }

    /// The streamed body has bytes again (or ended, or failed).
    func bodyAvailable() {
        guard deferred, machine.state == .open else { return }
        deferred = false
        connection?.resumeData(self)
    }

    private func letGoOfBody() {
        wholeBody = nil
        if readsBody, let stream = request.bodyStream {
            stream.onAvailable = nil
            stream.readerLeft()
        }
        readsBody = false
    }
}
