internal import CLibevent
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A client request received by `HTTPServer`, valid until it is answered.
///
/// Ownership: libevent owns the underlying `evhttp_request`; it frees it when
/// a reply completes (`reply`, `endReply`) or when the connection is freed by
/// `abort()`. After that every method here is a no-op, because `raw` is
/// cleared first, so a late upstream callback cannot touch freed memory.
public final class HTTPRequest {
    private var raw: UnsafeMutablePointer<evhttp_request>?
    /// Answer with `Connection: close` (set for requests libevent rejected).
    public var closeAfterReply = false
    /// Told when the client goes away or queued output drains (see
    /// `watchClientClose()` and `send(_:notifyWhenDrained:)`). Held
    /// unowned(unsafe): the observer outlives the request's answer.
    public unowned(unsafe) var observer: HTTPRequestObserver?
    private var watchingClose = false
    private var drainPending = false
    /// While armed: an EV_CLOSED watch on the client socket (see `watchForHangUp`).
    private var hangUpEvent: OpaquePointer?

    init(_ raw: UnsafeMutablePointer<evhttp_request>) { self.raw = raw }

    // MARK: - Request

    public var method: String {
        guard let raw else { return "GET" }
        switch Int32(evhttp_request_get_command(raw).rawValue) {
        case 1 << 0: return "GET"
        case 1 << 1: return "POST"
        case 1 << 2: return "HEAD"
        case 1 << 3: return "PUT"
        case 1 << 4: return "DELETE"
        case 1 << 5: return "OPTIONS"
        case 1 << 6: return "TRACE"
        case 1 << 7: return "CONNECT"
        case 1 << 8: return "PATCH"
        default: return "GET"
        }
    }

    /// The request target exactly as the client sent it (origin form).
    public var target: String {
        guard let raw, let uri = evhttp_request_get_uri(raw) else { return "/" }
        return String(cString: uri)
    }

    /// Calls `body` with each request header in arrival order.
    public func forEachHeader(_ body: (_ name: String, _ value: String) -> Void) {
        guard let raw, let headers = evhttp_request_get_input_headers(raw) else { return }
        var entry = headers.pointee.tqh_first
        while let e = entry {
            if let key = e.pointee.key, let value = e.pointee.value {
                body(String(cString: key), String(cString: value))
            }
            entry = e.pointee.next.tqe_next
        }
    }

    public func header(_ name: String) -> String? {
        guard let raw, let value = evhttp_find_header(evhttp_request_get_input_headers(raw), name) else { return nil }
        return String(cString: value)
    }

    /// The client's address, as text.
    public var peerAddress: String {
        guard let raw, let evcon = evhttp_request_get_connection(raw) else { return "" }
        var host: UnsafeMutablePointer<CChar>?
        var port: UInt16 = 0
        evhttp_connection_get_peer(evcon, &host, &port)
        return host.map { String(cString: $0) } ?? ""
    }

    /// The whole request body (libevent has read it before `serve`).
    public func takeBody() -> RequestBody {
        guard let raw, let buffer = evhttp_request_get_input_buffer(raw) else { return .empty }
        let count = evbuffer_get_length(buffer)
        guard count > 0 else { return .empty }
        let body = RequestBody(count: count)
        evbuffer_remove(buffer, body.baseAddress, count)
        return body
    }

    // MARK: - Whole replies

    /// Sends a complete response and releases the request.
    public func reply(status: Int, headers: [HTTPField] = [], body: String? = nil) {
        guard let raw else { return }
        self.raw = nil
        clearConnectionCallbacks(raw)
        let out = evhttp_request_get_output_headers(raw)
        for field in headers { evhttp_add_header(out, field.name, field.value) }
        if closeAfterReply { evhttp_add_header(out, "Connection", "close") }
        if let body, !body.isEmpty {
            let buffer = evbuffer_new()
            var body = body
            body.withUTF8 { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
            evhttp_send_reply(raw, Int32(status), reasonPhrase(status), buffer)
            evbuffer_free(buffer)
        } else {
            evhttp_send_reply(raw, Int32(status), reasonPhrase(status), nil)
        }
    }

    // MARK: - Streamed replies

    /// Replaces every response header added so far (a new try starts clean).
    public func clearResponseHeaders() {
        guard let raw else { return }
        evhttp_clear_headers(evhttp_request_get_output_headers(raw))
    }

    public func addResponseHeader(_ name: String, _ value: String) {
        guard let raw else { return }
        name.withCString { n in value.withCString { v in _ = evhttp_add_header(evhttp_request_get_output_headers(raw), n, v) } }
    }

    /// Adds a header from raw bytes (as libcurl hands them over) without
    /// building Swift strings: copied with terminators into a stack buffer.
    public func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard let raw else { return }
        let total = name.count + value.count + 2
        withUnsafeTemporaryAllocation(byteCount: total, alignment: 1) { buffer in
            let base = buffer.baseAddress!
            if name.count > 0 { base.copyMemory(from: name.baseAddress!, byteCount: name.count) }
            base.storeBytes(of: 0, toByteOffset: name.count, as: UInt8.self)
            let valueStart = base + name.count + 1
            if value.count > 0 { valueStart.copyMemory(from: value.baseAddress!, byteCount: value.count) }
            valueStart.storeBytes(of: 0, toByteOffset: value.count, as: UInt8.self)
            evhttp_add_header(
                evhttp_request_get_output_headers(raw), base.assumingMemoryBound(to: CChar.self),
                valueStart.assumingMemoryBound(to: CChar.self))
        }
    }

    /// Sends the status line and headers; the body follows with `send`.
    /// With a `Content-Length` header the body is sent as is; without one,
    /// HTTP/1.1 clients get chunked encoding.
    public func startReply(status: Int) {
        guard let raw else { return }
        if closeAfterReply { evhttp_add_header(evhttp_request_get_output_headers(raw), "Connection", "close") }
        evhttp_send_reply_start(raw, Int32(status), reasonPhrase(status))
    }

    /// Queues body bytes for the client. With `notifyWhenDrained`, the
    /// observer hears `requestOutputDrained` once everything queued so far
    /// has been written to the socket (for back-pressure).
    public func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool = false) {
        guard let raw, bytes.count > 0 else { return }
        let buffer = ReplyScratch.buffer
        evbuffer_add(buffer, bytes.baseAddress, bytes.count)
        drainPending = notifyWhenDrained
        if notifyWhenDrained {
            evhttp_send_reply_chunk_with_cb(raw, buffer, httpRequestDrainedCallback, Unmanaged.passUnretained(self).toOpaque())
        } else {
            evhttp_send_reply_chunk(raw, buffer)
        }
        let refused = evbuffer_get_length(buffer)
        if refused > 0 {
            // libevent takes no body for HEAD, 204 and 304 (or a closed
            // connection): discard, and report "drained" at once.
            evbuffer_drain(buffer, refused)
            drained()
        }
    }

    /// Bytes queued for the client and not yet written.
    public var pendingOutput: Int {
        guard let raw, let evcon = evhttp_request_get_connection(raw),
            let bev = evhttp_connection_get_bufferevent(evcon)
        else { return 0 }
        return evbuffer_get_length(bufferevent_get_output(bev))
    }

    /// Finishes a streamed reply and releases the request.
    public func endReply() {
        guard let raw else { return }
        self.raw = nil
        clearConnectionCallbacks(raw)
        evhttp_send_reply_end(raw)
    }

    /// Drops the client connection without completing the response (the body
    /// was cut short upstream: the client must see a broken response, not a
    /// complete one). Releases the request.
    public func abort() {
        guard let raw else { return }
        self.raw = nil
        clearConnectionCallbacks(raw)
        if let evcon = evhttp_request_get_connection(raw) {
            evhttp_connection_free(evcon)  // frees the request with it
        } else {
            evhttp_send_reply_end(raw)  // already detached: this only frees it
        }
    }

    /// Tells the observer (`requestClientClosed`) if the client connection
    /// closes before the answer is complete. The connection holds an
    /// unretained pointer to `self`, cleared before the request is released.
    public func watchClientClose() {
        guard let raw, let evcon = evhttp_request_get_connection(raw) else { return }
        watchingClose = true
        evhttp_connection_set_closecb(evcon, httpRequestCloseCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    /// libevent stops reading a connection while its request is handled, so a
    /// client that hangs up is only noticed when the answer is written. For
    /// long waits (parked, queued) this watches the socket for the peer's
    /// close (EPOLLRDHUP) and reports it as `requestClientClosed`. It costs
    /// system calls, so it is not for every request.
    public func watchForHangUp() {
        guard hangUpEvent == nil, let raw, let evcon = evhttp_request_get_connection(raw),
            let bev = evhttp_connection_get_bufferevent(evcon)
        else { return }
        let event = event_new(
            evhttp_connection_get_base(evcon), bufferevent_getfd(bev), Int16(EV_CLOSED), httpRequestHangUpCallback,
            Unmanaged.passUnretained(self).toOpaque())
        hangUpEvent = event
        event_add(event, nil)
    }

    public func stopWatchingForHangUp() {
        if let hangUpEvent {
            event_del(hangUpEvent)
            event_free(hangUpEvent)
        }
        hangUpEvent = nil
    }

    fileprivate func hungUp() {
        stopWatchingForHangUp()
        observer?.requestClientClosed(self)
    }

    private func clearConnectionCallbacks(_ raw: UnsafeMutablePointer<evhttp_request>) {
        stopWatchingForHangUp()
        if watchingClose, let evcon = evhttp_request_get_connection(raw) {
            evhttp_connection_set_closecb(evcon, nil, nil)
        }
        watchingClose = false
        drainPending = false
    }

    fileprivate func connectionClosed() {
        stopWatchingForHangUp()
        // Still attached: libevent frees the request right after this callback,
        // so forget it. Detached (evcon == NULL): it is ours to release later.
        if let raw, raw.pointee.evcon != nil { self.raw = nil }
        watchingClose = false
        drainPending = false
        observer?.requestClientClosed(self)
    }

    fileprivate func drained() {
        guard drainPending else { return }
        drainPending = false
        observer?.requestOutputDrained(self)
    }

    /// Writes `bytes` raw to the socket (no HTTP framing), then drops the
    /// connection: the demo upstream's "garbage" answer.
    public func sendRawAndDrop(_ bytes: [UInt8]) {
        guard let raw, let evcon = evhttp_request_get_connection(raw),
            let bev = evhttp_connection_get_bufferevent(evcon)
        else { return }
        let fd = bufferevent_getfd(bev)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        dropConnection()
    }

    /// Shuts the client's socket (both ways) without a response: the demo
    /// upstream's "drop the connection". The request is released once
    /// libevent notices.
    public func dropConnection() {
        guard let raw else { return }
        if let evcon = evhttp_request_get_connection(raw), let bev = evhttp_connection_get_bufferevent(evcon) {
            shutdown(bufferevent_getfd(bev), Int32(SHUT_RDWR))
        }
        reply(status: 500)
    }
}

private func httpRequestCloseCallback(_: OpaquePointer?, _ arg: UnsafeMutableRawPointer?) {
    guard let arg else { return }
    Unmanaged<HTTPRequest>.fromOpaque(arg).takeUnretainedValue().connectionClosed()
}

private func httpRequestHangUpCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    guard let arg else { return }
    Unmanaged<HTTPRequest>.fromOpaque(arg).takeUnretainedValue().hungUp()
}

private func httpRequestDrainedCallback(_: OpaquePointer?, _ arg: UnsafeMutableRawPointer?) {
    guard let arg else { return }
    Unmanaged<HTTPRequest>.fromOpaque(arg).takeUnretainedValue().drained()
}

/// What a request tells the code answering it, on the loop's thread.
public protocol HTTPRequestObserver: AnyObject {
    /// The client connection closed first. Called from inside libevent's
    /// connection teardown: defer real work to the next loop pass.
    func requestClientClosed(_ request: HTTPRequest)
    /// Everything queued with `notifyWhenDrained` has been written.
    func requestOutputDrained(_ request: HTTPRequest)
}

/// One scratch evbuffer per thread for moving body bytes into a reply
/// (`evhttp_send_reply_chunk` moves its chains out, leaving it empty).
private enum ReplyScratch {
    static var buffer: OpaquePointer {
        if let existing = pthread_getspecific(key) { return OpaquePointer(existing) }
        let created = evbuffer_new()!
        pthread_setspecific(key, UnsafeRawPointer(created))
        return created
    }

    static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { pointer in evbuffer_free(OpaquePointer(pointer)) }
        return key
    }()
}

/// Reason phrases libevent 2.1 lacks (it prints "Client Error" for them);
/// nil lets libevent use its own table.
private func reasonPhrase(_ status: Int) -> UnsafePointer<CChar>? {
    let phrase: StaticString
    switch status {
    case 422: phrase = "Unprocessable Content"
    case 425: phrase = "Too Early"
    case 428: phrase = "Precondition Required"
    case 429: phrase = "Too Many Requests"
    case 431: phrase = "Request Header Fields Too Large"
    case 451: phrase = "Unavailable For Legal Reasons"
    default: return nil
    }
    return UnsafeRawPointer(phrase.utf8Start).assumingMemoryBound(to: CChar.self)
}
