import HappyPathCore

/// The problems the worker answers itself, before any upstream is tried,
/// for what a route will not take: each says what happened and what to do.
enum RouteProblems {
    static func noRoute(method: String, path: String, requestID: String) -> Problem {
        Problem(.noRoute, requestID: requestID, detail: "No route matches \(method) \(path).")
    }

    /// TRACE, and Microsoft's TRACK, in any case: methods are case-sensitive,
    /// but upstreams that upper-case them would echo the request all the same.
    static func echoesRequest(_ method: String) -> Bool {
        var m = method
        return m.withUTF8 { b in
            let raw = UnsafeRawBufferPointer(b)
            return HTTPBytes.equals(raw, "trace") || HTTPBytes.equals(raw, "track")
        }
    }

    /// TRACE asks the upstream to echo the request back, credentials and
    /// cookies included (cross-site tracing): answered 405, with the
    /// route's other methods in `Allow`, unless the route sets `allow_trace`.
    static func traceRefused(method: String, route: RuntimeRoute, requestID: String) -> (Problem, allow: HTTPField) {
        let allowed = route.allowedMethods.filter { !echoesRequest($0) }.joined(separator: ", ")
        let problem = Problem(
            .methodNotAllowed, requestID: requestID,
            detail: "\(method) is not forwarded on this route; set allow_trace: true on the route to forward it.")
        return (problem, HTTPField(name: "Allow", value: allowed))
    }

    /// `strip_prefix` ends inside a path segment and removing it would send
    /// the upstream a dot-segment (`/pub../x` → `/../x`).
    static func prefixLeavesDotSegment(path: String, requestID: String) -> Problem {
        Problem(
            .badRequest, requestID: requestID,
            detail: "The path \(path) would reach the upstream with a dot-segment once the route's strip_prefix is removed.")
    }

    /// Over the route's rate limit: 429 RATE_LIMITED with when to come back.
    static func rateLimited(route: RuntimeRoute, retryAfter: Int, requestID: String) -> Problem {
        var problem = Problem(
            .rateLimited, requestID: requestID,
            detail: "Over this route's rate limit (rate_limit on \(route.label)); a token is due in \(retryAfter) s.")
        problem.retryAfterSeconds = retryAfter
        return problem
    }

    /// A request still waiting in a rate-limit queue when the drain ends:
    /// the answer every request left in flight then gets.
    static func shuttingDown(requestID: String) -> Problem {
        var problem = Problem(.upstreamUnavailable, requestID: requestID, detail: "The proxy is shutting down; try again.")
        problem.retryAfterSeconds = 1
        return problem
    }
}
