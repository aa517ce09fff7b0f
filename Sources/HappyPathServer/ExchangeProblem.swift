import HappyPathCore
import HappyPathPolicies

/// Builds the problem a client gets when its request ends in a failure: the
/// code for what happened and a `detail` that says exactly that (how many
/// tries, what each got, how long it waited and for what).
struct ExchangeProblem {
    let requestID: String
    let upstream: String
    let route: RuntimeRoute

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
            return problem(.upstreamTimeout, "No response within the route's timeout of \(route.timeout.configText)\(tries).")
        case .overloaded(byParking: false):
            return problem(.overloaded, "'\(upstream)' has max_connections tries in flight and as many waiting.", retryAfter: 1)
        case .overloaded(byParking: true):
            return problem(.overloaded, "Too many requests are waiting for unavailable upstreams (limits.max_parked).")
        case let .circuitOpen(retryAfter):
            return problem(
                .circuitOpen, "The circuit breaker for '\(upstream)' is open after repeated failures.",
                retryAfter: Int((retryAfter.nanoseconds + 999_999_999) / 1_000_000_000))
        case let .parkExpired(reason, waited, byDeadline):
            let limit =
                byDeadline
                ? "the route's timeout of \(route.timeout.configText)" : "reachability.park_for of \(route.parkFor.configText)"
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
            }
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

    private func retryAfterSeconds(_ relay: ResponseRelay, wallSeconds: Int64) -> Int? {
        guard let text = relay.retryAfter, let d = RetryAfter.parse(text, nowUnixSeconds: wallSeconds) else { return nil }
        return Int((d.nanoseconds + 999_999_999) / 1_000_000_000)
    }
}
