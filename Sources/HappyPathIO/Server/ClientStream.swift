import HappyPathCore

/// One client request's stream on its transport: what `HTTPRequest` reads
/// the request from and writes the answer to. The HTTP/1.1 connection is
/// one (`HTTPConnection`, carrying one request at a time); an HTTP/2 stream
/// is meant to be the next. It is async-http-client's `HTTPRequestExecutor`
/// seen from a server: the request holds "a stream that reads, writes and
/// is told when to stop", and nothing of the wire. Back the other way, the
/// stream tells the request that its client left (`HTTPRequest.streamCancelled`)
/// or that its output is written (`streamDrained`), as the executor calls
/// its `HTTPExecutableRequest`.
///
/// Each call names the request, as the executor's calls name their task:
/// a stream acts only for the request it carries now, so a late upstream
/// callback never reads or writes another request's bytes; for any other
/// request a call does nothing and reads as empty.
///
/// The framing is the stream's: `writeHead` gives the status and, if known,
/// the body's length; the stream decides how the body is delimited (HTTP/1.1:
/// `Content-Length`, chunked or the close; HTTP/2: DATA frames and
/// END_STREAM), whether a body may follow at all (HEAD, 1xx, 204, 304),
/// how much of `writeBodyPart` goes out (never more than announced), and
/// what an `end` short of the announced length means (a broken answer).
///
/// On the loop's thread.
public protocol ClientStream: AnyObject {
    // MARK: - The request

    /// The request's method (nil: `request` is not this stream's now).
    func method(of request: HTTPRequest) -> String?
    /// Its path and query in origin form, the path normalized (no
    /// dot-segments, unreserved characters decoded: docs/http1.md,
    /// "Paths"); `*` for `OPTIONS *`.
    func target(of request: HTTPRequest) -> String?
    /// What else is known of its head.
    func head(of request: HTTPRequest) -> ClientRequestHead?
    /// Calls `body` with each field, in arrival order, as bytes valid only
    /// during the call.
    func forEachField(
        of request: HTTPRequest, _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void)
    /// The fields a `Connection` field names, by index in `forEachField` order.
    func nominatedFields(of request: HTTPRequest) -> [Bool]
    /// The whole body (read before the request is served), handed over once.
    func takeBody(of request: HTTPRequest) -> RequestBody
    /// The body as it streams, for a request handed over at its head (an
    /// HTTP/2 request the delegate lets stream: `HTTPServerDelegate.streamsBody`);
    /// nil when `takeBody` has it whole.
    func takeBodyStream(of request: HTTPRequest) -> RequestBodyStream?
    /// Reading resumes for a request whose body the delegate held
    /// (`HTTPServerDelegate.holdsBody`, which paused it at the head): its
    /// body is read, then the request is served.
    func resumeReading(for request: HTTPRequest)
    /// The client's address, as text.
    var peerAddress: String { get }
    /// The address the client reached, as text.
    var localAddress: String { get }
    /// The protocol the request came in (`HTTP/1.0`, `HTTP/1.1`, `HTTP/2`),
    /// for the access log.
    func protocolName(of request: HTTPRequest) -> StaticString

    // MARK: - The answer

    /// Adds a field to the answer's head, copied (`content-length` and
    /// `transfer-encoding` are dropped: the framing is the stream's).
    func stageField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest)
    /// Adds a trailer field, sent after the body at `end` (copied). HTTP/2:
    /// the final HEADERS frame. HTTP/1.1: in the last chunk, only when the
    /// answer is chunked and the client sent `TE: trailers`; else dropped.
    func stageTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest)
    /// Forgets the fields staged so far (a new try starts clean).
    func clearStagedFields(for request: HTTPRequest)
    /// Drops the staged fields that `connectionValue` (an upstream's own
    /// `Connection` field) names.
    func removeStagedFields(nominatedBy connectionValue: UnsafeRawBufferPointer, for request: HTTPRequest)
    /// An informational answer (102 to 199) at once, ahead of the final
    /// one and never after it started: `fields` are `Name: value` lines,
    /// each ending in CRLF (as an upstream's 1xx block arrives). A client
    /// that cannot take one gets nothing.
    func writeInformational(status: Int, fields: UnsafeRawBufferPointer, for request: HTTPRequest)
    /// The answer's head: `status`, the staged fields and the stream's
    /// framing for `contentLength` (nil: not known). It may wait for the
    /// first body part, to leave with it. `reason`: the upstream's own
    /// reason phrase, when it is not the standard one (field-value bytes).
    func writeHead(status: Int, contentLength: Int?, reason: [UInt8]?, for request: HTTPRequest)
    /// Body bytes of the answer. With `notifyWhenDrained`, the request hears
    /// `streamDrained` once everything queued so far is written.
    func writeBodyPart(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool, for request: HTTPRequest)
    /// A whole answer at once (head, staged fields, `body`), then `end`.
    /// False if `request` is not this stream's now (nothing happened).
    func writeWhole(status: Int, body: UnsafeRawBufferPointer, for request: HTTPRequest) -> Bool
    /// The answer is complete: the stream moves on. An answer shorter than
    /// its announced length is broken off instead (`cancel`). False if
    /// `request` is not this stream's now (nothing happened).
    func end(_ request: HTTPRequest) -> Bool
    /// Breaks the answer off (an upstream body cut short: the client must
    /// see a broken answer, not a complete one), without telling the request.
    /// Nothing for a request this stream does not carry now.
    func cancel(_ request: HTTPRequest)
    /// Bytes of the answer queued and not yet taken by the client.
    func pendingOutput(for request: HTTPRequest) -> Int
    /// Answer bytes the client's connection may still queue before the
    /// answer must wait for it (`limits.connection_buffer`, all streams of
    /// an HTTP/2 connection together); 0 or less: wait now (`writeBodyPart`
    /// with nothing and `notifyWhenDrained`), 0 for a request not carried now.
    func outputRoom(for request: HTTPRequest) -> Int
    /// The answer started may be read ahead of the client into a spool file
    /// (`limits.read_ahead`): past the connection's bound its bytes go to
    /// disk instead of waiting in the upstream transfer. Not for answers
    /// that must keep the client's pace (event streams, gRPC calls).
    func permitReadAhead(for request: HTTPRequest)
    /// The request's head was refused at the edge (its fields are not
    /// kept) and was a gRPC call's: its refusal is a gRPC status.
    func isRefusedGRPCCall(_ request: HTTPRequest) -> Bool
    /// An HTTP/2 extended CONNECT's `:protocol` (RFC 8441); nil for any other request.
    func connectProtocol(of request: HTTPRequest) -> String?
}

extension ClientStream {
    public func takeBodyStream(of request: HTTPRequest) -> RequestBodyStream? { nil }
    public func isRefusedGRPCCall(_ request: HTTPRequest) -> Bool { false }
    public func permitReadAhead(for request: HTTPRequest) {}
    public func connectProtocol(of request: HTTPRequest) -> String? { nil }
}

/// What `HTTPRequest` knows of a request's head besides its method, target
/// and fields, in terms every transport has.
public struct ClientRequestHead: Sendable, Equatable {
    /// `OPTIONS *` (a target of `*`, not a path).
    public var isAsteriskForm: Bool
    /// The head's size as received (HTTP/1.1: the request line and fields).
    public var size: Int
    /// A `Connection` field names other fields, which are hop-by-hop then
    /// (never in HTTP/2, which has no `Connection` field).
    public var connectionNominatesFields: Bool
    /// The request came over TLS.
    public var isSecure: Bool

    public init(isAsteriskForm: Bool, size: Int, connectionNominatesFields: Bool, isSecure: Bool) {
        self.isAsteriskForm = isAsteriskForm
        self.size = size
        self.connectionNominatesFields = connectionNominatesFields
        self.isSecure = isSecure
    }
}
