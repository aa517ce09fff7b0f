/// One client connection of the HTTP/1.1 server as a pure state machine:
/// events in (bytes read, a body's progress, the request's answer starting,
/// its bytes, its end, output queued or drained, the timer, the peer
/// closing, drain), `Actions` out for the driver (`HTTPConnection`) to
/// perform on the socket, its events and its timer. No system call happens
/// here, so the whole life of a connection is tested as a table of events
/// (`HTTP1ServerConnectionStateMachineTests`) and fuzzed with every split
/// of its input (`FuzzConnection`).
///
/// ```
///         ┌───────────────── keep-alive, nothing buffered ◀───────────────┐
///         ▼                                                              │
///  start ▶ idle ─▶ head ─▶ (Expect: 100-continue) admitting ─▶ body ─▶ dispatched ─▶ answered
///           │        │                       │                   │        │   │ (close after, EOF,
///           │        └─ refused ─────────────┴───────────────────┴──▶ dispatched   drain, HTTP/1.0)
///           │                                                                 ▼
///           └─ idle timeout, drain ───────────────────────────────▶ closed ◀─ lingering (2 s)
/// ```
///
/// The machine decides: when each of the four client waits (`Wait`) is
/// armed and what its expiry means, when to read and when to stop
/// (pipelined bytes read ahead while an answer is written are bounded),
/// whether the connection is kept after an answer (keep-alive, `Connection:
/// close`, HTTP/1.0, a refusal, an answer framed by the close, drain, a
/// client that left), how an answer is framed, and the lingering close.
/// The driver owns the bytes: the read buffer (the machine parses a view of
/// it from the current request's start), the body's storage and the
/// process's body budget, the output queue.
public struct HTTP1ServerConnectionStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        /// Between requests: nothing of the next one has arrived.
        case idle
        /// Part of a request head arrived.
        case head
        /// `Expect: 100-continue` with no body byte yet: the delegate decides
        /// whether the client is invited to send it. An answer given now ends
        /// the connection (the body may or may not follow). Also a head the
        /// delegate holds before its body's storage is reserved (`holdBody`:
        /// a rate limit judged at the head): what the client sends meanwhile
        /// is read ahead into the read buffer only, as far as `readAhead`.
        case admitting
        /// Reading the current request's body.
        case body
        /// The current request is with the delegate, which answers it.
        case dispatched
        /// The answer is written and the write side shut: what the client
        /// still sends is read and dropped, so that unread bytes do not turn
        /// the close into a reset that destroys the answer in flight.
        case lingering
        case closed
    }

    /// What the connection's one timer waits for.
    public enum Wait: Sendable, Equatable {
        /// Between requests (keep-alive): expiry closes.
        case idle
        /// A head that started must end: expiry refuses it (408).
        case head
        /// A body must not stall: expiry refuses it (408).
        case body
        /// The client must keep reading its answer: expiry closes.
        case writeStall
        /// The lingering close: expiry closes.
        case linger
    }

    public enum TimerChange: Sendable, Equatable {
        case arm(Wait)
        case cancel
    }

    /// What the driver does, besides the timer and the read and write
    /// interest, after an event.
    public enum Step: Sendable, Equatable {
        case none
        /// The head is parsed and has a body: reserve its storage (`head.framing`)
        /// and report `bodyStarted`.
        case startBody
        /// Hand the current request to the delegate.
        case dispatch
        /// Hand the current request to the delegate as refused; the
        /// connection closes after its answer.
        case refuse(HTTP1Refusal)
        /// Ask the delegate whether the body is wanted (`admission(_:)`).
        case askAdmission
        /// Write `HTTP/1.1 100 Continue`; the body follows.
        case writeContinue
        /// Parse the bytes buffered after the answered request, on the next
        /// loop pass (not from inside the code that answered it).
        case parseNext
        /// Shut the write side (lingering begins).
        case halfClose
        /// Close the socket now (a request still open is told its client left).
        case close
        /// Tell the current request that its client left; the connection
        /// stays until the request is answered (or gives up).
        case clientLost
        /// Tell the current request that its queued output is written.
        case notifyDrained
        /// Check on the next pass whether the output is written (it already
        /// is: the notification must not come from inside the write).
        case checkDrained
    }

    /// Everything one event asks of the driver: a fixed-size value (no
    /// allocation per event), the fields nil when nothing changes.
    public struct Actions: Sendable, Equatable {
        public var timer: TimerChange?
        /// Pause (false) or resume (true) reading the socket.
        public var reading: Bool?
        /// Watch the socket for writability (true) or stop (false).
        public var writeInterest: Bool?
        public var step: Step

        public init(timer: TimerChange? = nil, reading: Bool? = nil, writeInterest: Bool? = nil, step: Step = .none) {
            self.timer = timer
            self.reading = reading
            self.writeInterest = writeInterest
            self.step = step
        }

        public static let none = Actions()
    }

    /// Where the next read goes.
    public enum ReadPlan: Sendable, Equatable {
        /// The connection is closed: nothing.
        case ignore
        /// Bytes are already buffered (pipelined): parse them, read nothing.
        case parseBuffered
        /// Into the read buffer (head, chunked body, read-ahead).
        case input
        /// Straight into the body's storage: at most this many bytes.
        case body(remaining: Int)
        /// Lingering: read and drop.
        case discard
        /// Too much read ahead while an answer is written: stop reading.
        case pause
    }

    /// How an answer is framed on the wire.
    public enum BodyFraming: Sendable, Equatable {
        /// No body (HEAD, 1xx, 204, 304, or a whole reply written at once).
        case none
        /// `Content-Length`: at most `remaining` more bytes.
        case length(remaining: Int)
        case chunked
        /// HTTP/1.0 without a length: the close ends the body.
        case untilClose
    }

    /// The head of an answer, as the machine framed it.
    public struct ResponseHead: Sendable, Equatable {
        /// The `Content-Length` to announce, if any.
        public var contentLength: Int?
        public var chunked: Bool
        /// `Connection: close` (the connection ends after this answer).
        public var close: Bool
        /// Whether body bytes may follow the head at all.
        public var hasBody: Bool

        public init(contentLength: Int?, chunked: Bool, close: Bool, hasBody: Bool) {
            self.contentLength = contentLength
            self.chunked = chunked
            self.close = close
            self.hasBody = hasBody
        }
    }

    public struct Limits: Sendable, Equatable {
        public var request: RequestLimits
        /// Pipelined bytes read ahead while an answer is written, at most.
        public var readAhead: Int

        public init(request: RequestLimits) {
            self.request = request
            readAhead = request.maxHeadBytes + 16 * 1024
        }
    }

    public let limits: Limits
    public private(set) var state = State.idle
    /// The timer's current use (nil: not armed).
    public private(set) var timer: Wait?
    public private(set) var readPaused = false
    /// The output queue is watched for writability.
    public private(set) var writeInterest = false

    // The current request.
    private var scanner = RequestHeadScanner()
    /// The current request's head, its fields and its normalized path:
    /// offsets into the view passed to `parse` (the read buffer from the
    /// request's first byte).
    public private(set) var head: RequestHead?
    public private(set) var fields: [HTTP1Field] = []
    public private(set) var normalizedPath: String?
    /// Where the current request ends in the view, once its body is read
    /// (a chunked body's raw bytes are consumed from the buffer as decoded).
    public private(set) var requestEnd = 0
    private var bodyRemaining = 0
    private var chunked: ChunkedDecoder?
    /// The head is held by the delegate (`holdBody`) before its body's storage.
    public private(set) var bodyHeld = false
    /// The current request has been handed to the delegate and not answered.
    public private(set) var requestOpen = false

    // What happens after the current answer.
    /// Close after the current answer instead of reading the next request.
    public private(set) var closeAfterResponse = false
    /// The client closed its side (or reset) while a request was answered.
    public private(set) var peerClosed = false
    private var parsePending = false
    private var closeWhenWritten = false
    private var drainNotifyPending = false
    private var draining = false

    // The answer being written.
    public private(set) var framing = BodyFraming.none

    /// Requests handed to the delegate and answers ended, for invariants.
    public private(set) var requestsDispatched = 0
    public private(set) var requestsAnswered = 0

    public init(limits: Limits) { self.limits = limits }

    /// The connection is accepted: wait for the first request.
    public mutating func start() -> Actions {
        timer = .idle
        return Actions(timer: .arm(.idle))
    }

    // MARK: - Reading

    /// The socket is readable (or a parse was scheduled): where the read goes.
    /// - Parameter buffered: bytes in the read buffer past the current
    ///   request's start (while answering: what was read ahead).
    public mutating func readReady(buffered: Int) -> ReadPlan {
        if parsePending {
            parsePending = false
            if state == .idle || state == .head { return .parseBuffered }
        }
        switch state {
        case .closed: return .ignore
        case .lingering: return .discard
        case .body where chunked == nil: return .body(remaining: bodyRemaining)
        case .dispatched, .admitting:
            if buffered >= limits.readAhead {
                readPaused = true
                return .pause
            }
            return .input
        default: return .input
        }
    }

    /// Bytes arrived in the read buffer (`.input`).
    public mutating func inputRead() -> Actions {
        if state == .body { return arm(.body) }
        return .none
    }

    /// The read found the end of the stream, or an error.
    public mutating func readEnded() -> Actions {
        switch state {
        case .closed: return .none
        case .dispatched where requestOpen:
            // Mid-answer: as nginx does, a client that closes its side is
            // taken to have left; if its request is answered anyway, the
            // connection closes after that answer.
            peerClosed = true
            var a = Actions(step: .clientLost)
            if !readPaused {
                readPaused = true
                a.reading = false
            }
            return a
        default:
            return closed()
        }
    }

    /// Parses the buffered bytes of the current request's head.
    /// - Parameter view: the read buffer from the current request's first
    ///   byte; the head's offsets point into it.
    public mutating func parse(_ view: UnsafeRawBufferPointer) -> Actions {
        guard state == .idle || state == .head else { return .none }
        let result = scanner.scan(view, limits: limits.request)
        var actions = Actions.none
        if state == .idle, scanner.started {
            // The whole head must arrive within the timeout, counted from its first byte.
            state = .head
            timer = .head
            actions.timer = .arm(.head)
        }
        switch result {
        case .incomplete:
            return actions
        case let .refused(reason):
            return refused(reason)
        case let .complete(start, end):
            let parsed = RequestHeadParser.parse(
                view, requestStart: start, end: end, limits: limits.request, fields: &fields,
                normalizedPath: &normalizedPath, requestLine: scanner.requestLine)
            switch parsed {
            case let .failure(reason):
                return refused(reason)
            case let .success(h):
                head = h
                framing = .none
                if case .none = h.framing {
                    requestEnd = h.headLength
                    return dispatch()
                }
                return Actions(timer: actions.timer, step: .startBody)
            }
        }
    }

    /// The body's storage is reserved (`.startBody`): `buffered` of its
    /// bytes (Content-Length) were already in the read buffer after the head.
    public mutating func bodyStarted(buffered: Int) -> Actions {
        guard state == .head, let head else { return .none }
        requestEnd = head.headLength + buffered
        switch head.framing {
        case .none:
            return dispatch()
        case let .contentLength(n):
            bodyRemaining = n - buffered
            if bodyRemaining == 0 { return dispatch() }
            if buffered == 0, head.expectsContinue { return askAdmission() }
        case .chunked:
            requestEnd = head.headLength
            chunked = ChunkedDecoder(limits: limits.request)
            if buffered == 0, head.expectsContinue { return askAdmission() }
        }
        state = .body
        return arm(.body)
    }

    /// The delegate holds a head with a body (`.startBody` not yet
    /// performed: no storage reserved, nothing of the process's body budget
    /// taken) until `releaseBody`, or answers it, which ends the connection.
    /// The client waits are off meanwhile: the delegate's hold is bounded
    /// by its own timer.
    public mutating func holdBody() -> Actions {
        guard state == .head, head != nil, !bodyHeld else { return .none }
        state = .admitting
        bodyHeld = true
        opened()
        return Actions(timer: timerWhileAnswering())
    }

    /// The held head's body may be read now: its storage is reserved next
    /// (`.startBody`), and reading resumes if the read-ahead had stopped it.
    public mutating func releaseBody() -> Actions {
        guard state == .admitting, bodyHeld else { return .none }
        bodyHeld = false
        state = .head
        var a = Actions(step: .startBody)
        if readPaused {
            readPaused = false
            a.reading = true
        }
        return a
    }

    private mutating func askAdmission() -> Actions {
        // The delegate has the request now; an answer given from inside
        // the admission ends the connection.
        state = .admitting
        opened()
        return Actions(timer: timerWhileAnswering(), step: .askAdmission)
    }

    /// While the delegate answers, the client waits are off: only a stall
    /// of output already queued (a `100 Continue`, an earlier answer) is timed.
    private mutating func timerWhileAnswering() -> TimerChange? {
        if writeInterest {
            if timer == .writeStall { return nil }
            timer = .writeStall
            return .arm(.writeStall)
        }
        guard timer != nil else { return nil }
        timer = nil
        return .cancel
    }

    /// The delegate's verdict on an `Expect: 100-continue` request: true
    /// invites the body; false means it answered the request already.
    public mutating func admission(_ granted: Bool) -> Actions {
        guard state == .admitting, !bodyHeld else { return .none }
        guard granted else {
            closeAfterResponse = true
            state = .dispatched
            return .none
        }
        state = .body
        timer = .body
        return Actions(timer: .arm(.body), step: .writeContinue)
    }

    /// `n` bytes of a Content-Length body were read into its storage.
    public mutating func bodyRead(_ n: Int) -> Actions {
        guard state == .body, chunked == nil else { return .none }
        bodyRemaining -= n
        if bodyRemaining > 0 { return arm(.body) }
        return dispatch()
    }

    /// Decodes the chunked body buffered at `pending` (the read buffer after
    /// the head), handing each data piece to `sink`, which returns false
    /// when the body outgrew the process's budget. The decoded raw bytes
    /// (`consumed`) are the driver's to drop from the buffer.
    public mutating func decodeChunked(
        _ pending: UnsafeRawBufferPointer, into sink: (UnsafeRawBufferPointer) -> Bool
    ) -> (consumed: Int, actions: Actions) {
        guard state == .body, chunked != nil else { return (0, .none) }
        var overBudget = false
        let step = chunked!.decode(pending) { data in
            if !overBudget, !sink(data) { overBudget = true }
        }
        if overBudget { return (0, refused(.bodyOverBudget)) }
        switch step {
        case let .needMore(consumed):
            return (consumed, .none)
        case let .done(consumed):
            chunked = nil
            return (consumed, dispatch())
        case let .refused(reason):
            return (0, refused(reason))
        }
    }

    /// Whether a chunked body is being decoded.
    public var decodingChunked: Bool { state == .body && chunked != nil }

    private mutating func opened() {
        if !requestOpen {
            requestOpen = true
            requestsDispatched += 1
        }
    }

    private mutating func dispatch() -> Actions {
        state = .dispatched
        opened()
        return Actions(timer: timerWhileAnswering(), step: .dispatch)
    }

    /// A request the edge will not serve (also the timer's 408s and a body
    /// over the budget): the delegate answers it, then the connection closes.
    public mutating func refused(_ reason: HTTP1Refusal) -> Actions {
        guard state != .closed, state != .lingering else { return .none }
        closeAfterResponse = true
        chunked = nil
        opened()
        state = .dispatched
        return Actions(timer: timerWhileAnswering(), step: .refuse(reason))
    }

    // MARK: - Answering

    /// The answer's head: how it is framed, given its status and, if known,
    /// its length. `whole`: the body is written with the head, at once.
    public mutating func responseStarted(status: Int, contentLength: Int?, whole: Bool = false) -> ResponseHead {
        let isHead = head?.isHead ?? false
        let noBody = isHead || status < 200 || status == 204 || status == 304
        var chunked = false
        if whole || noBody {
            framing = .none
        } else if let contentLength {
            framing = .length(remaining: contentLength)
        } else if head?.version == .http10 || head == nil {
            // No length and no chunked coding for HTTP/1.0: the close ends the body.
            framing = .untilClose
            closeAfterResponse = true
        } else {
            framing = .chunked
            chunked = true
        }
        let announced: Int?
        if status < 200 || status == 204 {
            announced = nil
        } else if whole {
            announced = contentLength
        } else {
            announced = noBody && !isHead ? nil : contentLength
        }
        return ResponseHead(
            contentLength: announced, chunked: chunked, close: closesAfterResponse, hasBody: !noBody)
    }

    /// Whether `Connection: close` goes with the answer.
    public var closesAfterResponse: Bool {
        closeAfterResponse || draining || state == .admitting || !(head?.keepAlive ?? false)
    }

    /// Body bytes offered for the answer: how many of `count` may be written
    /// (never more than a `Content-Length` announced).
    public mutating func bodyBytes(_ count: Int) -> Int {
        switch framing {
        case .none: return 0
        case let .length(remaining):
            let n = min(remaining, count)
            framing = .length(remaining: remaining - n)
            return n
        case .chunked, .untilClose: return count
        }
    }

    /// Whether an answer ended now is shorter than its announced length
    /// (it cannot end well: the connection is closed instead).
    public var responseShort: Bool {
        if case let .length(remaining) = framing { return remaining > 0 }
        return false
    }

    /// The answer to the current request is written (or queued): the next
    /// request, or the close.
    /// - Parameters:
    ///   - buffered: bytes in the read buffer past this request's end.
    ///   - outputPending: output still queued.
    public mutating func responseEnded(buffered: Int, outputPending: Bool) -> Actions {
        guard requestOpen else { return .none }
        requestOpen = false
        requestsAnswered += 1
        drainNotifyPending = false
        // The answer said `Connection: close` (the client asked for it, or
        // HTTP/1.0 without keep-alive): nothing after it may be served
        // (RFC 9112 section 9.6).
        let keepAlive = head?.keepAlive ?? false
        head = nil
        chunked = nil
        bodyHeld = false
        if !keepAlive || closeAfterResponse || draining || peerClosed || state == .admitting {
            state = .dispatched
            if outputPending {
                closeWhenWritten = true
                return .none
            }
            return linger()
        }
        scanner.reset()
        requestEnd = 0
        state = .idle
        var a = arm(.idle)
        if readPaused {
            readPaused = false
            a.reading = true
        }
        if buffered > 0 {
            parsePending = true
            a.step = .parseNext
        }
        return a
    }

    private mutating func linger() -> Actions {
        state = .lingering
        var a = arm(.linger)
        a.step = .halfClose
        if readPaused {
            readPaused = false
            a.reading = true
        }
        return a
    }

    // MARK: - Writing

    /// Bytes were queued because the kernel did not take them all.
    public mutating func outputQueued() -> Actions {
        guard state != .closed, !writeInterest else { return .none }
        writeInterest = true
        var a = arm(.writeStall)
        a.writeInterest = true
        return a
    }

    /// Part of the queue was written; more waits.
    public mutating func outputProgressed() -> Actions {
        guard state != .closed else { return .none }
        return arm(.writeStall)
    }

    /// Everything queued is written.
    public mutating func outputDrained() -> Actions {
        guard state != .closed else { return .none }
        var a = Actions.none
        if writeInterest {
            writeInterest = false
            a.writeInterest = false
        }
        if timer == .writeStall {
            // The wait the state had before the output stalled comes back
            // (a body after `100 Continue` must still not stall).
            switch state {
            case .idle: a.timer = arm(.idle).timer
            case .head: a.timer = arm(.head).timer
            case .body: a.timer = arm(.body).timer
            default:
                timer = nil
                a.timer = .cancel
            }
        }
        if closeWhenWritten {
            closeWhenWritten = false
            var l = linger()
            l.writeInterest = a.writeInterest
            return l
        }
        if drainNotifyPending, requestOpen {
            drainNotifyPending = false
            a.step = .notifyDrained
        }
        return a
    }

    /// The request wants to hear when its output is written.
    public mutating func notifyWhenDrained(outputPending: Bool) -> Actions {
        guard state != .closed, requestOpen else { return .none }
        drainNotifyPending = true
        return outputPending ? .none : Actions(step: .checkDrained)
    }

    /// A write failed: the client reset the connection.
    public mutating func writeFailed() -> Actions { closed() }

    // MARK: - Time and the end

    /// The timer fired.
    public mutating func timerFired() -> Actions {
        guard let wait = timer else { return .none }
        timer = nil
        switch wait {
        case .idle, .linger, .writeStall: return closed()
        case .head: return refused(.headTimeout)
        case .body: return refused(.bodyTimeout)
        }
    }

    /// Drain: close now if nothing is under way, else after the current answer.
    public mutating func drain(buffered: Int, outputPending: Bool) -> Actions {
        draining = true
        if state == .idle, buffered == 0, !outputPending { return closed() }
        closeAfterResponse = true
        return .none
    }

    /// The connection is closed (or handed over): every later event is
    /// ignored. `.close` tells the driver to close the socket and to tell a
    /// request still open that its client left.
    public mutating func closed() -> Actions {
        guard state != .closed else { return .none }
        state = .closed
        timer = nil
        readPaused = false
        writeInterest = false
        chunked = nil
        bodyHeld = false
        requestOpen = false
        return Actions(step: .close)
    }

    private mutating func arm(_ wait: Wait) -> Actions {
        timer = wait
        return Actions(timer: .arm(wait))
    }
}
