/// One try carried as a stream of an HTTP/2 upstream connection, from the
/// pool's queue to its end. Pure: the driver (`HTTP2UpstreamStream`) hands
/// the response to the try's handler and performs the actions.
///
/// What it decides:
/// - **Flow control follows the reader.** A DATA chunk goes to the handler
///   only while it takes bytes; a chunk it refuses (its client is full),
///   and every later one, is held, and the stream's receive window is given
///   back (`consume`) only for bytes the handler took. So a stalled client
///   holds at most the stream's window (64 KiB) here, and the upstream stops.
/// - **The end waits for the held bytes.** A response that ended while bytes
///   are held finishes once they are taken; a failed one finishes at once.
/// - **Each try finishes exactly once**, and nothing reaches its handler after.
public struct HTTP2ClientStreamStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        /// In the pool's queue, no stream yet.
        case waiting
        /// Submitted on a connection (HEADERS queued or sent).
        case open
        case finished
    }

    /// How the try ended.
    public enum Outcome: Sendable, Equatable {
        /// The whole response arrived.
        case complete
        /// The server refused the stream (REFUSED_STREAM, or its id was
        /// above a GOAWAY's last): never processed, safe to send again.
        case refused
        /// The server reset the stream with this code (it answered: it is alive).
        case resetByPeer(UInt32)
        /// The response was not valid (a head refused by the handler, or
        /// one nghttp2 found malformed and reset).
        case badResponse(String)
        /// The connection was lost or failed under the stream.
        case connectionLost(String)
        /// No byte either way for the try's idle timeout (`limits.client_timeout`)
        /// while the proxy was not holding it back.
        case timedOut
        /// The connection was lost before the stream's HEADERS went out:
        /// never processed, safe to send again.
        case unsent(String)
        /// No connection could be had: the request never left.
        case noConnection(String)
        /// The TLS handshake failed (the certificate, or no h2 in ALPN): the request never left.
        case tlsFailed(String)
    }

    public enum Action: Sendable, Equatable {
        case none
        /// Hand the chunk to the handler (`delivered` says whether it took it).
        case deliver
        /// Keep the chunk behind the held ones; nothing is consumed.
        case hold
        /// Give `n` bytes of window back to the server.
        case consume(Int)
        /// Hand the held bytes to the handler on the loop's next pass.
        case deliverHeldSoon
        /// The try ended: tell its handler (once).
        case finish(Outcome)
        /// Reset the stream (RST_STREAM with `code`); the try has ended
        /// (with `outcome`, told to the handler if not nil).
        case reset(code: UInt32, outcome: Outcome?)
        /// Take the try out of the pool's queue (it had no stream yet).
        case withdraw
        /// The stream was refused unprocessed: the try goes back to the
        /// pool's queue, first, for another stream (RFC 9113 section 8.7).
        case replay
    }

    /// Streams refused unprocessed that a try sends again itself, inside
    /// the transport (a rolling restart may refuse twice: a GOAWAY, then the
    /// next connection's). Past them the try fails as never sent.
    public static let maxReplays = 2

    public private(set) var state: State = .waiting
    /// The handler refused a chunk, or the exchange paused receiving.
    public private(set) var paused = false
    /// Bytes held for the handler.
    public private(set) var held = 0
    /// The response ended while bytes were held: told once they are taken.
    public private(set) var endedWithHeld = false
    /// The final head arrived (a 1xx does not count).
    public private(set) var headComplete = false
    /// Times the try was sent again after a refusal.
    public private(set) var replays = 0

    public init() {}

    /// The pool gave the try a stream.
    public mutating func assigned() {
        if state == .waiting { state = .open }
    }

    /// The final head is complete; `refusal` is the handler's reason to refuse it.
    public mutating func headEnded(refusal: String?) -> Action {
        guard state == .open else { return .none }
        headComplete = true
        guard let refusal else { return .none }
        state = .finished
        return .reset(code: HTTP2ErrorCode.cancel.rawValue, outcome: .badResponse(refusal))
    }

    /// A DATA chunk of `count` bytes arrived.
    public mutating func data(_ count: Int) -> Action {
        guard state == .open else { return .consume(count) }  // nobody wants it: window back
        if paused || held > 0 {
            held &+= count
            return .hold
        }
        return .deliver
    }

    /// The handler took the delivered chunk (true) or refused it (false: it is held).
    public mutating func delivered(_ count: Int, taken: Bool) -> Action {
        guard state == .open else { return .consume(count) }
        if taken { return .consume(count) }
        paused = true
        held &+= count
        return .hold
    }

    /// The exchange stops receiving (its client is full).
    public mutating func pause() {
        if state == .open { paused = true }
    }

    /// The exchange goes on receiving.
    public mutating func resume() -> Action {
        guard state == .open, paused else { return .none }
        paused = false
        if held > 0 { return .deliverHeldSoon }
        if endedWithHeld { return finish(.complete) }
        return .none
    }

    /// The held bytes were handed to the handler: it took them all (true) or none.
    public mutating func heldDelivered(taken: Bool) -> Action {
        guard state == .open, held > 0 else { return .none }
        guard taken else {
            paused = true
            return .none
        }
        let n = held
        held = 0
        // A closed stream's window is moot.
        return endedWithHeld ? finish(.complete) : .consume(n)
    }

    /// The stream closed (nghttp2's `on_stream_close`), or its connection
    /// went. `canResend`: nothing of the response reached the handler and
    /// the request body can be sent again from its first byte.
    public mutating func closed(_ outcome: Outcome, canResend: Bool = false) -> Action {
        guard state == .open else { return .none }
        switch outcome {
        case .refused, .unsent:
            guard canResend, !headComplete, replays < Self.maxReplays else { break }
            replays += 1
            state = .waiting
            paused = false
            held = 0
            return .replay
        default: break
        }
        if outcome == .complete, held > 0 {
            endedWithHeld = true
            return .none
        }
        return finish(outcome)
    }

    /// The exchange no longer wants the try (a client reset, a deadline, a hedge lost).
    public mutating func cancel() -> Action {
        switch state {
        case .waiting:
            state = .finished
            return .withdraw
        case .open:
            state = .finished
            if endedWithHeld { return .none }  // the stream is already closed
            return .reset(code: HTTP2ErrorCode.cancel.rawValue, outcome: nil)
        case .finished: return .none
        }
    }

    /// No byte moved either way for the idle timeout. A stream the proxy
    /// paused (its client is slow) is never idle: the wait is not the upstream's.
    public mutating func idle() -> Action {
        guard state == .open, !paused, held == 0, !endedWithHeld else { return .none }
        state = .finished
        return .reset(code: HTTP2ErrorCode.cancel.rawValue, outcome: .timedOut)
    }

    /// The pool could not give it a connection.
    public mutating func failedWaiting(_ failure: HTTP2ConnectFailure) -> Action {
        guard state == .waiting else { return .none }
        return finish(failure.tls ? .tlsFailed(failure.why) : .noConnection(failure.why))
    }

    private mutating func finish(_ outcome: Outcome) -> Action {
        state = .finished
        return .finish(outcome)
    }
}
