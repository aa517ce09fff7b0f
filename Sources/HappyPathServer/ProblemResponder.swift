import HappyPathCore
import HappyPathIO

/// The one place a `Problem` becomes an HTTP response.
enum ProblemResponder {
    /// Returns the body's size in bytes.
    @discardableResult
    static func respond(_ request: HTTPRequest, _ problem: Problem) -> Int {
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
        let body = problem.json()
        request.reply(status: problem.status, headers: headers, body: body)
        return body.utf8.count
    }

    /// Problems for requests libevent refused before routing.
    static func problem(for reason: RejectedRequest, requestID: String, limits: HTTPServerLimits) -> Problem {
        switch reason {
        case .malformed:
            return Problem(.badRequest, requestID: requestID, detail: "The request line or headers could not be parsed.")
        case .headersTooLarge:
            return Problem(
                .headersTooLarge, requestID: requestID,
                detail: "The request head is larger than \(limits.maxHeaderBytes) bytes (limits.max_header_bytes).")
        case .bodyTooLarge:
            return Problem(
                .payloadTooLarge, requestID: requestID,
                detail: "The request body is larger than \(limits.maxBodyBytes) bytes (limits.max_request_body).")
        case .methodNotAllowed:
            return Problem(.badRequest, requestID: requestID, detail: "This request method is not supported.")
        case let .other(status):
            var p = Problem(.badRequest, requestID: requestID, detail: "The request was refused (HTTP \(status)).")
            p.status = status
            return p
        }
    }
}
