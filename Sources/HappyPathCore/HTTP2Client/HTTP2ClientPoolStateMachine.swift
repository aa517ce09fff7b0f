/// The HTTP/2 connections one worker keeps to one upstream endpoint, and
/// the tries waiting for a stream on them. Pure: the driver
/// (`HTTP2ConnectionPool`) opens and closes sockets and submits streams as
/// the actions say, and reports what happened as events.
///
/// The rules (docs/http2.md, "Towards upstreams"):
/// - A try goes on the **oldest** ready connection with room (fill first, so
///   extra connections go idle and close). Room is the peer's
///   SETTINGS_MAX_CONCURRENT_STREAMS less the streams open on it.
/// - A connection opens only when every open one is full (or none is open)
///   and fewer than `maxConnections` are open; one opening at a time is
///   assumed to take `assumedCapacity` tries, so a burst opens one, not many.
/// - No stream goes on a connection before the server's SETTINGS: it proved
///   it speaks HTTP/2, and its stream limit is known.
/// - A connection that fails before it is ready fails the tries waiting,
///   unless another connection that may take them is open or opening; it
///   opens no other by itself (a connect that fails at once never loops).
/// - A GOAWAY drains: no new stream; the connection closes when its last
///   stream ends. A ready connection without a stream for `idleTimeout` closes.
/// - A connection the server was silent on for `pingAfterSilence` is asked
///   a PING before it takes another stream (its driver closes it when no
///   ACK comes within the connect timeout; the tries wait for another).
public struct HTTP2ClientPoolStateMachine: Sendable {
    public typealias ConnectionID = Int
    public typealias TryID = Int

    public enum Phase: Sendable, Equatable {
        /// Connecting, or waiting for the server's SETTINGS.
        case opening
        case ready
        /// Silent for `pingAfterSilence`: a PING went out before it takes
        /// another stream; it is ready again at the ACK, closed without one.
        case verifying
        /// A GOAWAY came: the streams below its id finish, nothing new goes on it.
        case draining
    }

    public struct Connection: Sendable, Equatable {
        public let id: ConnectionID
        public var phase: Phase
        public var streams: Int
        /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS (once ready).
        public var capacity: Int
        /// Since when it has had no stream (ready connections only).
        public var idleSince: Instant?
        /// When a byte last came from the server.
        public var lastHeard = Instant(nanoseconds: 0)

        var room: Int { phase == .ready ? max(0, capacity - streams) : 0 }
    }

    public enum CloseReason: String, Sendable, Equatable {
        /// No stream for `idleTimeout`.
        case idle
        /// A GOAWAY came and its last stream ended.
        case drained
        /// The pool is being shut down (its streams are dropped).
        case shutdown
    }

    public enum Action: Sendable, Equatable {
        /// Open a new connection with this id.
        case open(ConnectionID)
        /// Send a PING on the connection (it was silent); report the ACK.
        case verify(ConnectionID)
        /// Start the try as a stream on the connection.
        case assign(TryID, ConnectionID)
        /// The try cannot get a connection: it fails, never sent.
        case fail(TryID, HTTP2ConnectFailure)
        /// Close the connection (no stream is left on it, unless `.shutdown`).
        case close(ConnectionID, CloseReason)
    }

    /// Connections a connection still opening is assumed to take (nghttp2's
    /// own assumption before SETTINGS); it only decides whether to open another.
    public static let assumedCapacity = 100

    public let maxConnections: Int
    public let idleTimeout: Duration
    /// A connection the server has said nothing on for this long is asked
    /// a PING before it takes another stream: a dead one is found before a
    /// request is put on it. Never on a schedule (gRPC servers answer
    /// pings without requests with GOAWAY): only before a request.
    public let pingAfterSilence: Duration
    public private(set) var connections: [Connection] = []
    /// Tries waiting for room, oldest first.
    public private(set) var waiting: [TryID] = []
    private var nextID: ConnectionID = 1
    public private(set) var isShutDown = false

    public init(maxConnections: Int, idleTimeout: Duration, pingAfterSilence: Duration = .seconds(10)) {
        self.maxConnections = max(1, maxConnections)
        self.idleTimeout = idleTimeout
        self.pingAfterSilence = pingAfterSilence
    }

    /// The earliest instant `timer` has something to do (an idle
    /// connection's close, the end of a backoff with tries waiting).
    public var nextDeadline: Instant? {
        let idle = connections.compactMap { $0.phase == .ready ? $0.idleSince.map { $0 + idleTimeout } : nil }.min()
        guard let backoffUntil, !waiting.isEmpty else { return idle }
        return min(idle ?? backoffUntil, backoffUntil)
    }

    /// Connections in a row that closed without one complete answer (a
    /// server that refuses everything: GOAWAY at once, no SETTINGS, a
    /// failed connect). From the third, the next one opens only after a
    /// backoff, 100 ms doubling to 5 s, and a try meanwhile with no
    /// connection to wait for fails at once; a connection that served resets it.
    public private(set) var failedInARow = 0
    public private(set) var backoffUntil: Instant?
    private var lastFailure: HTTP2ConnectFailure = ""
    /// The latest instant an event carried (what `openIfNeeded` compares the backoff with).
    private var now = Instant(nanoseconds: 0)

    private func index(of id: ConnectionID) -> Int? { connections.firstIndex { $0.id == id } }

    // MARK: - Events

    /// A try wants a stream. `replayed`: it was refused unprocessed on a
    /// stream already (REFUSED_STREAM, past a GOAWAY, never sent), and goes
    /// before the tries waiting, as it came before them.
    public mutating func want(_ tryID: TryID, at now: Instant, replayed: Bool = false) -> [Action] {
        self.now = max(self.now, now)
        guard !isShutDown else { return [.fail(tryID, "the proxy is shutting down")] }
        // In a backoff with no connection to wait for: it fails at once, as a
        // refused connect would (the exchange parks it or tries elsewhere).
        if let backoffUntil, now < backoffUntil, !connections.contains(where: { $0.phase != .draining }) {
            var failure = lastFailure
            failure.why += " (\(failedInARow) connections in a row served nothing; the next opens after a backoff)"
            return [.fail(tryID, failure)]
        }
        if replayed { waiting.insert(tryID, at: 0) } else { waiting.append(tryID) }
        return assignWaiting(at: now) + openIfNeeded()
    }

    /// The connection's server sent its first SETTINGS: it is ready, with
    /// room for `maxStreams` streams.
    public mutating func opened(_ id: ConnectionID, maxStreams: Int, at now: Instant) -> [Action] {
        self.now = max(self.now, now)
        guard let i = index(of: id), connections[i].phase == .opening else { return [] }
        connections[i].phase = .ready
        connections[i].capacity = max(0, maxStreams)
        connections[i].idleSince = now
        connections[i].lastHeard = now
        var actions = assignWaiting(at: now)
        actions += openIfNeeded()
        return actions
    }

    /// The server changed SETTINGS_MAX_CONCURRENT_STREAMS. A lower value
    /// takes no stream back (nghttp2 holds what is past it).
    public mutating func capacityChanged(_ id: ConnectionID, maxStreams: Int, at now: Instant) -> [Action] {
        self.now = max(self.now, now)
        guard let i = index(of: id) else { return [] }
        connections[i].capacity = max(0, maxStreams)
        var actions = assignWaiting(at: now)
        actions += openIfNeeded()
        return actions
    }

    /// A stream on the connection ended (whichever way).
    public mutating func streamEnded(_ id: ConnectionID, at now: Instant) -> [Action] {
        self.now = max(self.now, now)
        guard let i = index(of: id) else { return [] }
        connections[i].streams = max(0, connections[i].streams - 1)
        if connections[i].streams == 0 {
            if connections[i].phase == .draining { return [.close(id, .drained)] }
            connections[i].idleSince = now
        }
        return assignWaiting(at: now)
    }

    /// The server sent GOAWAY on the connection: it drains.
    public mutating func goaway(_ id: ConnectionID) -> [Action] {
        guard let i = index(of: id), connections[i].phase != .draining else { return [] }
        let wasOpening = connections[i].phase == .opening
        connections[i].phase = .draining
        connections[i].idleSince = nil
        var actions: [Action] = []
        if connections[i].streams == 0 { actions.append(.close(id, .drained)) }
        if wasOpening { actions += failIfNothingLeft("the upstream sent GOAWAY before its SETTINGS") }
        return actions + openIfNeeded()
    }

    /// The connection is gone (closed by either side, or it never opened).
    /// `failure` says why, when it closed before it was ready.
    public mutating func connectionClosed(
        _ id: ConnectionID, failure: HTTP2ConnectFailure?, served: Bool = true, at now: Instant? = nil
    ) -> [Action] {
        guard let i = index(of: id) else { return [] }
        if let now { self.now = max(self.now, now) }
        let wasOpening = connections[i].phase == .opening
        connections.remove(at: i)
        if !served {
            lastFailure = failure ?? "the upstream closed the connection without answering"
            failedInARow += 1
            if failedInARow >= 3 {
                let shift = min(failedInARow - 3, 6)
                backoffUntil = self.now + min(Duration.milliseconds(100 << shift), .seconds(5))
            }
        } else {
            failedInARow = 0
            backoffUntil = nil
        }
        // One that never became ready opens no other at once (the next try
        // may): a connect that fails at once must not loop.
        if wasOpening { return failIfNothingLeft(failure ?? "the upstream closed the connection before its SETTINGS") }
        return openIfNeeded()
    }

    /// Bytes came from the server on the connection.
    public mutating func heard(_ id: ConnectionID, at now: Instant) {
        if let i = index(of: id) { connections[i].lastHeard = now }
    }

    /// The server answered the connection's PING: it takes streams again.
    public mutating func pingAnswered(_ id: ConnectionID, at now: Instant) -> [Action] {
        self.now = max(self.now, now)
        guard let i = index(of: id), connections[i].phase == .verifying else { return [] }
        connections[i].phase = .ready
        connections[i].lastHeard = now
        if connections[i].streams == 0 { connections[i].idleSince = now }
        return assignWaiting(at: now) + openIfNeeded()
    }

    /// A waiting try is no longer wanted (a stream already assigned is the connection's to reset).
    public mutating func cancelled(_ tryID: TryID) {
        if let i = waiting.firstIndex(of: tryID) { waiting.remove(at: i) }
    }

    /// Time passed: ready connections idle for `idleTimeout` close; a
    /// backoff over opens a connection for the tries waiting.
    public mutating func timer(at now: Instant) -> [Action] {
        self.now = max(self.now, now)
        var actions: [Action] = []
        if let backoffUntil, now >= backoffUntil {
            self.backoffUntil = nil
            actions += openIfNeeded()
        }
        for i in connections.indices where connections[i].phase == .ready && connections[i].streams == 0 {
            if let since = connections[i].idleSince, now - since >= idleTimeout {
                connections[i].phase = .draining
                actions.append(.close(connections[i].id, .idle))
            }
        }
        return actions
    }

    /// Everything stops: waiting tries fail, every connection closes now.
    public mutating func shutdown() -> [Action] {
        isShutDown = true
        let failed = waiting.map { Action.fail($0, "the proxy is shutting down") }
        waiting.removeAll()
        return failed + connections.map { .close($0.id, .shutdown) }
    }

    // MARK: - Rules

    private mutating func assign(_ tryID: TryID, _ i: Int) -> Action {
        connections[i].streams += 1
        connections[i].idleSince = nil
        return .assign(tryID, connections[i].id)
    }

    /// Waiting tries onto the oldest ready connections with room; one
    /// silent too long is asked a PING first.
    private mutating func assignWaiting(at now: Instant) -> [Action] {
        var actions: [Action] = []
        var taken = 0
        while taken < waiting.count, let i = connections.firstIndex(where: { $0.room > 0 }) {
            // (Strictly longer: the ACK's own instant lets the waiting tries on, even with 0.)
            if now - connections[i].lastHeard > pingAfterSilence {
                connections[i].phase = .verifying
                actions.append(.verify(connections[i].id))
                continue
            }
            actions.append(assign(waiting[taken], i))
            taken += 1
        }
        if taken > 0 { waiting.removeFirst(taken) }
        return actions
    }

    /// One more connection when the waiting tries are more than the
    /// connections opening are assumed to take, within `maxConnections`.
    private mutating func openIfNeeded() -> [Action] {
        guard !isShutDown, !waiting.isEmpty else { return [] }
        if let backoffUntil, now < backoffUntil { return [] }
        // One being asked a PING counts as one opening: it will take them, or close.
        let opening = connections.reduce(0) { $0 + ($1.phase == .opening || $1.phase == .verifying ? 1 : 0) }
        let live = connections.reduce(0) { $0 + ($1.phase == .draining ? 0 : 1) }
        guard waiting.count > opening * Self.assumedCapacity, live < maxConnections else { return [] }
        let id = nextID
        nextID += 1
        connections.append(Connection(id: id, phase: .opening, streams: 0, capacity: 0, idleSince: nil))
        return [.open(id)]
    }

    /// A connection failed before it was ready: the waiting tries fail
    /// unless another connection is opening or ready (it will take them).
    private mutating func failIfNothingLeft(_ why: HTTP2ConnectFailure) -> [Action] {
        guard !connections.contains(where: { $0.phase != .draining }) else { return [] }
        let failed = waiting.map { Action.fail($0, why) }
        waiting.removeAll()
        return failed
    }
}
