/// Limits the edge enforces while it reads a request.
public struct RequestLimits: Sendable, Equatable {
    /// Request line, fields and the empty line that ends them (431 above it).
    public var maxHeadBytes: Int
    /// The request line alone (414 above it).
    public var maxRequestLineBytes: Int
    /// Field lines in the head, and in a chunked body's trailers (431 above it).
    public var maxFields: Int
    /// The decoded body (413 above it).
    public var maxBodyBytes: Int
    /// How the path is normalized before anything routes on it.
    public var path: PathNormalization

    public init(
        maxHeadBytes: Int, maxRequestLineBytes: Int? = nil, maxFields: Int = 100, maxBodyBytes: Int,
        path: PathNormalization = PathNormalization()
    ) {
        self.maxHeadBytes = maxHeadBytes
        self.maxRequestLineBytes = maxRequestLineBytes ?? min(8 * 1024, maxHeadBytes)
        self.maxFields = maxFields
        self.maxBodyBytes = maxBodyBytes
        self.path = path
    }
}

/// One field line of a head, as offsets into the buffer it was parsed from:
/// no copy and no allocation per field.
public struct HTTP1Field: Sendable, Equatable {
    public var nameStart: Int
    public var nameEnd: Int
    /// The value without leading and trailing whitespace.
    public var valueStart: Int
    public var valueEnd: Int

    public init(nameStart: Int, nameEnd: Int, valueStart: Int, valueEnd: Int) {
        self.nameStart = nameStart
        self.nameEnd = nameEnd
        self.valueStart = valueStart
        self.valueEnd = valueEnd
    }
}

/// A parsed request head. Ranges are offsets into the read buffer; the
/// field lines are in the array passed to `RequestHeadParser.parse`.
public struct RequestHead: Sendable, Equatable {
    public enum TargetForm: Sendable, Equatable {
        /// `/path?query`
        case origin
        /// `http://authority/path?query`: accepted as RFC 9112 requires of a
        /// server, but the authority is never used for routing.
        case absolute
        /// `*`, with OPTIONS only.
        case asterisk
    }

    public var method: Range<Int>
    /// The target exactly as sent.
    public var target: Range<Int>
    /// Path and query: the whole target in origin form, the part after the
    /// authority in absolute form (possibly empty, meaning "/").
    public var pathAndQuery: Range<Int>
    public var form: TargetForm
    public var version: HTTPVersion
    /// Bytes from the start of the buffer to the end of the empty line.
    public var headLength: Int
    public var host: Range<Int>?
    public var framing: BodyFraming
    /// The connection stays open after the response (HTTP/1.1 without
    /// `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`).
    public var keepAlive: Bool
    /// `Expect: 100-continue`.
    public var expectsContinue: Bool
    /// `Connection` names fields other than close/keep-alive, which are then
    /// hop-by-hop for this request.
    public var connectionNominatesFields: Bool
    /// Whether the method is HEAD (its response has no body).
    public var isHead: Bool
}

/// Finds where a request head ends, one byte at a time across reads, so that
/// a head trickled in byte by byte costs time linear in its size. It refuses
/// early what can be refused from a prefix: bare LF, bare CR, an overlong
/// request line, an overlong head.
public struct RequestHeadScanner: Sendable {
    /// Bytes already examined.
    private var scanned = 0
    private var lineStart = 0
    /// Where the request line starts (after ignored empty lines), once known.
    public private(set) var requestStart: Int?
    private var requestLineEnd: Int?
    /// The request line, parsed when it ended (the parser reuses it).
    public private(set) var requestLine: (method: Range<Int>, target: Range<Int>, version: HTTPVersion)?

    public init() {}

    public enum Result: Sendable, Equatable {
        case incomplete
        /// The head is `requestStart..<end` (the empty line included).
        case complete(requestStart: Int, end: Int)
        case refused(HTTP1Refusal)
    }

    /// Starts over for the next request (the buffer was shifted to offset 0).
    public mutating func reset() { self = RequestHeadScanner() }

    /// Whether any byte of a request arrived (empty lines before it do not count).
    public var started: Bool { scanned > lineStart || requestStart != nil }

    public mutating func scan(_ buffer: UnsafeRawBufferPointer, limits: RequestLimits) -> Result {
        let count = buffer.count
        // Nothing past the head limit is examined, so that the answer does
        // not depend on how the bytes were split into reads.
        let limit = count > limits.maxHeadBytes ? limits.maxHeadBytes + 1 : count
        var i = scanned
        while i < limit {
            let b = buffer[i]
            if i > 0, buffer[i - 1] == 0x0D, b != 0x0A { return .refused(.bareCarriageReturn) }
            if b == 0x0A {
                guard i > 0, buffer[i - 1] == 0x0D else { return .refused(.bareLineFeed) }
                let lineLength = i - 1 - lineStart
                if requestLineEnd == nil {
                    if lineLength == 0 {
                        // An empty line before the request line is ignored (RFC 9112 section 2.2).
                        lineStart = i + 1
                    } else {
                        if lineLength > limits.maxRequestLineBytes { return .refused(.requestLineTooLong) }
                        // Checked now: a line without a version (HTTP/0.9)
                        // would otherwise wait for a head that never ends.
                        switch RequestHeadParser.parseRequestLine(buffer, lineStart, i - 1) {
                        case let .success(line): requestLine = line
                        case let .failure(refusal): return .refused(refusal)
                        }
                        requestStart = lineStart
                        requestLineEnd = i + 1
                        lineStart = i + 1
                    }
                } else if lineLength == 0 {
                    scanned = i + 1
                    if i + 1 > limits.maxHeadBytes { return .refused(.headTooLarge) }
                    return .complete(requestStart: requestStart!, end: i + 1)
                } else {
                    lineStart = i + 1
                }
            } else if requestLineEnd == nil, i - lineStart >= limits.maxRequestLineBytes + 1 {
                return .refused(.requestLineTooLong)
            }
            i += 1
        }
        scanned = limit
        if count > limits.maxHeadBytes { return .refused(.headTooLarge) }
        return .incomplete
    }
}

/// The strict RFC 9112 request-head parser. It works in place on the read
/// buffer: names and values are offsets, nothing is copied. Everything that
/// could let two readers frame the request differently is refused.
public enum RequestHeadParser {
    /// Parses a complete head (`requestStart..<end`, as found by
    /// `RequestHeadScanner`). `fields` is cleared and filled; its capacity is
    /// reused from request to request.
    public static func parse(
        _ buffer: UnsafeRawBufferPointer, requestStart: Int, end: Int, limits: RequestLimits, fields: inout [HTTP1Field]
    ) -> Result<RequestHead, HTTP1Refusal> {
        var normalizedPath: String?
        return parse(
            buffer, requestStart: requestStart, end: end, limits: limits, fields: &fields, normalizedPath: &normalizedPath)
    }

    /// - Parameter normalizedPath: set to the normalized path
    ///   (`PathNormalizer`) when it differs from the one sent, else nil
    ///   (the path is used as it came). Kept out of `RequestHead` so that the
    ///   head stays a plain value, copied without reference counting.
    public static func parse(
        _ buffer: UnsafeRawBufferPointer, requestStart: Int, end: Int, limits: RequestLimits, fields: inout [HTTP1Field],
        normalizedPath: inout String?, requestLine known: (method: Range<Int>, target: Range<Int>, version: HTTPVersion)? = nil
    ) -> Result<RequestHead, HTTP1Refusal> {
        fields.removeAll(keepingCapacity: true)
        normalizedPath = nil
        // MARK: Request line
        var lineEnd = requestStart
        while buffer[lineEnd] != 0x0D { lineEnd += 1 }  // the scanner guarantees CRLF
        let method: Range<Int>
        let target: Range<Int>
        let version: HTTPVersion
        if let known {
            // The scanner parsed it when the line ended.
            (method, target, version) = known
        } else {
            switch parseRequestLine(buffer, requestStart, lineEnd) {
            case let .success(line): (method, target, version) = (line.method, line.target, line.version)
            case let .failure(e): return .failure(e)
            }
        }
        let targetStart = target.lowerBound

        let isConnect = equals(buffer, method, "CONNECT")
        if isConnect { return .failure(.connectMethod) }
        let form: RequestHead.TargetForm
        var pathAndQuery = target
        if buffer[targetStart] == UInt8(ascii: "/") {
            form = .origin
        } else if target.count == 1, buffer[targetStart] == UInt8(ascii: "*") {
            guard equals(buffer, method, "OPTIONS") else { return .failure(.asteriskFormNotOptions) }
            form = .asterisk
        } else {
            switch absolutePath(buffer, target) {
            case let .success(path):
                form = .absolute
                pathAndQuery = path
            case let .failure(e): return .failure(e)
            }
        }
        // MARK: Path
        if form != .asterisk {
            var pathEnd = pathAndQuery.lowerBound
            while pathEnd < pathAndQuery.upperBound, buffer[pathEnd] != UInt8(ascii: "?") { pathEnd += 1 }
            switch PathNormalizer.normalize(buffer, pathAndQuery.lowerBound..<pathEnd, limits.path) {
            case let .success(path): normalizedPath = path
            case let .failure(e): return .failure(e)
            }
        }

        // MARK: Field lines
        var hostCount = 0
        var host: Range<Int>?
        var contentLength: Int?
        var sawContentLength = false
        var sawTransferEncoding = false
        var codings = CodingState()
        var close = false
        var keepAliveToken = false
        var expectsContinue = false
        var nominates = false
        var lineStart = lineEnd + 2
        let fieldsEnd = end - 2
        while lineStart < fieldsEnd {
            var e = lineStart
            while buffer[e] != 0x0D { e += 1 }
            if buffer[lineStart] == 0x20 || buffer[lineStart] == 0x09 {
                return .failure(fields.isEmpty ? .whitespaceBeforeFirstField : .obsFold)
            }
            guard fields.count < limits.maxFields else { return .failure(.tooManyFields) }
            let field: HTTP1Field
            switch parseFieldLine(buffer, lineStart, e) {
            case let .success(f): field = f
            case let .failure(err): return .failure(err)
            }
            fields.append(field)
            let name = UnsafeRawBufferPointer(rebasing: buffer[field.nameStart..<field.nameEnd])
            let value = UnsafeRawBufferPointer(rebasing: buffer[field.valueStart..<field.valueEnd])
            switch name.count {
            case 4 where HTTPBytes.equals(name, "host"):
                hostCount += 1
                host = field.valueStart..<field.valueEnd
            case 6 where HTTPBytes.equals(name, "expect"):
                if HTTPBytes.equals(value, "100-continue") { expectsContinue = true }
            case 10 where HTTPBytes.equals(name, "connection"):
                forEachListElement(value) { token in
                    if HTTPBytes.equals(token, "close") {
                        close = true
                    } else if HTTPBytes.equals(token, "keep-alive") {
                        keepAliveToken = true
                    } else {
                        nominates = true
                    }
                }
            case 14 where HTTPBytes.equals(name, "content-length"):
                sawContentLength = true
                // A tab around the number is whitespace to RFC 9110 but an
                // error to llhttp (Node and the servers built on it): the
                // request could be framed two ways, so it is refused.
                if buffer[(field.nameEnd + 1)..<field.valueStart].contains(0x09) || buffer[field.valueEnd..<e].contains(0x09) {
                    return .failure(.badContentLength)
                }
                switch parseContentLength(value, previous: contentLength) {
                case let .success(n): contentLength = n
                case let .failure(err): return .failure(err)
                }
            case 17 where HTTPBytes.equals(name, "transfer-encoding"):
                sawTransferEncoding = true
                codings.add(value)
            default: break
            }
            lineStart = e + 2
        }

        // MARK: Host (RFC 9112 section 3.2)
        if hostCount > 1 { return .failure(.repeatedHost) }
        if let host, !HTTPBytes.isValidHost(UnsafeRawBufferPointer(rebasing: buffer[host])) {
            return .failure(.invalidHost)
        }
        if version == .http11, hostCount == 0 { return .failure(.missingHost) }

        // MARK: Framing (RFC 9112 section 6.3)
        var framing = BodyFraming.none
        if sawTransferEncoding {
            if version == .http10 { return .failure(.transferEncodingOnHTTP10) }
            if sawContentLength { return .failure(.contentLengthWithTransferEncoding) }
            if codings.malformed || !codings.lastIsChunked || codings.chunkedCount != 1 {
                return .failure(.chunkedNotFinal)
            }
            if codings.others > 0 { return .failure(.unsupportedTransferCoding) }
            framing = .chunked
        } else if let contentLength {
            if contentLength > limits.maxBodyBytes { return .failure(.bodyTooLarge) }
            if contentLength > 0 { framing = .contentLength(contentLength) }
        }

        return .success(
            RequestHead(
                method: method, target: target, pathAndQuery: pathAndQuery, form: form, version: version,
                headLength: end, host: host, framing: framing,
                keepAlive: version == .http11 ? !close : (keepAliveToken && !close),
                expectsContinue: expectsContinue && version == .http11 && framing != .none,
                connectionNominatesFields: nominates, isHead: equals(buffer, method, "HEAD")))
    }

    /// `name ":" OWS value OWS` on `start..<end` (no CR or LF inside: the
    /// scanner saw to that). Shared with chunked trailers.
    public static func parseFieldLine(_ buffer: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> Result<
        HTTP1Field, HTTP1Refusal
    > {
        var i = start
        while i < end, HTTPBytes.isToken(buffer[i]) { i += 1 }
        guard i < end else { return .failure(.missingColon) }
        let c = buffer[i]
        if c != UInt8(ascii: ":") {
            if c == 0x20 || c == 0x09 { return .failure(.whitespaceBeforeColon) }
            return .failure(.badFieldName)
        }
        guard i > start else { return .failure(.badFieldName) }
        let nameEnd = i
        i += 1
        while i < end, buffer[i] == 0x20 || buffer[i] == 0x09 { i += 1 }
        let valueStart = i
        var valueEnd = i
        while i < end {
            let b = buffer[i]
            guard HTTPBytes.isFieldValue(b) else { return .failure(.badFieldValue) }
            i += 1
            if b != 0x20 && b != 0x09 { valueEnd = i }
        }
        return .success(HTTP1Field(nameStart: start, nameEnd: nameEnd, valueStart: valueStart, valueEnd: valueEnd))
    }

    /// `HTTP/1.1`, `HTTP/1.0`; other minor versions of 1 are read as 1.1
    /// (RFC 9110 section 2.5); other majors get 505.
    /// `method SP request-target SP HTTP-version` on `start..<lineEnd` (the
    /// CR excluded). The scanner calls it as soon as the line ends, so a
    /// line that is not a request line (an HTTP/0.9 `GET /p` among them) is
    /// refused at once instead of waiting for a head that never comes.
    public static func parseRequestLine(_ buffer: UnsafeRawBufferPointer, _ start: Int, _ lineEnd: Int) -> Result<
        (method: Range<Int>, target: Range<Int>, version: HTTPVersion), HTTP1Refusal
    > {
        var i = start
        while i < lineEnd, HTTPBytes.isToken(buffer[i]) { i += 1 }
        guard i > start, i < lineEnd else { return .failure(i == start ? .badMethod : .badRequestLine) }
        guard buffer[i] == 0x20 else { return .failure(HTTPBytes.isFieldValue(buffer[i]) ? .badMethod : .badRequestLine) }
        let method = start..<i
        i += 1
        let targetStart = i
        while i < lineEnd, buffer[i] != 0x20 {
            guard HTTPBytes.isTarget(buffer[i]) else { return .failure(.badTarget) }
            i += 1
        }
        guard i > targetStart, i < lineEnd else { return .failure(.badRequestLine) }
        let target = targetStart..<i
        switch parseVersion(buffer, i + 1, lineEnd) {
        case let .success(v): return .success((method, target, v))
        case let .failure(e): return .failure(e)
        }
    }

    private static func parseVersion(_ buffer: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> Result<
        HTTPVersion, HTTP1Refusal
    > {
        guard end - start == 8 else {
            for j in start..<end where buffer[j] == 0x20 { return .failure(.badRequestLine) }
            return .failure(.badVersion)
        }
        let prefix: [UInt8] = [0x48, 0x54, 0x54, 0x50, 0x2F]  // "HTTP/"
        for j in 0..<5 where buffer[start + j] != prefix[j] { return .failure(.badVersion) }
        let major = buffer[start + 5]
        let dot = buffer[start + 6]
        let minor = buffer[start + 7]
        guard major >= 0x30, major <= 0x39, dot == UInt8(ascii: "."), minor >= 0x30, minor <= 0x39 else {
            return .failure(.badVersion)
        }
        guard major == 0x31 else { return .failure(.unsupportedVersion) }
        return .success(minor == 0x30 ? .http10 : .http11)
    }

    /// The path-and-query of an absolute-form target `http(s)://authority/...`.
    private static func absolutePath(_ buffer: UnsafeRawBufferPointer, _ target: Range<Int>) -> Result<
        Range<Int>, HTTP1Refusal
    > {
        var i = target.lowerBound
        while i < target.upperBound, buffer[i] != UInt8(ascii: ":") {
            let c = HTTPBytes.lower(buffer[i])
            let ok =
                (c >= 0x61 && c <= 0x7A)
                || (i > target.lowerBound && ((c >= 0x30 && c <= 0x39) || c == 0x2B || c == 0x2D || c == 0x2E))
            guard ok else { return .failure(.authorityForm) }
            i += 1
        }
        let scheme = UnsafeRawBufferPointer(rebasing: buffer[target.lowerBound..<i])
        guard i + 2 < target.upperBound, buffer[i + 1] == UInt8(ascii: "/"), buffer[i + 2] == UInt8(ascii: "/") else {
            // "host:port" and friends: authority-form.
            return .failure(.authorityForm)
        }
        guard HTTPBytes.equals(scheme, "http") || HTTPBytes.equals(scheme, "https") else { return .failure(.badTarget) }
        let authorityStart = i + 3
        var j = authorityStart
        while j < target.upperBound, buffer[j] != UInt8(ascii: "/"), buffer[j] != UInt8(ascii: "?") { j += 1 }
        let authority = UnsafeRawBufferPointer(rebasing: buffer[authorityStart..<j])
        // No userinfo ("user@host"): RFC 9110 section 4.2.4 forbids it in http URIs.
        guard !authority.isEmpty, HTTPBytes.isValidHost(authority) else { return .failure(.badTarget) }
        return .success(j..<target.upperBound)
    }

    /// One Content-Length field value: 1*DIGIT, or a list of identical
    /// values (RFC 9110 section 8.6). Differing values, signs, spaces inside
    /// a number or more than 18 digits are refused.
    static func parseContentLength(_ value: UnsafeRawBufferPointer, previous: Int?) -> Result<Int, HTTP1Refusal> {
        var result = previous
        var sawElement = false
        var failure: HTTP1Refusal?
        forEachListElement(value, keepEmpty: true) { element in
            guard failure == nil else { return }
            sawElement = true
            guard !element.isEmpty, element.count <= 18 else { return failure = .badContentLength }
            var n = 0
            for b in element {
                guard b >= 0x30, b <= 0x39 else { return failure = .badContentLength }
                n = n * 10 + Int(b - 0x30)
            }
            if let result, result != n { return failure = .conflictingContentLength }
            result = n
        }
        if let failure { return .failure(failure) }
        guard sawElement, let result else { return .failure(.badContentLength) }
        return .success(result)
    }

    /// The transfer codings seen so far, across every Transfer-Encoding line.
    private struct CodingState {
        var lastIsChunked = false
        var chunkedCount = 0
        var others = 0
        var malformed = false

        mutating func add(_ value: UnsafeRawBufferPointer) {
            var any = false
            forEachListElement(value) { element in
                any = true
                // A coding is a token, optionally followed by parameters.
                var n = 0
                while n < element.count, HTTPBytes.isToken(element[n]) { n += 1 }
                if n == 0 { malformed = true }
                let name = UnsafeRawBufferPointer(rebasing: element[0..<n])
                if HTTPBytes.equals(name, "chunked") {
                    if n != element.count { malformed = true }  // chunked takes no parameters
                    chunkedCount += 1
                    lastIsChunked = true
                } else {
                    others += 1
                    lastIsChunked = false
                }
            }
            if !any { malformed = true }
        }
    }

    private static func equals(_ buffer: UnsafeRawBufferPointer, _ range: Range<Int>, _ literal: StaticString) -> Bool {
        guard range.count == literal.utf8CodeUnitCount else { return false }
        let p = literal.utf8Start
        for j in 0..<range.count where buffer[range.lowerBound + j] != p[j] { return false }
        return true
    }
}

/// Calls `body` with each element of a comma-separated list (RFC 9110
/// section 5.6.1), trimmed of OWS. Empty elements are skipped unless
/// `keepEmpty`. One pass over the value: linear in its size.
public func forEachListElement(
    _ value: UnsafeRawBufferPointer, keepEmpty: Bool = false, _ body: (UnsafeRawBufferPointer) -> Void
) {
    var start = 0
    let n = value.count
    var i = 0
    while i <= n {
        if i == n || value[i] == UInt8(ascii: ",") {
            var s = start
            var e = i
            while s < e, value[s] == 0x20 || value[s] == 0x09 { s += 1 }
            while e > s, value[e - 1] == 0x20 || value[e - 1] == 0x09 { e -= 1 }
            if e > s || keepEmpty { body(UnsafeRawBufferPointer(rebasing: value[s..<e])) }
            start = i + 1
        }
        i += 1
    }
}
