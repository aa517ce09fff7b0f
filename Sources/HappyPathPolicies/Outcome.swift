import HappyPathCore

/// How one try ended, as the policies see it (docs/contract.md, "Request lifecycle").
public enum Outcome: Sendable, Equatable {
    case success(status: Int)
    /// A status listed in `retry.on` (e.g. 502, 503, 504).
    case serverError(status: Int)
    /// Any other 4xx: the request itself was refused; healthy upstream.
    case clientError(status: Int)
    /// No response within the try's time.
    case timeout
    /// No connection: refused, unresolvable, connect timeout.
    case unreachable
    /// The connection dropped (or the answer was not HTTP) before a complete response.
    case reset
    /// A gRPC call answered (Trailers-Only) with a status `retry.on` names.
    case grpcError(GRPCStatus)

    /// Counts against the upstream (breaker, outlier ejection).
    public var isFailure: Bool {
        switch self {
        case .success, .clientError: false
        case .serverError, .timeout, .unreachable, .reset, .grpcError: true
        }
    }

    /// The `retry.on` name of this outcome.
    public var retryOnName: String? {
        switch self {
        case .success, .clientError: nil
        case let .serverError(status): String(status)
        case .timeout: "timeout"
        case .unreachable: "connect-failure"
        case .reset: "reset"
        case let .grpcError(status): status.configName
        }
    }

    /// For `detail`: "503", "timeout", "connection refused"...
    public var summary: String {
        switch self {
        case let .success(s), let .serverError(s), let .clientError(s): String(s)
        case .timeout: "timeout"
        case .unreachable: "connection failed"
        case .reset: "connection reset"
        case let .grpcError(status): status.name
        }
    }
}
