import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A client request received by `HTTPServer`, valid until it is answered.
///
/// Its head lives in the connection's read buffer (names and values are
/// read in place) until the answer is complete; after that, and after the
/// connection is gone, every method here is a no-op, so a late upstream
/// callback cannot write into another request's answer.
public final class HTTPRequest {
    /// Strong while the request is open; cleared when it is answered.
    private var connection: HTTPConnection?
    /// Told when the client goes away or queued output drains. Held
    /// The request's handler, held until the request is answered or
    /// aborted (then dropped, which ends the handler ↔ request cycle). Not
    /// weak: a weak reference would move the handler's reference counts to
    /// a side table, slowing every retain and release of it.
    public var observer: HTTPRequestObserver?
    private var lostReported = false
    /// The delegate was asked whether it holds this head's body (`holdsBody`).
    var screened = false
    /// Free for the delegate: what it decided at the head, before the body
    /// was read (a rate limit's token taken then), for when it serves the
    /// request.
    public var headDecision: AnyObject?
    private var cachedMethod: String?
    private var cachedTarget: String?

    init(connection: HTTPConnection) { self.connection = connection }

    /// The connection, while this request is the one it is answering.
    private var live: HTTPConnection? {
        guard let connection, connection.current === self else { return nil }
        return connection
    }

    private var head: RequestHead? { live?.head }

    // MARK: - Request

    public var method: String {
        if let cachedMethod { return cachedMethod }
        guard let head, let c = live else { return "GET" }
        let m = String(decoding: UnsafeRawBufferPointer(rebasing: c.requestBytes[head.method]), as: UTF8.self)
        cachedMethod = m
        return m
    }

    /// Path and query, in origin form: an absolute-form target's authority
    /// is dropped (it is never used for routing); `*` for `OPTIONS *`. The
    /// path is the normalized one (no dot-segments, unreserved characters
    /// decoded: docs/http1.md, "Paths"), which routes match and upstreams receive.
    public var target: String {
        if let cachedTarget { return cachedTarget }
        guard let head, let c = live else { return "/" }
        let raw = UnsafeRawBufferPointer(rebasing: c.requestBytes[head.pathAndQuery])
        var t: String
        if let path = c.machine.normalizedPath {
            // The parser normalized the path (PathNormalizer); the query stays as it came.
            t = path
            if let q = raw.firstIndex(of: UInt8(ascii: "?")) {
                t += String(decoding: UnsafeRawBufferPointer(rebasing: raw[q...]), as: UTF8.self)
            }
        } else {
            t = String(decoding: raw, as: UTF8.self)
        }
        if head.form == .absolute, raw.first != UInt8(ascii: "/") { t = "/" + t }
        cachedTarget = t
        return t
    }

    public var isAsteriskForm: Bool { head?.form == .asterisk }

    /// Size of the request head as received (request line and fields).
    public var headBytes: Int { head?.headLength ?? 0 }

    /// Whether `Connection` names other fields (they are hop-by-hop then).
    public var connectionNominatesFields: Bool { head?.connectionNominatesFields ?? false }

    /// Calls `body` with each request field, in arrival order, as bytes in
    /// the read buffer (valid only during the call): no copy per field.
    public func forEachRawHeader(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void) {
        guard head != nil, let c = live else { return }
        let bytes = c.requestBytes
        for f in c.machine.fields {
            body(
                UnsafeRawBufferPointer(rebasing: bytes[f.nameStart..<f.nameEnd]),
                UnsafeRawBufferPointer(rebasing: bytes[f.valueStart..<f.valueEnd]))
        }
    }

    /// Each request field as strings, in arrival order.
    public func forEachHeader(_ body: (_ name: String, _ value: String) -> Void) {
        forEachRawHeader { name, value in
            body(String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self))
        }
    }

    /// The first value of the field `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        var found: String?
        var wanted = name
        wanted.withUTF8 { w in
            let wanted = UnsafeRawBufferPointer(w)
            forEachRawHeader { n, v in
                if found == nil, n.count == wanted.count, HTTPBytes.equalsIgnoringCase(n, wanted) {
                    found = String(decoding: v, as: UTF8.self)
                }
            }
        }
        return found
    }

    /// The fields that a `Connection` header of this request names, by
    /// index in `forEachRawHeader` order (linear in the head's size).
    public func nominatedFields() -> [Bool] {
        guard head != nil, let c = live else { return [] }
        let fields = c.machine.fields
        var marks = [Bool](repeating: false, count: fields.count)
        let bytes = c.requestBytes
        for f in fields where HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: bytes[f.nameStart..<f.nameEnd]), "connection") {
            NominatedFields.mark(
                count: fields.count,
                name: { UnsafeRawBufferPointer(rebasing: bytes[fields[$0].nameStart..<fields[$0].nameEnd]) },
                connectionValue: UnsafeRawBufferPointer(rebasing: bytes[f.valueStart..<f.valueEnd]), nominated: &marks)
        }
        return marks
    }

    /// The client's address, as text.
    public var peerAddress: String { connection?.peerAddress ?? "" }

    /// The address the client connected to, as text (the listener's own,
    /// or the interface's for a wildcard listener).
    public var localAddress: String { connection?.localAddress ?? "" }

    /// The whole request body (read before `serve`), handed over once.
    public func takeBody() -> RequestBody { live?.takeBody() ?? .empty }

    // MARK: - Whole replies

    /// Sends a complete response (the staged headers, then `headers`) and
    /// releases the request.
    public func reply(status: Int, headers: [HTTPField] = [], body: String? = nil) {
        guard let c = live else { return }
        for field in headers { addResponseHeader(field.name, field.value) }
        var body = body ?? ""
        let framed = c.machine.responseStarted(status: status, contentLength: body.utf8.count, whole: true)
        c.response.composeHead(
            status: status, contentLength: framed.contentLength, chunked: false, close: framed.close, server: c.server)
        _ = body.withUTF8 { b in
            c.write([
                c.response.headOut.bytes,
                framed.hasBody ? UnsafeRawBufferPointer(b) : UnsafeRawBufferPointer(start: nil, count: 0),
            ])
        }
        c.response.headPending = false
        release(c)
    }

    // MARK: - Streamed replies

    /// Forgets every response header staged so far (a new try starts clean).
    public func clearResponseHeaders() {
        live?.response.clearStaged()
    }

    public func addResponseHeader(_ name: String, _ value: String) {
        guard let c = live else { return }
        var name = name
        var value = value
        name.withUTF8 { n in
            value.withUTF8 { v in c.response.stage(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
        }
    }

    /// Stages a header from raw bytes (as libcurl hands them over), copied.
    public func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        live?.response.stage(name: name, value: value)
    }

    /// Drops the staged headers that a `Connection` value names
    /// (an upstream's own hop-by-hop fields).
    public func removeResponseHeaders(nominatedBy connectionValue: UnsafeRawBufferPointer) {
        live?.response.removeNominated(by: connectionValue)
    }

    /// Stages the status line and headers; they leave with the first body
    /// bytes (one write). The framing is the proxy's own: `Content-Length`
    /// when the length is known, else chunked (HTTP/1.1) or end-of-connection
    /// (HTTP/1.0). HEAD, 1xx, 204 and 304 answers carry no body.
    /// - Parameter reason: the upstream's own reason phrase, when it is not
    ///   the standard one (checked by the caller: field-value bytes only).
    public func startReply(status: Int, contentLength: Int? = nil, reason: [UInt8]? = nil) {
        guard let c = live else { return }
        let framed = c.machine.responseStarted(status: status, contentLength: contentLength)
        c.response.composeHead(
            status: status, contentLength: framed.contentLength, chunked: framed.chunked, close: framed.close,
            server: c.server, reason: reason)
        c.response.headPending = true
    }

    /// Writes an informational answer (`103 Early Hints` and the like) at
    /// once, ahead of the final one: `fields` are `Name: value\r\n` lines.
    /// Not to an HTTP/1.0 client (it does not know 1xx), and never once the
    /// final answer has started.
    public func sendInformational(status: Int, fields: UnsafeRawBufferPointer) {
        guard let c = live, c.head?.version == .http11, !c.response.headPending, (102..<200).contains(status) else {
            return
        }
        var line = "HTTP/1.1 \(status) \(reasonPhrase(status))\r\n"
        line.withUTF8 { first in
            _ = c.write([UnsafeRawBufferPointer(first), fields, crlf])
        }
    }

    /// Writes body bytes. With `notifyWhenDrained`, the observer hears
    /// `requestOutputDrained` once everything queued so far is written.
    public func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool = false) {
        guard let c = live else { return }
        let head = c.response.headPending ? c.response.headOut.bytes : UnsafeRawBufferPointer(start: nil, count: 0)
        c.response.headPending = false
        // Never more than announced: the client frames by this length.
        let n = c.machine.bodyBytes(bytes.count)
        if c.machine.framing == .chunked, n > 0 {
            c.response.chunkLine.count = 0
            c.response.chunkLine.append(hex: n)
            c.response.chunkLine.append("\r\n")
            c.write([head, c.response.chunkLine.bytes, bytes, crlf])
        } else {
            c.write([head, UnsafeRawBufferPointer(rebasing: bytes[0..<n])])
        }
        if notifyWhenDrained, live != nil { c.notifyWhenDrained() }
    }

    /// Bytes queued for the client and not yet written.
    public var pendingOutput: Int { live?.pendingOutput ?? 0 }

    /// Finishes a streamed reply and releases the request. A body shorter
    /// than its announced length cannot end well: the connection is closed.
    public func endReply() {
        guard let c = live else { return }
        let head = c.response.headPending ? c.response.headOut.bytes : UnsafeRawBufferPointer(start: nil, count: 0)
        c.response.headPending = false
        if c.machine.framing == .chunked {
            c.write([head, lastChunk])
        } else {
            c.write([head])
            if c.machine.responseShort { return abort() }
        }
        release(c)
    }

    /// A head held by the delegate (`HTTPServerDelegate.holdsBody`): its
    /// body is read now, then the request is served as usual.
    public func readBody() { live?.releaseBody(self) }

    /// Drops the client connection without completing the response (the
    /// body was cut short upstream: the client must see a broken response,
    /// not a complete one). Releases the request.
    public func abort() {
        observer = nil
        guard let c = connection else { return }
        connection = nil
        c.abort(self)
    }

    private func release(_ c: HTTPConnection) {
        observer = nil
        connection = nil
        c.finished(self)
    }

    // MARK: - From the connection

    /// The client is gone (closed, reset, or stopped reading): told once.
    func connectionLost() {
        guard !lostReported else { return }
        lostReported = true
        observer?.requestClientClosed(self)
    }

    func outputDrained() { observer?.requestOutputDrained(self) }

    // MARK: - Leaving HTTP

    /// The request came over a TLS listener (`X-Forwarded-Proto: https`).
    public var arrivedOverTLS: Bool { live?.tls != nil }

    /// The request is HTTP/1.1 (an upgrade needs it).
    public var isHTTP11: Bool { head?.version == .http11 }

    /// Answers `101 Switching Protocols` with `fields` and turns the
    /// connection into the client end of a tunnel to `upstream`, which the
    /// returned tunnel now owns (it closes both; it may be closed already,
    /// if the client went away as it opened). The request is answered.
    /// Nil if the client is gone (then `upstream` is the caller's to close).
    public func switchProtocols(
        fields: [HTTPField], to upstream: UpstreamUpgrade, limits: Tunnel.Machine.Limits, now: @escaping () -> Instant
    ) -> Tunnel? {
        guard let c = live else { return nil }
        observer = nil
        connection = nil
        var head = "HTTP/1.1 101 Switching Protocols\r\n"
        for field in fields { head += "\(field.name): \(field.value)\r\n" }
        head += "\r\n"
        return head.withUTF8 { c.startTunnel(self, head: UnsafeRawBufferPointer($0), upstream: upstream, limits: limits, now: now) }
    }

    /// Takes the connection out of HTTP: the server stops reading, writing
    /// and timing it, forgets it, and returns its socket (non-blocking),
    /// which the caller now owns and must close. For a protocol that takes
    /// over after a request (a `101 Switching Protocols` upgrade, a
    /// `CONNECT` tunnel), or a test peer that must misbehave below HTTP.
    /// Call it before any answer was started: bytes already read past this
    /// request (pipelined ones) are dropped. Nil if the request is no
    /// longer its connection's current one; the request is answered either way.
    public func takeOverConnection() -> Int32? {
        guard let c = live else { return nil }
        connection = nil
        return c.detach(self)
    }
}

nonisolated(unsafe) private let crlf = UnsafeRawBufferPointer(start: StaticString("\r\n").utf8Start, count: 2)
nonisolated(unsafe) private let lastChunk = UnsafeRawBufferPointer(start: StaticString("0\r\n\r\n").utf8Start, count: 5)

/// What a request tells the code answering it, on the loop's thread.
public protocol HTTPRequestObserver: AnyObject {
    /// The client connection closed (or reset) before the answer was
    /// complete. May be called from inside a write: defer real work to the
    /// next loop pass.
    func requestClientClosed(_ request: HTTPRequest)
    /// Everything queued with `notifyWhenDrained` has been written.
    func requestOutputDrained(_ request: HTTPRequest)
}

// MARK: - The response being written

/// The answer's staged head and framing, kept by the connection and reused.
struct ResponseState {
    /// `Name: value\r\n` lines, in order.
    var staged = ByteBuffer(capacity: 512)
    /// Each staged line: where it starts, where its name ends, where it ends.
    var entries: [(start: Int, nameEnd: Int, end: Int)] = []
    var removed: [Bool] = []
    var anyRemoved = false
    var hasDate = false
    var headOut = ByteBuffer(capacity: 1024)
    var headPending = false
    var chunkLine = ByteBuffer(capacity: 32)
    var version = HTTPVersion.http11
    var isHead = false

    mutating func reset(version: HTTPVersion, isHead: Bool) {
        clearStaged()
        headPending = false
        self.version = version
        self.isHead = isHead
    }

    mutating func clearStaged() {
        staged.count = 0
        entries.removeAll(keepingCapacity: true)
        anyRemoved = false
        hasDate = false
    }

    func deallocate() {
        staged.deallocate()
        headOut.deallocate()
        chunkLine.deallocate()
    }

    mutating func stage(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        // The framing is the server's alone (`startReply(contentLength:)`),
        // so that a response can never carry two.
        if name.count == 14, HTTPBytes.equals(name, "content-length") { return }
        if name.count == 17, HTTPBytes.equals(name, "transfer-encoding") { return }
        let start = staged.count
        staged.append(name)
        let nameEnd = staged.count
        staged.append(": ")
        staged.append(value)
        staged.append("\r\n")
        entries.append((start, nameEnd, staged.count))
        if name.count == 4, HTTPBytes.equals(name, "date") { hasDate = true }
    }

    mutating func removeNominated(by connectionValue: UnsafeRawBufferPointer) {
        removed.removeAll(keepingCapacity: true)
        let bytes = staged.bytes
        let entries = self.entries
        NominatedFields.mark(
            count: entries.count, name: { UnsafeRawBufferPointer(rebasing: bytes[entries[$0].start..<entries[$0].nameEnd]) },
            connectionValue: connectionValue, nominated: &removed)
        anyRemoved = removed.contains(true)
    }

    mutating func composeHead(
        status: Int, contentLength: Int?, chunked: Bool, close: Bool, server: HTTPServer, reason: [UInt8]? = nil
    ) {
        headOut.count = 0
        headOut.append("HTTP/1.1 ")
        headOut.append(decimal: status)
        headOut.append(byte: 0x20)
        if let reason {
            reason.withUnsafeBytes { headOut.append($0) }
        } else {
            headOut.append(reasonPhrase(status))
        }
        headOut.append("\r\n")
        if anyRemoved {
            for (k, e) in entries.enumerated() where !(k < removed.count && removed[k]) {
                headOut.append(UnsafeRawBufferPointer(rebasing: staged.bytes[e.start..<e.end]))
            }
        } else {
            headOut.append(staged.bytes)
        }
        if !hasDate { server.dateHeader.withLine { headOut.append($0) } }
        if let contentLength {
            headOut.append("Content-Length: ")
            headOut.append(decimal: contentLength)
            headOut.append("\r\n")
        } else if chunked {
            headOut.append("Transfer-Encoding: chunked\r\n")
        }
        if close {
            headOut.append("Connection: close\r\n")
        } else if version == .http10 {
            headOut.append("Connection: keep-alive\r\n")
        }
        headOut.append("\r\n")
    }
}

/// The proxy's own reason phrase for `status` (RFC 9110 section 15).
public func reasonPhrase(_ status: Int) -> StaticString {
    switch status {
    case 100: "Continue"
    case 101: "Switching Protocols"
    case 102: "Processing"
    case 103: "Early Hints"
    case 200: "OK"
    case 201: "Created"
    case 202: "Accepted"
    case 203: "Non-Authoritative Information"
    case 204: "No Content"
    case 205: "Reset Content"
    case 206: "Partial Content"
    case 300: "Multiple Choices"
    case 301: "Moved Permanently"
    case 302: "Found"
    case 303: "See Other"
    case 304: "Not Modified"
    case 307: "Temporary Redirect"
    case 308: "Permanent Redirect"
    case 400: "Bad Request"
    case 401: "Unauthorized"
    case 403: "Forbidden"
    case 404: "Not Found"
    case 405: "Method Not Allowed"
    case 406: "Not Acceptable"
    case 408: "Request Timeout"
    case 409: "Conflict"
    case 410: "Gone"
    case 411: "Length Required"
    case 412: "Precondition Failed"
    case 413: "Content Too Large"
    case 414: "URI Too Long"
    case 415: "Unsupported Media Type"
    case 416: "Range Not Satisfiable"
    case 417: "Expectation Failed"
    case 421: "Misdirected Request"
    case 422: "Unprocessable Content"
    case 425: "Too Early"
    case 426: "Upgrade Required"
    case 428: "Precondition Required"
    case 429: "Too Many Requests"
    case 431: "Request Header Fields Too Large"
    case 451: "Unavailable For Legal Reasons"
    case 500: "Internal Server Error"
    case 501: "Not Implemented"
    case 502: "Bad Gateway"
    case 503: "Service Unavailable"
    case 504: "Gateway Timeout"
    case 505: "HTTP Version Not Supported"
    default:
        status < 200
            ? "Informational"
            : status < 300 ? "Success" : status < 400 ? "Redirection" : status < 500 ? "Client Error" : "Server Error"
    }
}
