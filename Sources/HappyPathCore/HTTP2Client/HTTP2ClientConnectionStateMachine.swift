/// One HTTP/2 connection to an upstream, from connect to close. Pure: the
/// driver (`HTTP2UpstreamConnection`) makes the socket calls and runs the
/// nghttp2 client session, reports what happened, and performs the actions.
///
/// connecting → (handshaking →) awaitingSettings → ready → draining →
/// closed. The TCP connect has `connectTimeout`; over TLS the handshake
/// has `connectTimeout` again from the moment TCP connected, and ALPN must
/// choose h2; the server's first SETTINGS has
/// `connectTimeout` again from the moment TCP connected (an h2c server that
/// waits for our preface answers it at once; one that does not speak
/// HTTP/2 never does). Nothing is sent on a stream before that SETTINGS.
public struct HTTP2ClientConnectionStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        case idle
        case connecting(deadline: Instant)
        /// TCP connected to an https:// endpoint: the TLS handshake runs.
        case handshaking(deadline: Instant)
        case awaitingSettings(deadline: Instant)
        case ready
        /// A GOAWAY came (or we stop using it): open streams finish.
        case draining
        case closed(CloseReason)
    }

    public enum CloseReason: Sendable, Equatable {
        /// The TCP connect failed (refused, unreachable), with the system's words.
        case connectFailed(String)
        /// No TCP connection within the connect timeout.
        case connectTimeout
        /// The endpoint's name was not resolved within the connect timeout.
        case resolveTimeout(String)
        /// The TLS handshake failed (the certificate, ALPN without h2, an
        /// alert), with OpenSSL's words: not transient, the tries fail as TLS failures.
        case tlsFailed(String)
        /// Connected, but no TLS handshake within the connect timeout.
        case handshakeTimeout
        /// Connected, but no SETTINGS from the server within the connect timeout.
        case settingsTimeout
        /// The server closed the connection, or a read or write failed.
        case peerClosed(String)
        /// nghttp2 found the server's frames invalid (the session ended).
        case protocolError(String)
        /// Asked a PING after a silence, the server did not answer within the connect timeout.
        case pingTimeout
        /// The pool closed it (idle, drained, shutdown).
        case closedByPool

        /// Why the connection could not be used, for the tries that waited on it.
        public var failure: String {
            switch self {
            case let .connectFailed(why): "could not connect to the upstream: \(why)"
            case .connectTimeout: "no connection to the upstream within connect_timeout"
            case let .resolveTimeout(host): "could not resolve \(host) within connect_timeout (is the DNS server in /etc/resolv.conf reachable?)"
            case let .tlsFailed(why): why
            case .handshakeTimeout: "the upstream accepted the connection but did not finish the TLS handshake within connect_timeout"
            case .settingsTimeout:
                "the upstream accepted the connection but sent no HTTP/2 SETTINGS within connect_timeout (does it speak h2c?)"
            case let .peerClosed(why): "the upstream closed the connection: \(why)"
            case let .protocolError(why): "the upstream broke the HTTP/2 protocol: \(why)"
            case .pingTimeout: "the upstream did not answer a PING within connect_timeout (the connection is dead)"
            case .closedByPool: "the connection was closed"
            }
        }

        /// What the tries that waited on it hear.
        public var connectFailure: HTTP2ConnectFailure {
            if case .tlsFailed = self { return HTTP2ConnectFailure(failure, tls: true) }
            return HTTP2ConnectFailure(failure)
        }
    }

    public enum Action: Sendable, Equatable {
        case none
        /// TCP connected to an https:// endpoint: start the TLS handshake.
        case startHandshake
        /// Connected (and the handshake done): start the session (preface and SETTINGS) and read.
        case startSession
        /// The server's SETTINGS came: the pool may put streams on it.
        case ready(maxStreams: Int)
        /// The server changed its stream limit.
        case capacityChanged(maxStreams: Int)
        /// A GOAWAY: the pool puts nothing new on it.
        case draining
        /// Close the socket now; the streams still on it end (`reason.failure`).
        case close(CloseReason)
    }

    public private(set) var state: State = .idle
    public let connectTimeout: Duration

    public init(connectTimeout: Duration) { self.connectTimeout = connectTimeout }

    /// When `timer` must run next (nil: no deadline).
    public var deadline: Instant? {
        switch state {
        case let .connecting(deadline), let .handshaking(deadline), let .awaitingSettings(deadline): deadline
        case .ready, .draining: pingDeadline
        default: nil
        }
    }

    /// A PING of ours is unanswered until then.
    public private(set) var pingDeadline: Instant?

    /// We sent a PING (the pool asked, after a silence).
    public mutating func pingSent(at now: Instant) {
        guard state == .ready || state == .draining, pingDeadline == nil else { return }
        pingDeadline = now + connectTimeout
    }

    /// The server answered our PING.
    public mutating func pingAnswered() -> Bool {
        guard pingDeadline != nil else { return false }
        pingDeadline = nil
        return true
    }

    public var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    /// The endpoint's name being resolved, before the connect (the same deadline).
    public private(set) var resolvingName: String?

    /// The name is being resolved (the connect deadline runs).
    public mutating func resolving(_ host: String) {
        if case .connecting = state { resolvingName = host }
    }

    /// The name resolved (or failed to): the connect goes on.
    public mutating func resolved() { resolvingName = nil }

    /// The connect starts.
    public mutating func start(at now: Instant) -> Action {
        guard state == .idle else { return .none }
        state = .connecting(deadline: now + connectTimeout)
        return .none
    }

    /// The socket is connected; `tls`: the endpoint is https://, a handshake comes first.
    public mutating func connected(at now: Instant, tls: Bool = false) -> Action {
        guard case .connecting = state else { return .none }
        if tls {
            state = .handshaking(deadline: now + connectTimeout)
            return .startHandshake
        }
        state = .awaitingSettings(deadline: now + connectTimeout)
        return .startSession
    }

    /// The TLS handshake is done and ALPN chose h2.
    public mutating func handshakeDone(at now: Instant) -> Action {
        guard case .handshaking = state else { return .none }
        state = .awaitingSettings(deadline: now + connectTimeout)
        return .startSession
    }

    /// The TLS handshake failed (or ALPN did not choose h2).
    public mutating func handshakeFailed(_ why: String) -> Action {
        guard case .handshaking = state else { return .none }
        return close(.tlsFailed(why))
    }

    /// The connect failed.
    public mutating func connectFailed(_ why: String) -> Action { close(.connectFailed(why)) }

    /// A SETTINGS frame (not an ACK) came from the server, with its
    /// SETTINGS_MAX_CONCURRENT_STREAMS as nghttp2 now applies it.
    public mutating func settings(maxStreams: Int) -> Action {
        switch state {
        case .awaitingSettings:
            state = .ready
            return .ready(maxStreams: maxStreams)
        case .ready, .draining: return .capacityChanged(maxStreams: maxStreams)
        default: return .none
        }
    }

    /// The server sent GOAWAY.
    public mutating func goaway() -> Action {
        switch state {
        case .ready:
            state = .draining
            return .draining
        case .awaitingSettings: return close(.protocolError("GOAWAY before SETTINGS"))
        default: return .none
        }
    }

    /// The server closed, a read or write failed, or the session ended on a protocol error.
    public mutating func failed(_ reason: CloseReason) -> Action { close(reason) }

    /// The pool closes it.
    public mutating func closeRequested() -> Action { close(.closedByPool) }

    /// The timer ran: a connect or SETTINGS deadline passed.
    public mutating func timer(at now: Instant) -> Action {
        switch state {
        case let .connecting(deadline) where now >= deadline:
            return close(resolvingName.map { .resolveTimeout($0) } ?? .connectTimeout)
        case let .handshaking(deadline) where now >= deadline: return close(.handshakeTimeout)
        case let .awaitingSettings(deadline) where now >= deadline: return close(.settingsTimeout)
        case .ready, .draining:
            if let pingDeadline, now >= pingDeadline { return close(.pingTimeout) }
            return .none
        default: return .none
        }
    }

    private mutating func close(_ reason: CloseReason) -> Action {
        if case .closed = state { return .none }
        state = .closed(reason)
        return .close(reason)
    }
}

/// Why a try got no connection: the words it is told, and whether TLS
/// failed (a certificate or protocol mismatch: not transient, so not
/// retried, as libcurl's TLS failures are not).
public struct HTTP2ConnectFailure: Sendable, Equatable, ExpressibleByStringLiteral, CustomStringConvertible {
    public var why: String
    public var tls: Bool

    public init(_ why: String, tls: Bool = false) {
        self.why = why
        self.tls = tls
    }

    public init(stringLiteral why: String) { self.init(why) }

    public var description: String { why }
}
