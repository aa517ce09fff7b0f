import CNghttp2
import HappyPathCore

/// The limits a client session holds an upstream's answers to.
public struct HTTP2ClientLimits: Sendable, Equatable {
    /// A response head's (and its trailers') bytes: name + value + 32 per
    /// field (`limits.max_header_bytes`), also sent as SETTINGS_MAX_HEADER_LIST_SIZE.
    public var maxHeadBytes: Int
    /// Fields in one response head (`limits.max_headers`).
    public var maxHeadFields: Int
    /// SETTINGS_INITIAL_WINDOW_SIZE: what the upstream may send a stream
    /// before the handler takes its bytes (a stalled client's cost).
    public var streamWindow: Int32
    /// The connection's receive window, raised once at the start and given
    /// back as DATA arrives (one stalled stream never stalls its neighbours).
    public var connectionWindow: Int32

    public init(
        maxHeadBytes: Int = 64 * 1024, maxHeadFields: Int = 100, streamWindow: Int32 = 64 * 1024,
        connectionWindow: Int32 = 1024 * 1024
    ) {
        self.maxHeadBytes = maxHeadBytes
        self.maxHeadFields = maxHeadFields
        self.streamWindow = streamWindow
        self.connectionWindow = connectionWindow
    }
}

/// What one `receive` found, for the connection driver.
struct HTTP2ClientReceiveResult {
    /// A fatal error (`mem_recv` < 0): the session is unusable.
    var error: HTTP2SessionError?
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS, when a SETTINGS frame (not an ACK) came.
    var maxStreams: Int?
    /// A GOAWAY came (its last stream id).
    var goaway: Int32?
    /// The server acknowledged a PING of ours.
    var pingAcked = false
}

/// A client `nghttp2_session` with no I/O, the mirror of the edge's
/// `HTTP2Session`: bytes read from the upstream go in through `receive`,
/// bytes for it come out of `produce`, requests go in through `submit`.
/// One per upstream connection, used only on its loop's thread.
///
/// Retention at the C boundary:
/// - `user_data` is this object, passed unretained; the `nghttp2_session`
///   is deleted in `deinit`, so no callback runs after the object is gone
///   (callbacks run only inside `mem_recv`, `mem_send` and `resume_data`,
///   called on the object).
/// - A stream is an `HTTP2UpstreamStream` held by `streams` from `submit`
///   until `on_stream_close`, the last callback for it. nghttp2 holds no
///   pointer to it (no stream user data, no data source pointer): the
///   callbacks look it up by id, so nothing can go stale.
/// - Frame, name, value and data pointers are nghttp2's, valid only during
///   the call: what is kept is copied.
/// - Parts of a response go to the stream's handler from inside the
///   callbacks (as libcurl's do); the end of a try is listed in `ended` and
///   told by the driver after `mem_recv` returns, so a retry may start from it.
final class HTTP2ClientSession {
    let limits: HTTP2ClientLimits
    private(set) var session: OpaquePointer?
    var streams: [Int32: HTTP2UpstreamStream] = [:]
    /// Tries ended (inside `mem_recv` or `mem_send`) and not yet told.
    var ended: [HTTP2UpstreamStream] = []
    /// Tries whose stream was refused unprocessed, to be sent again on another stream.
    var replays: [HTTP2UpstreamStream] = []
    /// Streams whose response ended (END_STREAM) in this read: those still
    /// open are waiting for the rest of our request, which is not needed.
    var remoteEnded: [HTTP2UpstreamStream] = []
    /// Streams nghttp2 closed since the driver last took the count (their room goes back to the pool).
    var closedStreams = 0
    var current = HTTP2ClientReceiveResult()
    /// Frames that cost work without moving a response, bounded per connection.
    private var floodGuard = HTTP2FloodGuard()
    /// Why the proxy ended the connection on the server's fault: a flood
    /// (then nothing more is read), or a protocol error nghttp2 answered
    /// with GOAWAY.
    private(set) var endReason: String?
    private(set) var fatalError: HTTP2SessionError?
    /// The driver's clock reading for this turn (set before `receive` and
    /// `produce`): what the callbacks stamp on streams that moved.
    var now = Instant(nanoseconds: 0)

    init(limits: HTTP2ClientLimits) throws(HTTP2SessionError) {
        self.limits = limits
        var callbacks: OpaquePointer?
        try Self.check(nghttp2_session_callbacks_new(&callbacks))
        defer { nghttp2_session_callbacks_del(callbacks) }  // copied into the session
        Self.install(callbacks)
        var option: OpaquePointer?
        try Self.check(nghttp2_option_new(&option))
        defer { nghttp2_option_del(option) }
        nghttp2_option_set_no_auto_window_update(option, 1)
        nghttp2_option_set_no_closed_streams(option, 1)
        nghttp2_option_set_max_settings(option, 32)
        nghttp2_option_set_max_outbound_ack(option, 1000)
        nghttp2_option_set_max_continuations(option, 8)
        nghttp2_option_set_max_deflate_dynamic_table_size(option, 4096)
        // A request head nghttp2 would refuse to send is closed REFUSED_STREAM
        // (as if the server refused it): room past any head the edge lets in.
        nghttp2_option_set_max_send_header_block_length(option, max(64 * 1024, limits.maxHeadBytes) * 4)
        // Alive: user_data is `self` unretained (the type's "Retention at the C boundary": callbacks run
        // only inside this object's own calls, and deinit deletes the session).
        try Self.check(nghttp2_session_client_new2(&session, callbacks, Unmanaged.passUnretained(self).toOpaque(), option))
        var entries = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                value: UInt32(clamping: max(0, limits.streamWindow))),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                value: UInt32(clamping: max(0, limits.maxHeadBytes))),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES.rawValue), value: 1),
        ]
        try Self.check(nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count))
        if limits.connectionWindow > HTTP2Session.defaultWindow {
            try Self.check(
                nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, limits.connectionWindow))
        }
    }

    deinit { nghttp2_session_del(session) }

    private static func check(_ rv: Int32) throws(HTTP2SessionError) {
        if rv != 0 { throw HTTP2SessionError(code: Int(rv)) }
    }

    // MARK: - Reading and writing

    /// Feeds bytes read from the upstream to nghttp2. Parts of responses go
    /// to their handlers meanwhile; ended streams wait in `ended`.
    func receive(_ bytes: UnsafeRawBufferPointer) -> HTTP2ClientReceiveResult {
        guard fatalError == nil else { return HTTP2ClientReceiveResult(error: fatalError) }
        let n = nghttp2_session_mem_recv(session, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count)
        var result = current
        current = HTTP2ClientReceiveResult()
        // A flood stops the read (a callback failure); the GOAWAY is still to be written.
        if endReason != nil { return result }
        if n < 0 {
            fatalError = HTTP2SessionError(code: n)
            result.error = fatalError
        }
        return result
    }

    func receive(_ bytes: [UInt8]) -> HTTP2ClientReceiveResult { bytes.withUnsafeBytes { receive($0) } }

    /// Copies what nghttp2 has to send to `sink` until at least `highWater`
    /// bytes went out or nothing is left; returns the count.
    @discardableResult
    func produce(highWater: Int, into sink: (UnsafeRawBufferPointer) -> Void) -> Int {
        HTTP2Session.produce(session, highWater: highWater, fatalError: &fatalError, into: sink)
    }

    func produceAll() -> [UInt8] {
        var out: [UInt8] = []
        produce(highWater: Int.max) { out.append(contentsOf: $0) }
        return out
    }

    /// The streams ended since the last call, in order (the driver tells their handlers).
    func takeEnded() -> [HTTP2UpstreamStream] {
        defer { ended.removeAll(keepingCapacity: true) }
        return ended
    }

    func takeRemoteEnded() -> [HTTP2UpstreamStream] {
        guard !remoteEnded.isEmpty else { return [] }
        defer { remoteEnded.removeAll(keepingCapacity: true) }
        return remoteEnded
    }

    /// What a turn left behind, once `mem_recv` or `mem_send` returned, in
    /// the order the pool needs it: the room of the streams nghttp2 closed
    /// (a try started from a tell takes it, not a new connection); the
    /// tries refused unprocessed, back to be sent again before any tell (a
    /// tell may end an exchange, which cancels its other tries: a replayed
    /// one is then withdrawn, never sent); the answers the server ended
    /// while our request still flowed, complete (RFC 9113 section 8.1: our
    /// side is reset NO_ERROR); then the ends told.
    func settle(room: (Int) -> Void, replay: (HTTP2UpstreamStream) -> Void) {
        let closed = closedStreams
        closedStreams = 0
        if closed > 0 { room(closed) }
        for stream in takeReplays() { replay(stream) }
        for stream in takeRemoteEnded() where streams[stream.id] === stream {
            if stream.remoteEnded() { ended.append(stream) }
            reset(stream.id, code: HTTP2ErrorCode.noError.rawValue)
        }
        for stream in takeEnded() {
            if stream.outcome == .complete { completedStreams &+= 1 }
            stream.tell()
        }
    }

    /// Tries answered whole on this session (a connection that served none
    /// counts towards the pool's backoff when it closes).
    private(set) var completedStreams = 0

    /// The tries to send again since the last call, in order.
    func takeReplays() -> [HTTP2UpstreamStream] {
        defer { replays.removeAll(keepingCapacity: true) }
        return replays
    }

    var wantsRead: Bool { fatalError == nil && nghttp2_session_want_read(session) != 0 }
    var wantsWrite: Bool { fatalError == nil && nghttp2_session_want_write(session) != 0 }
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS as nghttp2 applies it.
    var remoteMaxStreams: Int {
        Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
    }

    // MARK: - Requests

    /// Submits `stream`'s request (HEADERS, and a data provider when it has
    /// a body); the stream is the session's until it closes. Nil on success.
    func submit(
        _ stream: HTTP2UpstreamStream, scheme: String, authority: String, scratch: inout HTTP2RequestFields
    ) -> HTTP2SessionError? {
        let hasBody = stream.prepareBody()
        let id: Int32 = scratch.build(
            stream.request, scheme: scheme, authority: authority, contentLength: stream.contentLength
        ) { nv in
            if hasBody {
                var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: clientDataSourceRead)
                return nghttp2_submit_request(session, nil, nv.baseAddress, nv.count, &provider, nil)
            }
            return nghttp2_submit_request(session, nil, nv.baseAddress, nv.count, nil, nil)
        }
        guard id > 0 else { return HTTP2SessionError(code: Int(id)) }
        stream.id = id
        streams[id] = stream
        return nil
    }

    /// Gives `n` bytes of the stream's window back (its handler took them).
    func consume(_ id: Int32, _ n: Int) {
        guard n > 0, streams[id] != nil else { return }
        nghttp2_session_consume_stream(session, id, n)
    }

    /// RST_STREAM with `code` (sent by the next `produce`).
    func reset(_ id: Int32, code: UInt32) {
        guard streams[id] != nil else { return }
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code)
    }

    /// A deferred request body has bytes again.
    func resumeData(_ id: Int32) {
        guard streams[id] != nil else { return }
        nghttp2_session_resume_data(session, id)
    }

    /// A PING (sent by the next `produce`).
    func ping() { nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil) }
}

// MARK: - Callbacks

extension HTTP2ClientSession {
    static func session(_ userData: UnsafeMutableRawPointer?) -> HTTP2ClientSession? {
        userData.map { Unmanaged<HTTP2ClientSession>.fromOpaque($0).takeUnretainedValue() }
    }

    static func install(_ callbacks: OpaquePointer?) {
        // Each frame's header, before its payload: the flood bounds.
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks) { _, hd, userData in
            guard let hd, let session = HTTP2ClientSession.session(userData) else { return 0 }
            return session.frameBegins(hd.pointee) ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE.rawValue
        }
        // One decoded field of a response head, a 1xx head or trailers: to the stream (found by id).
        nghttp2_session_callbacks_set_on_header_callback(callbacks) {
            _, frame, name, nameLength, value, valueLength, _, userData in
            guard let frame, let session = HTTP2ClientSession.session(userData),
                let stream = session.streams[frame.pointee.hd.stream_id]
            else { return 0 }
            stream.lastMoved = session.now
            let ok = stream.field(
                name: UnsafeRawBufferPointer(start: name, count: nameLength),
                value: UnsafeRawBufferPointer(start: value, count: valueLength), limits: session.limits)
            // Past the limits: nghttp2 resets the stream and decodes the rest without calling back.
            return ok ? 0 : NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
        }
        // A whole frame: a head's end goes to its stream; SETTINGS and GOAWAY to the driver.
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
            guard let frame, let session = HTTP2ClientSession.session(userData) else { return 0 }
            session.frameReceived(frame)
            return 0
        }
        // Response body bytes (nghttp2's buffer, during the call only). The connection window goes back at once.
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, streamID, data, length, userData in
            guard let session = HTTP2ClientSession.session(userData) else { return 0 }
            nghttp2_session_consume_connection(session.session, length)
            guard let stream = session.streams[streamID] else {
                nghttp2_session_consume_stream(session.session, streamID, length)
                return 0
            }
            stream.lastMoved = session.now
            let taken = stream.data(UnsafeRawBufferPointer(start: data, count: length), window: session.limits.streamWindow)
            if taken > 0 { nghttp2_session_consume_stream(session.session, streamID, taken) }
            return 0
        }
        // A frame of ours went out of `mem_send`: a request's HEADERS may now reach the upstream.
        // (A DATA frame of the request body counts as a byte moved, for the idle sweep.)
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks) { _, frame, userData in
            guard let frame, let session = HTTP2ClientSession.session(userData) else { return 0 }
            // nghttp2 ended the session on a connection error of the server's (a window overflow, a bad frame).
            if UInt32(frame.pointee.hd.type) == NGHTTP2_GOAWAY.rawValue, frame.pointee.goaway.error_code != 0,
                session.endReason == nil
            {
                let code = HTTP2UpstreamStream.codeName(frame.pointee.goaway.error_code)
                session.endReason = "the upstream broke the HTTP/2 protocol (\(code)): the proxy ended the connection"
            }
            guard let stream = session.streams[frame.pointee.hd.stream_id] else { return 0 }
            switch UInt32(frame.pointee.hd.type) {
            case NGHTTP2_HEADERS.rawValue:
                stream.headersProduced = true
                stream.lastMoved = session.now
            case NGHTTP2_DATA.rawValue: stream.lastMoved = session.now
            default: break
            }
            return 0
        }
        // The last callback for a stream: `streams` lets go of it; its end is told after mem_recv/mem_send.
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, streamID, errorCode, userData in
            guard let session = HTTP2ClientSession.session(userData),
                let stream = session.streams.removeValue(forKey: streamID)
            else { return 0 }
            session.closedStreams &+= 1
            switch stream.closed(code: errorCode) {
            case .ended: session.ended.append(stream)
            case .replay: session.replays.append(stream)
            case .none: break
            }
            return 0
        }
    }

    /// A frame from the server begins: false when it is past a flood bound
    /// (the session ends with GOAWAY ENHANCE_YOUR_CALM; `mem_recv` stops).
    func frameBegins(_ hd: nghttp2_frame_hd) -> Bool {
        if endReason != nil { return false }
        let ack = hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0
        let kind: HTTP2FloodGuard.Kind
        switch UInt32(hd.type) {
        case NGHTTP2_SETTINGS.rawValue where !ack: kind = .settings
        case NGHTTP2_PING.rawValue where !ack: kind = .ping
        case NGHTTP2_RST_STREAM.rawValue where streams[hd.stream_id] == nil: kind = .strayReset
        case NGHTTP2_DATA.rawValue where hd.length == 0 && hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) == 0:
            kind = .emptyData
        case NGHTTP2_PRIORITY.rawValue: kind = .priority
        default: return true
        }
        if floodGuard.frame(kind, at: now) { return true }
        endReason = floodGuard.reason(kind)
        nghttp2_session_terminate_session(session, NGHTTP2_ENHANCE_YOUR_CALM.rawValue)
        return false
    }

    func frameReceived(_ frame: UnsafePointer<nghttp2_frame>) {
        let hd = frame.pointee.hd
        switch UInt32(hd.type) {
        case NGHTTP2_HEADERS.rawValue:
            guard let stream = streams[hd.stream_id] else { return }
            if hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 {
                stream.endStreamReceived = true
                remoteEnded.append(stream)
            }
            if stream.headersFrameEnded() {
                // The handler refused the head: the stream is reset, and the try has ended.
                // (It stays in `streams` until nghttp2 closes it.)
                nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), hd.stream_id, NGHTTP2_CANCEL.rawValue)
                ended.append(stream)
            }
        case NGHTTP2_DATA.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0, let stream = streams[hd.stream_id] {
                stream.endStreamReceived = true
                remoteEnded.append(stream)
            }
        case NGHTTP2_RST_STREAM.rawValue:
            streams[hd.stream_id]?.resetByPeer = true
        case NGHTTP2_SETTINGS.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 { current.maxStreams = remoteMaxStreams }
        case NGHTTP2_GOAWAY.rawValue:
            current.goaway = frame.pointee.goaway.last_stream_id
        case NGHTTP2_PING.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0 { current.pingAcked = true }
        default: break
        }
    }
}

/// The data provider's read callback (`source` is unused: the stream is
/// found by id in the session's `streams`).
let clientDataSourceRead: nghttp2_data_source_read_callback = { _, streamID, buffer, length, flags, _, userData in
    guard let session = HTTP2ClientSession.session(userData), let stream = session.streams[streamID] else {
        return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
    }
    return stream.readBody(into: buffer, max: length, flags: flags)
}
