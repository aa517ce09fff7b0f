internal import CCurl
import HappyPathCore

/// A try in flight. Retained by libcurl's private pointer from `start` until
/// it finishes or is cancelled.
public final class UpstreamTransfer {
    let handle: EasyHandle
    var handler: UpstreamResponseHandler?
    /// What libcurl reads while the try is in flight: kept alive here.
    var headers: HeaderBlock?
    var body: RequestBody?
    /// A body read as it streams (`upstreamReadCallback`).
    var bodyStream: RequestBodyStream?
    /// This try reads `bodyStream` as it comes (it had not ended when the try began).
    var readsBody = false
    /// The read callback paused sending: the body had nothing new.
    var sendPaused = false
    /// Alive: read only while the try is in flight (`bodyAvailable`), and the
    /// client completes every transfer in flight in `shutdown()` (also deinit).
    unowned let client: UpstreamClient
    var inFinalBlock = false
    var headersDone = false
    /// The next line starts a block (the first line, or the one after an
    /// empty line): only there is an `HTTP/` line a status line.
    var atBlockStart = true
    /// The status of the 1xx block being read, if it is forwarded (0: none).
    var informational = 0
    /// Its fields so far (allocated only when an upstream sends one).
    var informationalFields: [UInt8] = []
    /// 1xx answers handed over in this try.
    var informationalCount = 0
    /// A flood of 1xx answers is bounded: this many per try, each this large.
    public static let maxInformational = 8
    public static let maxInformationalBytes = 8 * 1024
    var finished = false
    var paused = false
    /// Where the client's `inFlight` list holds it (-1: not in flight).
    var inFlightIndex = -1
    /// Why the response head was refused (the transfer was aborted for it).
    var refusal: String?

    init(handle: EasyHandle, client: UpstreamClient) {
        self.handle = handle
        self.client = client
    }

    /// One field line of a forwarded 1xx answer: kept if it is a valid,
    /// end-to-end field; a block that grows too large is not forwarded.
    func addInformationalField(_ line: UnsafeRawBufferPointer) {
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

    /// A line after the final head: a trailer field (libcurl passes HTTP/2
    /// trailers and a chunked body's trailer section this way, after the
    /// body). One that is not a valid field, or is hop-by-hop or framing,
    /// is dropped: a trailer never fails an answer already under way.
    func trailer(_ line: UnsafeRawBufferPointer, to handler: UpstreamResponseHandler) {
        guard let colon = line.firstIndex(of: 0x3A), colon > 0 else { return }
        let name = UnsafeRawBufferPointer(rebasing: line[..<colon])
        var valueStart = colon + 1
        while valueStart < line.count, line[valueStart] == 0x20 || line[valueStart] == 0x09 { valueStart += 1 }
        var valueEnd = line.count
        while valueEnd > valueStart, line[valueEnd - 1] == 0x20 || line[valueEnd - 1] == 0x09 { valueEnd -= 1 }
        let value = UnsafeRawBufferPointer(rebasing: line[valueStart..<valueEnd])
        guard name.allSatisfy({ HTTPBytes.isToken($0) }), value.allSatisfy({ HTTPBytes.isFieldValue($0) }),
            !HopByHop.isHopByHop(name), !HTTPBytes.equals(name, "content-length")
        else { return }
        handler.upstreamTrailer(name: name, value: value)
    }

    /// Aborts the transfer from inside a header callback (returning a size
    /// other than the line's makes libcurl fail it and close the connection).
    func refuse(_ reason: String) -> Int {
        refusal = reason
        return 0
    }

    /// Continues a paused transfer. Call from a libevent callback, never from
    /// inside an `UpstreamResponseHandler` method.
    public func resume() {
        guard paused, !finished else { return }
        pauseEnded()
        curl_easy_pause(handle.easy, sendPaused ? CURLPAUSE_SEND : CURLPAUSE_CONT)
    }

    /// Stops receiving before the next bytes arrive (the client's connection
    /// is full): nothing waits inside libcurl, as a refused write would.
    /// Call from a libevent callback, never from inside an
    /// `UpstreamResponseHandler` method; `resume` goes on.
    public func pauseReceiving() {
        guard !paused, !finished else { return }
        pauseStarted()
        curl_easy_pause(handle.easy, sendPaused ? CURLPAUSE_RECV | CURLPAUSE_SEND : CURLPAUSE_RECV)
    }

    /// The streamed body has something new for a paused send: libcurl is
    /// told on the loop's next pass (never from inside one of its callbacks).
    func bodyAvailable() {
        guard sendPaused, !finished else { return }
        client.resumeSendingSoon(self)
    }

    /// Sending goes on (the receiving side keeps its own pause).
    func resumeSending() {
        guard sendPaused, !finished else { return }
        sendPaused = false
        curl_easy_pause(handle.easy, paused ? CURLPAUSE_RECV : CURLPAUSE_CONT)
    }

    /// The write callback paused the transfer for a slow client.
    func pauseStarted() {
        paused = true
    }

    func pauseEnded() { paused = false }
}

// MARK: - Reading the response (libcurl's header and write callbacks)

/// Header lines arrive one per call, CRLF included, not NUL-terminated; each
/// `HTTP/` line starts a new block (1xx blocks are skipped).
func upstreamHeaderCallback(
    _ data: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ userdata: UnsafeMutableRawPointer?
) -> Int {
    let n = size * count
    guard let data, let userdata else { return n }
    let transfer = Unmanaged<UpstreamTransfer>.fromOpaque(userdata).takeUnretainedValue()
    guard let handler = transfer.handler else { return n }
    let line = UnsafeRawBufferPointer(start: data, count: n)
    var end = n
    while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
    if transfer.headersDone {
        // After the head, only trailers come this way (no blank line ends them).
        if end > 0 { transfer.trailer(UnsafeRawBufferPointer(rebasing: line[0..<end]), to: handler) }
        return n
    }
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
            return transfer.refuse("The upstream's status line is not 'HTTP/1.x' or 'HTTP/2' and a status from 100 to 599.")
        }
        transfer.inFinalBlock = status >= 200
        // 100 Continue is the edge's own to send, 101 never comes unasked.
        let forward = status >= 102 && status < 200 && transfer.informationalCount < UpstreamTransfer.maxInformational
        transfer.informational = forward ? status : 0
        transfer.informationalFields.removeAll(keepingCapacity: true)
        if transfer.inFinalBlock {
            let head = UnsafeRawBufferPointer(rebasing: line[0..<end])
            let reason = UnsafeRawBufferPointer(rebasing: head[ResponseFraming.reasonStart(ofLine: head)...])
            handler.upstreamStatus(status, reason: reason)
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

func upstreamWriteCallback(
    _ data: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ userdata: UnsafeMutableRawPointer?
) -> Int {
    let n = size * count
    guard let data, let userdata else { return n }
    let transfer = Unmanaged<UpstreamTransfer>.fromOpaque(userdata).takeUnretainedValue()
    guard let handler = transfer.handler else { return n }
    if handler.upstreamBody(UnsafeRawBufferPointer(start: data, count: n)) { return n }
    transfer.pauseStarted()
    return Int(CURL_WRITEFUNC_PAUSE)
}

/// libcurl asks for request body bytes to send (a streamed body only).
func upstreamReadCallback(
    _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int, _ userdata: UnsafeMutableRawPointer?
) -> Int {
    guard let buffer, let userdata else { return Int(CURL_READFUNC_ABORT) }
    let transfer = Unmanaged<UpstreamTransfer>.fromOpaque(userdata).takeUnretainedValue()
    guard let body = transfer.bodyStream else { return Int(CURL_READFUNC_ABORT) }
    switch body.read(into: buffer, max: size &* count) {
    case let .bytes(n): return n
    case .end: return 0
    case .failed: return Int(CURL_READFUNC_ABORT)
    case .wait:
        transfer.sendPaused = true
        return Int(CURL_READFUNC_PAUSE)
    }
}
