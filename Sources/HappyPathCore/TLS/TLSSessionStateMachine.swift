/// Why a TLS handshake did not complete (the `reason` of
/// `happypath_tls_handshake_failures_total`).
public enum TLSHandshakeFailure: String, Sendable, CaseIterable {
    /// Not done within `limits.client_timeout` (a trickled or stalled ClientHello).
    case timeout
    /// Plain HTTP sent to a TLS listener.
    case httpRequest = "http_request"
    /// Not TLS at all, or a version below `min_version`.
    case version
    case noSharedCipher = "no_shared_cipher"
    /// The client offers ALPN protocols, none of them http/1.1.
    case alpn
    /// The client hung up during the handshake.
    case closed
    /// A ClientHello that declares more than 16 KiB, refused on its first bytes.
    case tooLarge = "too_large"
    /// Anything else the client got wrong.
    case `protocol`
}

/// The TLS layer of one client connection, before HTTP starts: the
/// handshake, driven step by step by the socket's readiness, bounded by one
/// deadline. Pure: the driver (`HTTPConnection`) makes the OpenSSL calls
/// and reports what they returned; this decides what happens next.
public struct TLSSessionStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        case idle
        case handshaking
        case established(version: Int)
        case failed(TLSHandshakeFailure)
    }

    /// What a handshake step returned.
    public enum StepResult: Sendable, Equatable {
        case done(version: Int)
        case wantRead
        case wantWrite
        case failed(TLSHandshakeFailure)
    }

    public enum Step: Sendable, Equatable {
        case none
        /// Call the handshake again.
        case handshake
        /// The handshake is done: HTTP starts (its own waits and timers).
        case startHTTP(version: Int)
        /// Close the connection; the failure is counted.
        case close(TLSHandshakeFailure)
    }

    public struct Actions: Sendable, Equatable {
        /// Arm the handshake deadline (true) or cancel it (false).
        public var deadline: Bool?
        /// Watch the socket for writing (the handshake's output waits for room).
        public var writeInterest: Bool?
        public var step: Step

        public init(deadline: Bool? = nil, writeInterest: Bool? = nil, step: Step = .none) {
            self.deadline = deadline
            self.writeInterest = writeInterest
            self.step = step
        }
    }

    public private(set) var state: State = .idle

    public init() {}

    public var isEstablished: Bool {
        if case .established = state { return true }
        return false
    }

    /// The connection was accepted: the deadline starts, and the first
    /// step runs (the ClientHello may already be there).
    public mutating func start() -> Actions {
        guard state == .idle else { return Actions() }
        state = .handshaking
        return Actions(deadline: true, step: .handshake)
    }

    /// The socket is readable or writable during the handshake.
    public mutating func socketReady() -> Actions {
        guard state == .handshaking else { return Actions() }
        return Actions(step: .handshake)
    }

    public mutating func stepped(_ result: StepResult) -> Actions {
        guard state == .handshaking else { return Actions() }
        switch result {
        case .wantRead:
            return Actions(writeInterest: false)
        case .wantWrite:
            return Actions(writeInterest: true)
        case let .done(version):
            state = .established(version: version)
            return Actions(deadline: false, writeInterest: false, step: .startHTTP(version: version))
        case let .failed(reason):
            state = .failed(reason)
            return Actions(deadline: false, writeInterest: false, step: .close(reason))
        }
    }

    /// The deadline passed.
    public mutating func deadlinePassed() -> Actions {
        guard state == .handshaking else { return Actions() }
        state = .failed(.timeout)
        return Actions(deadline: false, writeInterest: false, step: .close(.timeout))
    }
}
