import HappyPathCore

/// One client session and its tries driven in memory, as
/// `HTTP2UpstreamConnection` drives them minus the socket and the pool:
/// the fuzz target `FuzzHTTP2Client` feeds it an upstream's bytes and
/// checks what the tries' handlers hear. A try refused unprocessed is
/// submitted again on the same session (as the pool would on a connection
/// with room). On one thread; the loop it makes is never run (`runSoon`
/// does the client's next pass by hand).
public final class HTTP2ClientSessionDriver {
    private let session: HTTP2ClientSession
    /// What the tries ask of their connection, done on the session.
    private let carrier: HTTP2SessionCarrier
    private let client: HTTP2UpstreamClient
    private var fields = HTTP2RequestFields()
    /// Every try started, in order.
    private var tries: [HTTP2UpstreamStream] = []
    /// Tries sent again after a refusal.
    public private(set) var replays = 0
    /// The session ended (a fatal error).
    public private(set) var ended = false

    /// The loop and client every driver shares (one thread): making an
    /// event base per fuzz input would cost more than the input.
    nonisolated(unsafe) private static var shared: (EventLoop, HTTP2UpstreamClient)?

    public init(limits: HTTP2ClientLimits) throws(HTTP2SessionError) {
        session = try HTTP2ClientSession(limits: limits)
        carrier = HTTP2SessionCarrier(session)
        if Self.shared == nil {
            let loop = EventLoop()
            Self.shared = (loop, HTTP2UpstreamClient(loop: loop, clock: { Instant(nanoseconds: 0) }))
        }
        client = Self.shared!.1
    }

    deinit { end() }

    /// Ends every try (their handlers are not told) and lets go of them.
    public func end() {
        for stream in tries {
            stream.cancel()
            stream.connection = nil
        }
        tries.removeAll()
        client.runSoon()
    }

    /// Streams the session holds.
    public var openStreams: Int { session.streams.count }
    /// Bytes held for try `i`'s handler.
    public func held(_ i: Int) -> Int { i < tries.count ? tries[i].held.count : 0 }
    /// The stream id try `i` has now (-1: none).
    public func streamID(_ i: Int) -> Int32 { i < tries.count ? tries[i].id : -1 }

    /// Starts a try: a GET, or a POST of `body`, to `/t`.
    public func start(body: [UInt8]?, handler: UpstreamResponseHandler) {
        var requestBody = RequestBody.empty
        if let body, !body.isEmpty {
            requestBody = RequestBody(count: body.count)
            body.withUnsafeBytes { requestBody.baseAddress?.copyMemory(from: $0.baseAddress!, byteCount: body.count) }
        }
        let request = UpstreamRequest(
            origin: "http://10.0.0.1:80/", target: "/t", method: body == nil ? "GET" : "POST",
            headers: HeaderBlock([HTTPField(name: "te", value: "trailers")]), body: requestBody, sendsBody: body != nil,
            connectTimeout: .seconds(1), idleTimeout: .seconds(30), httpVersion: .h2PriorKnowledge)
        let stream = HTTP2UpstreamStream(request: request, handler: handler, client: client, tryID: tries.count + 1)
        tries.append(stream)
        submit(stream)
    }

    private func submit(_ stream: HTTP2UpstreamStream) {
        stream.machine.assigned()
        guard stream.machine.state == .open else { return }
        stream.connection = carrier
        if session.submit(stream, scheme: "http", authority: "10.0.0.1", scratch: &fields) != nil {
            stream.connection = nil
            if stream.connectionLost("not submitted") == .ended { stream.tell() }
        }
    }

    /// The upstream's bytes, then what the turn left behind.
    public func receive(_ bytes: [UInt8]) {
        guard !ended else { return }
        if session.receive(bytes).error != nil { ended = true }
        settle()
        if ended { endAll() }
    }

    /// What the session has to send (consumed: the upstream's side is the fuzzer's).
    public func produce() -> Int {
        guard !ended else { return 0 }
        let n = session.produceAll().count
        if session.fatalError != nil { ended = true }
        settle()
        if ended { endAll() }
        return n
    }

    public func pause(_ i: Int) { if i < tries.count { tries[i].pauseReceiving() } }
    public func resume(_ i: Int) { if i < tries.count { tries[i].resume() } }
    public func cancel(_ i: Int) { if i < tries.count { tries[i].cancel() } }
    public func detach(_ i: Int) { if i < tries.count { tries[i].detach() } }

    /// The client's next pass: held bytes handed over again, ends told.
    public func runSoon() { client.runSoon() }

    private func settle() {
        session.settle(
            room: { _ in },
            replay: { stream in
                replays += 1
                submit(stream)
            })
    }

    /// The session is gone: every try on it ends, as when a connection closes.
    private func endAll() {
        let open = session.streams.values.sorted { $0.id < $1.id }
        session.streams.removeAll()
        for stream in open where stream.connectionLost("the session ended") == .ended { stream.tell() }
    }
}

/// A session alone as the carrier of its streams (no socket, no flush):
/// the in-memory driver's and the session tests'. It holds the session
/// unowned, so a stream (which holds its carrier) never keeps its session,
/// and the session's owner lets go of both.
final class HTTP2SessionCarrier: HTTP2StreamCarrier {
    /// Alive: the session's owner (the in-memory driver, the session tests) holds the session beside
    /// this carrier, and the driver's `end()` (also deinit) takes it from every try before the session goes.
    unowned let session: HTTP2ClientSession

    init(_ session: HTTP2ClientSession) { self.session = session }

    func reset(_ stream: HTTP2UpstreamStream, code: UInt32) {
        session.reset(stream.id, code: code)
        stream.connection = nil
    }

    func consume(_ stream: HTTP2UpstreamStream, _ n: Int) { session.consume(stream.id, n) }

    func resumeData(_ stream: HTTP2UpstreamStream) { session.resumeData(stream.id) }
}
