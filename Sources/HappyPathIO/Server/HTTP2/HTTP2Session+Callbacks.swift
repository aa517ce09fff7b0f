import CNghttp2
import HappyPathCore

// The C callbacks of `HTTP2Session`, each turned into a method on the
// session that records what happened and returns.
//
// Retention, for all of them:
// - `user_data` is the `HTTP2Session`, passed unretained to
//   `nghttp2_session_server_new2`. The session object owns the
//   `nghttp2_session` and deletes it in `deinit`, so while a callback runs
//   the object is alive (a callback runs only inside `mem_recv`, `mem_send`
//   or `resume_data`, called on the object).
// - A stream's state is an `HTTP2Session.Stream`, owned by the session's
//   `streams` from `on_begin_headers` until `on_stream_close`, the last
//   callback nghttp2 makes for that stream. nghttp2 holds no pointer to it
//   (no stream user data, no data source pointer): the callbacks look it up
//   by id, so nothing can go stale, and a stream gone is simply not found.
// - The data provider is given by value to `submit_response` (nghttp2
//   copies it); its read callback copies staged bytes into nghttp2's buffer.
// - Frame, name, value and data pointers are nghttp2's, valid only during
//   the call: what is kept is copied (the head reader stores bytes, the body
//   is appended).
// - Nothing here calls `mem_recv` or `mem_send`, and nothing is dispatched:
//   events are listed in `current` and acted on after `receive` returns.

extension HTTP2Session {
    static func session(_ userData: UnsafeMutableRawPointer?) -> HTTP2Session? {
        userData.map { Unmanaged<HTTP2Session>.fromOpaque($0).takeUnretainedValue() }
    }

    /// Sets every callback on nghttp2's callbacks object (copied into the session).
    static func install(_ callbacks: OpaquePointer?) {
        // Every frame header read: counted by type. `hd` is nghttp2's, read during the call only.
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks) { _, hd, userData in
            guard let hd, let session = HTTP2Session.session(userData) else { return 0 }
            session.current.framesBegun.add(hd.pointee.type)
            session.framesBegun.add(hd.pointee.type)
            // With SETTINGS_NO_RFC7540_PRIORITIES nghttp2 skips a PRIORITY
            // frame's payload and never reports it received: the machine's
            // PRIORITY budget counts it here, at its header.
            if hd.pointee.type == UInt8(NGHTTP2_PRIORITY.rawValue) { session.current.frames.append(.priority) }
            return 0
        }
        // A request HEADERS begins: the session's `streams` takes the new Stream (retained until on_stream_close).
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, userData in
            guard let frame, let session = HTTP2Session.session(userData) else { return 0 }
            return session.beginHeaders(frame)
        }
        // One decoded field: copied into the stream's head reader; name and value are nghttp2's, valid during the call.
        nghttp2_session_callbacks_set_on_header_callback(callbacks) {
            _, frame, name, nameLength, value, valueLength, _, userData in
            HTTP2Session.header(frame, name, nameLength, value, valueLength, userData, invalid: false)
        }
        // A field nghttp2 would drop: the same, and the head is refused (the reader, or `sawInvalidField`).
        nghttp2_session_callbacks_set_on_invalid_header_callback(callbacks) {
            _, frame, name, nameLength, value, valueLength, _, userData in
            HTTP2Session.header(frame, name, nameLength, value, valueLength, userData, invalid: true)
        }
        // A whole frame: END_HEADERS finishes the head, END_STREAM ends the request, RST_STREAM and GOAWAY are
        // listed. The frame is nghttp2's, read during the call only.
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
            guard let frame, let session = HTTP2Session.session(userData) else { return 0 }
            session.frameReceived(frame)
            return 0
        }
        // Body bytes: copied into the stream's body (or dropped); nghttp2's buffer, valid during the call only.
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, streamID, data, length, userData in
            guard let session = HTTP2Session.session(userData) else { return 0 }
            session.dataChunk(streamID, UnsafeRawBufferPointer(start: data, count: length))
            return 0
        }
        // A frame went out (inside `mem_send`): DATA bytes and our END_STREAM counted on the stream, found by id.
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks) { _, frame, userData in
            guard let frame, let session = HTTP2Session.session(userData) else { return 0 }
            session.frameSent(frame)
            return 0
        }
        // The last callback for a stream: `streams` releases its Stream here.
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, streamID, errorCode, userData in
            guard let session = HTTP2Session.session(userData) else { return 0 }
            session.streamClosed(streamID, code: errorCode)
            return 0
        }
    }

    /// `on_header` and `on_invalid_header` (the same signature).
    static func header(
        _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?, _ nameLength: Int,
        _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ userData: UnsafeMutableRawPointer?, invalid: Bool
    ) -> Int32 {
        guard let frame, let session = session(userData) else { return 0 }
        return session.header(
            frame, UnsafeRawBufferPointer(start: name, count: nameLength),
            UnsafeRawBufferPointer(start: value, count: valueLength), invalid: invalid)
    }

    // MARK: - Recording

    /// A request HEADERS frame opens a stream; trailers reuse theirs.
    func beginHeaders(_ frame: UnsafePointer<nghttp2_frame>) -> Int32 {
        let id = frame.pointee.hd.stream_id
        guard frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
            frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
        else { return 0 }
        let stream = Stream(id: id, limits: settings.request)
        streams[id] = stream
        current.events.append(.opened(id))
        return 0
    }

    /// One field of a head or of trailers. Counted even for a refused head;
    /// far past the limit the stream is reset (TEMPORAL_CALLBACK_FAILURE:
    /// nghttp2 sends RST_STREAM and decodes the rest without calling back).
    func header(
        _ frame: UnsafePointer<nghttp2_frame>, _ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer,
        invalid: Bool
    ) -> Int32 {
        let failure = NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
        guard frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
            let stream = streams[frame.pointee.hd.stream_id]
        else { return 0 }
        if stream.headComplete {
            // Request trailers: counted against the same limits, not kept
            // (an HTTP/1.1 upstream gets no request trailers), but checked
            // as a head's fields are: one that is malformed makes the
            // request malformed (`malformed`, at the frame's end).
            if invalid || !HTTP2RequestHeadReader.isAllowedTrailer(name: name, value: value) {
                stream.malformedTrailer = true
            }
            let size = name.count.addingReportingOverflow(value.count).partialValue
                .addingReportingOverflow(HTTP2RequestHeadReader.fieldOverhead)
            let (sum, over) = stream.trailerBytes.addingReportingOverflow(size.partialValue)
            stream.trailerBytes = over || size.overflow ? Int.max : sum
            let (hard, overflow) = settings.request.maxHeadBytes.multipliedReportingOverflow(
                by: HTTP2RequestHeadReader.hardLimitFactor)
            return !overflow && stream.trailerBytes > hard ? failure : 0
        }
        if invalid { stream.sawInvalidField = true }
        return stream.reader.add(name: name, value: value) == .resetStream ? failure : 0
    }

    func frameReceived(_ frame: UnsafePointer<nghttp2_frame>) {
        let hd = frame.pointee.hd
        current.framesReceived.add(hd.type)
        framesReceived.add(hd.type)
        let endStream = hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        current.frames.append(Self.inbound(frame, endStream: endStream))
        switch UInt32(hd.type) {
        case NGHTTP2_HEADERS.rawValue:
            guard let stream = streams[hd.stream_id] else { return }
            if !stream.headComplete {
                stream.headComplete = true
                switch stream.reader.finish() {
                case let .success(head) where !stream.sawInvalidField: stream.head = head
                case .success: stream.refusal = .http1(.badFieldValue)
                case let .failure(refusal): stream.refusal = refusal
                }
                if stream.refusal != nil { stream.refusedGRPC = stream.reader.isGRPC }
                stream.reader = HTTP2RequestHeadReader(limits: settings.request)  // its storage is not needed any more
                current.events.append(.headComplete(hd.stream_id))
            }
            if stream.malformedTrailer {
                // Never an end: a request that could be read two ways is not
                // served. (Trailers come once: nghttp2 refuses a HEADERS
                // frame after them, or trailers without END_STREAM.)
                current.events.append(.malformed(hd.stream_id))
                return
            }
            if endStream { requestEnded(stream) }
        case NGHTTP2_DATA.rawValue:
            if endStream, let stream = streams[hd.stream_id] { requestEnded(stream) }
        case NGHTTP2_RST_STREAM.rawValue:
            guard let stream = streams[hd.stream_id] else { return }
            stream.resetByPeer = true
            current.events.append(.resetByPeer(hd.stream_id, code: frame.pointee.rst_stream.error_code))
        case NGHTTP2_GOAWAY.rawValue:
            current.events.append(
                .goawayReceived(code: frame.pointee.goaway.error_code, lastStreamID: frame.pointee.goaway.last_stream_id))
        default: break
        }
    }

    /// The frame as the connection machine counts it: payload lengths without padding.
    static func inbound(_ frame: UnsafePointer<nghttp2_frame>, endStream: Bool)
        -> HTTP2ConnectionStateMachine.InboundFrame
    {
        let hd = frame.pointee.hd
        switch UInt32(hd.type) {
        case NGHTTP2_DATA.rawValue: return .data(length: max(0, hd.length &- frame.pointee.data.padlen), endStream: endStream)
        case NGHTTP2_HEADERS.rawValue:
            return .headers(length: max(0, hd.length &- frame.pointee.headers.padlen), endStream: endStream)
        // Counted at its header (on_begin_frame), whether nghttp2 reads it or skips it.
        case NGHTTP2_PRIORITY.rawValue: return .other
        case NGHTTP2_WINDOW_UPDATE.rawValue: return .windowUpdate
        case NGHTTP2_SETTINGS.rawValue: return .settings
        case NGHTTP2_PING.rawValue: return .ping
        default: return .other
        }
    }

    private func requestEnded(_ stream: Stream) {
        guard !stream.requestEnded else { return }
        stream.requestEnded = true
        current.events.append(.requestEnded(stream.id))
    }

    /// Request body bytes. The connection window is given back at once; the
    /// stream's when the bytes are taken, or at once when they are dropped
    /// (a refused head, a body over the limit).
    func dataChunk(_ id: Int32, _ data: UnsafeRawBufferPointer) {
        nghttp2_session_consume_connection(session, data.count)
        guard let stream = streams[id], stream.head != nil, !stream.bodyTooLarge else {
            nghttp2_session_consume_stream(session, id, data.count)
            return
        }
        let (total, overflow) = stream.bodyTotal.addingReportingOverflow(data.count)
        // An extended CONNECT's body is a tunnel's bytes (RFC 8441): flow control bounds what is held, not a size.
        if overflow || total > settings.request.maxBodyBytes, stream.head?.connectProtocol == nil {
            stream.bodyTooLarge = true
            stream.body = []
            nghttp2_session_consume_stream(session, id, data.count)
            current.events.append(.bodyTooLarge(id))
            return
        }
        stream.bodyTotal = overflow ? Int.max : total
        stream.body.append(contentsOf: data)
        current.events.append(.data(id, count: data.count))
    }

    /// One of our frames was sent: the stream's DATA bytes and END_STREAM.
    func frameSent(_ frame: UnsafePointer<nghttp2_frame>) {
        let hd = frame.pointee.hd
        switch UInt32(hd.type) {
        case NGHTTP2_DATA.rawValue: current.dataFramesSent &+= 1
        case NGHTTP2_RST_STREAM.rawValue: current.events.append(.resetSent(hd.stream_id, code: frame.pointee.rst_stream.error_code))
        default: break
        }
        guard let stream = streams[hd.stream_id] else { return }
        if hd.type == UInt8(NGHTTP2_DATA.rawValue) {
            // The payload less its padding (we send none; the length is nghttp2's, within a frame).
            stream.dataSent = stream.dataSent &+ max(0, hd.length &- frame.pointee.data.padlen)
        }
        if hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 { stream.endStreamSent = true }
    }

    func streamClosed(_ id: Int32, code: UInt32) {
        guard let stream = streams.removeValue(forKey: id) else { return }
        if stream.head?.connectProtocol != nil, !stream.body.isEmpty || stream.requestEnded {
            closedTunnels[id] = (stream.body, stream.requestEnded)
        }
        stagedBytes -= stream.output.count
        stream.spool?.close()
        current.events.append(.closed(id, code: code))
    }

    // MARK: - The data provider

    /// Copies staged body bytes into nghttp2's frame buffer; DEFERRED while
    /// none are staged and the body has not ended; at the end, EOF, and the
    /// trailers (submitted from here, as nghttp2 allows) instead of END_STREAM.
    func readData(
        _ id: Int32, into buffer: UnsafeMutablePointer<UInt8>?, length: Int, flags: UnsafeMutablePointer<UInt32>?
    ) -> Int {
        guard let stream = streams[id] else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        var n = buffer.map { stream.output.take(into: UnsafeMutableRawPointer($0), max: length) } ?? 0
        stagedBytes -= n
        guard stream.output.isEmpty else { return n }
        // Then what was read ahead into the spool (the file's front); while
        // it holds bytes the answer has not ended, whether or not this frame
        // had room for any of them.
        if let spool = stream.spool, !spool.isEmpty {
            if let buffer, n < length {
                guard let read = spool.read(into: UnsafeMutableRawPointer(buffer + n), max: length - n) else {
                    // The spool could not be read: the answer is broken off (the stream reset).
                    return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
                }
                n += read
            }
            if !spool.isEmpty { return n }
        }
        if stream.outputEnded {
            var f = NGHTTP2_DATA_FLAG_EOF.rawValue
            if let trailers = stream.trailers, !trailers.isEmpty {
                let rv = trailers.withNV { nv in nghttp2_submit_trailer(session, id, nv.baseAddress, nv.count) }
                if rv == 0 { f |= NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue }
            }
            flags?.pointee |= f
            return n
        }
        if n > 0 { return n }
        stream.deferred = true
        return Int(NGHTTP2_ERR_DEFERRED.rawValue)
    }
}

/// The data provider's read callback (`source` is unused: the stream is
/// found by id in the session's `streams`, see the retention note above).
let dataSourceRead: nghttp2_data_source_read_callback = { _, streamID, buffer, length, flags, _, userData in
    guard let session = HTTP2Session.session(userData) else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
    return session.readData(streamID, into: buffer, length: length, flags: flags)
}
