/// One HTTP/2 stream (one exchange) as a pure state machine: the request
/// coming in, its hand-over, the answer going out, and the ways a stream
/// ends early. The session (nghttp2) keeps the stream's protocol state
/// (RFC 9113 section 5.1) and its flow-control windows; the driver
/// (`HTTP2Stream` in HappyPathIO) reports what the session and the exchange
/// did, and performs the `Actions` returned. Tested as tables of events
/// (`HTTP2StreamStateMachineTests`).
///
/// ```
///  head ─▶ body ─────────────▶ ready ─▶ dispatched ─▶ answering ─▶ ended ─▶ closed
///   │       │ ▲ release          ▲ (the connection's    │ (head)      (data,   (both sides done;
///   │       ▼ │                  │  dispatch turn)      └─ no body ──▶ trailers) or a reset)
///   │      held (the delegate ───┘
///   │       holds the head)
///   └─ refused (431, 400, 413, 503) ─▶ ready: the exchange answers the refusal
/// ```
///
/// The machine decides:
/// - **The request**: body bytes are acknowledged to the client (`consume`,
///   a WINDOW_UPDATE) once stored; a held body is not, so the client stops
///   at its window and at most one window waits in memory. The request is
///   ready for its exchange when the client's END_STREAM arrives, or, when
///   the delegate lets the body stream (`releaseBody(streaming: true)`), at
///   once: the body's bytes are then passed on as they arrive (`pass`), and
///   acknowledged only as the exchange takes them.
/// - **The answer's framing**: an answer to HEAD, a 204 and a 304 carry no
///   body (END_STREAM on the HEADERS), nor does a 1xx (which leaves the
///   state as it is). Body bytes beyond an announced Content-Length are
///   never sent; an answer that ends short of it is reset INTERNAL_ERROR,
///   so the client cannot take it for complete.
/// - **An early answer** (given while the request body still comes: a
///   refusal, a rate limit's answer to a held head) ends with RST_STREAM
///   NO_ERROR once our END_STREAM is sent (RFC 9113 section 8.1): the
///   client stops sending, and keeps the answer.
/// - **The ends**: a client reset, at any point, cancels the stream; the
///   exchange is told once, and only if it has the request. A stream with
///   no progress either way for `idle` while it waits on the client (its
///   request still coming, or answer bytes it does not take: a zero window)
///   is reset CANCEL. While the exchange works (the upstream answers) no
///   client wait runs: the exchange has its own timeouts.
public struct HTTP2StreamStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        /// HEADERS (and CONTINUATION) arriving.
        case head
        /// The request body arriving into its storage.
        case body
        /// The delegate holds the head (a rate limit judged at the head): the
        /// body is received but neither stored nor acknowledged.
        case held
        /// The request is complete (or refused) and waits for the connection's dispatch turn.
        case ready
        /// With the exchange; no answer head yet.
        case dispatched
        /// The answer's head is sent; DATA follows.
        case answering
        /// Our END_STREAM is queued (after the data, or the trailers).
        case ended
        case closed(CloseReason)
    }

    /// Why a stream ended (a metric label).
    public enum CloseReason: String, Sendable, Equatable {
        /// Both sides ended.
        case complete
        /// The client reset the stream.
        case clientReset = "client_reset"
        /// No progress either way for `idle` while waiting on the client (we reset CANCEL).
        case idle = "idle_timeout"
        /// The answer ended short of its Content-Length (we reset INTERNAL_ERROR).
        case shortAnswer = "short_answer"
        /// Answered before the request body ended (we reset NO_ERROR after our END_STREAM).
        case answeredEarly = "answered_early"
        /// The exchange broke its answer off (an upstream body cut short: we reset INTERNAL_ERROR).
        case aborted
        /// The request turned out malformed after its head (its trailers:
        /// we reset PROTOCOL_ERROR, RFC 9113 section 8.1.1).
        case malformed
        /// The session closed it otherwise (the connection ended).
        case lost
    }

    /// What the exchange is handed.
    public enum Dispatch: Sendable, Equatable {
        case request
        /// The edge refuses the request: the exchange answers the refusal
        /// (why is the driver's: an `HTTP2RequestRefusal`, a body over its limit).
        case refused
    }

    /// How our answer ends.
    public enum End: Sendable, Equatable {
        /// END_STREAM on the last DATA frame.
        case endStream
        /// The trailers staged (a HEADERS frame with END_STREAM) after the last DATA.
        case trailers
    }

    public enum TimerChange: Sendable, Equatable {
        /// Arm the stream's timer this long from now.
        case arm(Duration)
        case cancel
    }

    /// How the answer is framed.
    public enum Framing: Sendable, Equatable {
        /// No body (HEAD, 204, 304, or a Content-Length of 0), or no final answer yet.
        case none
        /// A Content-Length: at most `remaining` more bytes.
        case length(remaining: Int)
        /// Until END_STREAM.
        case open
    }

    /// The answer's head, as the machine framed it.
    public struct ResponseHead: Sendable, Equatable {
        /// A 1xx: a HEADERS frame of its own, the final answer follows.
        public var informational: Bool
        /// END_STREAM goes on the HEADERS frame: no DATA follows.
        public var endStream: Bool
        /// The Content-Length to send, if any (never on a 1xx or a 204).
        public var contentLength: Int?

        public init(informational: Bool = false, endStream: Bool, contentLength: Int?) {
            self.informational = informational
            self.endStream = endStream
            self.contentLength = contentLength
        }
    }

    /// Everything one event asks of the driver: fixed size, nil or zero fields change nothing.
    public struct Actions: Sendable, Equatable {
        public var timer: TimerChange?
        /// Reserve the request body's storage (bytes received while the head
        /// was held move into it).
        public var startBody: Bool
        /// Request body bytes to acknowledge to the client now (`nghttp2_session_consume_stream`).
        public var consume: Int
        /// Request body bytes for the exchange's body as it streams
        /// (`RequestBodyStream`), acknowledged as the exchange takes them.
        public var pass: Int
        /// The client's END_STREAM ends the streamed body.
        public var passEnd: Bool
        /// The request is ready: tell the connection (`streamReady`), which dispatches it.
        public var ready: Dispatch?
        /// End our answer.
        public var end: End?
        /// Send RST_STREAM with this code.
        public var reset: HTTP2ErrorCode?
        /// Tell the exchange its client left (at most once in the stream's life).
        public var cancelExchange: Bool

        public init(
            timer: TimerChange? = nil, startBody: Bool = false, consume: Int = 0, pass: Int = 0, passEnd: Bool = false,
            ready: Dispatch? = nil, end: End? = nil, reset: HTTP2ErrorCode? = nil, cancelExchange: Bool = false
        ) {
            self.timer = timer
            self.startBody = startBody
            self.consume = consume
            self.pass = pass
            self.passEnd = passEnd
            self.ready = ready
            self.end = end
            self.reset = reset
            self.cancelExchange = cancelExchange
        }

        public static let none = Actions()
    }

    /// No progress either way this long, while waiting on the client, resets the stream.
    public let idle: Duration
    public private(set) var state = State.head
    public private(set) var framing = Framing.none
    /// The request is HEAD: its answer carries no body.
    public private(set) var isHead = false
    /// The client's END_STREAM arrived: the request side is over.
    public private(set) var clientDone = false
    /// The edge refused the request.
    public private(set) var isRefused = false
    /// Body bytes received while held, not acknowledged yet.
    public private(set) var heldBytes = 0
    /// Answer bytes accepted (`bodyBytes`) and not yet sent in DATA frames.
    public private(set) var pendingOutput = 0
    /// The exchange has the request (dispatched, or its head held).
    public private(set) var exchangeHasIt = false
    /// The request was handed over at its head and its body streams to the
    /// exchange (`releaseBody(streaming: true)`).
    public private(set) var streaming = false
    /// The stream carries a tunnel (an extended CONNECT answered 200, RFC
    /// 8441): each side ends on its own, so our END_STREAM leaves the
    /// client's side open, and its bytes still pass.
    public private(set) var isTunnel = false
    private var bodyArrived = false
    private var cancelTold = false
    private var timerArmed = false
    private var lastProgress: Instant
    /// Answer bytes delivered since `lastProgress` moved (`progressQuantum`).
    private var deliveredSinceProgress = 0

    public init(idle: Duration, now: Instant) {
        self.idle = idle
        lastProgress = now
    }

    public var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    /// The stream opened (its first HEADERS began): the head must arrive within `idle`.
    public mutating func start(now: Instant) -> Actions {
        Actions(timer: settle(now: now))
    }

    // MARK: - The request

    /// The request's head is complete and valid.
    /// - Parameters:
    ///   - isHead: the method is HEAD.
    ///   - endStream: the HEADERS frame carried END_STREAM: no body.
    public mutating func headComplete(isHead: Bool, endStream: Bool, now: Instant) -> Actions {
        guard state == .head else { return .none }
        lastProgress = now
        self.isHead = isHead
        guard endStream else {
            state = .body
            return Actions(timer: settle(now: now), startBody: true)
        }
        clientDone = true
        return readyNow(.request, now: now)
    }

    /// The edge refuses the request (its head, or its body over a limit): the
    /// exchange answers the refusal.
    public mutating func refused(isHead: Bool = false, endStream: Bool = false, now: Instant) -> Actions {
        guard state == .head || state == .body else { return .none }
        if state == .head { self.isHead = isHead }
        if endStream { clientDone = true }
        isRefused = true
        return readyNow(.refused, now: now)
    }

    private mutating func readyNow(_ dispatch: Dispatch, now: Instant) -> Actions {
        state = .ready
        return Actions(timer: settle(now: now), ready: dispatch)
    }

    /// The delegate holds the head (before any body byte arrived): nothing of
    /// the body is stored or acknowledged until `releaseBody`, or an answer.
    public mutating func holdBody(now: Instant) -> Actions {
        guard state == .body, !bodyArrived else { return .none }
        state = .held
        exchangeHasIt = true
        return Actions(timer: settle(now: now))
    }

    /// The delegate lets the held body come: its storage is reserved, what
    /// arrived meanwhile is acknowledged, and the request is ready if it ended.
    /// With `streaming`, a body still coming goes to the exchange as it
    /// arrives instead: the request is ready now, and what arrived
    /// meanwhile is passed on (acknowledged as the exchange takes it).
    public mutating func releaseBody(streaming: Bool = false, now: Instant) -> Actions {
        guard state == .held else { return .none }
        if streaming, !clientDone {
            self.streaming = true
            let held = heldBytes
            heldBytes = 0
            lastProgress = now
            state = .ready
            return Actions(timer: settle(now: now), pass: held, ready: .request)
        }
        var a = Actions(startBody: true, consume: heldBytes)
        heldBytes = 0
        lastProgress = now
        if clientDone {
            state = .ready
            a.ready = .request
        } else {
            state = .body
        }
        a.timer = settle(now: now)
        return a
    }

    /// `count` request body bytes arrived (a DATA frame's payload).
    public mutating func bodyReceived(_ count: Int, endStream: Bool, now: Instant) -> Actions {
        guard !isClosed else { return .none }
        let n = max(0, count)
        lastProgress = now
        bodyArrived = true
        if endStream { clientDone = true }
        switch state {
        case .body:
            var a = Actions(consume: n)
            if endStream {
                state = .ready
                a.ready = .request
            }
            a.timer = settle(now: now)
            return a
        case .held:
            heldBytes.addSaturating(n)
            return .none
        case .ready where streaming, .dispatched where streaming, .answering where streaming, .ended where isTunnel:
            // The exchange works while the body streams (its timeouts, not
            // the client wait, bound a client that stops sending).
            return Actions(pass: n, passEnd: endStream)
        default:
            // Refused or answered already: what still comes is dropped, and
            // not acknowledged (the stream is reset after our answer).
            return .none
        }
    }

    /// The connection's dispatch turn came: what the exchange is handed (nil:
    /// the stream is no longer ready).
    public mutating func dispatched() -> Dispatch? {
        guard state == .ready else { return nil }
        state = .dispatched
        exchangeHasIt = true
        return isRefused ? .refused : .request
    }

    /// The answer began a tunnel (its body streams, RFC 8441): see `isTunnel`.
    public mutating func becameTunnel() {
        guard streaming, state == .answering else { return }
        isTunnel = true
    }

    // MARK: - The answer

    /// The exchange's answer head: how it is framed, and the timer (an early
    /// answer ends the wait for the request body). Nil: the stream cannot
    /// answer any more, or answered already.
    public mutating func responseStarted(status: Int, contentLength: Int?, now: Instant)
        -> (head: ResponseHead, actions: Actions)?
    {
        guard exchangeHasIt else { return nil }
        switch state {
        case .held, .body, .ready, .dispatched: break
        default: return nil
        }
        if status < 200 { return (ResponseHead(informational: true, endStream: false, contentLength: nil), .none) }
        let noBody = isHead || status == 204 || status == 304
        let length = contentLength.map { max(0, $0) }
        if noBody || length == 0 {
            framing = .none
            state = .ended
        } else {
            framing = length.map { .length(remaining: $0) } ?? .open
            state = .answering
        }
        // A 204 has no Content-Length (RFC 9110 section 8.6); HEAD and 304 announce the representation's.
        let head = ResponseHead(endStream: state == .ended, contentLength: status == 204 ? nil : length)
        return (head, Actions(timer: settle(now: now)))
    }

    /// Answer body bytes offered: how many of `count` may be sent (never more
    /// than an announced Content-Length), and the timer, which runs while
    /// bytes wait for the client.
    public mutating func bodyBytes(_ count: Int, now: Instant) -> (accepted: Int, actions: Actions) {
        guard state == .answering else { return (0, .none) }
        let n: Int
        switch framing {
        case .none: n = 0
        case let .length(remaining):
            n = min(remaining, max(0, count))
            framing = .length(remaining: remaining - n)
        case .open: n = max(0, count)
        }
        pendingOutput.addSaturating(n)
        return (n, Actions(timer: settle(now: now)))
    }

    /// `count` answer bytes went out in DATA frames (the client's window took
    /// them). Progress is real only in whole `progressQuantum`s, or when
    /// nothing is left waiting: a client that opens its window a byte at a
    /// time (a 1-byte WINDOW_UPDATE every few seconds) does not keep a
    /// stalled answer, and what it holds, alive past `idle`.
    public mutating func dataSent(_ count: Int, now: Instant) -> Actions {
        guard !isClosed else { return .none }
        let n = min(pendingOutput, max(0, count))
        pendingOutput -= n
        deliveredSinceProgress += n
        if deliveredSinceProgress >= Self.progressQuantum || pendingOutput == 0 {
            deliveredSinceProgress = 0
            lastProgress = now
        }
        return Actions(timer: settle(now: now))
    }

    /// Answer bytes that count as progress for the idle timer when they
    /// reach the client (fewer count only if they were all it waited for).
    public static let progressQuantum = 1024

    /// The exchange ended its answer.
    /// - Parameter trailers: trailers are staged (sent after the data).
    public mutating func responseEnded(trailers: Bool, now: Instant) -> Actions {
        guard state == .answering else { return .none }
        if case let .length(remaining) = framing, remaining > 0 {
            // Ending here would look complete to the client: it must see a
            // failure. (The exchange ended it: nothing to tell it.)
            cancelTold = true
            return close(.shortAnswer, reset: .internalError, now: now)
        }
        state = .ended
        return Actions(timer: settle(now: now), end: trailers ? .trailers : .endStream)
    }

    /// Our END_STREAM was sent. A request body still coming is no longer
    /// wanted: RST_STREAM NO_ERROR tells the client to stop, and to keep the answer.
    public mutating func endStreamSent(now: Instant) -> Actions {
        guard state == .ended, !clientDone, !isTunnel else { return .none }
        return close(.answeredEarly, reset: .noError, now: now)
    }

    // MARK: - The end

    /// The exchange breaks the answer off (`ClientStream.cancel`): the client
    /// must see a failure, not a complete answer. The exchange knows already.
    public mutating func aborted(now: Instant) -> Actions {
        guard !isClosed else { return .none }
        cancelTold = true
        return close(.aborted, reset: .internalError, now: now)
    }

    /// The request's trailers are malformed: the request is never served
    /// (a request not handed over yet never will be; one streaming is
    /// told, and its body fails before its end), the stream is reset
    /// PROTOCOL_ERROR, and an answer begun is cut.
    public mutating func malformed(now: Instant) -> Actions {
        guard !isClosed else { return .none }
        return close(.malformed, reset: .protocolError, now: now)
    }

    /// The client reset the stream (RST_STREAM received).
    public mutating func clientReset(now: Instant) -> Actions {
        guard !isClosed else { return .none }
        return close(.clientReset, reset: nil, now: now)
    }

    /// The session closed the stream (`on_stream_close`) without one of the
    /// events above: both sides ended, or the connection is going.
    public mutating func closed(now: Instant) -> Actions {
        guard !isClosed else { return .none }
        return close(state == .ended ? .complete : .lost, reset: nil, now: now)
    }

    /// The stream's timer fired.
    public mutating func timerFired(now: Instant) -> Actions {
        guard timerArmed else { return .none }
        timerArmed = false
        guard waitingOnClient else { return .none }
        let quiet = now - lastProgress
        guard quiet >= idle else {
            timerArmed = true
            return Actions(timer: .arm(idle - quiet))
        }
        return close(.idle, reset: .cancel, now: now)
    }

    /// The stream waits on the client: its request still coming (not held),
    /// or answer bytes it has not taken.
    private var waitingOnClient: Bool {
        switch state {
        case .head, .body: true
        case .answering, .ended: pendingOutput > 0
        default: false
        }
    }

    /// The timer follows the wait on the client: armed when it begins (the
    /// idle time counts from then), cancelled when it ends. Progress
    /// meanwhile only moves `lastProgress`; the timer re-arms itself for the rest.
    private mutating func settle(now: Instant) -> TimerChange? {
        let waiting = waitingOnClient
        if waiting, !timerArmed {
            timerArmed = true
            lastProgress = now
            deliveredSinceProgress = 0
            return .arm(idle)
        }
        if !waiting, timerArmed {
            timerArmed = false
            return .cancel
        }
        return nil
    }

    /// The exchange still works on the request: it must hear that the stream is gone.
    private var exchangeWorking: Bool {
        guard exchangeHasIt else { return false }
        switch state {
        case .held, .body, .ready, .dispatched, .answering: return true
        default: return false
        }
    }

    private mutating func close(_ reason: CloseReason, reset: HTTP2ErrorCode?, now: Instant) -> Actions {
        let tell = exchangeWorking && !cancelTold
        if tell { cancelTold = true }
        state = .closed(reason)
        pendingOutput = 0
        heldBytes = 0
        return Actions(timer: settle(now: now), reset: reset, cancelExchange: tell)
    }
}
