/// The built-in error codes (the table in docs/errors.md), each with the text
/// a client sees when no route or upstream mapping overrides it.
public enum ProblemCode: String, Sendable, CaseIterable {
    case noRoute = "NO_ROUTE"
    case badRequest = "BAD_REQUEST"
    case payloadTooLarge = "PAYLOAD_TOO_LARGE"
    case headersTooLarge = "HEADERS_TOO_LARGE"
    case upstreamUnreachable = "UPSTREAM_UNREACHABLE"
    case upstreamTimeout = "UPSTREAM_TIMEOUT"
    case upstreamUnavailable = "UPSTREAM_UNAVAILABLE"
    case circuitOpen = "CIRCUIT_OPEN"
    case overloaded = "OVERLOADED"
    case rateLimited = "RATE_LIMITED"
    case authFailed = "AUTH_FAILED"
    case forbidden = "FORBIDDEN"
    case notFound = "NOT_FOUND"
    case clientError = "CLIENT_ERROR"
    case badGateway = "BAD_GATEWAY"
    case upstreamTLS = "UPSTREAM_TLS"
    case uriTooLong = "URI_TOO_LONG"
    case requestTimeout = "REQUEST_TIMEOUT"
    case notImplemented = "NOT_IMPLEMENTED"
    case versionNotSupported = "VERSION_NOT_SUPPORTED"
    case methodNotAllowed = "METHOD_NOT_ALLOWED"
    case upstreamPaused = "UPSTREAM_PAUSED"
    case storeUnavailable = "STORE_UNAVAILABLE"
    case idempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED"

    public var status: Int {
        switch self {
        case .noRoute, .notFound: 404
        case .badRequest: 400
        case .payloadTooLarge: 413
        case .headersTooLarge: 431
        case .upstreamUnreachable, .upstreamUnavailable, .circuitOpen, .overloaded, .storeUnavailable, .upstreamPaused: 503
        case .idempotencyKeyReused: 422
        case .upstreamTimeout: 504
        case .rateLimited: 429
        case .authFailed: 401
        case .forbidden: 403
        case .clientError: 400
        case .badGateway, .upstreamTLS: 502
        case .uriTooLong: 414
        case .requestTimeout: 408
        case .notImplemented: 501
        case .versionNotSupported: 505
        case .methodNotAllowed: 405
        }
    }

    public var retryable: Bool {
        switch self {
        case .upstreamUnreachable, .upstreamTimeout, .upstreamUnavailable, .circuitOpen, .overloaded,
            .rateLimited, .badGateway, .storeUnavailable, .upstreamPaused:
            true
        default: false
        }
    }

    /// `urn:happypath:error:` followed by the code in kebab case.
    public var type: String { Self.type(for: rawValue) }

    /// The `type` URI for any code, built-in or a route's own.
    public static func type(for code: String) -> String {
        "urn:happypath:error:" + code.lowercased().replacingUnderscores()
    }

    public var title: String {
        switch self {
        case .noRoute: "No route matches this request"
        case .badRequest: "The request is malformed"
        case .payloadTooLarge: "The request body is too large"
        case .headersTooLarge: "The request headers are too large"
        case .upstreamUnreachable: "The service cannot be reached"
        case .upstreamTimeout: "The service did not answer in time"
        case .upstreamUnavailable: "The service is temporarily unavailable"
        case .circuitOpen: "The service is paused after repeated failures"
        case .overloaded: "The gateway is at capacity"
        case .rateLimited: "Too many requests"
        case .authFailed: "The gateway could not authenticate to the service"
        case .forbidden: "Access to this resource is not allowed"
        case .notFound: "The resource does not exist"
        case .clientError: "The service rejected the request"
        case .badGateway: "The service sent an invalid response"
        case .upstreamTLS: "The service's TLS connection could not be established or verified"
        case .uriTooLong: "The request line is too long"
        case .requestTimeout: "The request did not arrive in time"
        case .notImplemented: "The request uses a feature the gateway does not support"
        case .versionNotSupported: "The HTTP version is not supported"
        case .methodNotAllowed: "The method is not allowed here"
        case .upstreamPaused: "The service asked for a pause"
        case .storeUnavailable: "The gateway cannot store the request right now"
        case .idempotencyKeyReused: "The Idempotency-Key was already used for another request"
        }
    }

    public var recoverySuggestion: String {
        switch self {
        case .noRoute: "Check the URL path and method against the gateway's routes."
        case .badRequest: "Fix the request syntax before sending it again."
        case .payloadTooLarge: "Send a smaller body, or ask the operator to raise limits.max_request_body."
        case .headersTooLarge: "Send fewer or smaller headers (cookies are the usual cause)."
        case .upstreamUnreachable: "Try again in a few seconds; the service is not accepting connections."
        case .upstreamTimeout: "Try again later; the service is slow right now."
        case .upstreamUnavailable: "Try again in a few seconds."
        case .circuitOpen: "Wait for the time given in Retry-After, then try again."
        case .overloaded: "Try again shortly, with backoff."
        case .rateLimited: "Slow down and retry after the time given in Retry-After."
        case .authFailed: "Contact the operator: the gateway's credentials for this service are not accepted."
        case .forbidden: "Check that you are allowed to access this resource."
        case .notFound: "Check the identifier in the URL."
        case .clientError: "Correct the request as the service describes, then send it again."
        case .badGateway: "Try again; if it persists, the service is misbehaving."
        case .upstreamTLS: "Contact the operator: the gateway does not trust the service's certificate, or their TLS settings do not match."
        case .uriTooLong: "Send a shorter URL (move long parameters into the body)."
        case .requestTimeout: "Send the whole request without pausing, then try again."
        case .notImplemented: "Send the body with Content-Length or plain chunked encoding."
        case .versionNotSupported: "Use HTTP/1.1."
        case .methodNotAllowed: "Use one of the methods in the Allow header."
        case .upstreamPaused: "Wait for the time given in Retry-After, then try again."
        case .storeUnavailable: "Try again later, with backoff; the gateway's store is not taking writes."
        case .idempotencyKeyReused: "Send a new Idempotency-Key for a new request; resend a request only unchanged."
        }
    }

    public var recoveryOptions: [String] { retryable ? ["retry", "cancel"] : ["cancel"] }
}

extension String {
    fileprivate func replacingUnderscores() -> String {
        String(unicodeScalars.map { $0 == "_" ? "-" : Character($0) })
    }
}

/// The one error body every failure becomes (RFC 9457 problem+json with the
/// fields listed in docs/contract.md, "Errors"). Rendered in exactly one place: `json()`.
public struct Problem: Sendable, Equatable {
    public var code: String
    public var type: String
    public var title: String
    public var status: Int
    public var retryable: Bool
    public var requestID: String
    public var detail: String?
    public var retryAfterSeconds: Int?
    public var recoverySuggestion: String?
    public var recoveryOptions: [String]
    public var attempts: Int?
    public var upstream: String?
    /// The upstream's own JSON error body, embedded as is (already validated JSON).
    public var upstreamBodyJSON: String?

    public init(
        _ code: ProblemCode, requestID: String, detail: String? = nil, attempts: Int? = nil,
        upstream: String? = nil, retryAfterSeconds: Int? = nil
    ) {
        self.code = code.rawValue
        self.type = code.type
        self.title = code.title
        self.status = code.status
        self.retryable = code.retryable
        self.requestID = requestID
        self.detail = detail
        self.retryAfterSeconds = retryAfterSeconds
        self.recoverySuggestion = code.recoverySuggestion
        self.recoveryOptions = code.recoveryOptions
        self.attempts = attempts
        self.upstream = upstream
    }

    /// The body, with keys in the documented order.
    public func json() -> String {
        var out = "{"
        out.reserveCapacity(384)
        func field(_ key: String, _ rendered: String) {
            if out.utf8.count > 1 { out += "," }
            out += "\"" + key + "\":" + rendered
        }
        field("type", JSON.quote(type))
        field("title", JSON.quote(title))
        field("status", String(status))
        field("code", JSON.quote(code))
        if let detail { field("detail", JSON.quote(detail)) }
        field("retryable", retryable ? "true" : "false")
        if let retryAfterSeconds { field("retry_after_s", String(retryAfterSeconds)) }
        if let recoverySuggestion { field("recovery_suggestion", JSON.quote(recoverySuggestion)) }
        if !recoveryOptions.isEmpty {
            field("recovery_options", "[" + recoveryOptions.map(JSON.quote).joined(separator: ",") + "]")
        }
        if let attempts { field("attempts", String(attempts)) }
        if let upstream { field("upstream", JSON.quote(upstream)) }
        if let upstreamBodyJSON { field("upstream_body", upstreamBodyJSON) }
        field("request_id", JSON.quote(requestID))
        out += "}"
        return out
    }
}

/// Minimal JSON string quoting for the bodies and log lines the proxy writes.
public enum JSON {
    public static func quote(_ s: String) -> String {
        // Fast path: nothing to escape (the usual case for ids, names, codes).
        if !s.utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
            return "\"" + s + "\""
        }
        var out = "\""
        out.reserveCapacity(s.utf8.count + 2)
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
        return out
    }
}
