internal import CCurl
internal import CLibevent
internal import CShims
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// One upgrade try: a `GET` with `Upgrade` sent to an upstream on a
/// connection of its own.
public struct UpstreamUpgradeRequest {
    /// `scheme://host:port/` of the endpoint: what libcurl connects to.
    public var origin: String
    /// The request head, written as it is (request line, fields, empty line).
    public var head: [UInt8]
    public var connectTimeout: Duration
    /// No byte from the upstream this long, before the tunnel opens: the try fails.
    public var idleTimeout: Duration
    public var tls: UpstreamTLS?
    public var connectTo: String?

    public init(
        origin: String, head: [UInt8], connectTimeout: Duration, idleTimeout: Duration, tls: UpstreamTLS?,
        connectTo: String?
    ) {
        self.origin = origin
        self.head = head
        self.connectTimeout = connectTimeout
        self.idleTimeout = idleTimeout
        self.tls = tls
        self.connectTo = connectTo
    }
}

/// Hears an upgrade try as a plain try is heard (`UpstreamResponseHandler`:
/// status, fields, head complete, body, end), plus the switch.
public protocol UpstreamUpgradeHandler: UpstreamResponseHandler {
    /// The upstream answered `101` and its head was accepted
    /// (`upstreamHeadersComplete` returned nil): `upgrade` is now the
    /// upstream end of a tunnel, the handler's to use and close. No other
    /// method is called after this one.
    func upstreamSwitched(_ upgrade: UpstreamUpgrade)
}

/// An upgrade try, and after a `101` the upstream end of its tunnel.
///
/// libcurl connects (`CURLOPT_CONNECT_ONLY`: its connect timeout, TLS,
/// certificate checks and `connect_to` apply as to any try); the head is
/// then written and the answer read with `curl_easy_send`/`curl_easy_recv`,
/// so the bytes pass through libcurl's TLS. Each try has a libcurl multi
/// handle of its own: a connect-only connection kept in a shared pool could
/// be closed under the tunnel when the pool is pruned (it counts as idle
/// there). An answer other than `101` is read with its framing
/// (Content-Length, chunked, or to the end of the connection) and reported
/// like any try's; the connection is then closed.
public final class UpstreamUpgrade {
    private enum Phase { case connecting, sendingHead, readingHead, readingBody, switched, done }

    private let loop: EventLoop
    private var multi: UnsafeMutableRawPointer?
    private var easy: UnsafeMutableRawPointer?
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private var connectToList: UnsafeMutablePointer<curl_slist>?
    private var url: OpaquePointer?
    /// The event libcurl asked for while it connects.
    private var curlEvent: OpaquePointer?
    private var curlTimer: OpaquePointer?
    /// Ours, once connected and until the switch: writable while the head
    /// goes out, readable while the answer comes in.
    private var ioEvent: OpaquePointer?
    private var ioWhat: Int16 = 0
    private var idleTimer: OpaquePointer?
    private let idleTimeout: Duration
    private var handler: UpstreamUpgradeHandler?
    private var phase = Phase.connecting
    private var head: [UInt8]
    private var headSent = 0
    /// Bytes read from the upstream and not yet used.
    private var received = ByteBuffer(capacity: 4096)
    /// How far `received` was searched for the end of the head.
    private var scanned = 0
    private var body = BodyReader.toEnd
    private var paused = false
    /// The connected socket (−1 before): for the tunnel's events.
    public private(set) var socket: Int32 = -1
    /// A plain (`http://`) connection leaves libcurl at the switch: its
    /// bytes are the socket's own, so the tunnel reads and writes a
    /// duplicate of it, and libcurl's handles (a multi handle, its pair of
    /// descriptors, the connection's state) are freed. True once that happened.
    private var ownsSocket = false
    private let plain: Bool

    /// The longest answer head read (the same bound as libcurl's).
    public static let maxHeadBytes = 100 * 1024

    private enum BodyReader {
        case none
        case length(Int)
        case chunked(ChunkedDecoder)
        case toEnd
    }

    public init(loop: EventLoop, request: UpstreamUpgradeRequest, handler: UpstreamUpgradeHandler) {
        self.loop = loop
        self.handler = handler
        head = request.head
        idleTimeout = request.idleTimeout
        plain = request.origin.hasPrefix("http://")
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer[0] = 0
        // Alive: the multi handle's callbacks and every event of this try get `self` unretained. The
        // exchange (`upgradeTry`), then the tunnel, holds the try; close() (also deinit) removes the
        // handle, cleans the multi handle up and frees every event; each callback holds the try while it runs.
        let me = Unmanaged.passUnretained(self).toOpaque()
        let multi = curl_multi_init()!
        self.multi = multi
        hp_multi_set_socket_cb(multi, upgradeSocketCallback)
        hp_multi_set_ptr(multi, CURLMOPT_SOCKETDATA, me)
        hp_multi_set_timer_cb(multi, upgradeTimerCallback)
        hp_multi_set_ptr(multi, CURLMOPT_TIMERDATA, me)
        curlTimer = event_new(loop.base, -1, 0, upgradeCurlTimerEventCallback, me)
        idleTimer = event_new(loop.base, -1, 0, upgradeIdleEventCallback, me)

        let easy = curl_easy_init()!
        self.easy = easy
        UpstreamClient.configureCommon(easy, errorBuffer: errorBuffer)
        hp_easy_set_long(easy, CURLOPT_CONNECT_ONLY, 1)
        hp_easy_allow_moving_write_buffer(easy)
        request.origin.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_URL, $0) }
        hp_easy_set_long(easy, CURLOPT_CONNECTTIMEOUT_MS, max(1, Int(request.connectTimeout.millisecondsRoundedUp)))
        // A fresh handle has libcurl's own CAs: only an upstream's `tls` changes anything.
        if let tls = request.tls { UpstreamClient.apply(tls, to: easy, defaultCA: nil) }
        if let entry = request.connectTo {
            connectToList = entry.withCString { curl_slist_append(nil, $0) }
            hp_easy_set_ptr(easy, CURLOPT_CONNECT_TO, connectToList.map { UnsafeRawPointer($0) })
        }
    }

    deinit {
        close()
        errorBuffer.deallocate()
        received.deallocate()
    }

    /// Starts connecting. The handler hears of the try from the loop.
    public func start() {
        curl_multi_add_handle(multi, easy)
        armIdle()
    }

    /// Ends the try or the tunnel's upstream end, without telling the
    /// handler: the connection is closed. Safe to call more than once.
    public func close() {
        handler = nil
        phase = .done
        releaseLibcurl()
        if ownsSocket { Glibc.close(socket) }
        ownsSocket = false
        socket = -1
    }

    /// Frees libcurl's handles and this try's events (libcurl closes its socket).
    private func releaseLibcurl() {
        for event in [ioEvent, curlEvent, curlTimer, idleTimer] { if let event { event_del(event) } }
        if let easy {
            curl_multi_remove_handle(multi, easy)
            curl_easy_cleanup(easy)
        }
        easy = nil
        if let multi { curl_multi_cleanup(multi) }
        multi = nil
        for event in [ioEvent, curlEvent, curlTimer, idleTimer] { if let event { event_free(event) } }
        (ioEvent, curlEvent, curlTimer, idleTimer) = (nil, nil, nil, nil)
        if let connectToList { curl_slist_free_all(connectToList) }
        connectToList = nil
    }

    /// A plain connection's socket, kept past libcurl (see `ownsSocket`).
    /// Stays with libcurl if it cannot be duplicated.
    private func takeSocket() {
        let copy = fcntl(socket, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { return }
        releaseLibcurl()
        socket = copy
        ownsSocket = true
    }

    /// Continues a body the handler paused (`upstreamBody` returned false).
    /// From a loop callback, never from inside a handler method.
    public func resume() {
        guard paused, phase == .readingBody else { return }
        paused = false
        armIdle()
        deliverBody()
        if phase == .readingBody, !paused {
            watch(Int16(EV_READ))
            // Bytes libcurl's TLS layer holds wake no event: read now.
            readAnswer()
        }
    }

    // MARK: - Connecting (libcurl)

    fileprivate func curlWatch(_ fd: curl_socket_t, _ what: Int32) {
        if let curlEvent {
            event_del(curlEvent)
            event_free(curlEvent)
            self.curlEvent = nil
        }
        guard what != CURL_POLL_REMOVE, phase == .connecting else { return }
        var kind = Int16(EV_PERSIST)
        if what & CURL_POLL_IN != 0 { kind |= Int16(EV_READ) }
        if what & CURL_POLL_OUT != 0 { kind |= Int16(EV_WRITE) }
        // Alive: as in init: close() (also deinit) frees this event.
        curlEvent = event_new(loop.base, fd, kind, upgradeCurlSocketEventCallback, Unmanaged.passUnretained(self).toOpaque())
        event_add(curlEvent, nil)
    }

    fileprivate func curlTimerWanted(_ milliseconds: Int) {
        guard let curlTimer else { return }
        if milliseconds < 0 { return _ = event_del(curlTimer) }
        var tv = timeval(tv_sec: milliseconds / 1000, tv_usec: (milliseconds % 1000) * 1000)
        event_add(curlTimer, &tv)
    }

    fileprivate func curlAction(_ fd: curl_socket_t, _ what: Int16) {
        guard let multi, phase == .connecting else { return }
        var flags: Int32 = 0
        if what & Int16(EV_READ) != 0 { flags |= CURL_CSELECT_IN }
        if what & Int16(EV_WRITE) != 0 { flags |= CURL_CSELECT_OUT }
        var running: Int32 = 0
        curl_multi_socket_action(multi, fd, flags, &running)
        var remaining: Int32 = 0
        while let message = curl_multi_info_read(multi, &remaining) {
            guard message.pointee.msg == CURLMSG_DONE else { continue }
            let code = hp_msg_result(message)
            guard code == CURLE_OK else { return fail(classify(code)) }
            var fd: curl_socket_t = -1
            hp_easy_get_socket(easy, CURLINFO_ACTIVESOCKET, &fd)
            guard fd >= 0 else { return fail(.connectFailed("the connection closed as it opened")) }
            return connected(fd)
        }
    }

    private func classify(_ code: CURLcode) -> UpstreamFailure {
        let message = errorBuffer[0] != 0 ? String(cString: errorBuffer) : String(cString: curl_easy_strerror(code))
        // Nothing was sent: whatever else went wrong, it went wrong connecting.
        return UpstreamClient.isTLSFailure(code) ? .tls(message) : .connectFailed(message)
    }

    private func connected(_ fd: Int32) {
        socket = fd
        if let curlEvent {
            event_del(curlEvent)
            event_free(curlEvent)
            self.curlEvent = nil
        }
        if let curlTimer { event_del(curlTimer) }
        // Alive: as in init: switchProtocols or close() (also deinit) frees this event.
        ioEvent = event_new(
            loop.base, fd, Int16(EV_PERSIST | EV_READ), upgradeIOEventCallback, Unmanaged.passUnretained(self).toOpaque())
        phase = .sendingHead
        armIdle()  // the connect took its own time: the answer gets the whole idle limit
        sendHead()
    }

    // MARK: - The exchange before the switch

    fileprivate func ioReady() {
        armIdle()
        switch phase {
        case .sendingHead: sendHead()
        case .readingHead, .readingBody: readAnswer()
        default: break
        }
    }

    private func watch(_ what: Int16) {
        guard let ioEvent, ioWhat != what else { return }
        event_del(ioEvent)
        if what != 0 {
            // Alive: the same event as in `connected`, freed by switchProtocols or close().
            event_assign(ioEvent, loop.base, socket, Int16(EV_PERSIST) | what, upgradeIOEventCallback,
                Unmanaged.passUnretained(self).toOpaque())
            event_add(ioEvent, nil)
        }
        ioWhat = what
    }

    private func sendHead() {
        while headSent < head.count {
            var n = 0
            let code = head.withUnsafeBytes { curl_easy_send(easy, $0.baseAddress! + headSent, $0.count - headSent, &n) }
            if code == CURLE_AGAIN { return watch(Int16(EV_WRITE)) }
            guard code == CURLE_OK else { return fail(.connectFailed("the upgrade request could not be sent")) }
            headSent += n
        }
        head = []
        phase = .readingHead
        watch(Int16(EV_READ))
    }

    /// Reads what the upstream sent, then uses it: the head, then the body.
    private func readAnswer() {
        while phase == .readingHead || (phase == .readingBody && !paused) {
            received.reserve(16 * 1024)
            var n = 0
            let code = curl_easy_recv(easy, received.end, received.room, &n)
            if code == CURLE_AGAIN { return }
            guard code == CURLE_OK else { return fail(.reset("the upstream connection failed")) }
            if n == 0 { return ended() }
            received.count += n
            if phase == .readingHead { parseHead() } else { deliverBody() }
        }
    }

    private func ended() {
        switch phase {
        case .readingHead:
            fail(.reset("the upstream closed the connection before answering"))
        case .readingBody:
            if case .toEnd = body { return finish(nil) }
            fail(.reset("the upstream closed the connection inside its answer"))
        default:
            break
        }
    }

    /// Looks for a complete head in `received`; reports it when there is one.
    private func parseHead() {
        while phase == .readingHead {
            guard let end = ResponseHeadReader.end(of: received.bytes, from: scanned) else {
                scanned = received.count
                if received.count > Self.maxHeadBytes { fail(.badResponse("the upstream's answer head is too large")) }
                return
            }
            scanned = 0
            // Taken out first: what follows it is the body, or the tunnel's first bytes.
            let head = Array(received.bytes[0..<end])
            received.removeFirst(end)
            let informational = head.withUnsafeBytes { report(head: $0) }
            if phase == .readingBody { return deliverBody() }
            // A 1xx other than 101 (100, 103): not the answer; the next head is.
            guard phase == .readingHead, informational else { return }
        }
    }

    /// Reports one head to the handler. Returns true for a 1xx to skip.
    private func report(head: UnsafeRawBufferPointer) -> Bool {
        var status = 0
        var framing = ResponseFraming()
        var chunked = false
        var started = false
        // The status is reported before the first field: the reader checks the status line first.
        let read = ResponseHeadReader.read(head) { name, value in
            guard phase == .readingHead, started else { return }
            // The body's framing, by the rules every answer is read by (the
            // handler refuses a head they refuse, before any body is read).
            _ = framing.add(name: name, value: value)
            if HTTPBytes.equals(name, "transfer-encoding") { chunked = true }
            handler?.upstreamHeader(name: name, value: value)
        } status: { code, reason in
            status = code
            guard code >= 200 || code == 101 else { return }
            started = true
            handler?.upstreamStatus(code, reason: reason)
        }
        guard case .success = read else {
            if case let .failure(error) = read { fail(.badResponse(error.message)) }
            return false
        }
        guard started else { return true }
        guard phase == .readingHead else { return false }
        if let refusal = handler?.upstreamHeadersComplete() {
            fail(.badResponse(refusal))
            return false
        }
        guard phase == .readingHead else { return false }
        if status == 101 {
            switchProtocols()
            return false
        }
        phase = .readingBody
        if status == 204 || status == 304 {
            body = .none
        } else if chunked {
            body = .chunked(
                ChunkedDecoder(limits: RequestLimits(maxHeadBytes: Self.maxHeadBytes, maxBodyBytes: Int.max / 2)))
        } else if case let .success(length?) = framing.verdict() {
            body = .length(length)
        } else {
            body = .toEnd
        }
        return false
    }

    /// Hands body bytes to the handler, as far as it takes them.
    private func deliverBody() {
        while phase == .readingBody, !paused {
            switch body {
            case .none:
                return finish(nil)
            case let .length(left):
                if left == 0 { return finish(nil) }
                guard received.count > 0 else { return }
                let take = min(left, received.count)
                guard handler?.upstreamBody(UnsafeRawBufferPointer(rebasing: received.bytes[0..<take])) ?? true else {
                    return pause()
                }
                received.removeFirst(take)
                body = .length(left - take)
            case var .chunked(decoder):
                if !held.isEmpty {
                    guard held.withUnsafeBytes({ handler?.upstreamBody($0) ?? true }) else { return pause() }
                    held = []
                    if heldWasLast { return finish(nil) }
                }
                guard received.count > 0 else { return }
                var decoded: [UInt8] = []
                let step = decoder.decode(received.bytes) { decoded.append(contentsOf: $0) }
                body = .chunked(decoder)
                switch step {
                case let .refused(reason):
                    return fail(.badResponse("the upstream's chunked body is invalid (\(reason.rawValue))"))
                case let .needMore(consumed), let .done(consumed):
                    received.removeFirst(consumed)
                    if !decoded.isEmpty {
                        // The decoded bytes are handed over whole: a pause holds them until resume.
                        let taken = decoded.withUnsafeBytes { handler?.upstreamBody($0) ?? true }
                        if !taken {
                            held = decoded
                            if case .done = step { heldWasLast = true }
                            return pause()
                        }
                    }
                    if case .done = step { return finish(nil) }
                    if consumed == 0 { return }
                }
            case .toEnd:
                guard received.count > 0 else { return }
                guard handler?.upstreamBody(received.bytes) ?? true else { return pause() }
                received.count = 0
            }
        }
    }

    /// Decoded bytes of a chunked body the handler paused on.
    private var held: [UInt8] = []
    /// The chunked body ended with the held bytes.
    private var heldWasLast = false

    /// The client is slow: no reading (and no idle limit) until `resume`.
    private func pause() {
        paused = true
        watch(0)
        if let idleTimer { event_del(idleTimer) }
    }

    private func switchProtocols() {
        phase = .switched
        watch(0)
        if let ioEvent { event_free(ioEvent) }
        ioEvent = nil
        if let idleTimer { event_del(idleTimer) }
        if plain { takeSocket() }
        let handler = self.handler
        self.handler = nil
        handler?.upstreamSwitched(self)
    }

    private func finish(_ failure: UpstreamFailure?) {
        let handler = self.handler
        close()
        handler?.upstreamFinished(failure)
    }

    private func fail(_ failure: UpstreamFailure) { finish(failure) }

    private func armIdle() {
        guard let idleTimer, phase != .switched else { return }
        var tv = timeval(idleTimeout)
        event_add(idleTimer, &tv)
    }

    fileprivate func idleFired() {
        guard phase != .switched, phase != .done else { return }
        // Connecting is libcurl's to time (connect_timeout); after that, a silent upstream.
        if phase == .connecting { return armIdle() }
        fail(.timeout)
    }

    // MARK: - The tunnel's upstream end (after upstreamSwitched)

    /// Bytes the upstream sent after its `101` head, read with it: the
    /// first bytes of the tunnel toward the client. Taken once.
    public func takeLeftover() -> [UInt8] {
        defer {
            // Not read into again: its memory goes back.
            received.count = 0
            received.shrink(to: 64)
        }
        return Array(received.bytes)
    }

    public enum IOResult: Equatable {
        case bytes(Int)
        case again
        case ended
        case failed
    }

    /// Reads tunnel bytes into `buffer`.
    public func receive(into buffer: UnsafeMutableRawPointer, count: Int) -> IOResult {
        if ownsSocket {
            let n = read(socket, buffer, count)
            if n > 0 { return .bytes(n) }
            if n == 0 { return .ended }
            return errno == EAGAIN || errno == EINTR ? .again : .failed
        }
        guard let easy else { return .failed }
        var n = 0
        let code = curl_easy_recv(easy, buffer, count, &n)
        if code == CURLE_AGAIN { return .again }
        guard code == CURLE_OK else { return .failed }
        return n == 0 ? .ended : .bytes(n)
    }

    /// Writes tunnel bytes; `.bytes(0)` or fewer than given: the socket is full.
    public func send(_ bytes: UnsafeRawBufferPointer) -> IOResult {
        if ownsSocket {
            guard let base = bytes.baseAddress, bytes.count > 0 else { return .bytes(0) }
            let n = write(socket, base, bytes.count)
            if n >= 0 { return .bytes(n) }
            return errno == EAGAIN || errno == EINTR ? .bytes(0) : .failed
        }
        guard let easy, let base = bytes.baseAddress else { return easy == nil ? .failed : .bytes(0) }
        var n = 0
        let code = curl_easy_send(easy, base, bytes.count, &n)
        if code == CURLE_AGAIN { return .bytes(0) }
        guard code == CURLE_OK else { return .failed }
        return .bytes(n)
    }

    /// No more bytes toward the upstream (a half-close).
    public func endWrite() {
        if socket >= 0 { shutdown(socket, Int32(SHUT_WR)) }
    }
}

// MARK: - C callbacks (each gets its upgrade through an unretained pointer)

@inline(__always)
private func withUpgrade(_ arg: UnsafeMutableRawPointer?, _ body: (UpstreamUpgrade) -> Void) {
    let upgrade = Unmanaged<UpstreamUpgrade>.fromOpaque(arg!).takeUnretainedValue()
    withExtendedLifetime(upgrade) { body(upgrade) }
}

private func upgradeSocketCallback(
    _: UnsafeMutableRawPointer?, _ fd: curl_socket_t, _ what: Int32, _ userp: UnsafeMutableRawPointer?,
    _: UnsafeMutableRawPointer?
) -> Int32 {
    withUpgrade(userp) { $0.curlWatch(fd, what) }
    return 0
}

private func upgradeTimerCallback(_: UnsafeMutableRawPointer?, _ ms: Int, _ userp: UnsafeMutableRawPointer?) -> Int32 {
    withUpgrade(userp) { $0.curlTimerWanted(ms) }
    return 0
}

private func upgradeCurlSocketEventCallback(_ fd: Int32, _ what: Int16, _ arg: UnsafeMutableRawPointer?) {
    withUpgrade(arg) { $0.curlAction(fd, what) }
}

private func upgradeCurlTimerEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withUpgrade(arg) { $0.curlAction(CURL_SOCKET_TIMEOUT, 0) }
}

private func upgradeIOEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withUpgrade(arg) { $0.ioReady() }
}

private func upgradeIdleEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    withUpgrade(arg) { $0.idleFired() }
}
