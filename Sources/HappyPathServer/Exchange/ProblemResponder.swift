import HappyPathCore
import HappyPathIO

/// The one place a `Problem` becomes an HTTP response.
enum ProblemResponder {
    /// Returns the body's size in bytes.
    @discardableResult
    static func respond<C: ExchangeClient>(_ request: C, _ problem: Problem, extraHeaders: [HTTPField] = []) -> Int {
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
