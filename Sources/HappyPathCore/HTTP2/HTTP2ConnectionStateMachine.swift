/// One HTTP/2 client connection as a pure state machine: what nghttp2 leaves
/// to us. The session (nghttp2, driven by `HTTP2Connection` in HappyPathIO)
/// parses frames, keeps the streams' protocol states and writes frames;
/// its callbacks report here what they saw (a stream opened, its head
/// complete, a client reset, frames by kind), the driver reports the end of
/// each loop turn with its output levels, and performs the `Actions`
/// returned. No system call happens here, so the defences are tested as
/// tables of events (`HTTP2ConnectionStateMachineTests`).
///
/// ```
///  start ▶ open ──── drain (streams open): GOAWAY(last id) ────▶ draining ── last stream closed ──┐
///           │  │                                                   │                               ▼
///           │  └─ idle, drain (no stream), a flood, rapid reset ───┼──▶ terminate: closing ─▶ closed
///           │                                                      │      (output written, or linger)
///           └─ EOF, write error, session error ────────────────────┴──────────────────────────▶ closed
/// ```
///
/// The machine decides:
/// - **Dispatch**, never from inside the session's input: a stream whose
///   head is complete is *ready*, and ready streams are handed to their
///   exchanges after the read, at most `maxDispatchesPerTurn` a loop turn
///   (`nextDispatch`), the rest on the next turn. A stream the client reset
///   in the same read is dropped before it reaches an exchange (rapid reset).
/// - **Premature resets** (CVE-2023-44487, Envoy's rule): once at least
///   `prematureResetMinimumStreams` streams have closed, if more than half
///   were reset by the client within `prematureResetAge` of opening, the
///   connection ends with GOAWAY ENHANCE_YOUR_CALM. Counted over the
///   connection's life; nghttp2's own reset-rate bucket stays as a backstop.
/// - **Control-frame floods** (CVE-2019-9511 to 9518) that nghttp2 accepts
///   without a limit: each budget below, passed, ends the connection with
///   GOAWAY ENHANCE_YOUR_CALM.
/// - **Back-pressure**: reading stops while our output is above high water
///   or the session's outbound frame queue is long (a client that sends
///   but does not read), and resumes at low water; an outbound queue past
///   `outboundQueueLimit` ends the connection.
/// - **Time**, with one timer: the idle connection (no stream for `idle`:
///   GOAWAY NO_ERROR and close), the drain deadline (streams still open are
///   cancelled), and the linger after a terminating GOAWAY (close once it
///   is written, or after `linger`).
///
/// Memory is O(1) in the connection's history: counters and one-second
/// windows, no per-frame or per-stream record beyond the streams open
/// (which the session bounds by SETTINGS_MAX_CONCURRENT_STREAMS) and the
/// ready streams of the current read.
public struct HTTP2ConnectionStateMachine: Sendable {
    public typealias StreamID = Int32

    // MARK: - Defences (docs/http2.md lists each with its number)

    /// Streams handed to exchanges in one loop turn at most: Envoy's
    /// `max_requests_per_io_cycle`. A read full of new streams costs one
    /// turn's worth of work before other connections are served.
    public static let maxDispatchesPerTurn = 100
    /// The premature-reset rule applies once this many streams have closed (Envoy's default).
    public static let prematureResetMinimumStreams = 500
    /// A client reset this soon after the stream opened is premature (Envoy's default).
    public static let prematureResetAge: Duration = .seconds(1)
    /// Frames in a row with an empty payload and no END_STREAM (DATA,
    /// HEADERS, CONTINUATION; CVE-2019-9518). Envoy allows 1; a few more
    /// here for clients that flush an empty DATA frame now and then.
    public static let maxConsecutiveEmptyFrames = 10
    /// PRIORITY frames allowed per stream opened, plus `priorityAllowance`
    /// (Envoy: 100 per stream). With SETTINGS_NO_RFC7540_PRIORITIES they cost
    /// no state, but each still costs a parse.
    public static let priorityPerStreamOpened = 100
    public static let priorityAllowance = 100
    /// WINDOW_UPDATE frames allowed per DATA frame we sent, plus
    /// `windowUpdatesPerStreamOpened` per stream the client opened, plus
    /// `windowUpdateAllowance` (Envoy: 10 per DATA frame sent, 2 per stream).
    /// A client may open a stream's window as it opens it, before any DATA
    /// came: httpx does, and 100 concurrent GETs were ended as a flood.
    public static let windowUpdatesPerDataFrameSent = 10
    public static let windowUpdatesPerStreamOpened = 2
    public static let windowUpdateAllowance = 100
    /// SETTINGS frames received in one second at most (each asks for an ACK).
    public static let maxSettingsPerSecond = 100
    /// PING frames received in one second at most (each asks for an ACK).
    public static let maxPingsPerSecond = 100
    /// RST_STREAM frames we send in one second at most: each malformed
    /// HEADERS costs one, queued by nghttp2 without a limit (CVE-2019-9514).
    public static let maxResetsSentPerSecond = 100
    /// Frames queued in the session past this stop reading (Envoy: 1,000
    /// control frames) until the client takes them.
    public static let outboundQueuePause = 1000
    /// Frames queued in the session past this end the connection (Envoy: 10,000 frames).
    public static let outboundQueueLimit = 10_000
    /// Our output above this stops reading; at or below `outputLowWater` reading resumes.
    public static let outputHighWater = 256 * 1024
    public static let outputLowWater = 64 * 1024
    /// How long a terminating GOAWAY may take to be written before the close.
    public static let linger: Duration = .seconds(2)

    public struct Limits: Sendable, Equatable {
        /// No stream open this long: GOAWAY NO_ERROR and close.
        public var idle: Duration
        /// How long streams in flight may finish after a drain's GOAWAY.
        public var drainTimeout: Duration
        public var maxDispatchesPerTurn: Int
        public var prematureResetMinimumStreams: Int
        public var prematureResetAge: Duration
        public var maxConsecutiveEmptyFrames: Int
        public var priorityPerStreamOpened: Int
        public var priorityAllowance: Int
        public var windowUpdatesPerDataFrameSent: Int
        public var windowUpdateAllowance: Int
        public var maxSettingsPerSecond: Int
        public var maxPingsPerSecond: Int
        public var maxResetsSentPerSecond: Int
        public var outboundQueuePause: Int
        public var outboundQueueLimit: Int
        public var outputHighWater: Int
        public var outputLowWater: Int
        public var linger: Duration

        /// - Parameters:
        ///   - idle: `limits.idle_timeout`: no stream open this long closes the connection.
        ///   - drainTimeout: `drain_timeout`: streams in flight finish within it after SIGTERM.
        ///   The defences default to the documented constants above.
        public init(idle: Duration, drainTimeout: Duration) {
            typealias M = HTTP2ConnectionStateMachine
            self.idle = idle
            self.drainTimeout = drainTimeout
            maxDispatchesPerTurn = M.maxDispatchesPerTurn
            prematureResetMinimumStreams = M.prematureResetMinimumStreams
            prematureResetAge = M.prematureResetAge
            maxConsecutiveEmptyFrames = M.maxConsecutiveEmptyFrames
            priorityPerStreamOpened = M.priorityPerStreamOpened
            priorityAllowance = M.priorityAllowance
            windowUpdatesPerDataFrameSent = M.windowUpdatesPerDataFrameSent
            windowUpdateAllowance = M.windowUpdateAllowance
            maxSettingsPerSecond = M.maxSettingsPerSecond
            maxPingsPerSecond = M.maxPingsPerSecond
            maxResetsSentPerSecond = M.maxResetsSentPerSecond
            outboundQueuePause = M.outboundQueuePause
            outboundQueueLimit = M.outboundQueueLimit
            outputHighWater = M.outputHighWater
            outputLowWater = M.outputLowWater
            linger = M.linger
        }
    }

    /// A budget the client passed (the `flood` reason's label).
    public enum Flood: String, Sendable, Equatable, CaseIterable {
        case emptyFrames = "empty_frames"
        case priority
        case windowUpdate = "window_update"
        case settings
        case ping
        case resetsSent = "resets_sent"
        case outboundQueue = "outbound_queue"
    }

    /// Why the connection ended (a metric label and a log field).
    public enum Reason: Sendable, Equatable {
        /// No stream for `idle`.
        case idle
        /// Drained: every stream finished after the drain's GOAWAY (or none was open).
        case drained
        /// Streams were still open at the drain deadline.
        case drainTimeout
        /// More than half of the streams were reset by the client right after opening.
        case rapidReset
        case flood(Flood)
        /// The client closed or reset the socket, or ended the session (its GOAWAY, all streams done).
        case clientClosed
        /// The session refused the input (a protocol, compression or
        /// CONTINUATION error: nghttp2 returned a fatal error).
        case sessionError

        /// The code of the GOAWAY that ends the session for this reason.
        public var code: HTTP2ErrorCode {
            switch self {
            case .idle, .drained, .drainTimeout, .clientClosed: .noError
            case .rapidReset, .flood: .enhanceYourCalm
            case .sessionError: .protocolError
            }
        }

        public var label: String {
            switch self {
            case .idle: "idle"
            case .drained: "drain"
            case .drainTimeout: "drain_timeout"
            case .rapidReset: "rapid_reset"
            case let .flood(flood): "flood_" + flood.rawValue
            case .clientClosed: "client"
            case .sessionError: "session_error"
            }
        }
    }

    /// What the client sent, as the session's frame callbacks see it.
    public enum InboundFrame: Sendable, Equatable {
        /// `length`: the payload without padding.
        case data(length: Int, endStream: Bool)
        case headers(length: Int, endStream: Bool)
        case continuation(length: Int)
        case priority
        case windowUpdate
        /// SETTINGS, an ACK or not.
        case settings
        /// PING, an ACK or not.
        case ping
        /// RST_STREAM (reported as `streamReset`), GOAWAY, PUSH_PROMISE, unknown types.
        case other
    }

    public enum State: Sendable, Equatable {
        case open
        /// The drain's GOAWAY is sent: streams open finish until `deadline`, new ones are refused.
        case draining(deadline: Instant)
        /// The session is terminated (GOAWAY queued): close once the output is
        /// written, or at `deadline` (the linger).
        case closing(Reason, deadline: Instant)
        case closed(Reason)
    }

    /// Everything one event asks of the driver, in this order: refuse, GOAWAY,
    /// terminate, reading, timer, close. Fixed size; nil fields change nothing.
    public struct Actions: Sendable, Equatable {
        /// Reset this new stream with REFUSED_STREAM (opened after our GOAWAY).
        public var refuse: StreamID?
        /// Send GOAWAY NO_ERROR naming this last stream id (the drain's): the
        /// session goes on for the streams up to it.
        public var goaway: StreamID?
        /// End the session (`nghttp2_session_terminate_session` with
        /// `reason.code`): GOAWAY, streams in flight cancelled, nothing more read.
        public var terminate: Reason?
        /// Resume (true) or stop (false) reading the socket.
        public var reading: Bool?
        /// Arm the one timer this long from now, replacing the one armed before.
        public var timer: Duration?
        /// Close the socket now; streams still open are cancelled.
        public var close: Reason?

        public init(
            refuse: StreamID? = nil, goaway: StreamID? = nil, terminate: Reason? = nil, reading: Bool? = nil,
            timer: Duration? = nil, close: Reason? = nil
        ) {
            self.refuse = refuse
            self.goaway = goaway
            self.terminate = terminate
            self.reading = reading
            self.timer = timer
            self.close = close
        }

        public static let none = Actions()
    }

    /// The answer of `nextDispatch`.
    public enum Dispatch: Sendable, Equatable {
        /// Hand this stream to its exchange now.
        case stream(StreamID)
        /// No ready stream is left.
        case done
        /// This turn's share is used and streams are still ready: continue on
        /// the next loop turn (a zero-delay event calling `turnEnded`).
        case nextTurn
    }

    private enum Phase: Sendable {
        case opening, ready, dispatched
    }

    private struct Entry: Sendable {
        var opened: Instant
        var phase: Phase
    }

    public let limits: Limits
    public private(set) var state = State.open
    public private(set) var reading = true

    /// The streams open, by id: bounded by the session's concurrent-stream limit.
    private var streams: [StreamID: Entry] = [:]
    /// Ready streams in the order they became ready, from `readyHead`; ids
    /// of streams closed since are skipped (and dropped) when met.
    private var readyQueue: [StreamID] = []
    private var readyHead = 0
    /// Streams ready and still open.
    public private(set) var readyCount = 0
    private var dispatchedThisTurn = 0
    /// The highest stream id the client opened (the drain's GOAWAY names it).
    public private(set) var lastStreamID: StreamID = 0
    /// The GOAWAY sent: streams above it are refused.
    private var goawayLastStreamID: StreamID?

    /// Since when no stream is open (nil while streams are).
    private var idleSince: Instant?
    /// The instant the timer was last armed for (nil: none that matters).
    private var armedFor: Instant?

    // Counters, saturating (their growth is the client's doing).
    public private(set) var streamsOpened = 0
    public private(set) var streamsClosed = 0
    public private(set) var prematureResets = 0
    private var consecutiveEmptyFrames = 0
    private var priorityFrames = 0
    private var windowUpdates = 0
    public private(set) var dataFramesSent = 0
    private var settingsWindow = SecondWindow()
    private var pingWindow = SecondWindow()
    private var resetsSentWindow = SecondWindow()

    public init(limits: Limits) { self.limits = limits }

    public var openStreams: Int { streams.count }

    public var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    /// The session serves frames (open or draining): not ending.
    private var serving: Bool {
        switch state {
        case .open, .draining: true
        case .closing, .closed: false
        }
    }

    /// The session started (our SETTINGS are queued): the idle wait begins.
    public mutating func start(now: Instant) -> Actions {
        guard state == .open else { return .none }
        idleSince = now
        return Actions(timer: retime(now: now))
    }

    // MARK: - Streams

    /// The client opened a stream (its first HEADERS began).
    public mutating func streamOpened(_ id: StreamID, now: Instant) -> Actions {
        guard serving else { return .none }
        if let last = goawayLastStreamID, id > last { return Actions(refuse: id) }
        guard streams[id] == nil else { return .none }
        streams[id] = Entry(opened: now, phase: .opening)
        lastStreamID = max(lastStreamID, id)
        streamsOpened.addSaturating(1)
        idleSince = nil
        return .none
    }

    /// The stream's request is ready for its exchange (`HTTP2StreamStateMachine`
    /// said so): it is handed over by `nextDispatch`, after the read.
    public mutating func streamReady(_ id: StreamID) {
        guard serving, streams[id]?.phase == .opening else { return }
        streams[id]!.phase = .ready
        readyCount += 1
        readyQueue.append(id)
    }

    /// The next ready stream to hand to its exchange this turn.
    public mutating func nextDispatch() -> Dispatch {
        guard serving, readyCount > 0 else {
            clearReadyQueue()
            return .done
        }
        guard dispatchedThisTurn < limits.maxDispatchesPerTurn else { return .nextTurn }
        while readyHead < readyQueue.count {
            let id = readyQueue[readyHead]
            readyHead += 1
            guard streams[id]?.phase == .ready else { continue }
            streams[id]!.phase = .dispatched
            readyCount -= 1
            dispatchedThisTurn += 1
            if readyCount == 0 {
                clearReadyQueue()
            } else if readyHead >= 1024, readyHead * 2 >= readyQueue.count {
                // Ids already passed (dispatched or closed) are dropped in bulk.
                readyQueue.removeFirst(readyHead)
                readyHead = 0
            }
            return .stream(id)
        }
        // Not reached: `readyCount` counts ids in the queue.
        clearReadyQueue()
        return .done
    }

    private mutating func clearReadyQueue() {
        readyQueue.removeAll(keepingCapacity: readyQueue.count <= 1024)
        readyHead = 0
    }

    /// The client reset the stream (RST_STREAM received). A stream reset this
    /// soon after it opened counts toward the premature-reset rule.
    public mutating func streamReset(_ id: StreamID, now: Instant) -> Actions {
        guard let entry = removeStream(id) else { return .none }
        if now - entry.opened < limits.prematureResetAge { prematureResets.addSaturating(1) }
        return streamGone(now: now)
    }

    /// The stream closed any other way (both sides ended, or we reset it).
    public mutating func streamClosed(_ id: StreamID, now: Instant) -> Actions {
        guard removeStream(id) != nil else { return .none }
        return streamGone(now: now)
    }

    private mutating func removeStream(_ id: StreamID) -> Entry? {
        guard let entry = streams.removeValue(forKey: id) else { return nil }
        if entry.phase == .ready {
            readyCount -= 1
            if readyCount == 0 { clearReadyQueue() }
        }
        return entry
    }

    private mutating func streamGone(now: Instant) -> Actions {
        streamsClosed.addSaturating(1)
        guard serving else { return .none }
        // Envoy's rule: judged once enough streams closed, over the connection's life.
        if streamsClosed >= limits.prematureResetMinimumStreams, prematureResets > streamsClosed / 2 {
            return terminate(.rapidReset, now: now)
        }
        guard streams.isEmpty else { return .none }
        if case .draining = state {
            // Every stream in flight finished: the GOAWAY is queued already; close once written.
            return closing(.drained, now: now)
        }
        idleSince = now
        return Actions(timer: retime(now: now))
    }

    // MARK: - Frames

    /// A frame arrived (the session's begin-frame or frame-received callback).
    public mutating func frameReceived(_ frame: InboundFrame, now: Instant) -> Actions {
        guard serving else { return .none }
        switch frame {
        case let .data(length, endStream), let .headers(length, endStream):
            return emptyFrame(length == 0 && !endStream, now: now)
        case let .continuation(length):
            return emptyFrame(length == 0, now: now)
        case .priority:
            priorityFrames.addSaturating(1)
            let budget = Self.budget(limits.priorityPerStreamOpened, per: streamsOpened, plus: limits.priorityAllowance)
            return priorityFrames > budget ? terminate(.flood(.priority), now: now) : .none
        case .windowUpdate:
            windowUpdates.addSaturating(1)
            var budget = Self.budget(
                limits.windowUpdatesPerDataFrameSent, per: dataFramesSent, plus: limits.windowUpdateAllowance)
            budget = Self.budget(Self.windowUpdatesPerStreamOpened, per: streamsOpened, plus: budget)
            return windowUpdates > budget ? terminate(.flood(.windowUpdate), now: now) : .none
        case .settings:
            let n = settingsWindow.count(now: now)
            return n > limits.maxSettingsPerSecond ? terminate(.flood(.settings), now: now) : .none
        case .ping:
            let n = pingWindow.count(now: now)
            return n > limits.maxPingsPerSecond ? terminate(.flood(.ping), now: now) : .none
        case .other:
            return .none
        }
    }

    private mutating func emptyFrame(_ empty: Bool, now: Instant) -> Actions {
        guard empty else {
            consecutiveEmptyFrames = 0
            return .none
        }
        consecutiveEmptyFrames.addSaturating(1)
        guard consecutiveEmptyFrames > limits.maxConsecutiveEmptyFrames else { return .none }
        return terminate(.flood(.emptyFrames), now: now)
    }

    /// `per` × `count` + `plus`, saturating.
    private static func budget(_ per: Int, per count: Int, plus: Int) -> Int {
        let (product, overflow) = per.multipliedReportingOverflow(by: count)
        var total = overflow ? Int.max : product
        total.addSaturating(plus)
        return total
    }

    /// We sent a DATA frame (it earns the client `windowUpdatesPerDataFrameSent` WINDOW_UPDATEs).
    public mutating func dataFrameSent(count: Int = 1) {
        dataFramesSent.addSaturating(max(0, count))
    }

    /// We sent an RST_STREAM (a malformed request, a refused or idle stream).
    public mutating func resetSent(now: Instant) -> Actions {
        guard serving else { return .none }
        let n = resetsSentWindow.count(now: now)
        return n > limits.maxResetsSentPerSecond ? terminate(.flood(.resetsSent), now: now) : .none
    }

    // MARK: - Turns and output

    /// A loop turn's input went through the session (or the zero-delay event
    /// that continues dispatching fired): the outbound levels are checked,
    /// and this turn's dispatch share opens (`nextDispatch` until it says
    /// `.done` or `.nextTurn`).
    /// - Parameters:
    ///   - outboundQueue: frames queued in the session (`nghttp2_session_get_outbound_queue_size`).
    ///   - outputPending: bytes in our output queue, not yet taken by the socket.
    public mutating func turnEnded(outboundQueue: Int, outputPending: Int, now: Instant) -> Actions {
        dispatchedThisTurn = 0
        return outputChanged(outboundQueue: outboundQueue, outputPending: outputPending, now: now)
    }

    /// The output was flushed (after every flush, whether the socket took
    /// everything or not).
    public mutating func outputChanged(outboundQueue: Int, outputPending: Int, now: Instant) -> Actions {
        switch state {
        case .closed:
            return .none
        case let .closing(reason, _):
            return outboundQueue == 0 && outputPending == 0 ? close(reason) : .none
        case .open, .draining:
            if outboundQueue > limits.outboundQueueLimit {
                return terminate(.flood(.outboundQueue), now: now)
            }
            if reading, outputPending > limits.outputHighWater || outboundQueue > limits.outboundQueuePause {
                reading = false
                return Actions(reading: false)
            }
            if !reading, outputPending <= limits.outputLowWater, outboundQueue <= limits.outboundQueuePause {
                reading = true
                return Actions(reading: true)
            }
            return .none
        }
    }

    // MARK: - Time and the end

    /// The timer fired.
    public mutating func timerFired(now: Instant) -> Actions {
        armedFor = nil
        switch state {
        case .closed:
            return .none
        case let .closing(reason, deadline):
            return now >= deadline ? close(reason) : Actions(timer: retime(now: now))
        case let .draining(deadline):
            return now >= deadline ? close(.drainTimeout) : Actions(timer: retime(now: now))
        case .open:
            if let idleSince, now - idleSince >= limits.idle { return terminate(.idle, now: now) }
            return Actions(timer: retime(now: now))
        }
    }

    /// The proxy drains (SIGTERM): GOAWAY naming the last stream opened;
    /// streams open finish until `drainTimeout`, new ones are refused. With
    /// no stream open, the session ends at once.
    public mutating func drain(now: Instant) -> Actions {
        guard state == .open else { return .none }
        guard !streams.isEmpty else { return terminate(.drained, now: now) }
        goawayLastStreamID = lastStreamID
        state = .draining(deadline: now + limits.drainTimeout)
        var a = Actions(goaway: lastStreamID)
        a.timer = retime(now: now)
        return a
    }

    /// The client closed its side, or a read or write failed.
    public mutating func connectionLost() -> Actions {
        switch state {
        case .closed: return .none
        // A client that leaves while our GOAWAY is written: the end we meant.
        case let .closing(reason, _): return close(reason)
        case .open, .draining: return close(.clientClosed)
        }
    }

    /// The session wants neither to read nor to write any more (the
    /// client's GOAWAY and every stream done, or our termination written).
    public mutating func sessionFinished() -> Actions { connectionLost() }

    /// The session refused the input (a fatal nghttp2 error): it is
    /// unusable, the socket closes at once.
    public mutating func sessionFailed() -> Actions {
        guard !isClosed else { return .none }
        return close(.sessionError)
    }

    private mutating func terminate(_ reason: Reason, now: Instant) -> Actions {
        var a = closing(reason, now: now)
        a.terminate = reason
        return a
    }

    /// Nothing more is read; the close follows the output, or the linger.
    private mutating func closing(_ reason: Reason, now: Instant) -> Actions {
        state = .closing(reason, deadline: now + limits.linger)
        // Streams not dispatched yet never will be (they go with the session).
        if readyCount > 0 {
            for (id, entry) in streams where entry.phase == .ready { streams[id]!.phase = .opening }
            readyCount = 0
        }
        clearReadyQueue()
        var a = Actions(timer: retime(now: now))
        if reading {
            reading = false
            a.reading = false
        }
        return a
    }

    private mutating func close(_ reason: Reason) -> Actions {
        state = .closed(reason)
        streams.removeAll()
        clearReadyQueue()
        readyCount = 0
        reading = false
        idleSince = nil
        armedFor = nil
        return Actions(close: reason)
    }

    /// The deadline the state waits for, armed if it is not armed yet.
    private mutating func retime(now: Instant) -> Duration? {
        let deadline: Instant?
        switch state {
        case .closed: deadline = nil
        case let .closing(_, until), let .draining(until): deadline = until
        case .open: deadline = idleSince.map { $0 + limits.idle }
        }
        guard let deadline else {
            armedFor = nil
            return nil
        }
        guard deadline != armedFor else { return nil }
        armedFor = deadline
        return deadline > now ? deadline - now : .zero
    }
}

/// Events counted in windows of one second: O(1) memory, whatever the rate.
/// A window starts with the first event after the previous one ended, so
/// a client may send the limit at the end of one window and again at the
/// start of the next (at most twice the limit in any second).
struct SecondWindow: Sendable {
    private var start: Instant?
    private var events = 0

    /// Counts one event at `now`; the events in the current window so far.
    mutating func count(now: Instant) -> Int {
        if let start, now - start < .seconds(1) {
            events.addSaturating(1)
        } else {
            start = now
            events = 1
        }
        return events
    }
}

extension Int {
    /// Adds, stopping at `Int.max`: for counts the client drives, which must never trap.
    mutating func addSaturating(_ n: Int) {
        let (sum, overflow) = addingReportingOverflow(n)
        self = overflow ? (n > 0 ? .max : .min) : sum
    }
}
