import HappyPathCore
import HappyPathPolicies

/// Builds the problem a client gets when its request ends in a failure: the
/// code for what happened and a `detail` that says exactly that (how many
/// tries, what each got, how long it waited and for what).
struct ExchangeProblem {
    let requestID: String
    let upstream: String
    let route: RuntimeRoute
    /// The upstream's pause, when it is paused (pacing): the status that
    /// paused it and how long it still lasts.
    var pause: (cause: Int, left: Duration)? = nil
    /// A gRPC call's `grpc-timeout`, when it was the deadline (shorter than the route's `timeout`).
    var clientTimeout: Duration? = nil
    /// The request's priority and whether its upstream's limit is adaptive, for an OVERLOADED detail.
    var priority: RequestPriority = .normal
    var adaptive = false

    /// What bounded the request, for its detail.
    private var deadlineText: String {
        if let clientTimeout { return "the call's grpc-timeout of \(clientTimeout.configText)" }
        return "the route's timeout of \(route.timeout.configText)"
    }

    /// - Parameters:
    ///   - machine: the request's history (tries, their results, the last failure).
    ///   - relay: the last held answer, for `.upstreamAnswer`.
    ///   - attempts: the number of tries sent (at least 1 in the body, as the contract's `attempts`).
    ///   - wallSeconds: the wall clock (Unix seconds), for `Retry-After` dates.
    func build(
        _ failure: ExchangeStateMachine.Failure, machine: ExchangeStateMachine, relay: ResponseRelay, attempts: Int,
        wallSeconds: Int64
    ) -> Problem {
        func problem(_ code: ProblemCode, _ detail: String, retryAfter: Int? = nil) -> Problem {
            var p = Problem(code, requestID: requestID, detail: detail, attempts: attempts, upstream: upstream)
            p.retryAfterSeconds = retryAfter
            return p
        }
        let history = machine.history
        let summary = "\(history.count) attempt\(history.count == 1 ? "" : "s") failed: " + history.joined(separator: ", ")
        switch failure {
        case .timeout:
            let tries = history.isEmpty ? "" : " (" + summary + ")"
            return problem(.upstreamTimeout, "No response within \(deadlineText)\(tries).")
        case .overloaded(byParking: false):
            let limit = adaptive ? "as many tries in flight as its adaptive concurrency limit allows" : "max_connections tries in flight"
            return problem(
                .overloaded,
                "'\(upstream)' has \(limit), and its queue is full of requests that matter as much as this \(priority.rawValue) one.",
                retryAfter: 1)
        case let .shed(priority):
            let lower = priority == .critical ? "" : " (lower priorities are shed first)"
            return problem(
                .overloaded,
                "'\(upstream)' is over its capacity: this \(priority.rawValue) request waited for a slot in a queue that stood too long, and was shed\(lower).",
                retryAfter: 1)
        case .overloaded(byParking: true):
            return problem(.overloaded, "Too many requests are waiting for unavailable upstreams (limits.max_parked).")
        case let .circuitOpen(retryAfter):
            return problem(
                .circuitOpen, "The circuit breaker for '\(upstream)' is open after repeated failures.",
                retryAfter: Int(OutsideValues.wholeSeconds(retryAfter)))
        case let .parkExpired(reason, waited, byDeadline):
            if byDeadline, clientTimeout != nil {
                // A gRPC call's own deadline passed while it waited: what any
                // gRPC server says then, DEADLINE_EXCEEDED, with what it waited for.
                let why =
                    switch reason {
                    case .unreachable: "'\(upstream)' could not be reached"
                    case .circuitOpen: "the circuit breaker for '\(upstream)' was open"
                    case .auth: "the token endpoint did not answer"
                    case .paused: "'\(upstream)' was paused (HTTP \(pause?.cause ?? 503) with Retry-After)"
                    }
                return problem(.upstreamTimeout, "No response within \(deadlineText): the call waited \(waited.configText) while \(why).")
            }
            let limit = byDeadline ? deadlineText : "reachability.park_for of \(route.parkFor.configText)"
            let waitedText = "waited \(waited.configText) (\(limit))"
            switch reason {
            case .unreachable:
                let cause = machine.lastFailure.map { "; last error: \($0.message)" } ?? ""
                return problem(
                    .upstreamUnreachable, "'\(upstream)' could not be reached; the request \(waitedText)\(cause).", retryAfter: 5)
            case .circuitOpen:
                return problem(
                    .circuitOpen,
                    "The circuit breaker for '\(upstream)' stayed open while the request \(waitedText).", retryAfter: 5)
            case .auth:
                return problem(.authFailed, "No valid token: the token endpoint did not answer while the request \(waitedText).")
            case .paused:
                return pausedProblem(
                    "The request waited \(waited.configText) for the pause to end, and \(deadlineText) came first.")
            }
        case .paused:
            return pausedProblem("Requests are not sent while it lasts (pacing.while_paused: fail).")
        case .requestBodyTooLarge:
            return problem(.payloadTooLarge, "The request body passed limits.max_request_body while it was being sent upstream.")
        case .unreachable:
            return problem(.upstreamUnreachable, machine.lastFailure?.message ?? "The upstream could not be reached.")
        case let .upstreamAnswer(status):
            var base = problem(.upstreamUnavailable, "")
            base.retryAfterSeconds = retryAfterSeconds(relay, wallSeconds: wallSeconds)
            var p = ErrorMapper.problem(
                status: status, body: relay.heldBody, complete: relay.heldBodyComplete, mappings: route.errors, base: base)
            if p.detail?.isEmpty ?? true {
                p.detail = history.count > 1 ? summary : "The upstream answered \(status)."
            }
            return p
        case let .badGateway(message):
            return problem(.badGateway, history.count == 1 ? message : summary + " (\(message))")
        case let .upstreamTLS(message):
            return problem(.upstreamTLS, "The TLS connection to the upstream failed: \(message).")
        case .unavailable:
            return problem(.upstreamUnavailable, summary, retryAfter: retryAfterSeconds(relay, wallSeconds: wallSeconds))
        case let .tokenRefusedAfterRefresh(status):
            return problem(.authFailed, "The upstream refused a freshly refreshed token (HTTP \(status)).")
        case let .tokenRefreshFailed(reason):
            return problem(.authFailed, "The token refresh failed: \(reason).")
        case .shuttingDown:
            return problem(.upstreamUnavailable, "The proxy is shutting down; try again.", retryAfter: 1)
        }
    }

    /// A paused upstream: 429 RATE_LIMITED when a 429 paused it (the client
    /// is over a limit too), else 503 UPSTREAM_PAUSED; `Retry-After` is the
    /// pause's time left.
    private func pausedProblem(_ why: String) -> Problem {
        let cause = pause?.cause ?? 503
        let left = pause.map { Int(OutsideValues.wholeSeconds($0.left)) } ?? 1
        var p = Problem(
            cause == 429 ? .rateLimited : .upstreamPaused, requestID: requestID,
            detail: "'\(upstream)' asked for a pause (HTTP \(cause) with Retry-After). " + why, upstream: upstream)
        p.retryAfterSeconds = max(1, left)
        return p
    }

    private func retryAfterSeconds(_ relay: ResponseRelay, wallSeconds: Int64) -> Int? {
        // Read (and clamped to retry.max_retry_after) by the relay as it arrived.
        relay.retryAfterSeconds.map { Int($0) }
    }
}
