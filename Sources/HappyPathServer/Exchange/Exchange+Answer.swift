import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Answering

/// What the client gets when the machine gives up (`.answer`): the route's
/// fallback, the upstream's own answer passed through, or a problem, as
/// `ExchangeAnswer` decides; and how an answer is written whole.
extension Exchange {
    /// The machine answered `failure`: everything held is already released.
    /// `leader`: a coalesced follower answers its leader's failure, with the
    /// leader's held answer and history (Exchange+Coalesce).
    func answer(_ failure: ExchangeStateMachine.Failure, from leader: Exchange? = nil) {
        if let leader {
            relay = leader.relay
            relay.kept = nil
        }
        let decision = ExchangeAnswer.decide(
            .init(
                failure: failure, fallbackOn: route.fallback?.on, passesErrors: route.passesErrors, heldStatus: relay.status,
                heldBodyComplete: relay.heldBodyComplete, grpc: isGRPC, heldCarriesGRPCStatus: relay.grpcStatus != .absent))
        if let reason = decision.fallback, let fallback = route.fallback, answerFallback(fallback, reason) { return end() }
        var builder = ExchangeProblem(requestID: command.requestID, upstream: upstream.name, route: route)
        builder.pause = guardian.pauseHolding(client: pacingKey, at: env.clock.now())
        builder.clientTimeout = grpcTimeout
        builder.priority = priority
        builder.adaptive = guardian.adaptive != nil
        var problem = builder.build(
            failure, machine: leader?.machine ?? machine, relay: relay, attempts: leader?.command.attempt ?? command.attempt,
            wallSeconds: env.clock.wallSeconds())
        // The upstream's words may carry what the proxy sent it (an echoed
        // Authorization header, a token endpoint repeating its form): none
        // of its credentials leave in a problem. Only upstreams with
        // credentials pay for the search, and only here, on the error path.
        let scrubber = tokens?.scrubber(sent: leader?.authToken ?? authToken)
        if let scrubber { problem = problem.scrubbed(by: scrubber) }
        env.logger.debug(
            "request failed",
            metadata: ["request_id": "\(problem.requestID)", "code": "\(problem.code)", "upstream": "\(upstream.name)"])
        result.status = problem.status
        result.code = problem.code
        result.problem = problem
        switch decision.otherwise {
        case let .passThrough(status):
            // upstream_errors: pass: the upstream's own answer, whole
            // (a 404 or 410 is kept for serve_stale like any answer).
            result.status = status
            if isGRPC { result.grpcStatus = relay.grpcStatus.clientStatus(httpStatus: status) }
            relay.answered(bytes: passHeldAnswer(attempts: leader?.command.attempt ?? command.attempt))
            if relay.kept != nil { keepAnswer(fields: relay.heldEndToEndFields, body: relay.heldBody) }
        case let .problemKeepingUpstreamFields(status):
            // The body is replaced; the fields clients act on are kept.
            var kept = ErrorMapper.keptFields(
                relay.heldEndToEndFields, status: status, proxyRetryAfter: problem.retryAfterSeconds != nil)
            // An upstream may echo a credential in a field as well as in its body.
            if let scrubber { kept = kept.map { HTTPField(name: $0.name, value: scrubber.scrub($0.value)) } }
            relay.answered(
                bytes: ProblemResponder.respond(
                    request, problem, extraHeaders: kept + (rateLimitFields?.fields ?? []), grpc: false))
        case .problem:
            relay.answered(
                bytes: ProblemResponder.respond(request, problem, extraHeaders: rateLimitFields?.fields ?? [], grpc: false))
        case .grpcStatus:
            // The proxy answers the call itself: HTTP 200, its status in the
            // trailers-only block. A pacing pause gives its exact wait as
            // RetryInfo (problem+json has only whole seconds for it).
            var pauseLeft: Duration?
            switch failure {
            case .paused, .parkExpired(.paused, _, _): pauseLeft = builder.pause?.left
            default: break
            }
            let answer = GRPCErrorResponse(problem, retryDelay: pauseLeft)
            result.grpcStatus = answer.status
            result.status = answer.httpStatus
            ProblemResponder.respondGRPC(
                request, answer, requestID: problem.requestID, extraHeaders: rateLimitFields?.fields ?? [])
            relay.answered(bytes: 0)
        }
        end()
    }

    /// Sends the held answer as the upstream gave it (status, reason,
    /// end-to-end fields, body) plus the proxy's own two fields. Returns the
    /// body's size.
    func passHeldAnswer(attempts: Int? = nil) -> Int {
        let attempts = attempts ?? command.attempt
        // A gRPC answer to a gRPC-Web text call: its body in base64 too.
        if let web = relay.web, web.translated, web.mode == .text, !relay.heldBody.isEmpty {
            let encoded = GRPCWeb.base64(relay.heldBody)
            encoded.withUnsafeBytes {
                answerWhole(
                    status: relay.status, reason: relay.reason, fields: relay.heldEndToEndFields, body: $0, attempts: attempts)
            }
            return encoded.count
        }
        relay.heldBody.withUnsafeBytes {
            answerWhole(
                status: relay.status, reason: relay.reason, fields: relay.heldEndToEndFields, body: $0, attempts: attempts)
        }
        return relay.heldBody.count
    }

    /// An answer written whole, not relayed: `fields`, the proxy's own two
    /// and the route's `RateLimit` fields, then `body`.
    func answerWhole(
        status: Int, reason: [UInt8]?, fields: [HTTPField], body: UnsafeRawBufferPointer, attempts: Int? = nil
    ) {
        request.clearResponseHeaders()
        for field in fields { request.addResponseHeader(field.name, field.value) }
        request.addResponseHeader("X-Request-Id", command.requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(attempts ?? command.attempt))
        rateLimitFields?.stage(on: request)
        request.startReply(status: status, contentLength: body.count, reason: reason)
        if !body.isEmpty { request.send(body, notifyWhenDrained: false) }
        request.endReply()
    }
}
