/// Why the HTTP/2 edge refused a stream's request, before any route saw it.
///
/// A rule HTTP/1.1 has too (a bad method or path, a bad host, the header
/// limits, a body over the limit) is that rule's `HTTP1Refusal`, so the
/// `reason` label of `happypath_requests_refused_total`, the status and the
/// problem's detail are the same on both protocols. The rules of RFC 9113
/// section 8 that only HTTP/2 has are `HTTP2Malformation`s: each makes the
/// request malformed, which the RFC answers with a stream error (a 400 may
/// go first, section 8.1.1); the connection lives on.
public enum HTTP2RequestRefusal: Error, Sendable, Hashable {
    case http1(HTTP1Refusal)
    case malformed(HTTP2Malformation)

    /// The `reason` label of `happypath_requests_refused_total`.
    public var label: String {
        switch self {
        case let .http1(refusal): refusal.rawValue
        case let .malformed(rule): rule.rawValue
        }
    }

    /// The status the stream is answered with.
    public var status: Int {
        switch self {
        case let .http1(refusal): refusal.status
        case .malformed: 400
        }
    }

    /// One sentence for the problem's `detail`. HTTP/1.1's, except where
    /// HTTP/1.1's names its own fields (Host) rather than HTTP/2's.
    public var detail: String {
        switch self {
        case .http1(.missingHost): "An HTTP/2 request must carry :authority or a Host header."
        case .http1(.repeatedHost): "The request carries more than one Host header."
        case .http1(.invalidHost): "The :authority or Host value is empty or not a valid host[:port]."
        case .http1(.badTarget):
            "The :path contains a byte that is not allowed there (space, control byte, '#', or non-ASCII)."
        case .http1(.asteriskFormNotOptions): "The :path '*' is only valid with OPTIONS."
        case let .http1(refusal): refusal.detail
        case let .malformed(rule): rule.detail
        }
    }
}

/// The rules of RFC 9113 section 8 that only HTTP/2 has; the raw value is
/// the `reason` label (none is one of `HTTP1Refusal`'s).
public enum HTTP2Malformation: String, Sendable, Hashable, CaseIterable {
    // MARK: Pseudo-headers (RFC 9113 section 8.3)
    /// `:method`, `:scheme` or `:path` is missing.
    case missingPseudoHeader = "missing_pseudo_header"
    /// A pseudo-header a request does not have (`:status`, `:foo`).
    case unknownPseudoHeader = "unknown_pseudo_header"
    /// The same pseudo-header twice.
    case repeatedPseudoHeader = "repeated_pseudo_header"
    /// A pseudo-header after a regular field.
    case pseudoHeaderAfterField = "pseudo_header_after_field"
    /// `:scheme` other than `http` or `https`.
    case badScheme = "bad_scheme"
    /// `:path` empty, or neither `/…` nor `*` (no absolute form in HTTP/2).
    case badPath = "bad_path"
    /// `:authority` and `Host` name different hosts (RFC 9113 section 8.3.1).
    case authorityMismatch = "authority_host_mismatch"

    // MARK: Fields (RFC 9113 section 8.2)
    /// `Connection`, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`,
    /// `Upgrade`, or `TE` other than `trailers` (section 8.2.2).
    case connectionSpecificField = "connection_specific_field"
    /// `:protocol` on a request that is not a CONNECT, or not a token (RFC 8441 section 4).
    case badProtocol = "bad_protocol"
    /// A field name with an upper-case letter (section 8.2.1).
    case uppercaseFieldName = "uppercase_field_name"

    public var detail: String {
        switch self {
        case .missingPseudoHeader: "An HTTP/2 request must carry :method, :scheme and :path."
        case .unknownPseudoHeader: "The request carries a pseudo-header that requests do not have."
        case .repeatedPseudoHeader: "The request carries the same pseudo-header twice."
        case .pseudoHeaderAfterField: "A pseudo-header comes after a regular header field."
        case .badScheme: "The :scheme is neither http nor https."
        case .badPath: "The :path is empty, or neither an absolute path nor '*'."
        case .authorityMismatch: "The Host header names another host than :authority."
        case .connectionSpecificField:
            "The request carries a connection-specific header field (Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding, Upgrade, or TE other than trailers), which HTTP/2 forbids."
        case .badProtocol: "The :protocol pseudo-header is only valid on an extended CONNECT, as one token (RFC 8441)."
        case .uppercaseFieldName: "A header field name has an upper-case letter, which HTTP/2 forbids."
        }
    }
}
