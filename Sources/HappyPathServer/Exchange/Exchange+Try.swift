import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - A try

/// A try sent (`.send`), and its end told to everything that counts it
/// and then to the machine. What the end is, is the machine's rules
/// (`TryEndRules`, through `machine.classify`); this file performs them.
extension Exchange {
    func send(attempt: Int, limit: Duration) {
        while command.attempt < attempt { command = command.nextAttempt() }
        relay.reset()
        relay.holdLimit = route.passesErrors ? ResponseRelay.passHoldLimit : ErrorMapper.maxBody
        if route.hedge != nil, upgrade == nil {
            let now = env.clock.now()
            hedging.trySent(at: now, limit: limit, hedgeDueAt: machine.mayHedge ? route.hedgeDue(sentAt: now) : nil)
            armTryTimer(at: now)
        } else {
            arm(after: limit)
        }
        // A retry prefers another endpoint than the one that just failed;
        // ejected endpoints are skipped.
        let count = upstream.endpoints.count
        let preferred = endpointIndex < 0 ? env.nextEndpointIndex(for: guardian, count: count) : (endpointIndex + 1) % count
        endpointIndex = count > 1 ? guardian.pickEndpoint(preferred: preferred, at: env.clock.now()) : preferred
        // Each try reads the streamed body from its first byte (a retry is
        // only allowed while it is all kept: `machine.bodyReplayable`). A
        // hedge never rewinds: it goes only once the body is whole.
        if let bodyStream { _ = bodyStream.rewind() }
        if guardian.adaptive != nil, upgrade == nil, let lane {
            machine.sampleSent(at: env.clock.now(), inFlight: lane.slots.inFlight)
        }
        if let upgrade {
            upgradeTry = startUpgrade(upgrade, endpoint: endpointIndex, limit: limit)
        } else {
            transfer = start(endpoint: endpointIndex, limit: limit, token: authToken, handler: self)
        }
        hedging.lastEndpoint = endpointIndex
    }

    /// A libcurl transfer to endpoint `index` carrying `token`, its parts
    /// reported to `handler` (the exchange, or a hedge beside its try).
    func start(endpoint index: Int, limit: Duration, token: Token?, handler: UpstreamResponseHandler)
        -> any UpstreamTry
    {
        let endpoint = upstream.endpoints[index]
        let method = command.method
        let sendsBody =
            command.body.count > 0 || bodyStream != nil || method == "POST" || method == "PUT" || method == "PATCH"
        var credentials: HTTPField?
        // The one place a credential is revealed: the header injected into the try.
        if let token, let tokens { credentials = HTTPField(name: tokens.header, value: token.credential.reveal) }
        if trace != nil {
            trace?.tryStarted(
                spanID: Tracer.nonZero(env.random()), endpoint: endpoint.origin, attempt: command.attempt,
                hedge: handler !== self, at: env.clock.now())
        }
        var request = UpstreamRequest(
            origin: endpoint.origin, target: endpoint.basePath + command.target, method: method,
            headers: command.headers, replacing: credentials, body: command.body, sendsBody: sendsBody,
            connectTimeout: min(upstream.connectTimeout, limit), idleTimeout: env.idleTimeout, tls: upstream.tls,
            connectTo: endpoint.connectTo, httpVersion: endpoint.httpVersion, bodyStream: bodyStream,
            replacingAlso: isGRPC ? tryTimeout(at: env.clock.now()) : nil)
        if upstream.speaksH2 { request.h2Counters = guardian.h2Counters }
        return env.startTry(request, handler: handler)
    }

    /// A gRPC try's own `grpc-timeout`: the time its call has left (the
    /// sooner of the route's deadline and the client's), so the upstream
    /// gives up no later than the proxy would (gRPC's deadline propagation).
    private func tryTimeout(at now: Instant) -> HTTPField? {
        GRPCTimeout.format(machine.remaining(at: now)).map { HTTPField(name: "grpc-timeout", value: $0) }
    }

    /// A try ended: what it is (`machine.classify`), counted (metrics,
    /// breaker, endpoint; or, an answer asking for a pause, pacing), then
    /// the machine decides.
    func tryEnded(_ reported: ExchangeStateMachine.TryEnd) {
        let verdict = machine.classify(
            reported, bodyFailure: bodyStream?.failure, headComplete: relay.headComplete, bytesToClient: relay.bytesOut)
        var end: ExchangeStateMachine.TryEnd
        switch verdict {
        case let .bodyBroke(tooLarge):
            // The try broke off because the client's body did: not the upstream's failure.
            return perform(machine.requestBodyFailed(tooLarge: tooLarge))
        case let .counted(counted, _):
            end = counted
        }
        if let bodyStream { machine.bodyReplayable = bodyStream.replayable }
        let now = env.clock.now()
        let outcome = machine.outcome(of: end)
        if trace != nil {
            var status: Int?
            if case let .answered(s, _, _) = end { status = s }
            trace?.tryEnded(lostHedge: false, outcome: outcome.metricLabel, status: status, at: now)
        }
        let breakerOpen: Bool
        var pacedAnswer = false
        if guardian.hasPacing, pacing(end, at: now) {
            // The upstream asked for a pause: its answer is pacing, not a
            // failure, so the breaker does not count it (metrics do). A retry
            // waits for the pause with the others (parked, woken when it
            // ends or a reload ends it), not on a Retry-After of its own.
            end = TryEndRules.withoutWait(end)
            pacedAnswer = true
            env.metrics.upstreamTry(upstream: upstream.name, outcome: outcome.metricLabel)
            if machine.probe { abandonProbe() }
            breakerOpen = false
        } else {
            breakerOpen = report(outcome, at: now)
        }
        if machine.state == .streaming, case let .failed(failure) = end {
            env.logger.warning(
                "upstream failed mid-response",
                metadata: ["request_id": "\(command.requestID)", "upstream": "\(upstream.name)", "error": "\(failure.message)"])
        }
        let random = Double(env.random() % 1_000_000) / 1_000_000
        // A retry after a pacing answer waits for the pause: the pause, not
        // the retry budget, bounds what reaches the upstream, so it spends
        // no budget (under load the budget would turn parked clients' retries into 429s).
        let action = machine.tryEnded(
            end, breakerOpen: breakerOpen, at: now, random: random, retrySpendsBudget: !pacedAnswer)
        // A hedge is still out: the request goes on with it.
        adoptNextHedge(at: now)
        perform(action)
    }
}
