internal import CCurl
internal import CLibevent
internal import CShims
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// The upstream side of one event loop: a libcurl multi handle driven by the
/// loop's libevent base (socket and timer callbacks, `curl_multi_socket_action`),
/// with its own connection pool. Nothing here blocks.
public final class UpstreamClient {
    private let loop: EventLoop
    private let multi: UnsafeMutableRawPointer
    private var timerEvent: OpaquePointer?
    /// Tries whose streamed body has something new for a paused send, and
    /// the event that resumes them (made by the first such try).
    private var sendResumes: [UpstreamTransfer] = []
    private var sendResumeEvent: OpaquePointer?
    /// Per descriptor: its libevent event (reused across transfers), the
    /// interest registered with libevent, and whether libcurl wants it now.
    /// An idle kept-alive connection stays registered for reading between
    /// transfers, so reusing it costs no epoll_ctl (see `watch`).
    private var sockets: [SocketSlot] = []

    private struct SocketSlot {
        var event: OpaquePointer?
        var registered: Int16 = 0
        var wanted = false
    }
    private var pool: [EasyHandle] = []
    /// Transfers handed to libcurl and not yet complete: `shutdown` ends
    /// them (libcurl's private pointer holds a reference to each).
    private var inFlight: [UpstreamTransfer] = []
    private var isShutDown = false
    /// Each origin parsed once into a libcurl URL handle (CURLOPT_CURLU),
    /// instead of libcurl parsing the URL string on every try.
    private var origins: [String: OpaquePointer] = [:]

    func parsedOrigin(_ origin: String) -> OpaquePointer? {
        if let url = origins[origin] { return url }
        guard let url = curl_url() else { return nil }
        let code = origin.withCString { curl_url_set(url, CURLUPART_URL, $0, 0) }
        guard code == CURLUE_OK else {
            curl_url_cleanup(url)
            return nil
        }
        origins[origin] = url
        return url
    }

    /// libcurl's own CA file and folder, asked once per process (the
    /// proxy's HTTP/2 client uses them too).
    static let libcurlDefaultCA: (file: String?, path: String?) = {
        let easy = curl_easy_init()!
        defer { curl_easy_cleanup(easy) }
        var file: UnsafeMutableRawPointer?
        var path: UnsafeMutableRawPointer?
        hp_easy_get_ptr(easy, CURLINFO_CAINFO, &file)
        hp_easy_get_ptr(easy, CURLINFO_CAPATH, &path)
        return (
            file.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) },
            path.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) }
        )
    }()

    public init(loop: EventLoop, maxConnectionsPerHost: Int, maxCachedConnections: Int) {
        self.loop = loop
        multi = curl_multi_init()
        // Alive: the multi handle's socket and timer data and every event of this client get `self`
        // unretained. The owner (a worker's or the health checker's transports) holds the client,
        // libcurl calls back only inside its curl_multi_* calls, and `shutdown()` (also deinit) ends both.
        let me = Unmanaged.passUnretained(self).toOpaque()
        hp_multi_set_socket_cb(multi, upstreamSocketCallback)
        hp_multi_set_ptr(multi, CURLMOPT_SOCKETDATA, me)
        hp_multi_set_timer_cb(multi, upstreamTimerCallback)
        hp_multi_set_ptr(multi, CURLMOPT_TIMERDATA, me)
        setConnectionLimits(perHost: maxConnectionsPerHost, cached: maxCachedConnections)
        timerEvent = event_new(loop.base, -1, 0, upstreamTimerEventCallback, me)
    }

    /// libcurl's connection caps: connections open to one host and port at
    /// once (more transfers wait inside libcurl for one), and idle
    /// connections kept for reuse. May change while transfers run (a
    /// configuration reload): libcurl applies the new values at its next
    /// check and closes nothing that is in use. On the loop's thread.
    public func setConnectionLimits(perHost: Int, cached: Int) {
        hp_multi_set_long(multi, CURLMOPT_MAX_HOST_CONNECTIONS, max(1, perHost))
        hp_multi_set_long(multi, CURLMOPT_MAXCONNECTS, max(4, cached))
    }

    deinit { shutdown() }

    /// Ends every transfer in flight (their handlers are not called) and
    /// frees libcurl's and libevent's resources, in that order. On the
    /// loop's thread, or after it stopped.
    public func shutdown() {
        guard !isShutDown else { return }
        isShutDown = true
        while let transfer = inFlight.last {
            transfer.handler = nil
            complete(transfer)
        }
        for handle in pool { handle.free() }
        pool.removeAll()
        for url in origins.values { curl_url_cleanup(url) }
        origins.removeAll()
        curl_multi_cleanup(multi)
        for case let event? in sockets.map(\.event) { event_free(event) }
        sockets.removeAll()
        if let timerEvent { event_free(timerEvent) }
        timerEvent = nil
        if let sendResumeEvent { event_free(sendResumeEvent) }
        sendResumeEvent = nil
        sendResumes.removeAll()
    }

    // MARK: - Transfers

    public func start(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> UpstreamTransfer {
        let handle = pool.popLast() ?? makeHandle()
        let transfer = UpstreamTransfer(handle: handle, client: self)
        transfer.handler = handler
        transfer.body = request.body
        transfer.headers = request.headers
        prepare(handle, for: request)
        let easy = handle.easy
        let retained = Unmanaged.passRetained(transfer).toOpaque()
        transfer.inFlightIndex = inFlight.count
        inFlight.append(transfer)
        hp_easy_set_ptr(easy, CURLOPT_PRIVATE, retained)
        hp_easy_set_ptr(easy, CURLOPT_HEADERDATA, retained)
        hp_easy_set_ptr(easy, CURLOPT_WRITEDATA, retained)
        if let stream = request.bodyStream {
            // Kept alive by the transfer; read as it goes only if it has not ended (`prepare`).
            transfer.bodyStream = stream
            if stream.completeBody == nil {
                transfer.readsBody = true
                hp_easy_set_ptr(easy, CURLOPT_READDATA, retained)
                // Alive: libcurl's reference holds the transfer until `complete`, which clears this first.
                stream.onAvailable = { [unowned transfer] in transfer.bodyAvailable() }
            }
        }
        curl_multi_add_handle(multi, easy)
        return transfer
    }

    /// Stops telling a try's handler anything, from inside a handler method
    /// too (where libcurl refuses `cancel`): what still arrives is read and
    /// dropped until `cancel` or the try's end.
    public func detach(_ transfer: UpstreamTransfer) { transfer.handler = nil }

    /// Stops a try without telling its handler (the caller is the handler).
    /// Not from inside a handler method.
    public func cancel(_ transfer: UpstreamTransfer) {
        transfer.handler = nil
        guard !transfer.finished else { return }
        complete(transfer)
    }

    /// Detaches a transfer from libcurl and returns its handle to the pool.
    private func complete(_ transfer: UpstreamTransfer) {
        transfer.finished = true
        if transfer.paused { transfer.pauseEnded() }
        let i = transfer.inFlightIndex
        if i >= 0 {
            let last = inFlight.removeLast()
            if i < inFlight.count {
                inFlight[i] = last
                last.inFlightIndex = i
            }
            transfer.inFlightIndex = -1
        }
        curl_multi_remove_handle(multi, transfer.handle.easy)
        hp_easy_set_ptr(transfer.handle.easy, CURLOPT_HTTPHEADER, nil)
        transfer.headers = nil
        transfer.body = nil
        if let stream = transfer.bodyStream {
            // Only the try that reads the body let go of it as its reader (a
            // hedge sent the whole body and never was one).
            if transfer.readsBody {
                stream.onAvailable = nil
                stream.readerLeft()
            }
            transfer.bodyStream = nil
            transfer.readsBody = false
            transfer.sendPaused = false
        }
        pool.append(transfer.handle)
        // Alive: libcurl's reference goes back only after curl_multi_remove_handle, so no callback of
        // this try runs after it; the caller (shutdown, cancel, drainCompleted) still holds the transfer.
        Unmanaged.passUnretained(transfer).release()  // the reference taken in start()
    }

    /// A paused send to resume on the loop's next pass (`resumeSent`).
    func resumeSendingSoon(_ transfer: UpstreamTransfer) {
        sendResumes.append(transfer)
        if sendResumeEvent == nil {
            // Alive: points at `self` unretained; `shutdown()` (the owner's, or deinit) frees it.
            sendResumeEvent = event_new(
                loop.base, -1, 0, upstreamResumeEventCallback, Unmanaged.passUnretained(self).toOpaque())
        }
        if sendResumes.count == 1, let sendResumeEvent { event_active(sendResumeEvent, 0, 0) }
    }

    fileprivate func resumeSent() {
        let due = sendResumes
        sendResumes.removeAll(keepingCapacity: true)
        for transfer in due { transfer.resumeSending() }
    }

    fileprivate func drainCompleted() {
        var remaining: Int32 = 0
        while let message = curl_multi_info_read(multi, &remaining) {
            guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
            let code = hp_msg_result(message)
            var privatePointer: UnsafeMutableRawPointer?
            hp_easy_get_ptr(easy, CURLINFO_PRIVATE, &privatePointer)
            guard let privatePointer else { continue }
            let transfer = Unmanaged<UpstreamTransfer>.fromOpaque(privatePointer).takeUnretainedValue()
            var failure = code == CURLE_OK ? nil : classify(code, transfer)
            if let refusal = transfer.refusal { failure = .badResponse(refusal) }
            let handler = transfer.handler
            transfer.handler = nil
            complete(transfer)
            handler?.upstreamFinished(failure)
        }
    }

    private func classify(_ code: CURLcode, _ transfer: UpstreamTransfer) -> UpstreamFailure {
        let message =
            transfer.handle.errorBuffer[0] != 0
            ? String(cString: transfer.handle.errorBuffer) : String(cString: curl_easy_strerror(code))
        switch code {
        case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY:
            return .connectFailed(message)
        case CURLE_OPERATION_TIMEDOUT:
            var sent = 0
            hp_easy_get_long(transfer.handle.easy, CURLINFO_REQUEST_SIZE, &sent)
            return sent == 0 ? .connectFailed(message) : .timeout
        case CURLE_GOT_NOTHING, CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_PARTIAL_FILE:
            return .reset(message)
        case CURLE_HTTP2_STREAM:
            return .streamReset(message)
        case CURLE_WEIRD_SERVER_REPLY, CURLE_UNSUPPORTED_PROTOCOL, CURLE_BAD_CONTENT_ENCODING:
            return .badResponse(message)
        case _ where Self.isTLSFailure(code):
            return .tls(message)
        default:
            return .other(message)
        }
    }

    /// libcurl's codes for a TLS connection that failed (not retried: `UpstreamFailure.tls`).
    static func isTLSFailure(_ code: CURLcode) -> Bool {
        switch code {
        case CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CONNECT_ERROR, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CACERT_BADFILE,
            CURLE_SSL_CIPHER, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_CRL_BADFILE:
            true
        default:
            false
        }
    }

    // MARK: - libcurl → libevent glue

    fileprivate func watch(socket fd: curl_socket_t, what: Int32) {
        let index = Int(fd)
        if index >= sockets.count {
            sockets.append(contentsOf: repeatElement(SocketSlot(), count: index + 1 - sockets.count))
        }
        if what == CURL_POLL_REMOVE {
            // The transfer is done but the connection may be kept: leave a
            // read registration in place (a later transfer that reads again
            // needs no epoll_ctl). A write registration is dropped.
            sockets[index].wanted = false
            if sockets[index].registered & Int16(EV_WRITE) != 0 { unregister(index) }
            return
        }
        var kind = Int16(EV_PERSIST)
        if what & CURL_POLL_IN != 0 { kind |= Int16(EV_READ) }
        if what & CURL_POLL_OUT != 0 { kind |= Int16(EV_WRITE) }
        sockets[index].wanted = true
        guard sockets[index].registered != kind else { return }
        // Alive: each socket event points at `self` unretained; `shutdown()` frees them after
        // curl_multi_cleanup (which may still call `closing` on them).
        let me = Unmanaged.passUnretained(self).toOpaque()
        if let event = sockets[index].event {
            event_del(event)
            event_assign(event, loop.base, fd, kind, upstreamSocketEventCallback, me)
            event_add(event, nil)
        } else {
            let event = event_new(loop.base, fd, kind, upstreamSocketEventCallback, me)
            sockets[index].event = event
            event_add(event, nil)
        }
        sockets[index].registered = kind
    }

    private func unregister(_ index: Int) {
        if let event = sockets[index].event, sockets[index].registered != 0 { event_del(event) }
        sockets[index].registered = 0
        sockets[index].wanted = false
    }

    /// libcurl closes a connection: drop its registration first.
    fileprivate func closing(socket fd: curl_socket_t) {
        if Int(fd) < sockets.count { unregister(Int(fd)) }
    }

    fileprivate func setTimer(milliseconds: Int) {
        guard let timerEvent else { return }
        if milliseconds < 0 {
            event_del(timerEvent)
        } else {
            // Zero means "now": libcurl forbids calling back into it from
            // here, so a zero-delay timer runs socket_action on the next pass.
            var tv = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
            event_add(timerEvent, &tv)
        }
    }

    fileprivate func socketReady(_ fd: Int32, _ what: Int16) {
        if Int(fd) < sockets.count, !sockets[Int(fd)].wanted {
            // An idle kept-alive connection became readable: the upstream
            // closed it (or sent junk). Stop watching; libcurl finds it dead
            // when it next considers reusing it.
            unregister(Int(fd))
            return
        }
        var flags: Int32 = 0
        if what & Int16(EV_READ) != 0 { flags |= CURL_CSELECT_IN }
        if what & Int16(EV_WRITE) != 0 { flags |= CURL_CSELECT_OUT }
        var running: Int32 = 0
        curl_multi_socket_action(multi, fd, flags, &running)
        drainCompleted()
    }

    fileprivate func timerFired() {
        var running: Int32 = 0
        curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running)
        drainCompleted()
    }
}

// MARK: - C callbacks (each gets its object through an unretained pointer)

private func upstreamSocketCallback(
    _: UnsafeMutableRawPointer?, _ fd: curl_socket_t, _ what: Int32, _ userp: UnsafeMutableRawPointer?,
    _: UnsafeMutableRawPointer?
) -> Int32 {
    Unmanaged<UpstreamClient>.fromOpaque(userp!).takeUnretainedValue().watch(socket: fd, what: what)
    return 0
}

private func upstreamTimerCallback(_: UnsafeMutableRawPointer?, _ ms: Int, _ userp: UnsafeMutableRawPointer?) -> Int32 {
    Unmanaged<UpstreamClient>.fromOpaque(userp!).takeUnretainedValue().setTimer(milliseconds: ms)
    return 0
}

private func upstreamSocketEventCallback(_ fd: Int32, _ what: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<UpstreamClient>.fromOpaque(arg!).takeUnretainedValue().socketReady(fd, what)
}

private func upstreamResumeEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<UpstreamClient>.fromOpaque(arg!).takeUnretainedValue().resumeSent()
}

private func upstreamTimerEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<UpstreamClient>.fromOpaque(arg!).takeUnretainedValue().timerFired()
}

func upstreamCloseSocketCallback(_ clientp: UnsafeMutableRawPointer?, _ fd: curl_socket_t) -> Int32 {
    Unmanaged<UpstreamClient>.fromOpaque(clientp!).takeUnretainedValue().closing(socket: fd)
    return close(fd)
}
