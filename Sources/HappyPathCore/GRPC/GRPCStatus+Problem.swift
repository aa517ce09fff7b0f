// MARK: - The proxy's own errors as gRPC statuses

extension ProblemCode {
    /// The status a gRPC client gets when the proxy answers a gRPC exchange
    /// itself with this code (the table in docs/grpc.md). The codes that say
    /// "the service cannot take the call now" are UNAVAILABLE, the one gRPC
    /// clients and retry policies (gRFC A6) treat as transient; a timeout is
    /// DEADLINE_EXCEEDED; limits the client can stay under are
    /// RESOURCE_EXHAUSTED; a path no route serves is a method this server does
    /// not implement. Every other code takes what gRPC's own HTTP-to-gRPC
    /// table gives its HTTP status, so a client sees what it would see from
    /// any HTTP intermediary.
    public var grpcStatus: GRPCStatus {
        switch self {
        case .upstreamUnreachable, .upstreamUnavailable, .circuitOpen, .overloaded, .upstreamPaused: .unavailable
        case .upstreamTimeout: .deadlineExceeded
        case .rateLimited, .payloadTooLarge: .resourceExhausted
        case .noRoute: .unimplemented
        case .authFailed: .unauthenticated
        case .forbidden: .permissionDenied
        default: GRPCStatus(httpStatus: status)
        }
    }
}

extension GRPCStatus {
    /// The status for a problem by its code: a built-in code's own mapping,
    /// or, for a code of a route's own (`errors:` mappings), gRPC's table
    /// applied to the HTTP status the problem carries.
    public init(problemCode: String, httpStatus: Int) {
        self = ProblemCode(rawValue: problemCode)?.grpcStatus ?? GRPCStatus(httpStatus: httpStatus)
    }
}
