/// What the proxy answers a gRPC client when it answers the call itself: a
/// Trailers-Only response (gRPC over HTTP/2), that is HTTP 200 and one
/// HEADERS block that ends the stream, carrying `content-type`, `grpc-status`,
/// `grpc-message` and `grpc-status-details-bin`. Never problem+json: a gRPC
/// client reads a status and its details, nothing else (docs/grpc.md).
public struct GRPCErrorResponse: Sendable, Equatable {
    public var status: GRPCStatus
    /// The text, unencoded: the problem's title, then its detail.
    public var message: String
    public var details: GRPCStatusDetails

    /// The answer for `problem`. `retryDelay` is the wait to put in
    /// `RetryInfo`; without it, the problem's `retry_after_s` when the problem
    /// is retryable. A non-retryable problem carries no `RetryInfo`.
    public init(_ problem: Problem, retryDelay: Duration? = nil) {
        status = GRPCStatus(problemCode: problem.code, httpStatus: problem.status)
        message = problem.detail.map { problem.title + ": " + $0 } ?? problem.title
        var metadata: [(key: String, value: String)] = [("request_id", problem.requestID)]
        if let upstream = problem.upstream { metadata.append(("upstream", upstream)) }
        if let attempts = problem.attempts { metadata.append(("attempts", String(attempts))) }
        if let suggestion = problem.recoverySuggestion { metadata.append(("recovery_suggestion", suggestion)) }
        var delay: Duration? = nil
        if problem.retryable { delay = retryDelay ?? problem.retryAfterSeconds.map { .seconds(max(0, $0)) } }
        // The same cut as `grpc-message`, so both say the same and the trailers stay small.
        let shown = GRPCMessage.decode(GRPCMessage.encode(message, limit: Self.messageLimit))
        details = GRPCStatusDetails(
            code: status, message: shown, errorInfo: .init(reason: problem.code, metadata: metadata), retryDelay: delay)
    }

    /// The longest `grpc-message`, encoded: with the details (which repeat
    /// it) it keeps the block well under the 8 KiB gRPC clients accept.
    public static let messageLimit = 2048

    /// The response's `:status`.
    public var httpStatus: Int { 200 }

    /// The fields of the one HEADERS block after `:status`, in order.
    public var fields: [HTTPField] {
        [
            HTTPField(name: "content-type", value: "application/grpc"),
            HTTPField(name: "grpc-status", value: status.fieldValue),
            HTTPField(name: "grpc-message", value: GRPCMessage.encode(message, limit: Self.messageLimit)),
            HTTPField(name: "grpc-status-details-bin", value: details.fieldValue),
        ]
    }
}
