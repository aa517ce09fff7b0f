import HappyPathCore

/// A client request received by `HTTPServer`, valid until it is answered.
///
/// It knows its transport only as a `ClientStream`: the request is read
/// from the stream (its head stays in the stream's buffers until the answer
/// is complete) and the answer written to it, which frames it. After the
/// answer, and after the client is gone, every method here is a no-op, so a
/// late upstream callback cannot write into another request's answer.
public final class HTTPRequest {
    /// The request's transport, kept for the request's life: a `let`, so a
    /// call through it costs no retain and release (a `var` would, as the
    /// call could clear it), which on the hot path is most of a call's cost.
    /// The stream acts only for the request it carries now, so after the
    /// answer every call through it is a no-op. It ends the cycle with the
    /// request when it lets go of it (after the answer, at its close).
    private let stream: any ClientStream
    /// Not yet answered, aborted, or taken out of HTTP.
    private var open = true
    /// The request's handler, held until the request is answered or
    /// aborted (then dropped, which ends the handler ↔ request cycle). Not
    /// weak: a weak reference would move the handler's reference counts to
    /// a side table, slowing every retain and release of it.
    public var observer: HTTPRequestObserver?
    private var lostReported = false
    /// The delegate was asked whether it holds this head's body (`holdsBody`).
    var screened = false
    /// Free for the delegate: what it decided at the head, before the body
    /// was read (a rate limit's token taken then), for when it serves the
    /// request.
    public var headDecision: AnyObject?
    /// Set by the delegate when it lets the body stream
    /// (`HTTPServerDelegate.streamsBody`): false when the request can never
    /// be sent twice once it began, so no copy is kept for a replay.
    public var keepsStreamedBody = true
    private var cachedMethod: String?
    private var cachedTarget: String?

    /// A request that `stream` carries (its transport makes it).
    public init(stream: any ClientStream) { self.stream = stream }

    // MARK: - Request

    public var method: String {
        if let cachedMethod { return cachedMethod }
        guard let m = stream.method(of: self) else { return "GET" }
        cachedMethod = m
        return m
    }

    /// Path and query, in origin form: an absolute-form target's authority
    /// is dropped (it is never used for routing); `*` for `OPTIONS *`. The
    /// path is the normalized one (no dot-segments, unreserved characters
    /// decoded: docs/http1.md, "Paths"), which routes match and upstreams receive.
    public var target: String {
        if let cachedTarget { return cachedTarget }
        guard let t = stream.target(of: self) else { return "/" }
        cachedTarget = t
        return t
    }

    public var isAsteriskForm: Bool { stream.head(of: self)?.isAsteriskForm ?? false }

    /// Size of the request head as received (request line and fields).
    public var headBytes: Int { stream.head(of: self)?.size ?? 0 }

    /// Whether `Connection` names other fields (they are hop-by-hop then).
    public var connectionNominatesFields: Bool { stream.head(of: self)?.connectionNominatesFields ?? false }

    /// Calls `body` with each request field, in arrival order, as bytes in
    /// the stream's buffer (valid only during the call): no copy per field.
    public func forEachRawHeader(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void) {
        stream.forEachField(of: self, body)
    }

    /// Each request field as strings, in arrival order.
    public func forEachHeader(_ body: (_ name: String, _ value: String) -> Void) {
        forEachRawHeader { name, value in
            body(String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self))
        }
    }

    /// The first value of the field `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        var found: String?
        var wanted = name
        wanted.withUTF8 { w in
            let wanted = UnsafeRawBufferPointer(w)
            forEachRawHeader { n, v in
                if found == nil, n.count == wanted.count, HTTPBytes.equalsIgnoringCase(n, wanted) {
                    found = String(decoding: v, as: UTF8.self)
                }
            }
        }
        return found
    }

    /// The fields that a `Connection` header of this request names, by
    /// index in `forEachRawHeader` order (linear in the head's size).
    public func nominatedFields() -> [Bool] { stream.nominatedFields(of: self) }

    /// The client's address, as text.
    public var peerAddress: String { open ? stream.peerAddress : "" }

    /// The address the client connected to, as text (the listener's own,
    /// or the interface's for a wildcard listener).
    public var localAddress: String { open ? stream.localAddress : "" }

    /// The protocol the request came in: `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    public var protocolName: StaticString { stream.protocolName(of: self) }

    /// A gRPC call whose head the edge refused (`ClientStream.isRefusedGRPCCall`).
    public var isRefusedGRPCCall: Bool { stream.isRefusedGRPCCall(self) }

    /// The whole request body (read before `serve`), handed over once.
    public func takeBody() -> RequestBody { stream.takeBody(of: self) }
    /// The body as it streams (nil: `takeBody` has it whole); see `ClientStream.takeBodyStream`.
    public func takeBodyStream() -> RequestBodyStream? { stream.takeBodyStream(of: self) }

    // MARK: - Whole replies

    /// Sends a complete response (the staged headers, then `headers`) and
    /// releases the request.
    public func reply(status: Int, headers: [HTTPField] = [], body: String? = nil) {
        guard open else { return }
        stageAnswerFields()
        for field in headers { addResponseHeader(field.name, field.value) }
        var body = body ?? ""
        let written = body.withUTF8 { stream.writeWhole(status: status, body: UnsafeRawBufferPointer($0), for: self) }
        if written { release() }
    }

    /// Fields every answer to this request carries, whoever writes it (the
    /// upstream's answer, a problem, a kept answer) and however many tries
    /// cleared the staged ones: a route's CORS fields. Empty: none.
    public var answerFields: [HTTPField] = []

    /// A gRPC-Web call on a `grpc:` route (set by the worker when the
    /// route is found): the exchange calls the upstream as gRPC and answers
    /// in this mode. Nil for every other request.
    public var grpcWeb: GRPCWeb.Mode?

    private func stageAnswerFields() {
        for field in answerFields { addResponseHeader(field.name, field.value) }
    }

    // MARK: - Streamed replies

    /// Forgets every response header staged so far (a new try starts clean).
    public func clearResponseHeaders() { stream.clearStagedFields(for: self) }

    public func addResponseHeader(_ name: String, _ value: String) {
        var name = name
        var value = value
        name.withUTF8 { n in
            value.withUTF8 { v in
                stream.stageField(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v), for: self)
            }
        }
    }

    /// Stages a header from raw bytes (as libcurl hands them over), copied.
    public func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        stream.stageField(name: name, value: value, for: self)
    }

    /// Stages a trailer field from raw bytes, copied: the stream sends it
    /// after the body if its client can take it (`ClientStream.stageTrailer`).
    public func addResponseTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        stream.stageTrailer(name: name, value: value, for: self)
    }

    /// Drops the staged headers that a `Connection` value names
    /// (an upstream's own hop-by-hop fields).
    public func removeResponseHeaders(nominatedBy connectionValue: UnsafeRawBufferPointer) {
        stream.removeStagedFields(nominatedBy: connectionValue, for: self)
    }

    /// Stages the status line and headers; they leave with the first body
    /// bytes. The framing is the stream's (`ClientStream.writeHead`):
    /// HEAD, 1xx, 204 and 304 answers carry no body.
    /// - Parameter reason: the upstream's own reason phrase, when it is not
    ///   the standard one (checked by the caller: field-value bytes only).
    public func startReply(status: Int, contentLength: Int? = nil, reason: [UInt8]? = nil) {
        stageAnswerFields()
        stream.writeHead(status: status, contentLength: contentLength, reason: reason, for: self)
    }

    /// Writes an informational answer (`103 Early Hints` and the like) at
    /// once, ahead of the final one: `fields` are `Name: value\r\n` lines.
    /// Not to a client that does not know 1xx (HTTP/1.0), and never once
    /// the final answer has started.
    public func sendInformational(status: Int, fields: UnsafeRawBufferPointer) {
        stream.writeInformational(status: status, fields: fields, for: self)
    }

    /// Writes body bytes. With `notifyWhenDrained`, the observer hears
    /// `requestOutputDrained` once everything queued so far is written.
    public func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool = false) {
        stream.writeBodyPart(bytes, notifyWhenDrained: notifyWhenDrained, for: self)
    }

    /// Bytes queued for the client and not yet written.
    public var pendingOutput: Int { stream.pendingOutput(for: self) }

    /// Answer bytes the client's connection may still queue (all its
    /// streams together); 0 or less: the answer waits for the client.
    public var outputRoom: Int { stream.outputRoom(for: self) }

    /// The answer started may be read ahead of the client into a spool
    /// file (`ClientStream.permitReadAhead`).
    public func permitReadAhead() { stream.permitReadAhead(for: self) }

    /// Finishes a streamed reply and releases the request. A body shorter
    /// than its announced length cannot end well: the stream breaks it off.
    public func endReply() {
        guard open, stream.end(self) else { return }
        release()
    }

    /// A head held by the delegate (`HTTPServerDelegate.holdsBody`): its
    /// body is read now, then the request is served as usual.
    public func readBody() { stream.resumeReading(for: self) }

    /// Drops the client connection without completing the response (the
    /// body was cut short upstream: the client must see a broken response,
    /// not a complete one). Releases the request.
    public func abort() {
        // A request that left HTTP (a tunnel's, whose end observes it now) keeps its observer.
        guard open else { return }
        observer = nil
        open = false
        stream.cancel(self)
    }

    private func release() {
        observer = nil
        open = false
    }

    // MARK: - From the stream

    /// The client is gone (closed, reset, or stopped reading): told once.
    public func streamCancelled() {
        guard !lostReported else { return }
        lostReported = true
        observer?.requestClientClosed(self)
    }

    /// Everything queued with `notifyWhenDrained` is written.
    public func streamDrained() { observer?.requestOutputDrained(self) }

    /// The connection is full: the answer waits (`requestOutputMustWait`).
    public func streamMustWait() { observer?.requestOutputMustWait(self) }

    // MARK: - Leaving HTTP

    /// The request came over a TLS listener (`X-Forwarded-Proto: https`).
    public var arrivedOverTLS: Bool { stream.head(of: self)?.isSecure ?? false }

    /// An HTTP/2 extended CONNECT's protocol (`websocket`, RFC 8441): the
    /// stream asks to become a tunnel. Nil for every other request.
    /// (HTTP/1.1 pays one call that answers nil.)
    public var connectProtocol: String? { stream.connectProtocol(of: self) }

    /// The stream, when it is an HTTP/1.1 connection carrying this request
    /// (a dynamic cast: only the few requests that may leave HTTP pay it):
    /// only there can a request leave HTTP (a `101`, a socket handed over).
    private var http1: HTTPConnection? {
        guard let connection = stream as? HTTPConnection, connection.carries(self) else { return nil }
        return connection
    }

    /// The request is HTTP/1.1 (an upgrade needs it).
    public var isHTTP11: Bool { http1?.speaksHTTP11 ?? false }

    /// Answers `101 Switching Protocols` with `fields` and turns the
    /// connection into the client end of a tunnel to `upstream`, which the
    /// returned tunnel now owns (it closes both; it may be closed already,
    /// if the client went away as it opened). The request is answered.
    /// Nil if the client is gone (then `upstream` is the caller's to close).
    /// An HTTP/2 extended CONNECT (`connectProtocol`) is answered `200`
    /// instead, and its stream becomes the tunnel's client end (RFC 8441).
    public func switchProtocols(
        fields: [HTTPField], to upstream: UpstreamUpgrade, limits: Tunnel.Machine.Limits, now: @escaping () -> Instant
    ) -> Tunnel? {
        guard let c = http1 else {
            guard open, let h2 = stream as? HTTP2Stream else { return nil }
            guard let tunnel = h2.startTunnel(self, fields: fields, upstream: upstream, limits: limits, now: now) else {
                return nil
            }
            // The request is the tunnel's now: the exchange's end of it does nothing.
            open = false
            return tunnel
        }
        observer = nil
        open = false
        var head = "HTTP/1.1 101 Switching Protocols\r\n"
        for field in fields { head += "\(field.name): \(field.value)\r\n" }
        head += "\r\n"
        return head.withUTF8 {
            c.startTunnel(self, head: UnsafeRawBufferPointer($0), upstream: upstream, limits: limits, now: now)
        }
    }

    /// Takes the connection out of HTTP: the server stops reading, writing
    /// and timing it, forgets it, and returns its socket (non-blocking),
    /// which the caller now owns and must close. For a protocol that takes
    /// over after a request (a `101 Switching Protocols` upgrade, a
    /// `CONNECT` tunnel), or a test peer that must misbehave below HTTP.
    /// Call it before any answer was started: bytes already read past this
    /// request (pipelined ones) are dropped. Nil if the request is no
    /// longer its connection's current one (or not on HTTP/1.1); the
    /// request is answered either way.
    public func takeOverConnection() -> Int32? {
        guard let c = http1 else { return nil }
        open = false
        return c.detach(self)
    }
}

/// What a request tells the code answering it, on the loop's thread.
public protocol HTTPRequestObserver: AnyObject {
    /// The client connection closed (or reset) before the answer was
    /// complete. May be called from inside a write: defer real work to the
    /// next loop pass.
    func requestClientClosed(_ request: HTTPRequest)
    /// Everything queued with `notifyWhenDrained` has been written.
    func requestOutputDrained(_ request: HTTPRequest)
    /// The client's connection is full (`limits.connection_buffer`, its
    /// other streams' answers too): stop feeding it now, before the next
    /// bytes come; `requestOutputDrained` follows when it has room. Called
    /// on a loop pass of its own, never from inside an upstream's callback.
    func requestOutputMustWait(_ request: HTTPRequest)
}

extension HTTPRequestObserver {
    public func requestOutputMustWait(_ request: HTTPRequest) {}
}
