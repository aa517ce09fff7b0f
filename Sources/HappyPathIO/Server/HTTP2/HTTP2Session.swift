import CNghttp2
import HappyPathCore

/// The numbers a server `HTTP2Session` is made with: what it advertises in
/// its SETTINGS and the defences of docs/plans/http2.md, section 1.
public struct HTTP2SessionSettings: Sendable, Equatable {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (Envoy's edge default).
    public var maxConcurrentStreams: UInt32
    /// SETTINGS_INITIAL_WINDOW_SIZE: how much request body a stream may
    /// send before its bytes are taken (`takeBody`), so also the most a
    /// stream's body buffer holds.
    public var initialStreamWindow: Int32
    /// The connection's receive window, raised once at the start.
    public var initialConnectionWindow: Int32
    /// The request head limits (`maxHeadBytes` is also sent as
    /// SETTINGS_MAX_HEADER_LIST_SIZE, which nghttp2 does not enforce:
    /// `HTTP2RequestHeadReader` does), and the body limit.
    public var request: RequestLimits
    /// SETTINGS entries accepted in one frame (nghttp2's default).
    public var maxSettingsEntries: Int
    /// PING and SETTINGS ACKs queued unsent before the session fails with
    /// `NGHTTP2_ERR_FLOODED` (nghttp2's default).
    public var maxOutboundAcks: Int
    /// nghttp2's Rapid Reset token bucket, a backstop to the connection
    /// machine's own rule: a burst of client resets, then so many a second.
    public var streamResetBurst: UInt64
    public var streamResetRate: UInt64
    /// CONTINUATION frames per header block (the next one is fatal, -905).
    public var maxContinuations: Int

    public init(
        maxConcurrentStreams: UInt32 = 100, initialStreamWindow: Int32 = 64 * 1024,
        initialConnectionWindow: Int32 = 1024 * 1024, request: RequestLimits,
        maxSettingsEntries: Int = 32, maxOutboundAcks: Int = 1000, streamResetBurst: UInt64 = 1000,
        streamResetRate: UInt64 = 33, maxContinuations: Int = 8
    ) {
        self.maxConcurrentStreams = maxConcurrentStreams
        self.initialStreamWindow = initialStreamWindow
        self.initialConnectionWindow = initialConnectionWindow
        self.request = request
        self.maxSettingsEntries = maxSettingsEntries
        self.maxOutboundAcks = maxOutboundAcks
        self.streamResetBurst = streamResetBurst
        self.streamResetRate = streamResetRate
        self.maxContinuations = maxContinuations
    }
}

/// Something that happened on a stream or the connection during one
/// `receive`, in the order nghttp2 reported it. Recorded by the callbacks,
/// acted on by the driver after `receive` returns (never inside `mem_recv`).
public enum HTTP2SessionEvent: Sendable, Equatable {
    /// A client HEADERS frame opened the stream.
    case opened(Int32)
    /// The stream's request head is complete (END_HEADERS): `head(of:)` or
    /// `refusal(of:)` says which.
    case headComplete(Int32)
    /// Request body bytes arrived for the stream (`takeBody`).
    case data(Int32, count: Int)
    /// The request ended (END_STREAM).
    case requestEnded(Int32)
    /// The request body passed `request.maxBodyBytes`: what came after was
    /// dropped (the driver answers 413 and resets).
    case bodyTooLarge(Int32)
    /// The request's trailers are malformed (RFC 9113 section 8.1.1): the
    /// request is, and is never served; the driver resets the stream
    /// PROTOCOL_ERROR. No `requestEnded` follows.
    case malformed(Int32)
    /// The client sent RST_STREAM.
    case resetByPeer(Int32, code: UInt32)
    /// The stream is closed (by either side, or by nghttp2 for a protocol
    /// error); it is gone from the session.
    case closed(Int32, code: UInt32)
    /// The client sent GOAWAY.
    case goawayReceived(code: UInt32, lastStreamID: Int32)
    /// We sent RST_STREAM on the stream (inside `produce`).
    case resetSent(Int32, code: UInt32)
}

/// Frames counted by type (DATA 0 … CONTINUATION 9, anything else 10).
public struct HTTP2FrameCounts: Sendable, Equatable {
    public static let kinds = 11
    public private(set) var counts = [Int](repeating: 0, count: kinds)

    public subscript(type: UInt8) -> Int { counts[Self.index(type)] }

    mutating func add(_ type: UInt8) {
        let i = Self.index(type)
        counts[i] = counts[i] &+ 1
    }

    static func index(_ type: UInt8) -> Int { min(Int(type), kinds - 1) }
}

/// What one `receive` did (its events include those recorded since the
/// last `receive` or `takeEvents`: streams closed while `produce` sent their
/// last frame).
public struct HTTP2ReceiveResult: Sendable {
    public init() {}
    /// Bytes nghttp2 read (all of them, unless `error`).
    public var consumed = 0
    /// A fatal error (`mem_recv` < 0): the session is unusable, close the connection.
    public var error: HTTP2SessionError?
    /// Everything recorded, in order.
    public var events: [HTTP2SessionEvent] = []
    /// Streams whose head completed in this read and are still open when
    /// it returned, in order: each appears once in a session's life, and a
    /// stream reset or closed in the same read never does.
    public var ready: [Int32] = []
    /// Frames begun (`on_begin_frame`) in this read, by type.
    public var framesBegun = HTTP2FrameCounts()
    /// Frames received whole (`on_frame_recv`) in this read, by type.
    public var framesReceived = HTTP2FrameCounts()
    /// The same frames in order, as the connection machine reads them
    /// (at most one per 9 bytes read); PRIORITY frames from their header,
    /// as nghttp2 skips their payload.
    public var frames: [HTTP2ConnectionStateMachine.InboundFrame] = []
    /// DATA frames we sent (inside `produce`) since the last `receive` or `takeEvents`.
    public var dataFramesSent = 0
}

/// nghttp2's error, with its name (`nghttp2_strerror`).
public struct HTTP2SessionError: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: Int
    public init(code: Int) { self.code = code }
    public var description: String { String(cString: nghttp2_strerror(Int32(truncatingIfNeeded: code))) }
}

/// A server `nghttp2_session`, with no I/O: bytes read from the client go
/// in through `receive`, bytes for the client come out of `produce`, and
/// answers go in through the `submit…` and `send…` helpers. One per
/// HTTP/2 connection, used only on its loop's thread.
///
/// The callbacks (HTTP2Session+Callbacks.swift) only record: streams made,
/// header fields read into each stream's `HTTP2RequestHeadReader`, body
/// bytes buffered, frames counted, events listed. Nothing is dispatched
/// inside `mem_recv`, so a stream opened and reset in the same read (Rapid
/// Reset) never comes out as ready.
///
/// Flow control is driven by hand (`no_auto_window_update`): the connection
/// window is given back as soon as DATA arrives, a stream's when its bytes
/// are taken (`takeBody`), so a stream buffers at most
/// `initialStreamWindow` bytes and one stream cannot stall the others.
public final class HTTP2Session {
    /// One stream the session knows of. Owned by `streams` from
    /// `on_begin_headers` to `on_stream_close`; nghttp2 holds no pointer to
    /// it (the callbacks find it by id).
    final class Stream {
        let id: Int32
        var reader: HTTP2RequestHeadReader
        var headComplete = false
        var head: HTTP2RequestHead?
        var refusal: HTTP2RequestRefusal?
        /// The refused head's content type was gRPC's.
        var refusedGRPC = false
        /// nghttp2 called `on_invalid_header` for a field the reader let through.
        var sawInvalidField = false
        /// Request trailers' bytes (counted, never kept).
        var trailerBytes = 0
        /// A trailer field is malformed (a pseudo-header, a framing or
        /// connection-specific field, a byte not allowed): the request is.
        var malformedTrailer = false
        var body: [UInt8] = []
        var bodyTotal = 0
        var bodyTooLarge = false
        var requestEnded = false
        var resetByPeer = false
        /// Came out in a `receive`'s `ready` (once in the stream's life).
        var readyReported = false

        // MARK: The answer
        var answerSubmitted = false
        /// Bytes staged for the data provider (counted in the session's `stagedBytes`).
        var output = ByteQueue()
        /// Bytes read ahead past the connection's bound (`limits.read_ahead`),
        /// framed after `output`; nil until the stream's first spill.
        var spool: AnswerSpool?
        var outputEnded = false
        var trailers: HTTP2FieldBlock?
        /// The data provider said DEFERRED: `resume_data` on the next bytes.
        var deferred = false
        /// Answer body bytes sent in DATA frames (`on_frame_send`).
        var dataSent = 0
        /// Our END_STREAM went out (on the HEADERS, the last DATA or the trailers).
        var endStreamSent = false

        init(id: Int32, limits: RequestLimits) {
            self.id = id
            reader = HTTP2RequestHeadReader(limits: limits)
        }
    }

    /// nghttp2's window sizes that do not import (shift expressions).
    public static let defaultWindow: Int32 = 65_535
    public static let maxWindow: Int32 = Int32.max

    public let settings: HTTP2SessionSettings
    /// The session; nil only if nghttp2 could not make one (out of memory).
    private(set) var session: OpaquePointer?
    var streams: [Int32: Stream] = [:]
    /// A tunnel's stream (RFC 8441) that closed in this read with body
    /// bytes or its END_STREAM not yet taken: kept until the driver has
    /// handled the read's events (`forgetClosed`), so that the client's
    /// last bytes still reach the upstream.
    var closedTunnels: [Int32: (body: [UInt8], ended: Bool)] = [:]

    /// The driver handled a closed stream's events.
    public func forgetClosed(_ id: Int32) {
        if !closedTunnels.isEmpty { closedTunnels[id] = nil }
    }
    /// What the callbacks recorded since the last `receive` or `takeEvents`.
    var current = HTTP2ReceiveResult()
    /// Frames since the session began, by type.
    public internal(set) var framesBegun = HTTP2FrameCounts()
    public internal(set) var framesReceived = HTTP2FrameCounts()
    /// The error that ended the session, once there is one.
    public private(set) var fatalError: HTTP2SessionError?

    /// Makes the server session and submits its SETTINGS (sent by the first
    /// `produce`). Throws when nghttp2 cannot (out of memory).
    public init(settings: HTTP2SessionSettings) throws(HTTP2SessionError) {
        self.settings = settings
        var callbacks: OpaquePointer?
        try Self.check(nghttp2_session_callbacks_new(&callbacks))
        defer { nghttp2_session_callbacks_del(callbacks) }  // nghttp2 copies it into the session
        Self.install(callbacks)

        var option: OpaquePointer?
        try Self.check(nghttp2_option_new(&option))
        defer { nghttp2_option_del(option) }  // copied as well
        nghttp2_option_set_max_settings(option, settings.maxSettingsEntries)
        nghttp2_option_set_max_outbound_ack(option, settings.maxOutboundAcks)
        nghttp2_option_set_stream_reset_rate_limit(option, settings.streamResetBurst, settings.streamResetRate)
        nghttp2_option_set_max_continuations(option, settings.maxContinuations)
        nghttp2_option_set_no_auto_window_update(option, 1)
        nghttp2_option_set_no_closed_streams(option, 1)

        // Alive: user_data is this object, unretained. nghttp2 calls back only inside this object's
        // own calls (receive, produce, ...), and deinit deletes the session, so none runs after it.
        try Self.check(nghttp2_session_server_new2(&session, callbacks, Unmanaged.passUnretained(self).toOpaque(), option))

        var entries = [
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: settings.maxConcurrentStreams),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                value: UInt32(clamping: max(0, settings.initialStreamWindow))),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                value: UInt32(clamping: max(0, settings.request.maxHeadBytes))),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES.rawValue), value: 1),
            // RFC 8441: a WebSocket may open on a stream (an extended CONNECT with :protocol).
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL.rawValue), value: 1),
        ]
        try Self.check(nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count))
        if settings.initialConnectionWindow > Self.defaultWindow {
            try Self.check(
                nghttp2_session_set_local_window_size(
                    session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, settings.initialConnectionWindow))
        }
    }

    deinit {
        nghttp2_session_del(session)
        stagedPool?.add(-stagedBytes)
    }

    private static func check(_ rv: Int32) throws(HTTP2SessionError) {
        if rv != 0 { throw HTTP2SessionError(code: Int(rv)) }
    }

    // MARK: - Reading

    /// Feeds bytes read from the client to nghttp2 (all of them at once),
    /// then says what became ready, reset or closed, and any fatal error.
    /// Not to be called from inside an nghttp2 callback.
    public func receive(_ bytes: UnsafeRawBufferPointer) -> HTTP2ReceiveResult {
        guard fatalError == nil else {
            var result = takeEvents()
            result.error = fatalError
            return result
        }
        let n = nghttp2_session_mem_recv(session, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count)
        var result = current
        current = HTTP2ReceiveResult()
        if n < 0 {
            // The session is unusable: nothing read in it is dispatched.
            fatalError = HTTP2SessionError(code: n)
            result.error = fatalError
            return result
        }
        result.consumed = n
        for event in result.events {
            // A stream's id is never reused (client ids only grow), so its
            // own flag keeps "ready once" without a record of closed streams.
            // One whose trailers came malformed in the same read is never
            // ready: it is reset before anything of it is served (found by FuzzHTTP2).
            guard case let .headComplete(id) = event, let stream = streams[id], !stream.resetByPeer,
                !stream.readyReported, !stream.malformedTrailer
            else { continue }
            stream.readyReported = true
            result.ready.append(id)
        }
        return result
    }

    /// The events recorded since the last `receive` (streams closed by
    /// `produce`, which sent their last frame or our RST_STREAM), and
    /// clears them.
    public func takeEvents() -> HTTP2ReceiveResult {
        defer { current = HTTP2ReceiveResult() }
        return current
    }

    /// `receive` for an array (tests, the fuzz harness).
    public func receive(_ bytes: [UInt8]) -> HTTP2ReceiveResult {
        bytes.withUnsafeBytes { receive($0) }
    }

    /// Whether nghttp2 still reads (false after GOAWAY both ways, or a fatal error).
    public var wantsRead: Bool { fatalError == nil && nghttp2_session_want_read(session) != 0 }
    /// Whether nghttp2 has frames to send.
    public var wantsWrite: Bool { fatalError == nil && nghttp2_session_want_write(session) != 0 }
    /// Frames queued in nghttp2 (the control-frame flood measure).
    public var outboundQueueSize: Int { nghttp2_session_get_outbound_queue_size(session) }
    /// Streams the session holds (open, or closing on our side).
    public var openStreams: Int { streams.count }
    /// Request body bytes buffered over all streams.
    public var bufferedBodyBytes: Int { streams.values.reduce(0) { $0 &+ $1.body.count } }
    /// The highest stream id the session has processed (for GOAWAY).
    public var lastProcessedStreamID: Int32 { nghttp2_session_get_last_proc_stream_id(session) }

    /// The stream's head, once complete and accepted.
    public func head(of id: Int32) -> HTTP2RequestHead? { streams[id]?.head }
    /// Why the stream's head was refused, once complete and refused.
    public func refusal(of id: Int32) -> HTTP2RequestRefusal? { streams[id]?.refusal }
    /// The refused head of the stream carried gRPC's content type.
    public func refusedGRPC(_ id: Int32) -> Bool { streams[id]?.refusedGRPC ?? false }
    /// Whether the stream's trailers were malformed (it is never served).
    public func isMalformed(_ id: Int32) -> Bool { streams[id]?.malformedTrailer ?? false }
    /// Whether the client ended its request (END_STREAM seen).
    public func requestEnded(_ id: Int32) -> Bool { streams[id]?.requestEnded ?? closedTunnels[id]?.ended ?? false }
    /// Whether the session still holds the stream.
    public func isOpen(_ id: Int32) -> Bool { streams[id] != nil }
    /// Request body bytes buffered for the stream.
    public func bufferedBody(of id: Int32) -> Int { streams[id]?.body.count ?? closedTunnels[id]?.body.count ?? 0 }

    /// Takes the stream's buffered request body, and gives that much window
    /// back to the client (a WINDOW_UPDATE on the next `produce`).
    public func takeBody(of id: Int32) -> [UInt8] {
        if streams[id] == nil, let closed = closedTunnels[id] {
            closedTunnels[id]?.body = []
            return closed.body
        }
        guard let stream = streams[id], !stream.body.isEmpty else { return [] }
        let body = stream.body
        stream.body = []
        nghttp2_session_consume_stream(session, id, body.count)
        return body
    }

    // MARK: - Writing

    /// Copies what nghttp2 has to send to `sink`, frame by frame, until at
    /// least `highWater` bytes went out or nothing is left; returns the
    /// count. The bytes passed to `sink` are valid only during the call.
    /// A negative `mem_send` ends the session (`fatalError`).
    @discardableResult
    public func produce(highWater: Int, into sink: (UnsafeRawBufferPointer) -> Void) -> Int {
        Self.produce(session, highWater: highWater, fatalError: &fatalError, into: sink)
    }

    /// `nghttp2_session_mem_send` into `sink` until `highWater` bytes went
    /// out or nothing is left (a negative result sets `fatalError`): both
    /// sessions', the edge's and the upstream client's.
    static func produce(
        _ session: OpaquePointer?, highWater: Int, fatalError: inout HTTP2SessionError?,
        into sink: (UnsafeRawBufferPointer) -> Void
    ) -> Int {
        var produced = 0
        while fatalError == nil, produced < highWater {
            var data: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &data)
            if n < 0 {
                fatalError = HTTP2SessionError(code: n)
                break
            }
            guard n > 0, let data else { break }
            sink(UnsafeRawBufferPointer(start: data, count: n))
            produced = produced &+ n
        }
        return produced
    }

    /// Everything nghttp2 has to send, as one array (tests, the fuzz harness).
    public func produceAll() -> [UInt8] {
        var out: [UInt8] = []
        produce(highWater: Int.max) { out.append(contentsOf: $0) }
        return out
    }

    /// Submits the answer's head. With `hasBody`, a data provider follows
    /// (`sendData`); else the head carries END_STREAM. The fields must carry
    /// no connection-specific field: nghttp2 does not police what it sends.
    public func submitResponse(_ id: Int32, status: Int, fields: [HTTPField], hasBody: Bool) -> HTTP2SessionError? {
        submitResponse(id, status: status, block: HTTP2FieldBlock(fields), hasBody: hasBody)
    }

    /// `submitResponse` for fields as bytes (names lower-cased there).
    public func submitResponse(_ id: Int32, status: Int, block fields: HTTP2FieldBlock, hasBody: Bool)
        -> HTTP2SessionError?
    {
        guard let stream = streams[id], !stream.answerSubmitted else {
            return HTTP2SessionError(code: Int(NGHTTP2_ERR_INVALID_ARGUMENT.rawValue))
        }
        stream.answerSubmitted = true
        let rv = fields.withNV(status: status) { nv in
            if hasBody {
                var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: dataSourceRead)
                return nghttp2_submit_response(session, id, nv.baseAddress, nv.count, &provider)
            }
            return nghttp2_submit_response(session, id, nv.baseAddress, nv.count, nil)
        }
        return rv == 0 ? nil : HTTP2SessionError(code: Int(rv))
    }

    /// Stages body bytes for the stream's data provider, and with `end`
    /// ends the body (then the trailers, if given, close the stream).
    public func sendData(_ id: Int32, _ bytes: UnsafeRawBufferPointer, end: Bool = false, trailers: [HTTPField]? = nil) {
        sendData(id, bytes, end: end, trailerBlock: trailers.map(HTTP2FieldBlock.init))
    }

    /// `sendData` with the trailers as bytes (names lower-cased there).
    public func sendData(_ id: Int32, _ bytes: UnsafeRawBufferPointer, end: Bool, trailerBlock trailers: HTTP2FieldBlock?) {
        sendData(id, bytes, end: end, trailerBlock: trailers, spill: nil)
    }

    /// `sendData`, the bytes into a spool: `spill` (kept as the stream's)
    /// when given, and the stream's spool whenever it holds bytes (they
    /// go first); else staged in memory.
    public func sendData(
        _ id: Int32, _ bytes: UnsafeRawBufferPointer, end: Bool = false, trailerBlock trailers: HTTP2FieldBlock? = nil,
        spill: AnswerSpool?
    ) {
        guard let stream = streams[id], !stream.outputEnded else { return }
        if stream.spool == nil, let spill { stream.spool = spill }
        if let spool = stream.spool, spill != nil || !spool.isEmpty {
            spool.append(bytes)
        } else {
            stream.output.append(bytes)
            stagedBytes += bytes.count
        }
        if end {
            stream.outputEnded = true
            stream.trailers = trailers
        }
        if stream.deferred, !stream.output.isEmpty || stream.spool?.isEmpty == false || end {
            stream.deferred = false
            nghttp2_session_resume_data(session, id)
        }
    }

    /// `sendData` for an array.
    public func sendData(_ id: Int32, _ bytes: [UInt8], end: Bool = false, trailers: [HTTPField]? = nil) {
        bytes.withUnsafeBytes { sendData(id, $0, end: end, trailers: trailers) }
    }

    /// Bytes for the stream not yet taken by nghttp2: staged, and read ahead into its spool.
    public func pendingOutput(for id: Int32) -> Int {
        guard let stream = streams[id] else { return 0 }
        return stream.output.count + (stream.spool?.held ?? 0)
    }

    /// The stream's bytes staged in memory (what `stagedBytes` counts of it).
    public func stagedOutput(for id: Int32) -> Int { streams[id]?.output.count ?? 0 }

    /// The connection is gone: every stream's spool file goes now (the
    /// streams themselves may outlive the connection a while).
    public func closeSpools() {
        for stream in streams.values { stream.spool?.close() }
    }

    /// The stream's spool (nil until its first spill, or once it is gone).
    public func spool(for id: Int32) -> AnswerSpool? { streams[id]?.spool }

    /// Bytes staged for every stream of the session and not yet taken by
    /// nghttp2: what the connection's staging bound (`limits.connection_buffer`) counts.
    public internal(set) var stagedBytes = 0 {
        didSet { stagedPool?.add(stagedBytes - oldValue) }
    }
    /// Where the process counts staged answer bytes (nil: not counted).
    public var stagedPool: MemoryPool?

    /// Answer body bytes sent so far in the stream's DATA frames (0 once it is gone).
    public func dataSent(of id: Int32) -> Int { streams[id]?.dataSent ?? 0 }

    /// Whether our END_STREAM went out on the stream (false once it is gone).
    public func endStreamSent(_ id: Int32) -> Bool { streams[id]?.endStreamSent ?? false }

    /// Submits an informational answer (1xx: a HEADERS frame without
    /// END_STREAM, the final answer to follow). Names as for `submitResponse`.
    public func submitInformational(_ id: Int32, status: Int, fields: HTTP2FieldBlock) -> HTTP2SessionError? {
        guard let stream = streams[id], !stream.answerSubmitted, (100..<200).contains(status) else {
            return HTTP2SessionError(code: Int(NGHTTP2_ERR_INVALID_ARGUMENT.rawValue))
        }
        let rv = fields.withNV(status: status) { nv in
            nghttp2_submit_headers(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, nil, nv.baseAddress, nv.count, nil)
        }
        return rv >= 0 ? nil : HTTP2SessionError(code: Int(rv))
    }

    /// Offers every stream `size` bytes of receive window from now on
    /// (SETTINGS_INITIAL_WINDOW_SIZE; nghttp2 applies it to the open streams
    /// once the client acknowledges it, RFC 9113 section 6.9.2).
    @discardableResult
    public func offerStreamWindow(_ size: Int) -> Bool {
        var entry = nghttp2_settings_entry(
            settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: UInt32(clamping: max(0, size)))
        return nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entry, 1) == 0
    }

    /// Resets the stream (RST_STREAM with `code`).
    @discardableResult
    public func resetStream(_ id: Int32, code: UInt32 = NGHTTP2_CANCEL.rawValue) -> Bool {
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code) == 0
    }

    /// GOAWAY with `code` and the last stream processed (drain, or a defence ending the connection).
    @discardableResult
    public func goaway(code: UInt32 = NGHTTP2_NO_ERROR.rawValue) -> Bool {
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastProcessedStreamID, code, nil, 0) == 0
    }

    /// A drain's GOAWAY (NO_ERROR) naming `lastStreamID`: streams up to it
    /// go on, later ones are refused by the peer's reading of it.
    @discardableResult
    public func goaway(lastStreamID: Int32) -> Bool {
        nghttp2_submit_goaway(
            session, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastStreamID, NGHTTP2_NO_ERROR.rawValue, nil, 0) == 0
    }

    /// Ends the session: GOAWAY with `code`, nothing more is read, the
    /// streams in flight are closed once the GOAWAY is written.
    @discardableResult
    public func terminate(code: UInt32) -> Bool { nghttp2_session_terminate_session(session, code) == 0 }

    /// The first GOAWAY of a graceful drain (last stream id 2³¹−1).
    @discardableResult
    public func shutdownNotice() -> Bool { nghttp2_submit_shutdown_notice(session) == 0 }

    /// Builds nghttp2's name/value array over `fields` for the call (nghttp2
    /// copies names and values in `submit_*`), names lower-cased.
    static func withNV<R>(_ fields: [HTTPField], _ body: (UnsafeMutableBufferPointer<nghttp2_nv>) -> R) -> R {
        HTTP2FieldBlock(fields).withNV(body)
    }
}
