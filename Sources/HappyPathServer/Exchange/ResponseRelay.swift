import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// One try's response on its way to the client: held back or streamed, its
/// framing checked and rewritten, and the client's pace respected
/// (back-pressure: past the client connection's `limits.connection_buffer`,
/// all its streams together, the upstream transfer pauses). An error answer
/// (4xx, 5xx, or a status the route retries) is held while the exchange
/// decides what to do with it; its first 16 KiB are kept for
/// `upstream_body` and the error mappings.
struct ResponseRelay {
    enum Mode {
        /// No status yet.
        case waiting
        /// The response goes to the client as it arrives.
        case streaming
        /// An error answer, kept (its first `ErrorMapper.maxBody` bytes) until the try ends.
        case holding
    }

    private(set) var mode = Mode.waiting
    private(set) var status = 0
    /// The upstream's reason phrase, kept only when it is not the standard
    /// one for its status (so the usual answer allocates nothing for it).
    private(set) var reason: [UInt8]?
    /// The head arrived whole and passed the framing checks (libcurl may
    /// report a response cut short inside its head as complete).
    private(set) var headComplete = false
    /// The answer's `Retry-After` in whole seconds, read by `RetryAfter`
    /// and clamped to `retryAfterCap`: the field is passed on rewritten
    /// as this integer, or dropped when it is malformed (or a second one).
    private(set) var retryAfterSeconds: Int64?
    /// `retry.max_retry_after` of the route.
    var retryAfterCap = RetryAfter.defaultMax
    /// The wall clock, read only when a `Retry-After` date arrives.
    var clock: any Clock = MonotonicClock()
    /// The held answer's `RateLimit` field (pacing reads its reset).
    private(set) var rateLimit: String?
    private(set) var heldBody: [UInt8] = []
    private(set) var heldBodyComplete = true
    /// The held answer's end-to-end fields, in order (hop-by-hop and
    /// framing fields already dropped): what a problem keeps of them, or
    /// all of them when the answer is passed through.
    private(set) var heldFields: [HTTPField] = []
    /// A gRPC call's `grpc-status` values that `retry.on` names: its `200`
    /// heads are held until complete, and one that carries such a status
    /// (a Trailers-Only answer, nothing relayed) stays held for the retry
    /// rules (`heldForRetry`); any other goes to the client then. Empty for
    /// every other request.
    var grpcRetryStatuses: Set<GRPCStatus> = []
    /// The held answer is a gRPC call's Trailers-Only answer with a status `retry.on` names.
    private(set) var heldForRetry: GRPCStatus?
    private var holdingHeadForGRPC = false
    /// How much of a held body is kept: `ErrorMapper.maxBody` to build a
    /// problem from, `passHoldLimit` when the answer may go out whole.
    var holdLimit = ErrorMapper.maxBody
    /// `upstream_errors: pass`: a held answer (one the retry rules may act
    /// on) is forwarded whole if its body is at most this; a larger one
    /// becomes a problem body.
    static let passHoldLimit = 1 << 20
    /// Body bytes sent to the client.
    private(set) var bytesOut = 0
    /// Bytes of trailer fields passed on (name + value + 4 each), bounded
    /// by `limits.max_header_bytes`: past it the rest are dropped.
    private(set) var trailerBytes = 0
    /// A gRPC call's answer: its `grpc-status` is read as it passes (in
    /// the head or the trailers) for metrics and the access log, and tells
    /// the upstream's own gRPC error from a proxy-side failure. Off (and
    /// free) for every other request.
    var readsGRPCStatus = false
    /// What this try's answer said in `grpc-status` so far.
    private(set) var grpcStatus = GRPCStatusField.absent
    /// A gRPC call to an upstream whose `pacing.on` names
    /// `resource-exhausted`: its `grpc-status-details-bin` (head or
    /// trailers) is kept, at most `GRPCStatusDetails.maxFieldBytes`, for
    /// the `RetryInfo` in it. Off (and free) for every other request.
    var readsGRPCDetails = false
    private var grpcDetails: [UInt8]?
    /// A gRPC-Web call's answer (nil, and free, for any other request):
    /// its content type becomes gRPC-Web's, its trailers go in the body as
    /// the trailer frame, and in text mode every piece of the body is base64.
    var web: GRPCWebAnswer?
    /// Paused until the client's connection drains.
    private(set) var waitingForDrain = false
    /// The streamed answer's `content-type` is `text/event-stream`.
    private var eventStream = false
    var isEventStream: Bool { eventStream }
    /// The head is checked as it comes; its framing is the proxy's to write,
    /// never forwarded as it came (see `ResponseFraming`).
    private var framing = ResponseFraming()
    /// The upstream's `Connection` values naming fields: those fields are its
    /// own hop-by-hop fields and are dropped.
    private var upstreamConnection: [UInt8] = []
    /// The streamed answer as it went to the client, for
    /// `fallback.serve_stale` (nil unless the route keeps answers and the
    /// request is a GET: nothing is copied for other routes).
    var kept: KeptAnswer?

    /// What a streamed answer sent: its fields and body, copied once as they
    /// pass, as raw bytes (no strings are made), up to `limit` bytes
    /// (`limits.stale_max_entry`); a larger answer is given up on
    /// (`overflow`) and its bytes let go.
    struct KeptAnswer {
        let limit: Int
        var fields: KeptFields
        var body: [UInt8] = []
        var bytes = 0
        var overflow = false

        /// Room for the fields of a usual answer, so that copying them
        /// does not grow the array field by field (the slack is given back
        /// when the answer is kept: `StaleEntry`).
        static let fieldRoom = 128

        init(limit: Int) {
            self.limit = limit
            fields = KeptFields(capacity: Self.fieldRoom)
        }

        mutating func reset() {
            fields.removeAll(keepingCapacity: true)
            body.removeAll(keepingCapacity: true)
            bytes = 0
            overflow = false
        }

        mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            guard take(name.count + value.count) else { return }
            fields.append(name: name, value: value)
        }

        mutating func add(body bytes: UnsafeRawBufferPointer) {
            guard take(bytes.count) else { return }
            // The first chunk (often the whole body) makes the array at its size.
            if body.isEmpty { body = [UInt8](bytes) } else { body.append(contentsOf: bytes) }
        }

        private mutating func take(_ n: Int) -> Bool {
            guard !overflow else { return false }
            bytes += n
            if bytes > limit {
                overflow = true
                fields = KeptFields()
                body = []
                return false
            }
            return true
        }
    }

    /// A new try: forget the last one's response.
    mutating func reset() {
        mode = .waiting
        status = 0
        reason = nil
        headComplete = false
        retryAfterSeconds = nil
        rateLimit = nil
        trailerBytes = 0
        grpcStatus = .absent
        grpcDetails = nil
        web?.reset()
        heldForRetry = nil
        holdingHeadForGRPC = false
        framing = ResponseFraming()
        eventStream = false
        upstreamConnection.removeAll(keepingCapacity: true)
        kept?.reset()
    }

    /// The status line arrived: `hold` for answers the exchange must look at first.
    mutating func begin<C: ExchangeClient>(status: Int, reason: UnsafeRawBufferPointer, hold: Bool, to request: C) {
        self.status = status
        self.reason = Self.ownReason(reason, status: status)
        holdingHeadForGRPC = !hold && status == 200 && !grpcRetryStatuses.isEmpty
        if hold || holdingHeadForGRPC {
            mode = .holding
            heldBody.removeAll(keepingCapacity: true)
            heldFields.removeAll(keepingCapacity: true)
            heldBodyComplete = true
        } else {
            mode = .streaming
            request.clearResponseHeaders()
        }
    }

    mutating func header<C: ExchangeClient>(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, to request: C) {
        // Content-Length and Transfer-Encoding are the proxy's to write, and
        // a malformed field fails the head (reported when it is complete).
        guard framing.add(name: name, value: value) else { return }
        // The proxy's own two fields are added once, by the proxy: an
        // upstream's copy would stand first and be read instead.
        if name.count == 12, HTTPBytes.equals(name, "x-request-id") { return }
        if name.count == 20, HTTPBytes.equals(name, "x-happypath-attempts") { return }
        if HopByHop.isHopByHop(name) {
            if HTTPBytes.equals(name, "connection") {
                // Kept only if it names fields: `keep-alive` and `close` (the usual values) name none.
                var namesFields = false
                forEachListElement(value) { token in
                    if !HTTPBytes.equals(token, "keep-alive"), !HTTPBytes.equals(token, "close") { namesFields = true }
                }
                guard namesFields else { return }
                if !upstreamConnection.isEmpty { upstreamConnection.append(UInt8(ascii: ",")) }
                upstreamConnection.append(contentsOf: value)
            }
            return
        }
        if readsGRPCStatus { readGRPC(name: name, value: value) }
        // Only gRPC's own content type is translated: any other answer (a
        // load balancer's HTML 503) keeps its own, and is no gRPC-Web body.
        if let web, name.count == 12, HTTPBytes.equals(name, "content-type"), GRPCCall.isContentType(value) {
            web.translated = true
            var type = web.contentType
            return type.withUTF8 { header(known: name, value: UnsafeRawBufferPointer($0), to: request) }
        }
        if name.count == 11, HTTPBytes.equals(name, "retry-after") {
            // Never passed on as it came: a plain non-negative integer, at most the cap, or nothing.
            guard retryAfterSeconds == nil,
                let seconds = RetryAfter.seconds(value, nowUnixSeconds: clock.wallSeconds(), max: retryAfterCap)
            else { return }
            retryAfterSeconds = seconds
            var text = String(seconds)
            text.withUTF8 { header(known: name, value: UnsafeRawBufferPointer($0), to: request) }
            return
        }
        header(known: name, value: value, to: request)
    }

    /// A field that passed the checks, as the mode wants it.
    @inline(__always) private mutating func header<C: ExchangeClient>(
        known name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, to request: C
    ) {
        switch mode {
        case .streaming:
            request.addResponseHeader(name: name, value: value)
            kept?.add(name: name, value: value)
            if value.count >= 17, name.count == 12, HTTPBytes.equals(name, "content-type") {
                eventStream = Self.isEventStream(value)
            }
        case .holding:
            if HTTPBytes.equals(name, "ratelimit") { rateLimit = String(decoding: value, as: UTF8.self) }
            heldFields.append(HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
        case .waiting:
            break
        }
    }

    enum HeadVerdict {
        /// The head is refused: the try fails with this reason.
        case refused(String)
        /// Held: nothing goes to the client yet.
        case held
        /// Streaming: the head went to the client.
        case streamed
    }

    /// The head is complete: refuse it, keep holding, or send it to the client.
    mutating func headComplete<C: ExchangeClient>(
        to request: C, requestID: String, attempt: Int, extra: RateLimitFields? = nil
    ) -> HeadVerdict {
        let length: Int?
        switch framing.verdict() {
        case let .failure(error): return .refused(error.message)
        case let .success(announced): length = announced
        }
        headComplete = true
        if holdingHeadForGRPC {
            holdingHeadForGRPC = false
            if case let .status(code) = grpcStatus, grpcRetryStatuses.contains(code) {
                heldForRetry = code
                return .held
            }
            // Not one to retry: the answer goes to the client, its fields first.
            mode = .streaming
            request.clearResponseHeaders()
            // (Never kept for `serve_stale`: that is for GETs, and a call is a POST.)
            for field in heldFields { request.addResponseHeader(field.name, field.value) }
            heldFields.removeAll(keepingCapacity: true)
        }
        guard mode == .streaming else { return .held }
        if !upstreamConnection.isEmpty {
            upstreamConnection.withUnsafeBytes { request.removeResponseHeaders(nominatedBy: $0) }
        }
        request.addResponseHeader("X-Request-Id", requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(attempt))
        extra?.stage(on: request)
        // A gRPC-Web answer's body gains the trailer frame (and base64): its length is the proxy's.
        request.startReply(status: status, contentLength: web?.translated == true ? nil : length, reason: reason)
        // An event stream and a gRPC call keep their client's pace; any other
        // answer is read from its upstream at the upstream's pace.
        if !eventStream, !readsGRPCStatus { request.permitReadAhead() }
        return .streamed
    }

    /// `text/event-stream` (its parameters aside): an answer whose events
    /// are worth nothing late, never read ahead of its client.
    static func isEventStream(_ value: UnsafeRawBufferPointer) -> Bool {
        let type: StaticString = "text/event-stream"
        let n = type.utf8CodeUnitCount
        guard value.count >= n else { return false }
        let head = UnsafeRawBufferPointer(rebasing: value[0..<n])
        guard HTTPBytes.equals(head, type) else { return false }
        return value.count == n || value[n] == UInt8(ascii: ";") || value[n] == 0x20 || value[n] == 0x09
    }

    /// Body bytes: kept (holding) or sent (streaming). False: the client is
    /// slow; pause the upstream until `drained()`.
    mutating func body<C: ExchangeClient>(_ bytes: UnsafeRawBufferPointer, to request: C) -> Bool {
        switch mode {
        case .holding:
            let room = holdLimit - heldBody.count
            if bytes.count > room { heldBodyComplete = false }
            if room > 0 { heldBody.append(contentsOf: bytes.prefix(room)) }
            return true
        case .waiting:
            return true
        case .streaming:
            if waitingForDrain { return false }
            guard let web, web.translated else { return stream(bytes, to: request) }
            let sent = web.mode == .text ? GRPCWeb.base64(bytes).withUnsafeBytes { stream($0, to: request) } : stream(bytes, to: request)
            if sent { web.frames.advance(bytes) }
            return sent
        }
    }

    /// A streamed answer's bytes to the client, at its pace.
    @inline(__always) private mutating func stream<C: ExchangeClient>(_ bytes: UnsafeRawBufferPointer, to request: C) -> Bool {
        let room = request.outputRoom
        if room <= 0 {
            // The connection is full (its other streams' answers too):
            // these bytes stay with the upstream transfer, which pauses.
            waitingForDrain = true
            request.send(UnsafeRawBufferPointer(start: nil, count: 0), notifyWhenDrained: true)
            return false
        }
        bytesOut += bytes.count
        kept?.add(body: bytes)
        if bytes.count >= room {
            waitingForDrain = true
            request.send(bytes, notifyWhenDrained: true)
        } else {
            request.send(bytes, notifyWhenDrained: false)
        }
        return true
    }

    /// A gRPC-Web answer's trailer frame, to send before its end (base64
    /// in text mode); nil for any other answer, or when its status came
    /// in its head (Trailers-Only: the head is the whole answer).
    mutating func webTrailerFrame() -> [UInt8]? {
        guard let web, web.translated, mode == .streaming, !web.trailers.isEmpty else { return nil }
        let frame = GRPCWeb.trailerFrame(web.trailers)
        return web.mode == .text ? GRPCWeb.base64(frame) : frame
    }

    /// A gRPC-Web answer cut short (the upstream failed, or a drain ran
    /// out): the proxy's status as its trailer frame, when the client has
    /// whole messages so far. Nil: not gRPC-Web, or cut inside a message
    /// (a frame after it would be read as the message's bytes).
    mutating func webFailureFrame(_ answer: GRPCErrorResponse) -> [UInt8]? {
        guard let web, web.translated, mode == .streaming, headComplete, web.frames.atBoundary else { return nil }
        let fields = answer.fields.dropFirst().map { (name: $0.name, value: $0.value) }  // not its content-type
        let frame = GRPCWeb.trailerFrame(fields)
        return web.mode == .text ? GRPCWeb.base64(frame) : frame
    }

    /// A trailer field (checked, hop-by-hop and framing fields dropped by
    /// the transfer): passed on with a streamed answer while the trailers
    /// stay within `limit` bytes. A held answer is answered whole, without
    /// them. Not kept for `serve_stale` (a kept answer is replayed without
    /// trailers).
    mutating func trailer<C: ExchangeClient>(
        name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, limit: Int, to request: C
    ) {
        guard mode == .streaming, headComplete else { return }
        // The proxy's own fields are never an upstream's to set, here either.
        if name.count == 12, HTTPBytes.equals(name, "x-request-id") { return }
        if name.count == 20, HTTPBytes.equals(name, "x-happypath-attempts") { return }
        let size = name.count + value.count + 4
        guard trailerBytes + size <= limit else { return trailerBytes = limit + 1 }
        if readsGRPCStatus { readGRPC(name: name, value: value) }
        trailerBytes += size
        if let web, web.translated {
            return web.trailers.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
        }
        request.addResponseTrailer(name: name, value: value)
    }

    /// A gRPC call's field, in the head or the trailers: `grpc-status`,
    /// and with `readsGRPCDetails` its `grpc-status-details-bin`.
    private mutating func readGRPC(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if name.count == 11, HTTPBytes.equals(name, "grpc-status") { grpcStatus = GRPCStatusField(value: value) }
        if readsGRPCDetails, name.count == 23, HTTPBytes.equals(name, "grpc-status-details-bin") {
            grpcDetails = value.count <= GRPCStatusDetails.maxFieldBytes ? [UInt8](value) : nil
        }
    }

    /// The wait a gRPC call's `RESOURCE_EXHAUSTED` answer asks for in the
    /// `RetryInfo` of its `grpc-status-details-bin`, at most `retryAfterCap`
    /// (as a `Retry-After` is); nil for any other answer, or none readable.
    var resourceExhaustedDelay: Duration? {
        guard case .status(.resourceExhausted) = grpcStatus, let grpcDetails else { return nil }
        return grpcDetails.withUnsafeBytes { GRPCStatusDetails.retryDelay(fieldValue: $0, max: retryAfterCap) }
    }

    /// The held answer's fields without those its `Connection` names (its
    /// own hop-by-hop fields).
    var heldEndToEndFields: [HTTPField] { endToEnd(heldFields) }

    /// `fields` without those the upstream's `Connection` names.
    func endToEnd(_ fields: [HTTPField]) -> [HTTPField] {
        guard !upstreamConnection.isEmpty else { return fields }
        let named = connectionNamed
        return fields.filter { !named.contains($0.name.lowercased()) }
    }

    /// The same for fields kept as bytes (a streamed answer's, `KeptAnswer`).
    func endToEnd(_ fields: KeptFields) -> KeptFields {
        guard !upstreamConnection.isEmpty else { return fields }
        let named = connectionNamed
        return fields.filtered { name, _ in !named.contains(String(decoding: name, as: UTF8.self).lowercased()) }
    }

    /// The streamed answer's fields (end to end) and body, moved out of
    /// the relay once it is over; nil when none was kept or it grew too
    /// large. Mutating, so that the relay is read in place, not copied.
    mutating func takeKeptAnswer() -> (fields: KeptFields, body: [UInt8])? {
        guard let kept = kept.take(), !kept.overflow else { return nil }
        return (endToEnd(kept.fields), kept.body)
    }

    /// The field names the upstream's `Connection` values name, lower-cased.
    private var connectionNamed: Set<String> {
        var named = Set<String>()
        upstreamConnection.withUnsafeBytes { value in
            forEachListElement(value) { named.insert(String(decoding: $0, as: UTF8.self).lowercased()) }
        }
        return named
    }

    /// The client's connection drained: the upstream may go on.
    mutating func drained() { waitingForDrain = false }

    /// The client's connection is full (its other streams' answers): a
    /// streamed answer waits for `drained`. False if it was not streaming.
    mutating func mustWait() -> Bool {
        guard mode == .streaming else { return false }
        waitingForDrain = true
        return true
    }

    /// The upstream's reason phrase when the client should see it as sent:
    /// not the standard phrase, at most 128 bytes of field-value text (a
    /// control byte could split the status line for a lenient client). An
    /// empty phrase (`HTTP/1.1 402 `) keeps the standard one.
    static func ownReason(_ reason: UnsafeRawBufferPointer, status: Int) -> [UInt8]? {
        guard !reason.isEmpty, reason.count <= 128, reason.allSatisfy({ HTTPBytes.isFieldValue($0) && $0 != 0x7F }) else {
            return nil
        }
        let standard = reasonPhrase(status)
        let same = UnsafeRawBufferPointer(start: standard.utf8Start, count: standard.utf8CodeUnitCount).elementsEqual(reason)
        return same ? nil : Array(reason)
    }

    /// A problem answer was sent instead: its size, for the access log.
    mutating func answered(bytes: Int) { bytesOut = bytes }
}

/// A gRPC-Web call's answer as it is translated (`ResponseRelay.web`): one
/// reference in the relay, so other answers carry none of it.
final class GRPCWebAnswer {
    let mode: GRPCWeb.Mode
    /// The answer's `content-type` (`GRPCWeb.answerContentType`).
    let contentType: String
    /// The upstream's trailers, kept for the trailer frame.
    var trailers: [(name: String, value: String)] = []
    /// Where the frames stand, as they went to the client.
    var frames = GRPCFrameCursor()
    /// The answer's content type was gRPC's, and went out as gRPC-Web's.
    var translated = false

    init(mode: GRPCWeb.Mode, contentType: String) {
        self.mode = mode
        self.contentType = contentType
    }

    /// A new try: its answer starts afresh.
    func reset() {
        trailers.removeAll()
        frames = GRPCFrameCursor()
        translated = false
    }
}
