/// One connection to Redis, as a pure state: connect, the greeting (AUTH,
/// SELECT, SCRIPT LOAD, or SUBSCRIBE for a subscriber), then ready, with
/// the commands in flight as a pipeline (replies come in the order the
/// commands went). Every step has a deadline of `timeout` (hiredis 0.14
/// has none of its own): a connect, a greeting or a command later than
/// that fails the connection, and every command in flight with it; the
/// link waits `retry` and connects again. The driver (`RedisConnection`)
/// performs the actions; tested as a table on an injected clock.
///
/// Health is what operators see: `down` from the first failure until a
/// greeting completes again (`up(restored: true)`), each change reported
/// once, so a Redis that stays away is logged once, not at every retry.
public struct RedisLinkStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        case idle
        case connecting
        case greeting
        case ready
        /// Failed; connects again at the instant.
        case waiting(Instant)
        case stopped
    }

    public enum Health: Sendable, Equatable {
        /// Never reached yet.
        case unknown
        case up
        case down
    }

    public enum Action: Sendable, Equatable {
        /// Open the socket (and TLS, when the URL says rediss://).
        case connect
        /// Write the greeting's commands (`greetingCount` of them).
        case sendGreeting
        /// The timer: at this instant, `timerFired`.
        case armTimer(Instant)
        case closeSocket
        /// Commands past their deadline: no reply will be read for them.
        case timedOut([UInt64])
        /// Commands lost with the connection, and why.
        case fail([UInt64], String)
        /// Reachable again (`restored`: after being down), or for the first time.
        case up(restored: Bool)
        /// Not reachable any more (or never was): said once per outage.
        case down(String)
    }

    public let timeout: Duration
    public let retry: Duration
    /// After its greeting, what the server sends are messages (SUBSCRIBE), not replies.
    public let subscriber: Bool
    /// Commands the greeting sends (each answered before the link is ready).
    public let greetingCount: Int

    public private(set) var state: State = .idle
    public private(set) var health: Health = .unknown
    private var greetingLeft = 0
    /// When the connect or the greeting must be done by.
    private var handshakeDeadline: Instant?
    /// Commands in flight, oldest first (from `head`), with their deadlines.
    private var inFlight: [(id: UInt64, deadline: Instant)] = []
    private var head = 0

    public init(timeout: Duration, retry: Duration, greetingCount: Int, subscriber: Bool = false) {
        self.timeout = timeout
        self.retry = retry
        self.greetingCount = greetingCount
        self.subscriber = subscriber
    }

    /// Commands waiting for their reply.
    public var pending: Int { inFlight.count - head }

    public var isReady: Bool { state == .ready && !subscriber }

    // MARK: - Events

    public mutating func start(at now: Instant) -> [Action] {
        guard state == .idle || isWaiting else { return [] }
        state = .connecting
        handshakeDeadline = now + timeout
        return [.connect, .armTimer(now + timeout)]
    }

    /// The socket (and TLS) is up: the greeting goes.
    public mutating func connected(at now: Instant) -> [Action] {
        guard state == .connecting else { return [] }
        guard greetingCount > 0 else { return becomeReady() }
        state = .greeting
        greetingLeft = greetingCount
        handshakeDeadline = now + timeout
        return [.sendGreeting, .armTimer(now + timeout)]
    }

    /// What `send` says of a command.
    public enum Send: Sendable, Equatable {
        /// Not ready (connecting, failed, a subscriber): decide without Redis.
        case refused
        /// Written; when it is the only one in flight, the timer goes to its deadline.
        case sent(armTimer: Instant?)
    }

    public mutating func send(_ id: UInt64, at now: Instant) -> Send {
        guard isReady else { return .refused }
        let first = pending == 0
        inFlight.append((id, now + timeout))
        return .sent(armTimer: first ? now + timeout : nil)
    }

    /// What a reply read from the socket is.
    public enum Reply: Sendable, Equatable {
        /// The answer to this command; then the timer goes to the next one's deadline (nil: none left).
        case answer(UInt64, next: Instant?)
        /// One of the greeting's replies; the actions follow from it.
        case greeting([Action])
        /// A subscriber's message.
        case message
        /// A reply nobody asked for: the connection is failed (`actions`).
        case unexpected([Action])
    }

    /// A complete reply came. `error`: it is an error reply (which fails a greeting).
    public mutating func replied(error: String?, at now: Instant) -> Reply {
        switch state {
        case .greeting:
            if let error { return .greeting(failed("the greeting was refused: \(error)", at: now)) }
            greetingLeft -= 1
            return .greeting(greetingLeft == 0 ? becomeReady() : [])
        case .ready where subscriber:
            return .message
        case .ready where pending > 0:
            let id = inFlight[head].id
            head += 1
            if head == inFlight.count {
                inFlight.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 64, head * 2 >= inFlight.count {
                inFlight.removeFirst(head)
                head = 0
            }
            return .answer(id, next: pending > 0 ? inFlight[head].deadline : nil)
        default:
            return .unexpected(failed("a reply to no command (the connection is out of step)", at: now))
        }
    }

    /// The timer fired: a deadline passed, or it is time to connect again.
    public mutating func timerFired(at now: Instant) -> [Action] {
        switch state {
        case .connecting, .greeting:
            guard let handshakeDeadline, handshakeDeadline <= now else { return handshakeDeadline.map { [.armTimer($0)] } ?? [] }
            let what = state == .connecting ? "connect" : "greeting"
            return failed("no \(what) within \(timeout.configText)", at: now)
        case .ready:
            guard pending > 0 else { return [] }
            guard inFlight[head].deadline <= now else { return [.armTimer(inFlight[head].deadline)] }
            var expired: [UInt64] = []
            while pending > 0, inFlight[head].deadline <= now {
                expired.append(inFlight[head].id)
                head += 1
            }
            return [.timedOut(expired)] + failed("a command had no reply within \(timeout.configText)", at: now)
        case let .waiting(at):
            guard at <= now else { return [.armTimer(at)] }
            return start(at: now)
        case .idle, .stopped:
            return []
        }
    }

    /// The socket failed or closed (or TLS, or a reply could not be read).
    public mutating func failed(_ reason: String, at now: Instant) -> [Action] {
        switch state {
        case .idle, .stopped, .waiting: return []
        default: break
        }
        let lost = inFlight[head...].map(\.id)
        inFlight.removeAll(keepingCapacity: true)
        head = 0
        handshakeDeadline = nil
        let again = now + retry
        state = .waiting(again)
        var actions: [Action] = [.closeSocket]
        if !lost.isEmpty { actions.append(.fail(lost, reason)) }
        actions.append(.armTimer(again))
        if health != .down {
            health = .down
            actions.append(.down(reason))
        }
        return actions
    }

    /// The link is closed for good (shutdown, reload): nothing more is sent.
    public mutating func stop() -> [Action] {
        let lost = inFlight[head...].map(\.id)
        inFlight.removeAll()
        head = 0
        let wasOpen = state != .idle && state != .stopped && !isWaiting
        state = .stopped
        var actions: [Action] = wasOpen ? [.closeSocket] : []
        if !lost.isEmpty { actions.append(.fail(lost, "the link was closed")) }
        return actions
    }

    // MARK: -

    private var isWaiting: Bool {
        if case .waiting = state { return true }
        return false
    }

    private mutating func becomeReady() -> [Action] {
        state = .ready
        handshakeDeadline = nil
        let restored = health == .down
        health = .up
        return [.up(restored: restored)]
    }
}
