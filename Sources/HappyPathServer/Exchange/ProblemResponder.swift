import HappyPathCore
import HappyPathIO

/// The one place a `Problem` becomes an HTTP response: problem+json, or
/// for a gRPC call its gRPC status (docs/grpc.md).
enum ProblemResponder {
    /// Returns the body's size in bytes. `grpc`: the request is a gRPC call
    /// (nil: look at the request, which only an error answer pays for).
    @discardableResult
    static func respond<C: ExchangeClient>(
        _ request: C, _ problem: Problem, extraHeaders: [HTTPField] = [], grpc: Bool? = nil
    ) -> Int {
        if grpc ?? request.isGRPCCall {
            respondGRPC(request, GRPCErrorResponse(problem), requestID: problem.requestID, extraHeaders: extraHeaders)
            return 0
        }
        request.clearResponseHeaders()
        // A client that asks for JSON but not problem+json gets the same body
        // labelled application/json, so plain JSON decoders accept it.
        let accept = request.header("Accept") ?? ""
        let contentType =
            accept.contains("application/json") && !accept.contains("application/problem+json")
            ? "application/json" : "application/problem+json"
        var headers = [
            HTTPField(name: "Content-Type", value: contentType),
            HTTPField(name: "Cache-Control", value: "no-store"),
            HTTPField(name: "X-Request-Id", value: problem.requestID),
        ]
        if let attempts = problem.attempts {
            headers.append(HTTPField(name: "X-Happypath-Attempts", value: String(attempts)))
        }
        if let retryAfter = problem.retryAfterSeconds {
            headers.append(HTTPField(name: "Retry-After", value: String(retryAfter)))
        }
        headers += extraHeaders
        let body = problem.json()
        request.reply(status: problem.status, headers: headers, body: body)
        return body.utf8.count
    }

    /// A gRPC call's answer: never problem+json, a Trailers-Only response
    /// (HTTP 200 and one HEADERS block that ends the stream: the HTTP/2
    /// stream holds a gRPC answer's head until body bytes come, and none
    /// do). `X-Request-Id` and `extraHeaders` (`RateLimit`, `Allow`) go in
    /// the same block, as metadata.
    static func respondGRPC<C: ExchangeClient>(
        _ request: C, _ answer: GRPCErrorResponse, requestID: String, extraHeaders: [HTTPField] = []
    ) {
        request.clearResponseHeaders()
        let web = request.grpcWeb
        for field in answer.fields {
            // A gRPC-Web client reads the same status from the same head, under its own content type.
            if let web, field.name == "content-type" {
                request.addResponseHeader(
                    field.name, GRPCWeb.answerContentType(web, request: (request.header("content-type") ?? "").utf8))
            } else {
                request.addResponseHeader(field.name, field.value)
            }
        }
        request.addResponseHeader("x-request-id", requestID)
        for field in extraHeaders { request.addResponseHeader(field.name, field.value) }
        request.startReply(status: answer.httpStatus, contentLength: nil, reason: nil)
        request.endReply()
    }

    /// `respond`, for a caller that has no use for the size.
    static func answer<C: ExchangeClient>(_ request: C, _ problem: Problem) {
        respond(request, problem)
    }

    /// The problem for a request the HTTP/1.1 edge refused before routing.
    static func problem(for refusal: HTTP1Refusal, requestID: String, limits: HTTPServerLimits) -> Problem {
        problem(for: refusal, detail: refusal.detail, requestID: requestID, limits: limits)
    }

    /// The problem for a request the HTTP/2 edge refused before routing: a
    /// rule HTTP/1.1 has too gets HTTP/1.1's problem (code, status, the
    /// limit named in the detail) with the detail worded for HTTP/2's
    /// fields; a rule only HTTP/2 has is a 400 BAD_REQUEST.
    static func problem(for refusal: HTTP2RequestRefusal, requestID: String, limits: HTTPServerLimits) -> Problem {
        switch refusal {
        case let .http1(reason): problem(for: reason, detail: refusal.detail, requestID: requestID, limits: limits)
        case .malformed: Problem(.badRequest, requestID: requestID, detail: refusal.detail)
        }
    }

    /// `detail`: the refusal's own sentence, which the limits a status
    /// names (413, 431, 408) replace or complete.
    private static func problem(
        for refusal: HTTP1Refusal, detail: String, requestID: String, limits: HTTPServerLimits
    ) -> Problem {
        let code: ProblemCode
        var detail = detail
        switch refusal.status {
        case 413:
            code = .payloadTooLarge
            detail = "The request body is larger than \(limits.maxBodyBytes) bytes (limits.max_request_body)."
        case 431:
            code = .headersTooLarge
            if refusal == .headTooLarge || refusal == .trailersTooLarge {
                detail = "The request head is larger than \(limits.maxHeaderBytes) bytes (limits.max_header_bytes)."
            } else {
                detail = "The request has more than \(limits.maxFields) header fields."
            }
        case 414: code = .uriTooLong
        case 408:
            code = .requestTimeout
            detail += " (limits.client_timeout: \(limits.timeout.configText))"
        case 501: code = .notImplemented
        case 505: code = .versionNotSupported
        case 503:
            // limits.max_buffered_bytes: the only edge refusal that is the proxy's state, not the request.
            var p = Problem(.overloaded, requestID: requestID, detail: detail)
            p.retryAfterSeconds = 1
            return p
        default: code = .badRequest
        }
        return Problem(code, requestID: requestID, detail: detail)
    }
}
