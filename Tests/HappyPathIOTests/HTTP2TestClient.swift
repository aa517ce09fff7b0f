import CNghttp2
import HappyPathCore

@testable import HappyPathIO

/// An nghttp2 client session in memory, for testing `HTTP2Session` without
/// sockets: it submits requests, and records what the server's bytes made of
/// each stream. Its `user_data` is itself, unretained: the test holds it for
/// as long as the session lives (deleted in deinit).
final class HTTP2TestClient {
    /// What came back on one stream.
    struct Answer {
        var head: [HTTPField] = []
        var trailers: [HTTPField] = []
        var body: [UInt8] = []
        var closedWith: UInt32?
        var resetWith: UInt32?
    }

    var session: OpaquePointer?
    var answers: [Int32: Answer] = [:]
    /// Request bodies still to send, by stream, and whether the body ends
    /// after them (else the provider waits, DEFERRED, for `sendBody`).
    var requestBodies: [Int32: (bytes: [UInt8], end: Bool)] = [:]
    var goaway: UInt32?
    /// At most this many body bytes per DATA frame, and whether each frame
    /// is padded to the largest payload nghttp2 allows.
    var bodyChunk = Int.max
    var padData = false

    init() throws {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0 else { throw HTTP2SessionError(code: -1) }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) {
            _, frame, name, nameLength, value, valueLength, _, userData in
            guard let frame, let name, let value, let userData else { return 0 }
            let client = Unmanaged<HTTP2TestClient>.fromOpaque(userData).takeUnretainedValue()
            let field = HTTPField(
                name: String(decoding: UnsafeBufferPointer(start: name, count: nameLength), as: UTF8.self),
                value: String(decoding: UnsafeBufferPointer(start: value, count: valueLength), as: UTF8.self))
            let id = frame.pointee.hd.stream_id
            if frame.pointee.headers.cat == NGHTTP2_HCAT_HEADERS, client.answers[id]?.head.isEmpty == false {
                client.answers[id, default: Answer()].trailers.append(field)
            } else {
                client.answers[id, default: Answer()].head.append(field)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, id, data, length, userData in
            guard let data, let userData else { return 0 }
            let client = Unmanaged<HTTP2TestClient>.fromOpaque(userData).takeUnretainedValue()
            client.answers[id, default: Answer()].body.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
            guard let frame, let userData else { return 0 }
            let client = Unmanaged<HTTP2TestClient>.fromOpaque(userData).takeUnretainedValue()
            let id = frame.pointee.hd.stream_id
            if frame.pointee.hd.type == UInt8(NGHTTP2_RST_STREAM.rawValue) {
                client.answers[id, default: Answer()].resetWith = frame.pointee.rst_stream.error_code
            }
            if frame.pointee.hd.type == UInt8(NGHTTP2_GOAWAY.rawValue) { client.goaway = frame.pointee.goaway.error_code }
            return 0
        }
        nghttp2_session_callbacks_set_select_padding_callback(callbacks) { _, frame, maxPayload, userData in
            guard let frame, let userData else { return 0 }
            let client = Unmanaged<HTTP2TestClient>.fromOpaque(userData).takeUnretainedValue()
            let padded = client.padData && frame.pointee.hd.type == UInt8(NGHTTP2_DATA.rawValue)
            return padded ? maxPayload : frame.pointee.hd.length
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, id, code, userData in
            guard let userData else { return 0 }
            let client = Unmanaged<HTTP2TestClient>.fromOpaque(userData).takeUnretainedValue()
            client.answers[id, default: Answer()].closedWith = code
            return 0
        }
        guard nghttp2_session_client_new(&session, callbacks, Unmanaged.passUnretained(self).toOpaque()) == 0 else {
            throw HTTP2SessionError(code: -1)
        }
        var none: [nghttp2_settings_entry] = []
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &none, 0)
    }

    deinit { nghttp2_session_del(session) }

    /// Submits a request: `:method`, `:scheme`, `:authority`, `:path`, then
    /// `fields`. With `body`, the body follows (ended unless `endBody` is
    /// false, when the stream stays open for `sendBody`). Returns the stream id.
    @discardableResult
    func request(
        _ method: String = "GET", _ path: String = "/", authority: String = "example.com", fields: [HTTPField] = [],
        body: [UInt8]? = nil, endBody: Bool = true
    ) -> Int32 {
        let all =
            [
                HTTPField(name: ":method", value: method), HTTPField(name: ":scheme", value: "http"),
                HTTPField(name: ":authority", value: authority), HTTPField(name: ":path", value: path),
            ] + fields
        return HTTP2Session.withNV(all) { nv in
            guard let body else { return nghttp2_submit_request(session, nil, nv.baseAddress, nv.count, nil, nil) }
            var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil)) {
                _, id, buffer, length, flags, _, userData in
                let client = Unmanaged<HTTP2TestClient>.fromOpaque(userData!).takeUnretainedValue()
                guard var pending = client.requestBodies[id] else { return Int(NGHTTP2_ERR_DEFERRED.rawValue) }
                let n = min(length, pending.bytes.count, client.bodyChunk)
                if n > 0 { pending.bytes.withUnsafeBufferPointer { buffer!.update(from: $0.baseAddress!, count: n) } }
                pending.bytes.removeFirst(n)
                client.requestBodies[id] = pending
                if pending.bytes.isEmpty, pending.end { flags!.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
                return n == 0 && !pending.end ? Int(NGHTTP2_ERR_DEFERRED.rawValue) : n
            }
            let id = nghttp2_submit_request(session, nil, nv.baseAddress, nv.count, &provider, nil)
            if id > 0 { requestBodies[id] = (body, endBody) }
            return id
        }
    }

    /// More request body for a stream submitted with `endBody: false`.
    func sendBody(_ id: Int32, _ bytes: [UInt8], end: Bool) {
        requestBodies[id, default: ([], false)].bytes.append(contentsOf: bytes)
        requestBodies[id]?.end = end
        nghttp2_session_resume_data(session, id)
    }

    /// Resets a stream from the client's side.
    func reset(_ id: Int32, code: UInt32 = NGHTTP2_CANCEL.rawValue) {
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code)
    }

    /// Everything the client has to send.
    func output() -> [UInt8] { nghttpOutput(session) }

    /// Feeds the server's bytes; the count read or a negative error.
    @discardableResult
    func input(_ bytes: [UInt8]) -> Int { nghttpInput(session, bytes) }

    /// Pumps bytes both ways until neither side has more; returns every
    /// server `receive` result on the way.
    @discardableResult
    func exchange(with server: HTTP2Session) -> [HTTP2ReceiveResult] {
        var results: [HTTP2ReceiveResult] = []
        for _ in 0..<64 {
            let toServer = output()
            if !toServer.isEmpty { results.append(server.receive(toServer)) }
            let toClient = server.produceAll()
            if !toClient.isEmpty { input(toClient) }
            let later = server.takeEvents()
            if !later.events.isEmpty { results.append(later) }
            if toServer.isEmpty, toClient.isEmpty { break }
        }
        return results
    }
}

extension HTTP2ReceiveResult {
    /// Every event of several reads.
    static func events(_ results: [HTTP2ReceiveResult]) -> [HTTP2SessionEvent] { results.flatMap(\.events) }
    static func ready(_ results: [HTTP2ReceiveResult]) -> [Int32] { results.flatMap(\.ready) }
}

/// Everything an nghttp2 session has to send, copied out (the pointer
/// `mem_send` gives is valid only until the next call on the session).
func nghttpOutput(_ session: OpaquePointer?) -> [UInt8] {
    var out: [UInt8] = []
    while true {
        var data: UnsafePointer<UInt8>?
        let n = nghttp2_session_mem_send(session, &data)
        guard n > 0, let data else { break }
        out.append(contentsOf: UnsafeBufferPointer(start: data, count: n))
    }
    return out
}

/// `mem_recv` over all of `bytes`: the count consumed, or a negative error.
func nghttpInput(_ session: OpaquePointer?, _ bytes: [UInt8]) -> Int {
    bytes.withUnsafeBufferPointer { nghttp2_session_mem_recv(session, $0.baseAddress, $0.count) }
}
