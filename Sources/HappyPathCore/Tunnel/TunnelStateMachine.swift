/// The life of a tunnel after a `101 Switching Protocols`: bytes flow both
/// ways unchanged between the client and the upstream until one side ends
/// it, or it stays quiet too long. Pure: the I/O layer (`Tunnel` in
/// HappyPathIO) reads, writes and times, reports what happened as events,
/// and performs the `Actions` returned.
///
/// - Back-pressure: bytes read from one side are written to the other at
///   once; what that side's socket does not take is queued. When the queue
///   toward a side passes `highWater`, the other side is no longer read;
///   reading resumes when the queue drains to `lowWater`. A tunnel holds at
///   most about `highWater` plus one read per direction.
/// - Ending: the end of one side's bytes (EOF, or a read error) is passed
///   on once the bytes queued toward the other side are written
///   (`endWrite`: a half-close), and the other side is read until it ends
///   too; then both close. While ending, `linger` without a byte moving
///   closes both (with bytes still queued, as an error). A write that
///   fails closes both at once.
/// - Idle: no byte either way for `idle` closes both.
public struct TunnelStateMachine: Sendable {
    public enum Side: Int, Sendable, Equatable, CaseIterable {
        case client = 0
        case upstream = 1

        public var other: Side { self == .client ? .upstream : .client }
    }

    /// Why a tunnel closed (a metric label and a log field).
    public enum CloseReason: String, Sendable, Equatable {
        /// The client ended its side first (EOF or a WebSocket close it began).
        case clientClosed = "client_closed"
        /// The upstream ended its side first.
        case upstreamClosed = "upstream_closed"
        /// Nothing moved either way for `idle`.
        case idle
        /// A read or write failed (a reset), or a side would not end within `linger`.
        case error
        /// The proxy is stopping (`drain_timeout` passed).
        case shutdown
    }

    public struct Limits: Sendable, Equatable {
        public var highWater: Int
        public var lowWater: Int
        public var idle: Duration
        public var linger: Duration

        public init(
            idle: Duration, highWater: Int = 256 * 1024, lowWater: Int = 64 * 1024, linger: Duration = .seconds(5)
        ) {
            self.idle = idle
            self.highWater = highWater
            self.lowWater = min(lowWater, highWater)
            self.linger = linger
        }
    }

    public enum State: Sendable, Equatable {
        case open
        /// `first` ended its bytes at `since`; the other side still may send.
        case ending(first: Side, since: Instant)
        case closed(CloseReason)
    }

    /// What the I/O layer does, in this order: reads, half-close, timer, close.
    public struct Actions: Sendable, Equatable {
        /// Start (true) or stop (false) reading the client; nil: unchanged.
        public var readClient: Bool?
        public var readUpstream: Bool?
        /// Pass the end on: shut down writing toward this side (its queue is empty).
        public var endWrite: Side?
        /// Arm the one timer this long from now (replacing any earlier one).
        public var timer: Duration?
        /// Close both sides (the tunnel is over).
        public var close: CloseReason?

        public init(
            readClient: Bool? = nil, readUpstream: Bool? = nil, endWrite: Side? = nil, timer: Duration? = nil,
            close: CloseReason? = nil
        ) {
            self.readClient = readClient
            self.readUpstream = readUpstream
            self.endWrite = endWrite
            self.timer = timer
            self.close = close
        }

        public static let none = Actions()

        mutating func read(_ side: Side, _ on: Bool) {
            if side == .client { readClient = on } else { readUpstream = on }
        }
    }

    public let limits: Limits
    public private(set) var state = State.open
    /// Bytes queued toward each side (by `Side.rawValue`).
    private var queued = [0, 0]
    /// Each side is being read.
    private var reading = [false, false]
    /// Each side's bytes ended (EOF read from it).
    private var ended = [false, false]
    /// Writing toward each side was shut down.
    private var writeEnded = [false, false]
    private var lastActivity: Instant

    public init(limits: Limits, now: Instant) {
        self.limits = limits
        lastActivity = now
    }

    public var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    public func isReading(_ side: Side) -> Bool { reading[side.rawValue] }

    /// The tunnel opens with `toward` bytes already queued toward each side
    /// (bytes that came with the handshake).
    public mutating func start(queuedTowardClient: Int, queuedTowardUpstream: Int, now: Instant) -> Actions {
        queued = [queuedTowardClient, queuedTowardUpstream]
        lastActivity = now
        var a = Actions(timer: limits.idle)
        for side in Side.allCases {
            // A side is read unless the queue toward the other is already full.
            let on = queued[side.other.rawValue] <= limits.highWater
            reading[side.rawValue] = on
            a.read(side, on)
        }
        return a
    }

    /// Bytes read from `side` went toward the other side, where `queued`
    /// bytes now wait for its socket.
    public mutating func moved(from side: Side, queued waiting: Int, now: Instant) -> Actions {
        guard !isClosed else { return .none }
        progressed(at: now)
        queued[side.other.rawValue] = waiting
        var a = Actions.none
        if waiting > limits.highWater, reading[side.rawValue] {
            reading[side.rawValue] = false
            a.read(side, false)
        }
        return a
    }

    /// Writing toward `side` progressed: `queued` bytes still wait.
    public mutating func flushed(toward side: Side, queued waiting: Int, now: Instant) -> Actions {
        guard !isClosed else { return .none }
        progressed(at: now)
        queued[side.rawValue] = waiting
        var a = Actions.none
        let source = side.other
        if waiting <= limits.lowWater, !reading[source.rawValue], !ended[source.rawValue] {
            reading[source.rawValue] = true
            a.read(source, true)
        }
        if waiting == 0, ended[source.rawValue], !writeEnded[side.rawValue] {
            writeEnded[side.rawValue] = true
            a.endWrite = side
        }
        return closeIfDone(a)
    }

    /// Bytes moved: the idle time, or the linger of an ending tunnel, starts again.
    private mutating func progressed(at now: Instant) {
        lastActivity = now
        if case let .ending(first, _) = state { state = .ending(first: first, since: now) }
    }

    /// `side` sent its last byte (EOF, or its read failed).
    public mutating func ended(_ side: Side, now: Instant) -> Actions {
        guard !isClosed, !ended[side.rawValue] else { return .none }
        ended[side.rawValue] = true
        var a = Actions.none
        if reading[side.rawValue] {
            reading[side.rawValue] = false
            a.read(side, false)
        }
        if case .open = state {
            state = .ending(first: side, since: now)
            a.timer = limits.linger
        }
        let toward = side.other
        if queued[toward.rawValue] == 0, !writeEnded[toward.rawValue] {
            writeEnded[toward.rawValue] = true
            a.endWrite = toward
        }
        return closeIfDone(a)
    }

    /// Writing to `side` failed (a reset, a broken pipe): nothing more can
    /// pass that way.
    public mutating func failed(_ side: Side) -> Actions {
        guard !isClosed else { return .none }
        // Once a side ended its bytes, the tunnel was ending anyway: a reset
        // now (a client that closes without reading the last bytes) only
        // ends it sooner, for the same reason.
        if case .ending = state { return close(reasonOfEnding) }
        return close(.error)
    }

    /// The timer armed last fired.
    public mutating func timerFired(now: Instant) -> Actions {
        switch state {
        case .closed:
            return .none
        case let .ending(_, since):
            guard now - since >= limits.linger else { return Actions(timer: limits.linger - (now - since)) }
            // Stuck with bytes that could not be delivered: not a clean end.
            return close(queued[0] + queued[1] > 0 ? .error : reasonOfEnding)
        case .open:
            let quiet = now - lastActivity
            guard quiet >= limits.idle else { return Actions(timer: limits.idle - quiet) }
            return close(.idle)
        }
    }

    /// The proxy stops (its drain ran out of time).
    public mutating func shutdown() -> Actions {
        guard !isClosed else { return .none }
        return close(.shutdown)
    }

    private var reasonOfEnding: CloseReason {
        if case let .ending(first, _) = state { return first == .client ? .clientClosed : .upstreamClosed }
        return .error
    }

    /// Both sides ended and everything queued is written: over.
    private mutating func closeIfDone(_ a: Actions) -> Actions {
        guard ended[0], ended[1], queued[0] == 0, queued[1] == 0 else { return a }
        var a = a
        a.close = reasonOfEnding
        state = .closed(reasonOfEnding)
        reading = [false, false]
        return a
    }

    private mutating func close(_ reason: CloseReason) -> Actions {
        state = .closed(reason)
        reading = [false, false]
        return Actions(close: reason)
    }
}
