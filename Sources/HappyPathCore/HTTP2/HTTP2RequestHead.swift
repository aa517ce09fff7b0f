/// One regular field of an HTTP/2 request head, as ranges of its head's
/// `storage`.
public struct HTTP2Field: Sendable, Equatable {
    public var name: Range<Int>
    public var value: Range<Int>
}

/// An HTTP/2 request's head as the exchange reads it, in HTTP/1.1's terms:
/// a method, a target in origin form (the path normalized as HTTP/1.1's
/// is), and fields, the first of them `host` (from `:authority`, which
/// plays Host's part), the cookie crumbs joined into one `cookie`.
/// Made by `HTTP2RequestHeadReader`.
///
/// Whether the request came over TLS is the connection's to say, not
/// `:scheme`'s (a client chooses the scheme it writes).
public struct HTTP2RequestHead: Sendable, Equatable {
    public var method: String
    /// Path and query, the path normalized (`PathNormalizer`); `*` for `OPTIONS *`.
    public var target: String
    public var isAsteriskForm: Bool
    /// `http` or `https`, lower-case.
    public var scheme: String
    /// `content-length`, when the request carries one (nghttp2 checks it
    /// against the DATA that follows).
    public var contentLength: Int?
    /// The head's size as HTTP/2 counts it: name, value and 32 per field,
    /// pseudo-headers included (RFC 9113 section 6.5.2).
    public var size: Int
    /// Names and values of `fields`.
    public var storage: [UInt8]
    /// `host` first, then the regular fields in arrival order.
    public var fields: [HTTP2Field]

    /// An extended CONNECT's `:protocol` (RFC 8441), lower-case
    /// (`websocket`): the stream is to become a tunnel. Its `method` is
    /// then `GET`, the request it becomes towards the upstream, by which it
    /// is routed. Nil for every other request.
    public var connectProtocol: String?

    /// Whether the method is HEAD (its answer has no body).
    public var isHead: Bool { method == "HEAD" }

    /// Calls `body` with each field, `host` first, as bytes valid only during the call.
    public func forEachField(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void) {
        storage.withUnsafeBytes { bytes in
            for field in fields {
                body(UnsafeRawBufferPointer(rebasing: bytes[field.name]), UnsafeRawBufferPointer(rebasing: bytes[field.value]))
            }
        }
    }

    /// The fields as strings (tests, logs).
    public var httpFields: [HTTPField] {
        var out: [HTTPField] = []
        forEachField { name, value in
            out.append(HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
        }
        return out
    }
}

/// Reads an HTTP/2 request head from its decoded fields (nghttp2's
/// `on_header`, one call per field, pseudo-headers first), checking RFC 9113
/// sections 8.2 and 8.3 and the proxy's limits, and makes the
/// `HTTP2RequestHead` the exchange reads, or says why the request is refused.
///
/// nghttp2's HTTP messaging already resets most malformed streams before
/// they get here (docs/plans/http2.md, section 1); this reader does not rely
/// on it, and adds what nghttp2 leaves out: `:authority` against `Host`, the
/// path's normalization, CONNECT, the header limits, the cookie crumbs.
///
/// Bounded: once the head is over `limits.maxHeadBytes` or
/// `limits.maxFields`, or refused for any reason, nothing more is stored,
/// but bytes are still counted; past `hardLimitFactor` times the byte
/// limit, `add` says to reset the stream (an HPACK bomb: nghttp2 decodes on,
/// without calling back). Counts saturate instead of trapping.
public struct HTTP2RequestHeadReader: Sendable {
    /// Past this many times `limits.maxHeadBytes`, the stream is reset rather than answered.
    public static let hardLimitFactor = 4
    /// What a field costs besides its name and value (RFC 9113 section 6.5.2).
    public static let fieldOverhead = 32

    public enum Verdict: Sendable, Equatable {
        /// Go on decoding (the head may already be refused: `finish` says).
        case proceed
        /// The head is far over the limit: reset the stream, decode no more
        /// of it (nghttp2: `NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE`).
        case resetStream
    }

    public let limits: RequestLimits
    /// Bytes counted so far (saturating).
    public private(set) var size = 0
    /// The first reason to refuse the request, once there is one.
    public private(set) var refusal: HTTP2RequestRefusal?
    /// The first `content-type` field is gRPC's (`GRPCCall.isContentType`),
    /// read whether or not the head is refused: a gRPC call refused at the
    /// edge is answered with a gRPC status, not problem+json.
    public private(set) var isGRPC = false
    private var sawContentType = false

    private var storage: [UInt8] = []
    private var fields: [HTTP2Field] = []
    /// Regular fields that will reach the upstream (a cookie's crumbs count once).
    private var fieldCount = 0
    private var sawRegularField = false
    private var method: Range<Int>?
    private var scheme: Range<Int>?
    private var path: Range<Int>?
    private var authority: Range<Int>?
    private var connectProtocol: Range<Int>?
    private var host: Range<Int>?
    /// The cookie crumbs' values, joined at `finish` where the first one was.
    private var cookies: [Range<Int>] = []
    private var cookieIndex: Int?
    private var contentLength: Int?

    public init(limits: RequestLimits) {
        self.limits = limits
    }

    /// One decoded field, in the order it came.
    public mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Verdict {
        size = Self.saturatingAdd(size, Self.saturatingAdd(name.count, Self.saturatingAdd(value.count, Self.fieldOverhead)))
        if size > limits.maxHeadBytes {
            refuse(.http1(.headTooLarge))
            let (hard, overflow) = limits.maxHeadBytes.multipliedReportingOverflow(by: Self.hardLimitFactor)
            if !overflow, size > hard { return .resetStream }
        }
        if !sawContentType, name.count == 12, HTTPBytes.equals(name, "content-type") {
            sawContentType = true
            isGRPC = GRPCCall.isContentType(value)
        }
        guard refusal == nil else { return .proceed }
        if let problem = check(name: name, value: value) { refuse(problem) }
        return .proceed
    }

    /// `add` for strings (tests).
    public mutating func add(_ name: String, _ value: String) -> Verdict {
        var name = name
        var value = value
        return name.withUTF8 { n in value.withUTF8 { v in add(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
        }
    }

    /// The head once its last field is in (END_HEADERS), or why it is refused.
    public func finish() -> Result<HTTP2RequestHead, HTTP2RequestRefusal> {
        if let refusal { return .failure(refusal) }
        return storage.withUnsafeBytes { bytes in finish(bytes) }
    }

    /// The whole head at once, from name and value pairs (tests, fuzzing).
    public static func read(_ fields: [(String, String)], limits: RequestLimits) -> Result<HTTP2RequestHead, HTTP2RequestRefusal>
    {
        var reader = HTTP2RequestHeadReader(limits: limits)
        for (name, value) in fields where reader.add(name, value) == .resetStream {
            return .failure(.http1(.headTooLarge))
        }
        return reader.finish()
    }

    /// A request trailer field that does not make the request malformed:
    /// a field name as a head's (lower-case token), a value as a head's
    /// (no NUL, CR, LF or other control byte, no whitespace at either end),
    /// no pseudo-header (RFC 9113 section 8.1), no connection-specific field
    /// (section 8.2.2) and no field that frames or routes the message
    /// (`content-length`, `transfer-encoding`, `host`: RFC 9110 section 6.5.1).
    public static func isAllowedTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        guard !name.isEmpty, name[0] != UInt8(ascii: ":"), syntaxRefusal(name: name, value: value) == nil,
            !isConnectionSpecific(name)
        else { return false }
        return !(name.count == 2 && HTTPBytes.equals(name, "te")) && !(name.count == 4 && HTTPBytes.equals(name, "host"))
            && !(name.count == 14 && HTTPBytes.equals(name, "content-length"))
    }

    /// What is wrong with a field's bytes, heads and trailers alike (nil:
    /// nothing): a name of lower-case token bytes after a pseudo-header's
    /// `:` (RFC 9113 section 8.2.1), and a value with no NUL, CR or LF and
    /// no whitespace at either end; as HTTP/1.1, no other control byte either.
    static func syntaxRefusal(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> HTTP2RequestRefusal? {
        guard !name.isEmpty else { return .http1(.badFieldName) }
        for b in name.dropFirst(name[0] == UInt8(ascii: ":") ? 1 : 0) {
            if b >= 0x41, b <= 0x5A { return .malformed(.uppercaseFieldName) }
            if !HTTPBytes.isToken(b) { return .http1(.badFieldName) }
        }
        for b in value where !HTTPBytes.isFieldValue(b) { return .http1(.badFieldValue) }
        if let first = value.first, let last = value.last, isWhitespace(first) || isWhitespace(last) {
            return .http1(.badFieldValue)
        }
        return nil
    }

    /// `Connection`, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`
    /// and `Upgrade`, which HTTP/2 forbids (RFC 9113 section 8.2.2; `TE`
    /// is allowed with the value `trailers` in a head).
    static func isConnectionSpecific(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 7: HTTPBytes.equals(name, "upgrade")
        case 10: HTTPBytes.equals(name, "connection") || HTTPBytes.equals(name, "keep-alive")
        case 16: HTTPBytes.equals(name, "proxy-connection")
        case 17: HTTPBytes.equals(name, "transfer-encoding")
        default: false
        }
    }

    // MARK: - One field

    private mutating func refuse(_ reason: HTTP2RequestRefusal) {
        if refusal == nil { refusal = reason }
    }

    private mutating func check(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> HTTP2RequestRefusal? {
        if let refusal = Self.syntaxRefusal(name: name, value: value) { return refusal }
        return name[0] == UInt8(ascii: ":") ? pseudoHeader(name, value) : regularField(name, value)
    }

    private mutating func pseudoHeader(_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer)
        -> HTTP2RequestRefusal?
    {
        if sawRegularField { return .malformed(.pseudoHeaderAfterField) }
        switch name.count {
        case 5 where HTTPBytes.equals(name, ":path"):
            if path != nil { return .malformed(.repeatedPseudoHeader) }
            path = store(value)  // checked whole at `finish`
        case 7 where HTTPBytes.equals(name, ":method"):
            if method != nil { return .malformed(.repeatedPseudoHeader) }
            guard !value.isEmpty, value.allSatisfy(HTTPBytes.isToken) else { return .http1(.badMethod) }
            method = store(value)
        case 7 where HTTPBytes.equals(name, ":scheme"):
            if scheme != nil { return .malformed(.repeatedPseudoHeader) }
            guard HTTPBytes.equals(value, "http") || HTTPBytes.equals(value, "https") else {
                return .malformed(.badScheme)
            }
            scheme = store(value)
        case 9 where HTTPBytes.equals(name, ":protocol"):
            // RFC 8441: offered by SETTINGS_ENABLE_CONNECT_PROTOCOL; checked with the method at `finish`.
            if connectProtocol != nil { return .malformed(.repeatedPseudoHeader) }
            guard !value.isEmpty, value.count <= 64, value.allSatisfy(HTTPBytes.isToken) else {
                return .malformed(.badProtocol)
            }
            connectProtocol = store(value)
        case 10 where HTTPBytes.equals(name, ":authority"):
            if authority != nil { return .malformed(.repeatedPseudoHeader) }
            guard !value.isEmpty, HTTPBytes.isValidHost(value) else { return .http1(.invalidHost) }
            authority = store(value)
        default: return .malformed(.unknownPseudoHeader)
        }
        return nil
    }

    private mutating func regularField(_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> HTTP2RequestRefusal? {
        sawRegularField = true
        var isCookieCrumb = false
        switch name.count {
        case 2 where HTTPBytes.equals(name, "te"):
            // The one connection-specific field HTTP/2 allows, with this one value.
            if !HTTPBytes.equals(value, "trailers") { return .malformed(.connectionSpecificField) }
        case 4 where HTTPBytes.equals(name, "host"):
            if host != nil { return .http1(.repeatedHost) }
            guard !value.isEmpty, HTTPBytes.isValidHost(value) else { return .http1(.invalidHost) }
            host = store(value)
            // Emitted first, at `finish`, unless `:authority` stands in for it.
            return countField()
        case 6 where HTTPBytes.equals(name, "cookie"):
            isCookieCrumb = cookieIndex != nil
        case _ where Self.isConnectionSpecific(name):
            return .malformed(.connectionSpecificField)
        case 14 where HTTPBytes.equals(name, "content-length"):
            switch RequestHeadParser.parseContentLength(value, previous: contentLength) {
            case let .success(n): contentLength = n
            case let .failure(refusal): return .http1(refusal)
            }
        default: break
        }
        if !isCookieCrumb, let refusal = countField() { return refusal }
        if name.count == 6, HTTPBytes.equals(name, "cookie") {
            cookies.append(store(value))
            if !isCookieCrumb {
                // A place for the joined value, kept where the first crumb came.
                cookieIndex = fields.count
                fields.append(HTTP2Field(name: 0..<0, value: 0..<0))
            }
            return nil
        }
        fields.append(HTTP2Field(name: store(name), value: store(value)))
        return nil
    }

    private mutating func countField() -> HTTP2RequestRefusal? {
        fieldCount = Self.saturatingAdd(fieldCount, 1)
        return fieldCount > limits.maxFields ? .http1(.tooManyFields) : nil
    }

    private mutating func store(_ bytes: UnsafeRawBufferPointer) -> Range<Int> {
        let start = storage.count
        storage.append(contentsOf: bytes)
        return start..<storage.count
    }

    // MARK: - The whole head

    private func finish(_ bytes: UnsafeRawBufferPointer) -> Result<HTTP2RequestHead, HTTP2RequestRefusal> {
        // CONNECT carries neither :scheme nor :path: refused as HTTP/1.1 refuses it, whatever else it lacks.
        guard let method else { return .failure(.malformed(.missingPseudoHeader)) }
        let isConnect = bytes[method].elementsEqual("CONNECT".utf8)
        // An extended CONNECT (RFC 8441 section 4) carries :protocol, :scheme, :path and :authority.
        if connectProtocol != nil {
            guard isConnect else { return .failure(.malformed(.badProtocol)) }
            guard authority != nil else { return .failure(.malformed(.missingPseudoHeader)) }
        } else if isConnect {
            return .failure(.http1(.connectMethod))
        }
        guard let scheme, let path else { return .failure(.malformed(.missingPseudoHeader)) }
        let isOptions = bytes[method].elementsEqual("OPTIONS".utf8)

        // MARK: :path (RFC 9113 section 8.3.1)
        guard !path.isEmpty else { return .failure(.malformed(.badPath)) }
        for b in bytes[path] where !HTTPBytes.isTarget(b) { return .failure(.http1(.badTarget)) }
        let target: String
        let isAsterisk = path.count == 1 && bytes[path.lowerBound] == UInt8(ascii: "*")
        if isAsterisk {
            guard isOptions else { return .failure(.http1(.asteriskFormNotOptions)) }
            target = "*"
        } else {
            guard bytes[path.lowerBound] == UInt8(ascii: "/") else { return .failure(.malformed(.badPath)) }
            let pathEnd = bytes[path].firstIndex(of: UInt8(ascii: "?")) ?? path.upperBound
            switch PathNormalizer.normalize(bytes, path.lowerBound..<pathEnd, limits.path) {
            case .success(nil): target = String(decoding: bytes[path], as: UTF8.self)
            case let .success(normalized?):
                target = normalized + String(decoding: bytes[pathEnd..<path.upperBound], as: UTF8.self)
            case let .failure(refusal): return .failure(.http1(refusal))
            }
        }

        // MARK: :authority and Host (RFC 9113 section 8.3.1)
        let schemeText = HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: bytes[scheme]), "https") ? "https" : "http"
        guard let hostValue = authority ?? host else { return .failure(.http1(.missingHost)) }
        if let authority, let host,
            !Self.sameEntity(
                UnsafeRawBufferPointer(rebasing: bytes[authority]), UnsafeRawBufferPointer(rebasing: bytes[host]),
                defaultPort: schemeText == "https" ? "443" : "80")
        {
            return .failure(.malformed(.authorityMismatch))
        }
        if authority != nil, host == nil, Self.saturatingAdd(fieldCount, 1) > limits.maxFields {
            return .failure(.http1(.tooManyFields))
        }

        // MARK: Body
        if let contentLength, contentLength > limits.maxBodyBytes { return .failure(.http1(.bodyTooLarge)) }

        // MARK: Fields: host first, the cookie crumbs joined with "; " (RFC 9113 section 8.2.3)
        var out: [UInt8] = []
        var outFields: [HTTP2Field] = []
        out.reserveCapacity(storage.count + 8)
        outFields.reserveCapacity(fields.count + 1)
        func append(_ name: StaticString, _ values: [Range<Int>]) {
            let nameStart = out.count
            out.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
            let valueStart = out.count
            for (i, v) in values.enumerated() {
                if i > 0 { out.append(contentsOf: "; ".utf8) }
                out.append(contentsOf: bytes[v])
            }
            outFields.append(HTTP2Field(name: nameStart..<valueStart, value: valueStart..<out.count))
        }
        append("host", [hostValue])
        for (i, field) in fields.enumerated() {
            if i == cookieIndex {
                append("cookie", cookies)
                continue
            }
            let nameStart = out.count
            out.append(contentsOf: bytes[field.name])
            let valueStart = out.count
            out.append(contentsOf: bytes[field.value])
            outFields.append(HTTP2Field(name: nameStart..<valueStart, value: valueStart..<out.count))
        }
        return .success(
            HTTP2RequestHead(
                method: connectProtocol == nil ? String(decoding: bytes[method], as: UTF8.self) : "GET", target: target,
                isAsteriskForm: isAsterisk, scheme: schemeText, contentLength: contentLength, size: size, storage: out,
                fields: outFields,
                connectProtocol: connectProtocol.map { String(decoding: bytes[$0], as: UTF8.self).lowercased() }))
    }

    // MARK: - Helpers

    @inline(__always)
    private static func isWhitespace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 }

    @inline(__always)
    static func saturatingAdd(_ a: Int, _ b: Int) -> Int {
        let (sum, overflow) = a.addingReportingOverflow(b)
        return overflow ? Int.max : sum
    }

    /// Whether two `host[:port]` values name the same host under the
    /// scheme-based normalization RFC 9113 section 8.3.1 asks of a proxy
    /// (RFC 3986 section 6.2.3): the host without case, and an empty or
    /// default port the same as none. Both are valid hosts already.
    static func sameEntity(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer, defaultPort: StaticString) -> Bool {
        let (hostA, portA) = splitPort(a)
        let (hostB, portB) = splitPort(b)
        guard HTTPBytes.equalsIgnoringCase(hostA, hostB) else { return false }
        func normalized(_ port: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
            port.isEmpty || HTTPBytes.equals(port, defaultPort) ? nil : port
        }
        switch (normalized(portA), normalized(portB)) {
        case (nil, nil): return true
        case let (x?, y?): return HTTPBytes.equalsIgnoringCase(x, y)
        default: return false
        }
    }

    /// The host and the port (empty when there is none) of a valid
    /// `host[:port]`, an IP literal in brackets included.
    private static func splitPort(_ value: UnsafeRawBufferPointer) -> (UnsafeRawBufferPointer, UnsafeRawBufferPointer) {
        var colon: Int?
        for i in value.indices.reversed() {
            if value[i] == UInt8(ascii: ":") {
                colon = i
                break
            }
            if value[i] == UInt8(ascii: "]") { break }
        }
        guard let colon else { return (value, UnsafeRawBufferPointer(rebasing: value[value.count..<value.count])) }
        return (
            UnsafeRawBufferPointer(rebasing: value[0..<colon]), UnsafeRawBufferPointer(rebasing: value[(colon + 1)...])
        )
    }
}
