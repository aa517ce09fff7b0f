import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import HappyPathStore
import Logging

/// One client request from arrival to answer: the driver of its
/// `ExchangeStateMachine`. The machine decides; this performs each action on
/// the real things it holds — the try in flight (a libcurl transfer), the
/// client's connection, a connection slot or a place in the queue, a place
/// in the parking lot, one timer — and feeds the results back as events.
/// Every way out releases what is held in one place (`releaseAll`).
final class Exchange: UpstreamResponseHandler, HTTPRequestObserver, LoopEventTarget {
    typealias ParkReason = ExchangeStateMachine.ParkReason

    /// The worker owns every exchange until `finished` (its `active`), and
    /// abandons those left at shutdown.
    let worker: ProxyWorker
    /// The client's connection, or a `DeliverySink` for a delivery round.
    let request: any ExchangeClient
    /// The stored request this round delivers (nil: a client waits on `request`).
    let delivery: ClaimedDelivery?
    let route: RuntimeRoute
    let upstream: RuntimeUpstream
    let guardian: UpstreamGuard
    /// The request as sent upstream; its `attempt` follows the machine's.
    private(set) var command: Command
    private var machine: ExchangeStateMachine
    private var relay = ResponseRelay()
    let startedAt: Instant

    // What this exchange holds, released by `releaseAll`.
    private var transfer: UpstreamTransfer?
    private var holdsSlot = false
    private var isQueued = false
    /// Where the worker's parking lot has it (nil: not parked).
    private(set) var parked: ParkReason?
    /// The machine's one timer (try limit, queue wait, backoff, park expiry).
    private var timer: LoopEvent?
    /// The client hung up: handled on the next loop pass, outside the connection's teardown.
    private var goneEvent: LoopEvent?

    /// The endpoint of the latest try (a retry prefers the next one).
    private var endpointIndex = -1
    /// The token the latest try carries.
    private var authToken: Token?
    private var tokens: TokenSource? { guardian.tokens }

    /// For the access log and metrics.
    /// Fields added to whatever answer the client gets (a rate-limited
    /// route's `RateLimit-Policy` and `RateLimit`); empty for most routes.
    var rateLimitFields: RateLimitFields?
    private(set) var finalStatus = 0
    private(set) var finalCode = "OK"
    /// The problem answered, if the request failed.
    private(set) var problem: Problem?
    /// The upstream's own status, when the problem answered is its answer.
    private(set) var upstreamAnswered: Int?
    var bytesOut: Int { relay.bytesOut }

    init(
        worker: ProxyWorker, request: any ExchangeClient, route: RuntimeRoute, upstream: RuntimeUpstream,
        guardian: UpstreamGuard, command: Command, delivery: ClaimedDelivery? = nil
    ) {
        self.worker = worker
        self.request = request
        self.delivery = delivery
        self.route = route
        self.upstream = upstream
        self.guardian = guardian
        self.command = command
        startedAt = worker.clock.now()
        machine = ExchangeStateMachine(
            .init(
                deadline: command.deadline, retry: route.retry, parkFor: route.parkFor,
                parkWhileOpen: upstream.whileOpen == .park, endpoints: upstream.endpoints.count, method: command.method,
                hasIdempotencyKey: command.headers.contains("idempotency-key"),
                refreshOn: Set(guardian.tokens?.refreshOn ?? [])))
    }

    var isFinished: Bool { machine.state == .finished }

    func start() {
        request.observer = self
        guardian.recordRequest(at: worker.clock.now())
        perform(machine.start())
    }

    // MARK: - Events from the worker

    /// The worker hands over a freed connection slot.
    func slotGranted() {
        guard isQueued else { return worker.releaseSlot(guardian: guardian) }
        isQueued = false
        holdsSlot = true
        timer?.disarm()
        perform(machine.slotGranted(at: worker.clock.now()))
    }

    /// The upstream recovered (the worker already took it out of the lot).
    func replay() {
        guard parked != nil else { return }
        parked = nil
        timer?.disarm()
        perform(machine.replay())
    }

    /// The token refresh this request waited for failed.
    func authFailed(_ reason: String) {
        guard parked == .auth else { return }
        perform(machine.tokenRefreshFailed(reason))
    }

    /// Drain ran out of time: answer now.
    func answerNow() { perform(machine.drain()) }

    /// The worker is shutting down: stop the try and drop the client, no answer.
    func abandon() {
        guard !isFinished else { return }
        _ = machine.clientGone()
        if let transfer { worker.client.cancel(transfer) }
        transfer = nil
        recycleTimers()
        request.abort()
    }

    // MARK: - Actions

    private func perform(_ action: ExchangeStateMachine.Action) {
        switch action {
        case .none:
            break
        case .admit:
            admit()
        case let .send(attempt, limit):
            send(attempt: attempt, limit: limit)
        case let .waitForSlot(limit):
            arm(after: limit)
        case let .backOff(delay):
            worker.metrics.retry(upstream: upstream.name)
            arm(after: delay)
        case let .park(reason, limit, probeAfter):
            if let probeAfter { worker.scheduleProbe(guardian: guardian, after: probeAfter) }
            // A connect failure: the next good health check replays, even if
            // the checker never saw the upstream down.
            if reason == .unreachable { guardian.suspect.store(true, ordering: .relaxed) }
            guard worker.park(self, reason: reason) else { return perform(machine.parkRefused()) }
            parked = reason
            arm(after: limit)
        case .cancelTry:
            if let transfer { worker.client.cancel(transfer) }
            transfer = nil
            releaseSlot()
            tryEnded(.failed(.init(.timeout, "timeout")))
        case .tokenRefused:
            guard let tokens, let authToken else { return admit() }
            switch tokens.refused(generation: authToken.generation) {
            case .retryWith:
                admit()
            case let .wait(start):
                if start { worker.startRefresh(guardian: guardian) }
                perform(machine.admitted(.park(.auth, probeAfter: nil), at: worker.clock.now()))
            }
        case .stream:
            timer?.disarm()
        case let .answer(failure, abandonProbe):
            if abandonProbe { self.abandonProbe() }
            if case let .upstreamAnswer(status) = failure { upstreamAnswered = status }
            releaseAll()
            var builder = ExchangeProblem(requestID: command.requestID, upstream: upstream.name, route: route)
            if let left = guardian.pausedFor(at: worker.clock.now()) { builder.pause = (guardian.pauseCause, left) }
            var problem = builder.build(
                failure, machine: machine, relay: relay, attempts: command.attempt, wallSeconds: worker.clock.wallSeconds())
            // The upstream's words may carry what the proxy sent it (an echoed
            // Authorization header, a token endpoint repeating its form): none
            // of its credentials leave in a problem. Only upstreams with
            // credentials pay for the search, and only here, on the error path.
            let scrubber = tokens?.scrubber(sent: authToken)
            if let scrubber { problem = problem.scrubbed(by: scrubber) }
            worker.logger.debug(
                "request failed",
                metadata: ["request_id": "\(problem.requestID)", "code": "\(problem.code)", "upstream": "\(upstream.name)"])
            finalStatus = problem.status
            finalCode = problem.code
            self.problem = problem
            if case let .upstreamAnswer(status) = failure, relay.status == status {
                if route.passesErrors, relay.heldBodyComplete {
                    // upstream_errors: pass: the upstream's own answer, whole.
                    finalStatus = status
                    relay.answered(bytes: passHeldAnswer())
                    return end()
                }
                // The body is replaced; the fields clients act on are kept.
                var kept = ErrorMapper.keptFields(
                    relay.heldEndToEndFields, status: status, proxyRetryAfter: problem.retryAfterSeconds != nil)
                // An upstream may echo a credential in a field as well as in its body.
                if let scrubber { kept = kept.map { HTTPField(name: $0.name, value: scrubber.scrub($0.value)) } }
                relay.answered(
                    bytes: ProblemResponder.respond(request, problem, extraHeaders: kept + (rateLimitFields?.fields ?? [])))
                return end()
            }
            relay.answered(bytes: ProblemResponder.respond(request, problem, extraHeaders: rateLimitFields?.fields ?? []))
            end()
        case let .finish(ending, abandonProbe):
            if abandonProbe { self.abandonProbe() }
            releaseAll()
            switch ending {
            case .completed:
                finalStatus = relay.status
                // An error streamed as it came (upstream_errors: pass) is
                // counted under the code its problem would have had.
                if relay.status >= 400 { finalCode = ErrorMapper.builtInCode(for: relay.status).rawValue }
                request.endReply()
            case .truncated, .drained:
                // Part of the response is already with the client: the only
                // honest signal left is a broken connection.
                finalStatus = relay.status
                finalCode = "TRUNCATED"
                request.abort()
            case .clientClosed:
                finalStatus = 499  // nginx's "client closed request"
                finalCode = "CLIENT_CLOSED"
                request.abort()
            }
            end()
        }
    }

    /// Deadline → pause → reachability → credentials → breaker → slot, as one decision.
    private func admit() {
        var gates = Gates(exchange: self, now: worker.clock.now())
        let verdict = Admission.decide(
            remaining: machine.remaining(at: gates.now), parkWhileOpen: machine.settings.parkWhileOpen, gates: &gates)
        perform(machine.admitted(verdict, at: gates.now))
    }

    private struct Gates: Admission.Gates {
        let exchange: Exchange
        let now: Instant

        func pause() -> Admission.Pause {
            // One atomic load while not paused (none without pacing).
            guard exchange.guardian.pausedFor(at: now) != nil else { return .none }
            return exchange.guardian.pacing?.whilePaused == .fail ? .fail : .wait
        }

        func isReachable() -> Bool { exchange.guardian.reachable.load(ordering: .relaxed) }

        func hasCredentials() -> Bool {
            guard let tokens = exchange.tokens else { return true }
            switch tokens.use(at: now) {
            case let .use(token):
                exchange.authToken = token
                return true
            case let .useAndRefresh(token):
                exchange.authToken = token
                exchange.worker.startRefresh(guardian: exchange.guardian)
                return true
            case let .wait(start):
                if start { exchange.worker.startRefresh(guardian: exchange.guardian) }
                return false
            }
        }

        func breaker() -> CircuitBreakerStateMachine.Admission { exchange.guardian.admit(at: now) }

        func slot() -> Admission.Slot {
            switch exchange.worker.acquireSlot(exchange, guardian: exchange.guardian) {
            case .acquired:
                exchange.holdsSlot = true
                return .acquired
            case .queued:
                exchange.isQueued = true
                return .queued
            case .full:
                return .full
            }
        }

        func abandonProbe() { exchange.abandonProbe() }
    }

    private func send(attempt: Int, limit: Duration) {
        while command.attempt < attempt { command = command.nextAttempt() }
        relay.reset()
        relay.holdLimit = route.passesErrors ? ResponseRelay.passHoldLimit : ErrorMapper.maxBody
        arm(after: limit)
        // A retry prefers another endpoint than the one that just failed;
        // ejected endpoints are skipped.
        let count = upstream.endpoints.count
        let preferred = endpointIndex < 0 ? worker.nextEndpointIndex(for: guardian, count: count) : (endpointIndex + 1) % count
        endpointIndex = count > 1 ? guardian.pickEndpoint(preferred: preferred, at: worker.clock.now()) : preferred
        let endpoint = upstream.endpoints[endpointIndex]
        let method = command.method
        let sendsBody = command.body.count > 0 || method == "POST" || method == "PUT" || method == "PATCH"
        var credentials: HTTPField?
        // The one place a credential is revealed: the header injected into the try.
        if let authToken, let tokens { credentials = HTTPField(name: tokens.header, value: authToken.credential.reveal) }
        transfer = worker.client.start(
            UpstreamRequest(
                origin: endpoint.origin, target: endpoint.basePath + command.target, method: method,
                headers: command.headers, replacing: credentials, body: command.body, sendsBody: sendsBody,
                connectTimeout: min(upstream.connectTimeout, limit), idleTimeout: worker.idleTimeout),
            handler: self)
    }

    /// A try ended: count it (metrics, breaker, endpoint), then let the machine decide.
    private func tryEnded(_ end: ExchangeStateMachine.TryEnd) {
        let now = worker.clock.now()
        var end = end
        if relay.headComplete, case let .failed(failure) = end, relay.bytesOut == 0,
            machine.state == .streaming || failure.kind != .timeout
        {
            // The head arrived whole, then the answer broke off (a close, a
            // bad chunk) before any byte reached the client: a response that
            // is not valid HTTP, retried or answered 502 BAD_GATEWAY. A
            // streamed head was staged, never written (it leaves with the
            // first body bytes), so the client has nothing yet either.
            if machine.state == .streaming { machine.streamFailedBeforeFirstByte() }
            end = .failed(.init(.invalidResponse, "the response broke off after its head (\(failure.message))"))
        }
        let outcome = machine.outcome(of: end)
        let breakerOpen: Bool
        var pacedAnswer = false
        if guardian.hasPacing, case let .answered(status, retryAfter, withToken) = end,
            paced(status, retryAfter, at: now)
        {
            // The upstream asked for a pause: its answer is pacing, not a
            // failure, so the breaker does not count it (metrics do). A retry
            // waits for the pause with the others (parked, woken when it
            // ends or a reload ends it), not on a Retry-After of its own.
            end = .answered(status: status, retryAfter: nil, withToken: withToken)
            pacedAnswer = true
            worker.metrics.upstreamTry(upstream: upstream.name, outcome: outcome.metricLabel)
            if machine.probe { abandonProbe() }
            breakerOpen = false
        } else {
            breakerOpen = report(outcome, at: now)
        }
        if machine.state == .streaming, case let .failed(failure) = end {
            worker.logger.warning(
                "upstream failed mid-response",
                metadata: ["request_id": "\(command.requestID)", "upstream": "\(upstream.name)", "error": "\(failure.message)"])
        }
        let random = Double(worker.ids.next() % 1_000_000) / 1_000_000
        // A retry after a pacing answer waits for the pause: the pause, not
        // the retry budget, bounds what reaches the upstream, so it spends
        // no budget (under load the budget would turn parked clients' retries into 429s).
        perform(machine.tryEnded(end, breakerOpen: breakerOpen, at: now, random: random) { pacedAnswer || guardian.withdrawRetry(at: now) })
    }

    /// A status in `pacing.on` with a wait (Retry-After, or an exhausted
    /// RateLimit field) pauses the whole upstream; every worker hears of a
    /// new pause. Returns whether this answer is pacing.
    private func paced(_ status: Int, _ retryAfter: Duration?, at now: Instant) -> Bool {
        guard guardian.pacing?.on.contains(status) == true else { return false }
        let wait =
            retryAfter
            ?? PacingSignal.wait(retryAfter: nil, rateLimit: relay.rateLimit, nowUnixSeconds: worker.clock.wallSeconds())
        guard wait != nil else { return false }
        if case let .paused(until) = guardian.paced(status: status, wait: wait, at: now) {
            worker.shared.paused(guardian, until: until)
        }
        return true
    }

    /// One try's result to everything that counts it: metrics, the breaker,
    /// the endpoint's ejection count. A probe's result also decides what the
    /// lot does next: replay everything (closed) or probe again later (open).
    /// Returns whether the breaker is open after it.
    private func report(_ outcome: Outcome, at now: Instant) -> Bool {
        worker.metrics.upstreamTry(upstream: upstream.name, outcome: outcome.metricLabel)
        let (transition, state) = guardian.record(outcome, probe: machine.probe, at: now)
        guardian.recordEndpoint(endpointIndex, failure: outcome.isFailure, at: now)
        if transition != nil || machine.probe {
            switch state {
            case .closed: worker.shared.recovered(guardian)
            case let .open(until) where upstream.whileOpen == .park:
                worker.scheduleProbe(guardian: guardian, after: until - now)
            default: break
            }
        }
        if case .open = state { return true }
        return false
    }

    /// A probe admitted by the breaker will not be sent: free its place and
    /// let the lot send another.
    private func abandonProbe() {
        guardian.probeAbandoned()
        if upstream.whileOpen == .park { worker.scheduleProbe(guardian: guardian, after: .zero) }
    }

    // MARK: - UpstreamResponseHandler

    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        // Held: what the exchange must look at before the client sees it.
        // With upstream_errors: pass, only what the retry rules or a token
        // refresh could act on; any other error streams as it comes.
        let retried = route.retry.configuration.statuses.contains(status)
        let hold =
            route.passesErrors
            ? retried || (tokens != nil && machine.settings.refreshOn.contains(status))
                || (guardian.hasPacing && guardian.pacing?.on.contains(status) == true)
            : status >= 400 || retried
        relay.begin(status: status, reason: reason, hold: hold, to: request)
    }

    /// An upstream's 103 Early Hints (or another 1xx) goes to the client
    /// at once, as RFC 9110 section 15.2 asks of a proxy: before any final
    /// answer has started, and only to an HTTP/1.1 client.
    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {
        guard !isFinished, relay.mode == .waiting else { return }
        request.sendInformational(status: status, fields: fields)
    }

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if route.rewritesRedirects, RedirectRewriter.applies(to: name), let rewritten = redirect(name: name, value: value) {
            var rewritten = rewritten
            return rewritten.withUTF8 { relay.header(name: name, value: UnsafeRawBufferPointer($0), to: request) }
        }
        relay.header(name: name, value: value, to: request)
    }

    /// Sends the held answer as the upstream gave it (status, reason,
    /// end-to-end fields, body) plus the proxy's own two fields. Returns the
    /// body's size.
    private func passHeldAnswer() -> Int {
        request.clearResponseHeaders()
        for field in relay.heldEndToEndFields { request.addResponseHeader(field.name, field.value) }
        request.addResponseHeader("X-Request-Id", command.requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(command.attempt))
        rateLimitFields?.stage(on: request)
        request.startReply(status: relay.status, contentLength: relay.heldBody.count, reason: relay.reason)
        if !relay.heldBody.isEmpty { relay.heldBody.withUnsafeBytes { request.send($0, notifyWhenDrained: false) } }
        request.endReply()
        return relay.heldBody.count
    }

    /// A redirect to the endpoint this try went to, as a path on the proxy
    /// (`redirects: rewrite`, the default).
    private func redirect(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> String? {
        guard endpointIndex >= 0 else { return nil }
        let endpoint = upstream.endpoints[endpointIndex]
        let rewriter = RedirectRewriter(
            endpointOrigin: endpoint.origin, basePath: endpoint.basePath, stripPrefix: route.stripPrefix)
        return rewriter.rewrite(String(decoding: value, as: UTF8.self), isRefresh: name.count == 7)
    }

    func upstreamHeadersComplete() -> String? {
        switch relay.headComplete(to: request, requestID: command.requestID, attempt: command.attempt, extra: rateLimitFields) {
        case let .refused(reason):
            return reason  // a failed try: BAD_GATEWAY once the retry rules give up
        case .held:
            return nil
        case .streamed:
            perform(machine.streamingStarted(status: relay.status))
            return nil
        }
    }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !isFinished else { return true }
        return relay.body(bytes, to: request)
    }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        transfer = nil
        releaseSlot()
        guard !isFinished else { return }
        let end: ExchangeStateMachine.TryEnd
        switch failure {
        case nil where !relay.headComplete:
            end = .failed(.init(.reset, "the connection closed inside the response head"))
        case nil:
            let retryAfter = relay.retryAfter.flatMap { RetryAfter.parse($0, nowUnixSeconds: worker.clock.wallSeconds()) }
            end = .answered(status: relay.status, retryAfter: retryAfter, withToken: authToken != nil && tokens != nil)
        case let .connectFailed(message)?: end = .failed(.init(.unreachable, message))
        case .timeout?: end = .failed(.init(.timeout, "timeout"))
        case let .reset(message)?, let .other(message)?: end = .failed(.init(.reset, message))
        case let .badResponse(message)?: end = .failed(.init(.invalidResponse, message))
        }
        tryEnded(end)
    }

    // MARK: - Timers

    private func arm(after delay: Duration) {
        let event = timer ?? worker.loop.takeEvent(target: self)
        timer = event
        event.arm(after: delay)
    }

    func loopEventFired(_ event: LoopEvent) {
        if event === goneEvent {
            return perform(machine.clientGone())
        }
        perform(machine.timerFired(at: worker.clock.now()))
    }

    // MARK: - HTTPRequestObserver

    func requestClientClosed(_ request: HTTPRequest) {
        // Inside the connection's teardown: finish on the next pass.
        guard !isFinished, goneEvent == nil else { return }
        let event = worker.loop.takeEvent(target: self)
        goneEvent = event
        event.arm(after: .zero)
    }

    func requestOutputDrained(_ request: HTTPRequest) {
        relay.drained()
        transfer?.resume()
    }

    // MARK: - Releasing

    private func releaseSlot() {
        if holdsSlot {
            holdsSlot = false
            worker.releaseSlot(guardian: guardian)
        }
        if isQueued {
            isQueued = false
            worker.leaveQueue(self, guardian: guardian)
        }
    }

    /// Everything this exchange holds, let go: the try, the slot or queue
    /// place, the parking place, the timer.
    private func releaseAll() {
        if let transfer { worker.client.cancel(transfer) }
        transfer = nil
        releaseSlot()
        if parked != nil {
            worker.unpark(self)
            parked = nil
        }
        timer?.disarm()
    }

    private func recycleTimers() {
        timer?.recycle()
        timer = nil
        goneEvent?.recycle()
        goneEvent = nil
    }

    private func end() {
        recycleTimers()
        worker.finished(self)
    }
}

extension UpstreamFailure {
    var message: String {
        switch self {
        case let .connectFailed(m), let .reset(m), let .badResponse(m), let .other(m): m
        case .timeout: "timeout"
        }
    }
}
