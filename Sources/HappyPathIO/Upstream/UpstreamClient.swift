internal import CCurl
internal import CLibevent
internal import CShims
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// One try against one endpoint, as libcurl will send it.
public struct UpstreamRequest {
    /// `scheme://host:port/` of the endpoint: what libcurl connects to.
    public var origin: String
    /// Sent verbatim as the request target (endpoint path + command target).
    public var target: String
    public var method: String
    /// Sent as they are, in order (the block stays alive for the try).
    public var headers: HeaderBlock
    /// Sent instead of any field of the same name in `headers` (credentials).
    public var replacing: HTTPField?
    public var body: RequestBody
    /// Whether a body (possibly empty, with `Content-Length: 0`) is sent.
    public var sendsBody: Bool
    /// How long the connection attempt may take.
    public var connectTimeout: Duration
    /// A response that stalls (no byte from upstream) this long is cut. The
    /// deadline for the response head is the caller's: a timer of its own,
    /// so a long body streaming to a slow client is not cut by it.
    public var idleTimeout: Duration
    /// How an https:// origin is verified (nil: libcurl's defaults).
    public var tls: UpstreamTLS?
    /// `HOST:PORT:CONNECT-HOST:CONNECT-PORT`: the origin names one host
    /// (SNI, verification, `Host`), the connection goes to another.
    public var connectTo: String?

    public init(
        origin: String, target: String, method: String, headers: HeaderBlock, replacing: HTTPField? = nil,
        body: RequestBody, sendsBody: Bool, connectTimeout: Duration, idleTimeout: Duration, tls: UpstreamTLS? = nil,
        connectTo: String? = nil
    ) {
        self.tls = tls
        self.connectTo = connectTo
        self.origin = origin
        self.target = target
        self.method = method
        self.headers = headers
        self.replacing = replacing
        self.body = body
        self.sendsBody = sendsBody
        self.connectTimeout = connectTimeout
        self.idleTimeout = idleTimeout
    }
}

/// An upstream's TLS settings (`upstreams.NAME.tls`), made once per
/// configuration and applied to a pooled handle only when they differ from
/// what the handle last used.
public final class UpstreamTLS: Sendable {
    let ca: String?
    let verify: Bool
    let clientCert: String?
    let clientKey: String?

    public init(ca: String?, verify: Bool, clientCert: String?, clientKey: String?) {
        self.ca = ca
        self.verify = verify
        self.clientCert = clientCert
        self.clientKey = clientKey
    }
}

/// How a try failed, typed where it arises (libcurl's result) so policies
/// and error rendering never look at curl codes.
public enum UpstreamFailure: Error, Sendable, Equatable {
    /// No connection: refused, unresolvable, or connect timed out. The
    /// request never left, so it is always safe to try again.
    case connectFailed(String)
    /// The try ran out of time after the request was sent.
    case timeout
    /// The connection dropped before the response was complete.
    case reset(String)
    /// What came back was not valid HTTP.
    case badResponse(String)
    /// The TLS connection failed: the certificate was not verified, or no
    /// common protocol or cipher (not transient: not retried).
    case tls(String)
    /// Anything else libcurl reports.
    case other(String)

}

/// Receives one try's response, on the loop thread, from inside libcurl's
/// callbacks (so it must not call back into the client except `resume`
/// later, from a libevent callback).
public protocol UpstreamResponseHandler: AnyObject {
    /// The final (non-1xx) status line arrived; `reason` is its reason
    /// phrase as sent (possibly empty), valid only during the call.
    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer)
    /// A header of the final response; the bytes are valid only during the call.
    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)
    /// A complete informational (1xx) answer other than 100 and 101, its
    /// fields as `Name: value\r\n` lines (checked: token names, no control
    /// bytes, hop-by-hop fields dropped), valid only during the call. At most
    /// `UpstreamTransfer.maxInformational` per try, each at most
    /// `maxInformationalBytes`; the rest are dropped.
    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer)
    /// The final response's head is complete. A non-nil reason refuses it:
    /// the try ends as `.badResponse(reason)` and its connection is closed,
    /// never reused (its framing cannot be trusted).
    func upstreamHeadersComplete() -> String?
    /// Body bytes. Return false to pause: the bytes are not consumed and come
    /// again after `UpstreamTransfer.resume()`.
    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool
    /// The try ended: nil on a complete response.
    func upstreamFinished(_ failure: UpstreamFailure?)
}

/// A try in flight. Retained by libcurl's private pointer from `start` until
/// it finishes or is cancelled.
public final class UpstreamTransfer {
    fileprivate let handle: EasyHandle
    fileprivate var handler: UpstreamResponseHandler?
    /// What libcurl reads while the try is in flight: kept alive here.
    fileprivate var headers: HeaderBlock?
    fileprivate var body: RequestBody?
    fileprivate unowned let client: UpstreamClient
    fileprivate var inFinalBlock = false
    fileprivate var headersDone = false
    /// The next line starts a block (the first line, or the one after an
    /// empty line): only there is an `HTTP/` line a status line.
    fileprivate var atBlockStart = true
    /// The status of the 1xx block being read, if it is forwarded (0: none).
    fileprivate var informational = 0
    /// Its fields so far (allocated only when an upstream sends one).
    fileprivate var informationalFields: [UInt8] = []
    /// 1xx answers handed over in this try.
    fileprivate var informationalCount = 0
    /// A flood of 1xx answers is bounded: this many per try, each this large.
    public static let maxInformational = 8
    public static let maxInformationalBytes = 8 * 1024
    fileprivate var finished = false
    fileprivate var paused = false
    /// Where the client's `inFlight` list holds it (-1: not in flight).
    fileprivate var inFlightIndex = -1
    /// Why the response head was refused (the transfer was aborted for it).
    fileprivate var refusal: String?

    fileprivate init(handle: EasyHandle, client: UpstreamClient) {
        self.handle = handle
        self.client = client
    }

    /// One field line of a forwarded 1xx answer: kept if it is a valid,
    /// end-to-end field; a block that grows too large is not forwarded.
    fileprivate func addInformationalField(_ line: UnsafeRawBufferPointer) {
        guard let colon = line.firstIndex(of: 0x3A), colon > 0 else { return informational = 0 }
        let name = UnsafeRawBufferPointer(rebasing: line[..<colon])
        var valueStart = colon + 1
        while valueStart < line.count, line[valueStart] == 0x20 || line[valueStart] == 0x09 { valueStart += 1 }
        let value = UnsafeRawBufferPointer(rebasing: line[valueStart...])
        guard name.allSatisfy({ HTTPBytes.isToken($0) }), value.allSatisfy({ HTTPBytes.isFieldValue($0) }) else {
            return informational = 0
        }
        if HopByHop.isHopByHop(name) { return }
        // A 1xx has no body: a length or coding in one could make a lenient
        // client swallow the start of the final answer (RFC 9110 section 8.6).
        if HTTPBytes.equals(name, "content-length") || HTTPBytes.equals(name, "transfer-encoding") { return }
        guard informationalFields.count + line.count + 4 <= Self.maxInformationalBytes else { return informational = 0 }
        informationalFields.append(contentsOf: name)
        informationalFields.append(contentsOf: [0x3A, 0x20])
        informationalFields.append(contentsOf: value)
        informationalFields.append(contentsOf: [0x0D, 0x0A])
    }

    /// Aborts the transfer from inside a header callback (returning a size
    /// other than the line's makes libcurl fail it and close the connection).
    fileprivate func refuse(_ reason: String) -> Int {
        refusal = reason
        return 0
    }

    /// Continues a paused transfer. Call from a libevent callback, never from
    /// inside an `UpstreamResponseHandler` method.
    public func resume() {
        guard paused, !finished else { return }
        paused = false
        curl_easy_pause(handle.easy, CURLPAUSE_CONT)
    }
}

/// A pooled libcurl easy handle with its error buffer and the nodes of its
/// header list. The nodes are ours (libcurl only reads a list): each try
/// points them at the fields of its `HeaderBlock`, so building the list
/// allocates nothing.
fileprivate final class EasyHandle {
    let easy: UnsafeMutableRawPointer
    let errorBuffer: UnsafeMutablePointer<CChar>
    private(set) var nodes: UnsafeMutablePointer<curl_slist>
    private(set) var nodeCapacity: Int
    /// `Name: value` of a replacing field, NUL-terminated.
    private var replacement: UnsafeMutablePointer<CChar>?
    private var replacementCapacity = 0
    /// The TLS settings and connect-to entry this handle was last given.
    var tls: UpstreamTLS?
    var connectTo: String?
    var connectToList: UnsafeMutablePointer<curl_slist>?

    init(easy: UnsafeMutableRawPointer) {
        self.easy = easy
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer[0] = 0
        nodeCapacity = 16
        nodes = .allocate(capacity: nodeCapacity)
    }

    func reserveNodes(_ count: Int) {
        guard count > nodeCapacity else { return }
        nodes.deallocate()
        nodeCapacity = max(count, nodeCapacity * 2)
        nodes = .allocate(capacity: nodeCapacity)
    }

    func replacementEntry(_ field: HTTPField) -> UnsafeMutablePointer<CChar> {
        var name = field.name
        var value = field.value
        let length = name.utf8.count + value.utf8.count + 3
        if length > replacementCapacity {
            replacement?.deallocate()
            replacementCapacity = max(length, 256)
            replacement = .allocate(capacity: replacementCapacity)
        }
        let out = UnsafeMutableRawPointer(replacement!)
        var i = 0
        name.withUTF8 { out.copyMemory(from: $0.baseAddress!, byteCount: $0.count); i = $0.count }
        out.storeBytes(of: 0x3A, toByteOffset: i, as: UInt8.self)
        out.storeBytes(of: 0x20, toByteOffset: i + 1, as: UInt8.self)
        i += 2
        value.withUTF8 { v in
            if v.count > 0 { (out + i).copyMemory(from: v.baseAddress!, byteCount: v.count) }
            i += v.count
        }
        out.storeBytes(of: 0, toByteOffset: i, as: UInt8.self)
        return replacement!
    }

    func free() {
        curl_easy_cleanup(easy)
        if let connectToList { curl_slist_free_all(connectToList) }
        errorBuffer.deallocate()
        nodes.deallocate()
        replacement?.deallocate()
    }
}

/// The upstream side of one event loop: a libcurl multi handle driven by the
/// loop's libevent base (socket and timer callbacks, `curl_multi_socket_action`),
/// with its own connection pool. Nothing here blocks.
public final class UpstreamClient {
    private let loop: EventLoop
    private let multi: UnsafeMutableRawPointer
    private var timerEvent: OpaquePointer?
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

    private func parsedOrigin(_ origin: String) -> OpaquePointer? {
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

    public init(loop: EventLoop, maxConnectionsPerHost: Int, maxCachedConnections: Int) {
        self.loop = loop
        multi = curl_multi_init()
        let me = Unmanaged.passUnretained(self).toOpaque()
        hp_multi_set_socket_cb(multi, upstreamSocketCallback)
        hp_multi_set_ptr(multi, CURLMOPT_SOCKETDATA, me)
        hp_multi_set_timer_cb(multi, upstreamTimerCallback)
        hp_multi_set_ptr(multi, CURLMOPT_TIMERDATA, me)
        setConnectionLimits(perHost: maxConnectionsPerHost, cached: maxCachedConnections)
        // The timer and socket events point at `self` unretained: they are
        // freed in `shutdown()`, which the owner calls before letting go.
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
    }

    // MARK: - Transfers

    public func start(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> UpstreamTransfer {
        let handle = pool.popLast() ?? makeHandle()
        let transfer = UpstreamTransfer(handle: handle, client: self)
        transfer.handler = handler
        transfer.body = request.body
        let easy = handle.easy
        handle.errorBuffer[0] = 0

        // withCString: no temporary copy for native strings (libcurl copies them).
        if let url = parsedOrigin(request.origin) {
            hp_easy_set_ptr(easy, CURLOPT_CURLU, UnsafeRawPointer(url))
        } else {
            // Not parseable ahead: libcurl reports the problem on the try.
            hp_easy_set_ptr(easy, CURLOPT_CURLU, nil)
            request.origin.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_URL, $0) }
        }
        request.target.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_REQUEST_TARGET, $0) }
        // Method and body. HTTPGET resets whatever the previous try set.
        hp_easy_set_long(easy, CURLOPT_HTTPGET, 1)
        hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, nil)
        if request.method == "HEAD" {
            hp_easy_set_long(easy, CURLOPT_NOBODY, 1)
        } else if request.sendsBody {
            hp_easy_set_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.count))
            // libcurl reads the body in place: `transfer.body` keeps it alive.
            hp_easy_set_ptr(easy, CURLOPT_POSTFIELDS, request.body.baseAddress ?? emptyBody)
            if request.method != "POST" { request.method.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, $0) } }
        } else if request.method != "GET" {
            request.method.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, $0) }
        }

        transfer.headers = request.headers
        hp_easy_set_ptr(easy, CURLOPT_HTTPHEADER, headerList(handle, request))
        // Only an upstream with `tls:` (or a handle that served one) pays for this.
        if request.tls !== handle.tls { apply(request.tls, to: handle) }
        if request.connectTo != handle.connectTo { connect(handle, to: request.connectTo) }

        // Less than one byte a second for idleTimeout: the upstream stalled.
        // (libcurl does not apply this while the transfer is paused.)
        hp_easy_set_long(easy, CURLOPT_LOW_SPEED_LIMIT, 1)
        hp_easy_set_long(easy, CURLOPT_LOW_SPEED_TIME, max(1, Int(request.idleTimeout.nanoseconds / 1_000_000_000)))
        hp_easy_set_long(easy, CURLOPT_CONNECTTIMEOUT_MS, max(1, Int(request.connectTimeout.millisecondsRoundedUp)))
        let retained = Unmanaged.passRetained(transfer).toOpaque()
        transfer.inFlightIndex = inFlight.count
        inFlight.append(transfer)
        hp_easy_set_ptr(easy, CURLOPT_PRIVATE, retained)
        hp_easy_set_ptr(easy, CURLOPT_HEADERDATA, retained)
        hp_easy_set_ptr(easy, CURLOPT_WRITEDATA, retained)
        curl_multi_add_handle(multi, easy)
        return transfer
    }

    /// The try's header list, in the handle's own nodes: the fields of the
    /// block (those named like the replacing field left out), the replacing
    /// field, and "Name:" entries that stop libcurl from inventing `Accept`,
    /// `Expect` and `Content-Type`.
    private func headerList(_ handle: EasyHandle, _ request: UpstreamRequest) -> UnsafeMutablePointer<curl_slist> {
        handle.reserveNodes(request.headers.fieldCount + 4)
        let nodes = handle.nodes
        var n = 0
        var sawAccept = false
        var sawContentType = false
        var skip: HTTPField? = request.replacing
        request.headers.forEach { name, _, entry in
            switch name.count {
            case 6 where HTTPBytes.equals(name, "accept"): sawAccept = true
            case 12 where HTTPBytes.equals(name, "content-type"): sawContentType = true
            default: break
            }
            if let replaced = skip?.name {
                var replaced = replaced
                let same = replaced.withUTF8 { HTTPBytes.equalsIgnoringCase(name, UnsafeRawBufferPointer($0)) }
                if same { return }
            }
            nodes[n].data = UnsafeMutablePointer(mutating: entry)
            n += 1
        }
        if let field = request.replacing {
            nodes[n].data = handle.replacementEntry(field)
            n += 1
            skip = nil
        }
        if !sawAccept {
            nodes[n].data = blankAccept
            n += 1
        }
        if request.sendsBody {
            nodes[n].data = blankExpect
            n += 1
            if !sawContentType {
                nodes[n].data = blankContentType
                n += 1
            }
        }
        for i in 0..<n { nodes[i].next = i + 1 < n ? nodes + i + 1 : nil }
        return nodes
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

    /// What every handle of the proxy's has, a try's or an upgrade's:
    /// no signals, no Nagle, HTTP/1.1 (also by ALPN), its error buffer, and
    /// upstreams reached directly: no `http_proxy` from the environment,
    /// and no proxy for any host (which also spares libcurl reading
    /// `no_proxy` and `NO_PROXY` from the environment on every transfer).
    static func configureCommon(_ easy: UnsafeMutableRawPointer, errorBuffer: UnsafeMutablePointer<CChar>) {
        hp_easy_set_long(easy, CURLOPT_NOSIGNAL, 1)
        hp_easy_set_long(easy, CURLOPT_TCP_NODELAY, 1)
        hp_easy_set_long(easy, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        hp_easy_set_ptr(easy, CURLOPT_ERRORBUFFER, errorBuffer)
        "".withCString { _ = hp_easy_set_ptr(easy, CURLOPT_PROXY, $0) }
        "*".withCString { _ = hp_easy_set_ptr(easy, CURLOPT_NOPROXY, $0) }
    }

    private func makeHandle() -> EasyHandle {
        let easy = curl_easy_init()!
        let handle = EasyHandle(easy: easy)
        Self.configureCommon(easy, errorBuffer: handle.errorBuffer)
        hp_easy_set_long(easy, CURLOPT_PATH_AS_IS, 1)
        hp_easy_set_long(easy, CURLOPT_HTTP_CONTENT_DECODING, 0)
        // One receive takes a head and a mid-sized body together, so the
        // client gets them in one write instead of two.
        hp_easy_set_long(easy, CURLOPT_BUFFERSIZE, 64 * 1024)
        hp_easy_set_closesocket_cb(easy, upstreamCloseSocketCallback)
        hp_easy_set_ptr(easy, CURLOPT_CLOSESOCKETDATA, Unmanaged.passUnretained(self).toOpaque())
        hp_easy_set_write_cb(easy, CURLOPT_HEADERFUNCTION, upstreamHeaderCallback)
        hp_easy_set_write_cb(easy, CURLOPT_WRITEFUNCTION, upstreamWriteCallback)
        return handle
    }

    /// libcurl's own CA file and folder (what a handle without `tls.ca` uses).
    private lazy var defaultCA: (file: String?, path: String?) = {
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

    private func apply(_ tls: UpstreamTLS?, to handle: EasyHandle) {
        Self.apply(tls, to: handle.easy, defaultCA: defaultCA)
        handle.tls = tls
    }

    /// An upstream's `tls` on a handle. A handle that served another
    /// upstream gets libcurl's own CAs back (`defaultCA`); a fresh one
    /// (nil) has them already.
    static func apply(
        _ tls: UpstreamTLS?, to easy: UnsafeMutableRawPointer, defaultCA: (file: String?, path: String?)?
    ) {
        func set(_ option: CURLoption, _ value: String?) {
            if let value { value.withCString { _ = hp_easy_set_ptr(easy, option, $0) } } else { hp_easy_set_ptr(easy, option, nil) }
        }
        if let ca = tls?.ca {
            // Only these CAs: not the system's folder beside them.
            set(CURLOPT_CAINFO, ca)
            set(CURLOPT_CAPATH, nil)
        } else if let defaultCA {
            set(CURLOPT_CAINFO, defaultCA.file)
            set(CURLOPT_CAPATH, defaultCA.path)
        }
        let verify = tls?.verify ?? true
        hp_easy_set_long(easy, CURLOPT_SSL_VERIFYPEER, verify ? 1 : 0)
        hp_easy_set_long(easy, CURLOPT_SSL_VERIFYHOST, verify ? 2 : 0)
        set(CURLOPT_SSLCERT, tls?.clientCert)
        set(CURLOPT_SSLKEY, tls?.clientKey)
    }

    private func connect(_ handle: EasyHandle, to entry: String?) {
        if let old = handle.connectToList { curl_slist_free_all(old) }
        handle.connectToList = entry.flatMap { e in e.withCString { curl_slist_append(nil, $0) } }
        hp_easy_set_ptr(handle.easy, CURLOPT_CONNECT_TO, handle.connectToList.map { UnsafeRawPointer($0) })
        handle.connectTo = entry
    }

    /// Detaches a transfer from libcurl and returns its handle to the pool.
    private func complete(_ transfer: UpstreamTransfer) {
        transfer.finished = true
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
        pool.append(transfer.handle)
        Unmanaged.passUnretained(transfer).release()  // the reference taken in start()
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

// "Name:" with nothing after it tells libcurl not to send a field it would add.
nonisolated(unsafe) private let blankAccept = strdup("Accept:")!
nonisolated(unsafe) private let blankExpect = strdup("Expect:")!
nonisolated(unsafe) private let blankContentType = strdup("Content-Type:")!
nonisolated(unsafe) private let emptyBody: UnsafeMutableRawPointer = UnsafeMutableRawPointer.allocate(byteCount: 1, alignment: 1)

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

private func upstreamTimerEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<UpstreamClient>.fromOpaque(arg!).takeUnretainedValue().timerFired()
}

private func upstreamCloseSocketCallback(_ clientp: UnsafeMutableRawPointer?, _ fd: curl_socket_t) -> Int32 {
    Unmanaged<UpstreamClient>.fromOpaque(clientp!).takeUnretainedValue().closing(socket: fd)
    return close(fd)
}

/// Header lines arrive one per call, CRLF included, not NUL-terminated; each
/// `HTTP/` line starts a new block (1xx blocks are skipped).
private func upstreamHeaderCallback(
    _ data: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ userdata: UnsafeMutableRawPointer?
) -> Int {
    let n = size * count
    guard let data, let userdata else { return n }
    let transfer = Unmanaged<UpstreamTransfer>.fromOpaque(userdata).takeUnretainedValue()
    guard let handler = transfer.handler, !transfer.headersDone else { return n }
    let line = UnsafeRawBufferPointer(start: data, count: n)
    var end = n
    while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
    if end == 0 {
        transfer.atBlockStart = true
        if transfer.inFinalBlock {
            transfer.headersDone = true
            if let refusal = handler.upstreamHeadersComplete() { return transfer.refuse(refusal) }
        } else if transfer.informational != 0 {
            transfer.informationalCount += 1
            transfer.informationalFields.withUnsafeBytes { handler.upstreamInformational(transfer.informational, fields: $0) }
            transfer.informational = 0
        }
        return n
    }
    let blockStart = transfer.atBlockStart
    transfer.atBlockStart = false
    // A field line that begins with "HTTP/" is a (bad) field, not a new
    // status line: read as one, it would let the upstream swap the status
    // of a response the proxy already holds.
    if blockStart, n >= 5, line[0] == 0x48, line[1] == 0x54, line[2] == 0x54, line[3] == 0x50, line[4] == 0x2F {  // "HTTP/"
        guard let status = ResponseFraming.status(ofLine: UnsafeRawBufferPointer(rebasing: line[0..<end])) else {
            return transfer.refuse("The upstream's status line is not 'HTTP/1.x' and a status from 100 to 599.")
        }
        transfer.inFinalBlock = status >= 200
        // 100 Continue is the edge's own to send, 101 never comes unasked.
        let forward = status >= 102 && status < 200 && transfer.informationalCount < UpstreamTransfer.maxInformational
        transfer.informational = forward ? status : 0
        transfer.informationalFields.removeAll(keepingCapacity: true)
        if transfer.inFinalBlock {
            handler.upstreamStatus(status, reason: UnsafeRawBufferPointer(rebasing: line[min(13, end)..<end]))
        }
        return n
    }
    guard transfer.inFinalBlock else {
        if transfer.informational != 0 { transfer.addInformationalField(UnsafeRawBufferPointer(rebasing: line[0..<end])) }
        return n
    }
    guard let colon = line[..<end].firstIndex(of: 0x3A) else {
        return transfer.refuse("The upstream sent a header line without a colon (or a folded one).")
    }
    var valueStart = colon + 1
    while valueStart < end, line[valueStart] == 0x20 || line[valueStart] == 0x09 { valueStart += 1 }
    var valueEnd = end
    while valueEnd > valueStart, line[valueEnd - 1] == 0x20 || line[valueEnd - 1] == 0x09 { valueEnd -= 1 }
    handler.upstreamHeader(
        name: UnsafeRawBufferPointer(rebasing: line[0..<colon]),
        value: UnsafeRawBufferPointer(rebasing: line[valueStart..<valueEnd]))
    return n
}

private func upstreamWriteCallback(
    _ data: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ userdata: UnsafeMutableRawPointer?
) -> Int {
    let n = size * count
    guard let data, let userdata else { return n }
    let transfer = Unmanaged<UpstreamTransfer>.fromOpaque(userdata).takeUnretainedValue()
    guard let handler = transfer.handler else { return n }
    if handler.upstreamBody(UnsafeRawBufferPointer(start: data, count: n)) { return n }
    transfer.paused = true
    return Int(CURL_WRITEFUNC_PAUSE)
}
