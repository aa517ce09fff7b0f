import CNghttp2
import HappyPathCore

/// Told by an `HTTP2Stream` that it gave the session something to send
/// (an answer's head, body bytes, a reset, a window given back): the
/// driver produces and flushes once on this loop pass, never from inside
/// the call.
public protocol HTTP2StreamOwner: AnyObject {
    func http2StreamHasOutput(_ stream: HTTP2Stream)
    /// The connection's staged answer bytes reached the stream's
    /// `stagingBound`: on the next pass, every stream still feeding it waits.
    func http2ConnectionFull(_ stream: HTTP2Stream)
    /// The stream's request is ready for the connection's dispatch turn
    /// (`readyToDispatch`), told once.
    func http2StreamReady(_ stream: HTTP2Stream)
    /// A spool for the stream's answer to read ahead into (`limits.read_ahead`), or nil.
    func http2AnswerSpool(_ stream: HTTP2Stream) -> AnswerSpool?
    /// A spool file of `capacity` bytes for a request body kept past
    /// `limits.body_in_memory`, or nil (kept in memory).
    func http2BodyMapping(capacity: Int) -> SpoolMapping?
    /// The server a tunnel on the stream uses (its loop, pools, scratch).
    var tunnelServer: HTTPServer? { get }
}

extension HTTP2StreamOwner {
    public func http2StreamReady(_ stream: HTTP2Stream) {}
    public func http2ConnectionFull(_ stream: HTTP2Stream) {}
    public func http2AnswerSpool(_ stream: HTTP2Stream) -> AnswerSpool? { nil }
    public func http2BodyMapping(capacity: Int) -> SpoolMapping? { nil }
    public var tunnelServer: HTTPServer? { nil }
}

/// One HTTP/2 stream of an `HTTP2Session` as the `ClientStream` of the one
/// request it carries, driven by an `HTTP2StreamStateMachine`.
///
/// The driver (the connection, or a test) makes one at the session's
/// `.opened` event, hands it every later event of its id (`handle`), asks
/// it for its request at the connection's dispatch turn (`dispatch`), and
/// calls `outputWritten` after each `produce`. The request side: the head
/// is the session's `HTTP2RequestHead`, the body is taken from the session
/// as it arrives (which gives the stream's window back) and handed over
/// once. The answer side: staged fields become nghttp2's name/value pairs
/// (lower-case, connection-specific fields dropped), the head is one
/// HEADERS frame (no reason phrase on HTTP/2), body bytes are staged for
/// the session's data provider, the end is END_STREAM or the trailers, and
/// `cancel` resets this stream only.
///
/// Ownership: the stream holds the session and the request it carries
/// (`current`), which holds the stream back; the cycle ends when the answer
/// ends, is broken off, or the stream closes (`current` cleared). The owner
/// is weak. On the loop's thread.
public final class HTTP2Stream: ClientStream {
    public typealias Machine = HTTP2StreamStateMachine

    public let id: Int32
    let session: HTTP2Session
    public weak var owner: HTTP2StreamOwner?
    public private(set) var machine: Machine
    public let peerAddress: String
    public let localAddress: String
    let isSecure: Bool
    let now: () -> Instant

    /// The request's head, once complete and accepted.
    public private(set) var head: HTTP2RequestHead?
    /// Why the edge refuses the request (its head), once known.
    public private(set) var refusal: HTTP2RequestRefusal?
    /// The refused head was a gRPC call's (its `content-type`).
    public private(set) var refusedGRPC = false
    /// The request body passed the limit (the session dropped the rest).
    public private(set) var bodyTooLarge = false
    /// What the connection's dispatch turn will hand over (the machine said ready).
    public private(set) var readyToDispatch: Machine.Dispatch?
    /// When the stream's timer is due (the driver arms one timer for the earliest).
    public private(set) var timerDeadline: Instant?
    /// The request this stream carries now.
    private(set) var current: HTTPRequest?

    private var body: [UInt8] = []
    /// A body with a `content-length` past `limits.body_in_memory`, read
    /// into a spool file instead of `body` (the owner's `http2BodyMapping`),
    /// and how much of it arrived.
    private var spooledBody: RequestBody?
    private var spooledFilled = 0
    /// `limits.body_in_memory` as the stream opened (set by the driver): only
    /// a longer body asks the owner for a spool file.
    var bodyInMemory = Int.max
    /// The body as it streams to the exchange, for a request handed over at
    /// its head (`streamBody`).
    private var bodyStream: RequestBodyStream?
    /// How far a streamed body may be taken ahead of the exchange's reader
    /// (set by the driver: the stream window).
    var streamAhead = 64 * 1024
    /// Answer bytes all streams of the connection may stage together
    /// (`limits.connection_buffer`, set by the driver): past it a stream
    /// with bytes of its own staged waits (`outputRoom`), and is told to go
    /// on once they are framed or the connection is down to half of it.
    var stagingBound = 256 * 1024
    /// How much of one answer may be read ahead into a spool the owner
    /// makes at its first spill (`limits.read_ahead`; 0, as set by a driver
    /// without one: none).
    var readAheadLimit = 0
    /// The answer may be read ahead (`permitReadAhead`).
    var readsAhead = false
    /// The stream has a spool (it spilled once): only then is the session
    /// asked about it, so an answer that never spills pays no lookup.
    var hasSpool = false
    /// Where request bodies are counted (`limits.max_buffered_bytes`), and
    /// how much of it this stream's body holds now.
    public var budget: BodyBudget?
    private var reserved = 0
    /// The `Date` field of answers that carry none (set by the driver).
    var dateHeader: DateHeaderCache?
    private var stagedDate = false
    /// The answer's fields as staged, names lower-case.
    private var staged = HTTP2FieldBlock()
    /// Values of staged `Connection` fields (dropped themselves): what they name goes at the head.
    private var nominators: [[UInt8]] = []
    private var trailers = HTTP2FieldBlock()
    private var drainWanted = false
    /// The answer was broken off: the stream is reset once what was staged
    /// before (the head, body bytes) has gone out, so the client sees how
    /// far it got.
    private var abortWhenSent = false
    /// A gRPC answer's head (its status), framed with a body to come but not
    /// given to the session yet: it leaves with the first body bytes, or, if
    /// the answer ends first with no body, alone with END_STREAM and the
    /// trailers in it: gRPC's trailers-only answer, which a gRPC client reads
    /// as the call's end only in that form (an empty DATA frame with
    /// END_STREAM after a HEADERS without it is an error to it).
    private var pendingHead: Int?
    /// The staged `content-type` is gRPC's (`application/grpc`, `application/grpc+…`).
    private var stagedGRPC = false
    /// `session.dataSent(of:)` when last looked at.
    private var sentSeen = 0

    /// A stream the session opened (`.opened(id)`).
    /// - Parameter idle: no progress either way this long while waiting on the client resets the stream.
    public init(
        session: HTTP2Session, id: Int32, peerAddress: String, localAddress: String, isSecure: Bool, idle: Duration,
        now: @escaping () -> Instant
    ) {
        self.session = session
        self.id = id
        self.peerAddress = peerAddress
        self.localAddress = localAddress
        self.isSecure = isSecure
        self.now = now
        let t = now()
        machine = Machine(idle: idle, now: t)
        perform(machine.start(now: t))
    }

    deinit { budget?.release(reserved) }

    // MARK: - From the driver

    /// One of the session's events for this stream (others are ignored).
    public func handle(_ event: HTTP2SessionEvent) {
        guard event.streamID == id else { return }
        let t = now()
        switch event {
        case .headComplete:
            if let h = session.head(of: id) {
                head = h
                // END_STREAM comes as its own event (`requestEnded`), in order.
                perform(machine.headComplete(isHead: h.isHead, endStream: false, now: t))
            } else {
                refusal = session.refusal(of: id)
                refusedGRPC = session.refusedGRPC(id)
                perform(machine.refused(now: t))
            }
        case let .data(_, count):
            perform(machine.bodyReceived(count, endStream: false, now: t))
        case .requestEnded:
            perform(machine.bodyReceived(0, endStream: true, now: t))
        case .bodyTooLarge:
            bodyTooLarge = true
            body = []
            bodyStream?.fail(.tooLarge)
            perform(machine.refused(now: t))
        case .malformed:
            // A streamed body fails while the upstream still misses its end.
            bodyStream?.fail(.malformed)
            perform(machine.malformed(now: t))
        case .resetByPeer:
            bodyStream?.fail(.clientGone)
            perform(machine.clientReset(now: t))
        case .closed:
            // A tunnel's client that ended as the stream closed (its END_STREAM
            // after ours): its last bytes go on, then the end (`fail` does nothing then).
            if machine.isTunnel, let stream = bodyStream {
                let rest = session.takeBody(of: id)
                if !rest.isEmpty { rest.withUnsafeBytes { stream.append($0) } }
                if session.requestEnded(id) { stream.finish() }
            }
            bodyStream?.fail(.clientGone)
            perform(machine.closed(now: t))
            current = nil
        case .opened, .goawayReceived, .resetSent:
            break
        }
    }

    /// The connection's dispatch turn: the request to serve (or whose
    /// refusal to answer, `refusal` or `bodyTooLarge` saying why); nil if
    /// the stream is not ready any more (reset meanwhile).
    public func dispatch() -> HTTPRequest? {
        guard machine.dispatched() != nil else { return nil }
        readyToDispatch = nil
        if let current { return current }
        let request = HTTPRequest(stream: self)
        current = request
        return request
    }

    /// The delegate holds the head (`HTTPServerDelegate.holdsBody`): the
    /// request, whose body is neither stored nor acknowledged until
    /// `HTTPRequest.readBody`. Nil if the body began already.
    public func hold() -> HTTPRequest? {
        let actions = machine.holdBody(now: now())
        guard machine.state == .held else { return nil }
        perform(actions)
        let request = current ?? HTTPRequest(stream: self)
        current = request
        return request
    }

    /// After the session produced output: DATA bytes sent count as
    /// progress, our END_STREAM before the request's end resets the rest
    /// (NO_ERROR), and a drain asked for is told once the connection has
    /// room again.
    public func outputWritten() {
        let t = now()
        let sent = session.dataSent(of: id)
        if sent > sentSeen {
            perform(machine.dataSent(sent - sentSeen, now: t))
            sentSeen = sent
        }
        if session.endStreamSent(id) { perform(machine.endStreamSent(now: t)) }
        if abortWhenSent, session.pendingOutput(for: id) == 0 {
            abortWhenSent = false
            perform(machine.aborted(now: t))
            owner?.http2StreamHasOutput(self)
        }
        // On once this stream's own bytes are all framed (it may then stage a
        // read more, `outputRoom`), or the connection is down to half its
        // bound (so that many streams resume together, not one at a time at
        // the edge); a stream whose answer waits in its spool, once the
        // spool has room again (its memory is not what holds it).
        if drainWanted, mayGoOn {
            drainWanted = false
            current?.streamDrained()
        }
    }

    /// The connection is full (`stagingBound`): an answer still fed that has
    /// bytes of its own staged waits now, before its transfer's next bytes
    /// arrive (they would wait inside the upstream client, a read of them per
    /// stream), and hears `streamDrained` once they are framed. (One with
    /// nothing staged goes on: `outputRoom`.)
    func connectionFull() {
        guard let request = current, !drainWanted, machine.state == .answering, session.pendingOutput(for: id) > 0,
            readAheadRoom == 0
        else { return }
        drainWanted = true
        request.streamMustWait()
    }

    /// The connection is gone (closed, or the session failed): the request
    /// this stream carries is told its client left, and let go (which ends
    /// the request ↔ stream cycle).
    public func connectionClosed() {
        bodyStream?.fail(.clientGone)
        guard let request = current else { return }
        current = nil
        request.streamCancelled()
    }

    /// The stream's timer is due.
    public func timerFired() {
        timerDeadline = nil
        perform(machine.timerFired(now: now()))
    }

    private func perform(_ a: Machine.Actions) {
        switch a.timer {
        case let .arm(d)?: timerDeadline = now() + d
        case .cancel?: timerDeadline = nil
        case nil: break
        }
        var output = false
        if a.consume > 0 {
            // The bytes arrived are stored; taking them gives the window back.
            let bytes = session.takeBody(of: id)
            if spooledBody == nil, body.isEmpty, !bytes.isEmpty, let length = head?.contentLength, length > bodyInMemory {
                spooledBody = owner?.http2BodyMapping(capacity: length).map { RequestBody(mapping: $0, count: length) }
            }
            if let spooled = spooledBody {
                // nghttp2 holds DATA to the announced length; a body past it is not stored.
                guard bytes.count <= spooled.count - spooledFilled else { return overBudget() }
                bytes.withUnsafeBytes { spooled.baseAddress!.advanced(by: spooledFilled).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                spooledFilled += bytes.count
            } else {
                if let budget, !bytes.isEmpty {
                    guard budget.reserve(bytes.count) else { return overBudget() }
                    reserved += bytes.count
                }
                body.append(contentsOf: bytes)
            }
            output = true
        }
        if a.pass > 0 || a.passEnd { feed() }
        if let ready = a.ready {
            readyToDispatch = ready
            owner?.http2StreamReady(self)
        }
        if let end = a.end {
            session.sendData(
                id, UnsafeRawBufferPointer(start: nil, count: 0), end: true,
                trailerBlock: end == .trailers ? trailers : nil)
            output = true
        }
        if let code = a.reset {
            session.resetStream(id, code: code.rawValue)
            output = true
        }
        if a.cancelExchange, let request = current {
            current = nil
            request.streamCancelled()
        }
        if output { owner?.http2StreamHasOutput(self) }
    }

    /// The body does not fit `limits.max_buffered_bytes` (or its client's
    /// share of it): what was kept goes, and the request is refused (503,
    /// as on HTTP/1.1).
    private func overBudget() {
        body = []
        spooledBody = nil
        budget?.release(reserved)
        reserved = 0
        refusal = .http1(.bodyOver(budget))
        perform(machine.refused(now: now()))
        owner?.http2StreamHasOutput(self)
    }

    // MARK: - The request

    public func protocolName(of request: HTTPRequest) -> StaticString { "HTTP/2" }

    public func method(of request: HTTPRequest) -> String? {
        current === request ? head?.method : nil
    }

    public func target(of request: HTTPRequest) -> String? {
        current === request ? head?.target : nil
    }

    public func head(of request: HTTPRequest) -> ClientRequestHead? {
        guard current === request, let head else { return nil }
        return ClientRequestHead(
            isAsteriskForm: head.isAsteriskForm, size: head.size, connectionNominatesFields: false, isSecure: isSecure)
    }

    public func connectProtocol(of request: HTTPRequest) -> String? {
        current === request ? head?.connectProtocol : nil
    }

    public func forEachField(
        of request: HTTPRequest, _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void
    ) {
        guard current === request, let head else { return }
        head.forEachField(body)
    }

    /// HTTP/2 has no `Connection` field: none is nominated.
    public func nominatedFields(of request: HTTPRequest) -> [Bool] {
        guard current === request, let head else { return [] }
        return [Bool](repeating: false, count: head.fields.count)
    }

    /// The body received, handed over once (the stream keeps no copy).
    public func takeBody(of request: HTTPRequest) -> RequestBody {
        if current === request, let spooled = spooledBody, spooledFilled == spooled.count {
            spooledBody = nil
            return spooled
        }
        guard current === request, !body.isEmpty else { return .empty }
        defer { body = [] }
        guard let budget else { return RequestBody(body) }
        // The reservation goes with the bytes: the body gives it back when freed.
        let handed = RequestBody(count: body.count, budget: budget, reserved: reserved) ?? RequestBody(body)
        reserved = 0
        if let base = handed.baseAddress { body.withUnsafeBytes { base.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
        return handed
    }

    public func resumeReading(for request: HTTPRequest) {
        guard current === request else { return }
        perform(machine.releaseBody(now: now()))
    }

    /// The delegate lets a held request's body stream to its exchange
    /// (`HTTPServerDelegate.streamsBody`): the request is ready now, and its
    /// body goes to a `RequestBodyStream` as the exchange reads it. A body
    /// that already ended is stored whole, as without.
    public func streamBody(for request: HTTPRequest) {
        guard current === request else { return }
        let actions = machine.releaseBody(streaming: true, now: now())
        if machine.streaming, bodyStream == nil {
            // A kept copy past `limits.body_in_memory` goes on in a spool file.
            let spill: SpoolMapping.Maker? =
                request.keepsStreamedBody && bodyInMemory < Int.max
                ? { [weak owner] in owner?.http2BodyMapping(capacity: $0) } : nil
            let stream = RequestBodyStream(
                declaredLength: head?.contentLength, ahead: streamAhead, budget: budget, keeps: request.keepsStreamedBody,
                inMemory: bodyInMemory, spill: spill)
            stream.onRoom = { [weak self] in self?.feed() }
            bodyStream = stream
        }
        perform(actions)
    }

    public func takeBodyStream(of request: HTTPRequest) -> RequestBodyStream? {
        current === request ? bodyStream : nil
    }

    public func isRefusedGRPCCall(_ request: HTTPRequest) -> Bool { current === request && refusedGRPC }

    /// Moves the body bytes the session holds into the streamed body while
    /// it has room (taking them gives the client that much window back), and
    /// ends it once the client's END_STREAM came and nothing is left. Also
    /// called by the body as its reader makes room, from inside libcurl's
    /// read callback: nothing here calls into libcurl.
    private func feed() {
        guard let stream = bodyStream else { return }
        if stream.room > 0, session.bufferedBody(of: id) > 0 {
            let bytes = session.takeBody(of: id)
            bytes.withUnsafeBytes { stream.append($0) }
            owner?.http2StreamHasOutput(self)
        }
        if session.requestEnded(id), session.bufferedBody(of: id) == 0 { stream.finish() }
    }

    // MARK: - The answer

    public func stageField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request else { return }
        if HTTPBytes.equals(name, "connection") {
            nominators.append(Array(value))
            return
        }
        guard !Self.dropped(name) else { return }
        if name.count == 4, HTTPBytes.equals(name, "date") { stagedDate = true }
        if name.count == 12, HTTPBytes.equals(name, "content-type"), GRPCCall.isContentType(value) { stagedGRPC = true }
        staged.append(name: name, value: value)
    }

    /// Adds a trailer, sent after the body (HEADERS with END_STREAM) by
    /// `end`. Connection-specific and framing fields are dropped. (An
    /// addition `ClientStream` is to gain for HTTP/2: docs/plans/http2.md.)
    public func stageTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request, !HTTPBytes.equals(name, "connection"), !Self.dropped(name) else { return }
        trailers.append(name: name, value: value)
    }

    public func clearStagedFields(for request: HTTPRequest) {
        guard current === request else { return }
        staged.removeAll()
        nominators.removeAll()
        trailers.removeAll()
        stagedDate = false
        stagedGRPC = false
    }

    public func removeStagedFields(nominatedBy connectionValue: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request else { return }
        staged.removeNominated(by: connectionValue)
    }

    /// `fields` are `Name: value` lines ending in CRLF; a HEADERS frame of
    /// its own, before the final answer.
    public func writeInformational(status: Int, fields: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request, (102..<200).contains(status),
            let started = machine.responseStarted(status: status, contentLength: nil, now: now()),
            started.head.informational
        else { return }
        var parsed = HTTP2FieldBlock()
        Self.forEachLine(fields) { name, value in
            if !HTTPBytes.equals(name, "connection"), !Self.dropped(name) { parsed.append(name: name, value: value) }
        }
        _ = session.submitInformational(id, status: status, fields: parsed)
        owner?.http2StreamHasOutput(self)
    }

    /// One HEADERS frame: `:status`, the staged fields (less those a staged
    /// `Connection` named), and `content-length` when the machine framed one.
    /// `reason` has no place on HTTP/2.
    public func writeHead(status: Int, contentLength: Int?, reason: [UInt8]?, for request: HTTPRequest) {
        guard current === request, status >= 200,
            let started = machine.responseStarted(status: status, contentLength: contentLength, now: now())
        else { return }
        for value in nominators { value.withUnsafeBytes { staged.removeNominated(by: $0) } }
        nominators.removeAll()
        if let length = started.head.contentLength { staged.append("content-length", String(length)) }
        if !stagedDate, let dateHeader {
            dateHeader.withValue { staged.append(name: Self.dateName, value: $0) }
        }
        perform(started.actions)
        if stagedGRPC, !started.head.endStream {
            pendingHead = status
        } else {
            submit(status: status, hasBody: !started.head.endStream)
        }
        owner?.http2StreamHasOutput(self)
    }

    /// The head waiting for its body goes to the session now, with a body to follow.
    func submitPendingHead() {
        guard let status = pendingHead else { return }
        pendingHead = nil
        submit(status: status, hasBody: true)
    }

    private func submit(status: Int, hasBody: Bool) {
        if session.submitResponse(id, status: status, block: staged, hasBody: hasBody) != nil {
            // The session cannot take it (the stream is gone): nothing is left to answer.
            perform(machine.aborted(now: now()))
        }
    }

    public func writeBodyPart(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained notify: Bool, for request: HTTPRequest) {
        guard current === request else { return }
        // Never more than announced, nothing where no body may be.
        let (n, actions) = machine.bodyBytes(bytes.count, now: now())
        if n > 0 {
            submitPendingHead()
            let part = UnsafeRawBufferPointer(rebasing: bytes[0..<n])
            if readsAhead, spills(n) {
                // Past the connection's bound: read ahead into the stream's spool.
                let spool = hasSpool ? session.spool(for: id) : owner?.http2AnswerSpool(self)
                hasSpool = hasSpool || spool != nil
                session.sendData(id, part, spill: spool)
            } else {
                session.sendData(id, part)
                if session.stagedBytes >= stagingBound { owner?.http2ConnectionFull(self) }
            }
        }
        perform(actions)
        if notify { drainWanted = true }
        owner?.http2StreamHasOutput(self)
    }

    public func writeWhole(status: Int, body: UnsafeRawBufferPointer, for request: HTTPRequest) -> Bool {
        guard current === request else { return false }
        writeHead(status: status, contentLength: body.count, reason: nil, for: request)
        writeBodyPart(body, notifyWhenDrained: false, for: request)
        return end(request)
    }

    /// END_STREAM (or the trailers) after the staged bytes; an answer short
    /// of its Content-Length is reset INTERNAL_ERROR instead.
    public func end(_ request: HTTPRequest) -> Bool {
        guard current === request else { return false }
        current = nil
        guard let status = pendingHead else {
            perform(machine.responseEnded(trailers: !trailers.isEmpty, now: now()))
            return true
        }
        // No body went out: one HEADERS frame with END_STREAM, the trailers' fields in it.
        pendingHead = nil
        var actions = machine.responseEnded(trailers: false, now: now())
        if actions.end != nil {
            actions.end = nil
            staged.append(contentsOf: trailers)
            trailers.removeAll()
            submit(status: status, hasBody: false)
        }
        perform(actions)
        owner?.http2StreamHasOutput(self)
        return true
    }

    /// The answer became a tunnel's (RFC 8441): the machine lets each side end on its own.
    func becomeTunnel() { machine.becameTunnel() }

    /// The tunnel on this stream closed before both sides ended: RST_STREAM
    /// now (also after our END_STREAM, when the client's side was still open).
    func resetTunnel() {
        current = nil
        perform(machine.aborted(now: now()))
        owner?.http2StreamHasOutput(self)
    }

    /// RST_STREAM INTERNAL_ERROR on this stream only (the connection and
    /// its other streams go on), after what was staged before goes out.
    public func cancel(_ request: HTTPRequest) {
        guard current === request else { return }
        current = nil
        abortWhenSent = true
        owner?.http2StreamHasOutput(self)
    }

    /// The stream's bytes staged and not yet taken into DATA frames.
    public func pendingOutput(for request: HTTPRequest) -> Int {
        current === request ? session.pendingOutput(for: id) : 0
    }
}

extension HTTP2SessionEvent {
    /// The stream the event is about (nil: the connection's).
    public var streamID: Int32? {
        switch self {
        case let .opened(id), let .headComplete(id), let .requestEnded(id), let .bodyTooLarge(id), let .malformed(id): id
        case let .data(id, _), let .resetByPeer(id, _), let .closed(id, _), let .resetSent(id, _): id
        case .goawayReceived: nil
        }
    }
}
