/// Why the HTTP/1.1 edge refused a client's request, before any route saw
/// it. Each case names one rule of RFC 9112 (or one of the proxy's limits);
/// the raw value is the `reason` label of `happypath_requests_refused_total`.
///
/// A request that could be read two ways is refused, never guessed at: the
/// connection is closed after the answer, because the proxy can no longer
/// tell where the next request would start.
public enum HTTP1Refusal: String, Error, Sendable, CaseIterable {
    // MARK: Request line (RFC 9112 section 3)
    case badRequestLine = "bad_request_line"
    case badMethod = "bad_method"
    case badTarget = "bad_target"
    case authorityForm = "authority_form"
    case connectMethod = "connect_method"
    case asteriskFormNotOptions = "asterisk_form"
    case badVersion = "bad_version"
    case unsupportedVersion = "unsupported_version"
    case requestLineTooLong = "request_line_too_long"

    // MARK: Path (RFC 3986 sections 2.1, 5.2.4; docs/http1.md "Paths")
    case badPercentEncoding = "bad_percent_encoding"
    case pathAboveRoot = "path_above_root"
    /// `..;x` or `.;x`: a dot-segment with parameters, which Tomcat and Jetty read as `..`.
    case dotSegmentParameters = "dot_segment_parameters"
    /// `%2F`, `%5C` or `\` in the path with `limits.encoded_slashes: reject`.
    case encodedSlash = "encoded_slash"

    // MARK: Field lines (RFC 9112 section 5)
    case bareLineFeed = "bare_lf"
    case bareCarriageReturn = "bare_cr"
    case whitespaceBeforeFirstField = "whitespace_before_first_field"
    case obsFold = "obs_fold"
    case badFieldName = "bad_field_name"
    case whitespaceBeforeColon = "whitespace_before_colon"
    case missingColon = "missing_colon"
    case badFieldValue = "bad_field_value"
    case headTooLarge = "head_too_large"
    case tooManyFields = "too_many_fields"

    // MARK: Host (RFC 9112 section 3.2)
    case missingHost = "missing_host"
    case repeatedHost = "repeated_host"
    case invalidHost = "invalid_host"

    // MARK: Framing (RFC 9112 section 6)
    case badContentLength = "bad_content_length"
    case conflictingContentLength = "conflicting_content_length"
    case contentLengthWithTransferEncoding = "content_length_with_transfer_encoding"
    case transferEncodingOnHTTP10 = "transfer_encoding_on_http10"
    case chunkedNotFinal = "chunked_not_final"
    case unsupportedTransferCoding = "unsupported_transfer_coding"
    case bodyTooLarge = "body_too_large"

    // MARK: Chunked body (RFC 9112 section 7.1)
    case badChunkSize = "bad_chunk_size"
    case badChunkExtension = "bad_chunk_extension"
    case chunkLineTooLong = "chunk_line_too_long"
    case missingChunkTerminator = "missing_chunk_crlf"
    case trailersTooLarge = "trailers_too_large"
    case badTrailer = "bad_trailer"

    // MARK: Time
    case headTimeout = "head_timeout"
    case bodyTimeout = "body_timeout"
    /// Not a protocol rule: the process holds as many request bodies as
    /// `limits.max_buffered_bytes` allows (503 OVERLOADED, retryable).
    case bodyOverBudget = "body_over_budget"
    /// Not a protocol rule either: this client (its address) holds its share
    /// of the body budget, `limits.max_buffered_per_client` (503 OVERLOADED).
    case bodyOverClientShare = "body_over_client_share"

    /// The refusal of a body `budget` did not take: the client's share
    /// when its own limit refused, else the process's budget.
    public static func bodyOver(_ budget: BodyBudget?) -> HTTP1Refusal {
        budget?.lastRefusalWasOwn == true ? .bodyOverClientShare : .bodyOverBudget
    }

    /// The status the client is answered with.
    public var status: Int {
        switch self {
        case .requestLineTooLong: 414
        case .headTooLarge, .tooManyFields, .trailersTooLarge: 431
        case .bodyTooLarge: 413
        case .unsupportedTransferCoding: 501
        case .unsupportedVersion: 505
        case .headTimeout, .bodyTimeout: 408
        case .bodyOverBudget, .bodyOverClientShare: 503
        default: 400
        }
    }

    /// One sentence for the problem's `detail`: which rule, in the client's terms.
    public var detail: String {
        switch self {
        case .badRequestLine: "The request line is not 'METHOD SP target SP HTTP/1.x' with single spaces and CRLF."
        case .badMethod: "The method is not a token (RFC 9110 section 9)."
        case .badTarget:
            "The request target contains a byte that is not allowed there (space, control byte, '#', or non-ASCII)."
        case .authorityForm: "Authority-form targets (host:port) are only for CONNECT, which this proxy does not tunnel."
        case .connectMethod: "CONNECT tunnels are not supported."
        case .asteriskFormNotOptions: "The target '*' is only valid with OPTIONS."
        case .badVersion: "The HTTP version is malformed."
        case .unsupportedVersion: "Only HTTP/1.0 and HTTP/1.1 are served on this listener."
        case .requestLineTooLong: "The request line is longer than this listener accepts."
        case .badPercentEncoding: "The path has a '%' that is not followed by two hexadecimal digits."
        case .pathAboveRoot: "The path climbs above the root with '..'; remove the dot-segments."
        case .dotSegmentParameters:
            "The path has a '.' or '..' segment with parameters ('..;x'), which some servers read as '..'."
        case .encodedSlash:
            "The path contains an encoded slash or backslash (%2F, %5C or '\\'), which this listener refuses (limits.encoded_slashes)."
        case .bareLineFeed: "A line ends in LF without CR; only CRLF ends a line here."
        case .bareCarriageReturn: "A CR is not followed by LF."
        case .whitespaceBeforeFirstField: "Whitespace between the request line and the first field."
        case .obsFold: "A field value is folded over several lines (obs-fold), which RFC 9112 deprecates."
        case .badFieldName: "A field name contains a byte that is not a token character."
        case .whitespaceBeforeColon: "Whitespace between a field name and its colon."
        case .missingColon: "A field line has no colon."
        case .badFieldValue: "A field value contains a control byte (CR, LF, NUL or another)."
        case .headTooLarge: "The request head is larger than this listener accepts."
        case .tooManyFields: "The request has more header fields than this listener accepts."
        case .missingHost: "An HTTP/1.1 request must carry a Host header."
        case .repeatedHost: "The request carries more than one Host header."
        case .invalidHost: "The Host header is not a valid host[:port]."
        case .badContentLength: "Content-Length is not a plain decimal number."
        case .conflictingContentLength: "The request carries Content-Length values that differ."
        case .contentLengthWithTransferEncoding: "The request carries both Content-Length and Transfer-Encoding."
        case .transferEncodingOnHTTP10: "Transfer-Encoding is not allowed in an HTTP/1.0 request."
        case .chunkedNotFinal: "The last transfer coding of a request must be chunked, applied once."
        case .unsupportedTransferCoding: "Only the chunked transfer coding is supported."
        case .bodyTooLarge: "The request body is larger than this listener accepts."
        case .badChunkSize: "A chunk size is not a hexadecimal number, or is too large."
        case .badChunkExtension: "A chunk extension is malformed."
        case .chunkLineTooLong: "A chunk-size line is too long."
        case .missingChunkTerminator: "Chunk data is not followed by CRLF."
        case .trailersTooLarge: "The trailer section is larger than the header limit."
        case .badTrailer: "A trailer field line is malformed."
        case .headTimeout: "The request head did not arrive in full within the client timeout."
        case .bodyTimeout: "The request body stalled for longer than the client timeout."
        case .bodyOverBudget:
            "The proxy holds as many request bodies in memory as its budget allows (limits.max_buffered_bytes); try again shortly."
        case .bodyOverClientShare:
            "Your requests' bodies held by the proxy already fill your address's share of its memory (limits.max_buffered_per_client); other clients are served as usual. Send this again once your earlier requests are answered."
        }
    }
}

/// The HTTP version of a request; only these two are served.
public enum HTTPVersion: Sendable, Equatable {
    case http10
    case http11
}

/// How a request's body is delimited (RFC 9112 section 6.3).
public enum BodyFraming: Sendable, Equatable {
    case none
    case contentLength(Int)
    case chunked
}

// MARK: - Byte classes

/// Character classes of RFC 9110 and RFC 3986, as 128-bit masks written as
/// constants: a check is a shift and a test, with no table to load and no
/// global to initialise first. (The masks are checked against the grammar,
/// byte by byte, in HTTP1ParserTests.)
public enum HTTPBytes {
    @inline(__always)
    static func inMask(_ b: UInt8, _ low: UInt64, _ high: UInt64) -> Bool {
        b < 64 ? (low >> UInt64(b)) & 1 != 0 : b < 128 ? (high >> UInt64(b &- 64)) & 1 != 0 : false
    }

    /// tchar: "!#$%&'*+-.^_`|~" / DIGIT / ALPHA.
    @inline(__always)
    public static func isToken(_ b: UInt8) -> Bool { inMask(b, 0x03ff_6cfa_0000_0000, 0x57ff_ffff_c7ff_fffe) }

    /// field-vchar / SP / HTAB: what may appear inside a field value.
    /// obs-text (0x80-0xFF) is allowed by the grammar; controls and DEL are not.
    @inline(__always)
    public static func isFieldValue(_ b: UInt8) -> Bool {
        b >= 128 || inMask(b, 0xffff_ffff_0000_0200, 0x7fff_ffff_ffff_ffff)
    }

    /// Bytes allowed in a request target: visible ASCII except '#' (a
    /// fragment is never part of a request target). Non-ASCII must arrive
    /// percent-encoded (RFC 3986 section 2.1).
    @inline(__always)
    public static func isTarget(_ b: UInt8) -> Bool { inMask(b, 0xffff_fff6_0000_0000, 0x7fff_ffff_ffff_ffff) }

    /// reg-name characters of RFC 3986: unreserved / pct-encoded ('%') / sub-delims.
    @inline(__always)
    public static func isRegName(_ b: UInt8) -> Bool { inMask(b, 0x2bff_7ff2_0000_0000, 0x47ff_fffe_87ff_fffe) }

    @inline(__always)
    public static func lower(_ b: UInt8) -> UInt8 { b >= 0x41 && b <= 0x5A ? b | 0x20 : b }

    /// ASCII case-insensitive comparison of raw bytes with a lower-case literal.
    public static func equals(_ bytes: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        guard bytes.count == lowercase.utf8CodeUnitCount else { return false }
        let p = lowercase.utf8Start
        for i in 0..<bytes.count where lower(bytes[i]) != p[i] { return false }
        return true
    }

    /// ASCII case-insensitive comparison of two byte runs.
    public static func equalsIgnoringCase(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count where lower(a[i]) != lower(b[i]) { return false }
        return true
    }

    /// Validates `host [ ":" port ]` (RFC 9110 section 7.2, RFC 3986 section 3.2.2):
    /// a reg-name or IPv4 address, or an IP literal in brackets; the port is
    /// digits. An empty value is valid (a target without an authority).
    public static func isValidHost(_ value: UnsafeRawBufferPointer) -> Bool {
        let n = value.count
        var i = 0
        if n > 0, value[0] == UInt8(ascii: "[") {
            i = 1
            while i < n, value[i] != UInt8(ascii: "]") {
                let c = value[i]
                let ok =
                    (c >= 0x30 && c <= 0x39) || (lower(c) >= 0x61 && lower(c) <= 0x66) || c == UInt8(ascii: ":")
                    || c == UInt8(ascii: ".") || lower(c) == UInt8(ascii: "v")
                if !ok { return false }
                i += 1
            }
            guard i < n, i > 1 else { return false }
            i += 1  // past ']'
        } else {
            while i < n, value[i] != UInt8(ascii: ":") {
                if !HTTPBytes.isRegName(value[i]) { return false }
                i += 1
            }
        }
        guard i < n else { return true }
        guard value[i] == UInt8(ascii: ":") else { return false }
        i += 1
        guard n - i <= 5 else { return false }
        while i < n {
            if value[i] < 0x30 || value[i] > 0x39 { return false }
            i += 1
        }
        return true
    }
}
