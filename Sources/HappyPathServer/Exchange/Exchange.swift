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
final class Exchange: UpstreamUpgradeHandler, HTTPRequestObserver, LoopEventTarget {
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
    /// An upgrade request (the route's `upgrades`): its tries are
    /// `UpstreamUpgrade`s, not libcurl transfers (docs/websocket.md).
    let upgrade: UpgradeRequest?
    private var upgradeTry: UpstreamUpgrade?
    /// The fields of an upstream's `101`, while its head is read.
    private var switching: [HTTPField]?
    /// One of them was not a valid field: the `101` is refused when its head completes.
    private var switchingHasInvalidField = false
    /// The `101` went to the client: the exchange ended in a tunnel.
    private(set) var switched = false
    private var holdsSlot = false
    private var isQueued = false
    /// Where the worker's parking lot has it (nil: not parked).
    private(set) var parked: ParkReason?
    /// The machine's one timer (try limit, queue wait, backoff, park expiry).
    private var timer: LoopEvent?
    /// The client hung up: handled on the next loop pass, outside the connection's teardown.
    private var goneEvent: LoopEvent?

    // Hedging (only routes with `hedge:`; nothing is allocated for others).
    /// Tries in flight beside `transfer`, none of them heard from yet.
    private var hedges: [HedgeTry] = []
    /// Tries that lost, detached inside a libcurl callback (where libcurl
    /// refuses to remove a transfer): cancelled, their slots freed and their
    /// failures counted on the next loop pass (`reap`).
    private var losers: [Loser] = []
    /// When the next hedge is due (nil: none). The machine's one timer is
    /// armed for it or the try's limit, whichever comes first: a hedge
    /// that is never due costs no timer of its own.
    private var hedgeDueAt: Instant?
    /// The try in flight's limit (per_try_timeout or the deadline).
    private var tryLimitAt = Instant(nanoseconds: 0)
    private var reapEvent: LoopEvent?
    /// When the try in flight went out (routes with `hedge` only).
    private var tryStartedAt = Instant(nanoseconds: 0)
    /// The endpoint of the latest try or hedge sent (a hedge prefers the next one).
    private var lastEndpoint = -1

    private struct Loser {
        var transfer: UpstreamTransfer
        var holdsSlot: Bool
        var endpointIndex: Int
        /// Its failure, for the breaker and metrics (nil: it was only cancelled).
        var outcome: Outcome?
    }

    /// The endpoint of the latest try (a retry prefers the next one).
    private var endpointIndex = -1
    /// The token the latest try carries.
    private var authToken: Token?
    private var tokens: TokenSource? { guardian.tokens }

    /// For the access log and metrics.
    /// Fields added to whatever answer the client gets (a rate-limited
    /// route's `RateLimit-Policy` and `RateLimit`); empty for most routes.
    var rateLimitFields: RateLimitFields?
    /// Whom the upstream's 429 is about (`pacing.scope_429: client`): the
    /// route's rate-limit key, else the client's address; set by the worker
    /// before `start`. A 429 to this request pauses only requests with the
    /// same key.
    var pacingKey = ""
    private(set) var finalStatus = 0
    private(set) var finalCode = "OK"
    /// The problem answered, if the request failed.
    private(set) var problem: Problem?
    /// The upstream's own status, when the problem answered is its answer.
    private(set) var upstreamAnswered: Int?
    var bytesOut: Int { relay.bytesOut }

    init(
        worker: ProxyWorker, request: any ExchangeClient, route: RuntimeRoute, upstream: RuntimeUpstream,
        guardian: UpstreamGuard, command: Command, delivery: ClaimedDelivery? = nil, upgrade: UpgradeRequest? = nil,
        trace: RequestTrace? = nil
    ) {
        self.trace = trace
        self.upgrade = upgrade
        self.worker = worker
        self.request = request
        self.delivery = delivery
        self.route = route
        self.upstream = upstream
        self.guardian = guardian
        self.command = command
        startedAt = worker.clock.now()
        relay.clock = worker.clock
        relay.retryAfterCap = route.retry.configuration.maxRetryAfter
        machine = ExchangeStateMachine(
            .init(
                deadline: command.deadline, retry: route.retry, parkFor: route.parkFor,
                parkWhileOpen: upstream.whileOpen == .park, endpoints: upstream.endpoints.count, method: command.method,
                hasIdempotencyKey: IdempotencyKey.isPresent(in: command.headers),
                refreshOn: Set(guardian.tokens?.refreshOn ?? []), hedgeMaxExtra: upgrade == nil ? route.hedge?.maxExtra ?? 0 : 0))
        if route.fallback?.serveStale != nil, command.method == "GET", delivery == nil, upgrade == nil,
            let store = worker.shared.stale
        {
            relay.kept = ResponseRelay.KeptAnswer(limit: store.maxEntryBytes)
        }
    }

    var isFinished: Bool { machine.state == .finished }

    /// A traced request's spans so far (nil: not traced, the usual case).
    private(set) var trace: RequestTrace?

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
        if trace != nil { trace?.parkedChanged(false, at: worker.clock.now()) }
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
        upgradeTry?.close()
        upgradeTry = nil
        for hedge in hedges { worker.client.cancel(hedge.transfer) }
        hedges.removeAll()
        for loser in losers { worker.client.cancel(loser.transfer) }
        losers.removeAll()
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
            if reason == .paused { worker.parkedForPause(self) }
            if trace != nil { trace?.parkedChanged(true, at: worker.clock.now()) }
            arm(after: limit)
        case .cancelTry:
            if let transfer { worker.client.cancel(transfer) }
            transfer = nil
            upgradeTry?.close()
            upgradeTry = nil
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
            if let fallback = route.fallback, let reason = failure.fallbackReason, fallback.on.contains(reason),
                answerFallback(fallback, reason)
            {
                return end()
            }
            var builder = ExchangeProblem(requestID: command.requestID, upstream: upstream.name, route: route)
            builder.pause = guardian.pauseHolding(client: pacingKey, at: worker.clock.now())
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
                    // upstream_errors: pass: the upstream's own answer, whole
                    // (a 404 or 410 is kept for serve_stale like any answer).
                    finalStatus = status
                    relay.answered(bytes: passHeldAnswer())
                    if relay.kept != nil { keepAnswer(fields: relay.heldEndToEndFields, body: relay.heldBody) }
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
                finalStatus = switched ? 101 : relay.status
                if let kept = relay.kept, !kept.overflow { keepAnswer(fields: relay.endToEnd(kept.fields), body: kept.body) }
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
            // Two atomic loads while nothing is paused (none without pacing).
            guard exchange.guardian.pausedFor(client: exchange.pacingKey, at: now) != nil else { return .none }
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
            case .granted:
                exchange.holdsSlot = true
                return .acquired
            case .queued:
                exchange.isQueued = true
                return .queued
            case .overloaded:
                return .full
            }
        }

        func abandonProbe() { exchange.abandonProbe() }
    }

    private func send(attempt: Int, limit: Duration) {
        while command.attempt < attempt { command = command.nextAttempt() }
        relay.reset()
        relay.holdLimit = route.passesErrors ? ResponseRelay.passHoldLimit : ErrorMapper.maxBody
        if route.hedge != nil, upgrade == nil {
            let now = worker.clock.now()
            tryStartedAt = now
            tryLimitAt = now + limit
            hedgeDueAt = machine.mayHedge ? route.hedgeDue(sentAt: now) : nil
            armTryTimer(at: now)
        } else {
            arm(after: limit)
        }
        // A retry prefers another endpoint than the one that just failed;
        // ejected endpoints are skipped.
        let count = upstream.endpoints.count
        let preferred = endpointIndex < 0 ? worker.nextEndpointIndex(for: guardian, count: count) : (endpointIndex + 1) % count
        endpointIndex = count > 1 ? guardian.pickEndpoint(preferred: preferred, at: worker.clock.now()) : preferred
        if let upgrade {
            upgradeTry = startUpgrade(upgrade, endpoint: endpointIndex, limit: limit)
        } else {
            transfer = start(endpoint: endpointIndex, limit: limit, token: authToken, handler: self)
        }
        lastEndpoint = endpointIndex
    }

    private func start(endpoint index: Int, limit: Duration, token: Token?, handler: UpstreamResponseHandler)
        -> UpstreamTransfer
    {
        let endpoint = upstream.endpoints[index]
        let method = command.method
        let sendsBody = command.body.count > 0 || method == "POST" || method == "PUT" || method == "PATCH"
        var credentials: HTTPField?
        // The one place a credential is revealed: the header injected into the try.
        if let token, let tokens { credentials = HTTPField(name: tokens.header, value: token.credential.reveal) }
        if trace != nil {
            trace?.tryStarted(
                spanID: Tracer.nonZero(worker.ids.next()), endpoint: endpoint.origin, attempt: command.attempt,
                hedge: handler !== self, at: worker.clock.now())
        }
        return worker.client.start(
            UpstreamRequest(
                origin: endpoint.origin, target: endpoint.basePath + command.target, method: method,
                headers: command.headers, replacing: credentials, body: command.body, sendsBody: sendsBody,
                connectTimeout: min(upstream.connectTimeout, limit), idleTimeout: worker.idleTimeout, tls: upstream.tls,
                connectTo: endpoint.connectTo),
            handler: handler)
    }

    /// An upgrade try: its own connection, the head written by the proxy.
    private func startUpgrade(_ upgrade: UpgradeRequest, endpoint index: Int, limit: Duration) -> UpstreamUpgrade {
        let endpoint = upstream.endpoints[index]
        var credentials: HTTPField?
        if let token = authToken, let tokens { credentials = HTTPField(name: tokens.header, value: token.credential.reveal) }
        let head = upgrade.head(
            target: endpoint.basePath + command.target, origin: endpoint.origin, fields: command.headers.fields,
            replacing: credentials)
        let attempt = UpstreamUpgrade(
            loop: worker.loop,
            request: UpstreamUpgradeRequest(
                origin: endpoint.origin, head: head, connectTimeout: min(upstream.connectTimeout, limit),
                idleTimeout: worker.idleTimeout, tls: upstream.tls, connectTo: endpoint.connectTo),
            handler: self)
        attempt.start()
        return attempt
    }

    /// The upstream switched: the `101` goes to the client, whose
    /// connection becomes a tunnel to the upgrade's; the exchange ends as
    /// a success.
    func upstreamSwitched(_ connection: UpstreamUpgrade) {
        upgradeTry = nil
        // The tunnel keeps the try's upstream connection open, so it keeps
        // the try's slot of the upstream's max_connections until it closes.
        let slot = holdsSlot ? guardian : nil
        holdsSlot = false
        releaseSlot()
        let fields = upgrade?.answerFields(switching ?? [], requestID: command.requestID) ?? []
        switching = nil
        let clock = worker.clock
        // Counted open before the 101 leaves: a client that has its 101 and
        // reads /metrics at once finds its tunnel counted.
        worker.shared.tunnels.add(1)
        guard !isFinished, let client = request as? HTTPRequest,
            let tunnel = client.switchProtocols(
                fields: fields, to: connection, limits: .init(idle: route.upgradesIdleTimeout), now: { clock.now() })
        else {
            worker.shared.tunnels.add(-1)
            if let slot { worker.releaseSlot(guardian: slot) }
            // The client left as the upstream agreed: the upstream did its part.
            connection.close()
            return perform(machine.clientGone())
        }
        switched = true
        worker.tunnelOpened(tunnel, route: route, upstream: upstream, slotOf: slot)
        perform(machine.streamingStarted(status: 101))
        tryEnded(.answered(status: 101, retryAfter: nil, withToken: authToken != nil && tokens != nil))
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
        if trace != nil {
            var status: Int?
            if case let .answered(s, _, _) = end { status = s }
            trace?.tryEnded(lostHedge: false, outcome: outcome.metricLabel, status: status, at: now)
        }
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
        let action = machine.tryEnded(end, breakerOpen: breakerOpen, at: now, random: random) {
            pacedAnswer || withdrawRetry(at: now)
        }
        // A hedge is still out: the request goes on with it.
        if machine.state == .trying, !hedges.isEmpty {
            if machine.mayHedge { hedgeDueAt = route.hedgeDue(sentAt: now) }
            adoptHedge(hedges.removeFirst(), at: now)
        }
        perform(action)
    }

    /// A status in `pacing.on` with a wait (Retry-After, or an exhausted
    /// RateLimit field) pauses the whole upstream (every worker hears of a
    /// new pause), or, a 429 under `scope_429: client`, this request's
    /// client key (its requests find it as they are admitted). Returns
    /// whether this answer is pacing.
    private func paced(_ status: Int, _ retryAfter: Duration?, at now: Instant) -> Bool {
        guard guardian.pacing?.on.contains(status) == true else { return false }
        let wait =
            retryAfter
            ?? PacingSignal.wait(retryAfter: nil, rateLimit: relay.rateLimit, nowUnixSeconds: worker.clock.wallSeconds())
        guard wait != nil else { return false }
        // `startedAt`: an answer to a request older than a reload that ended
        // the pause early is stale, and revives nothing.
        if case let .paused(until, nil) = guardian.paced(
            status: status, wait: wait, client: pacingKey, sentAt: startedAt, at: now)
        {
            worker.shared.paused(guardian, until: until)
        }
        return true
    }

    /// One try's result to everything that counts it: metrics, the breaker,
    /// the endpoint's ejection count. A probe's result also decides what the
    /// lot does next: replay everything (closed) or probe again later (open).
    /// Returns whether the breaker is open after it.
    private func report(_ outcome: Outcome, endpoint: Int? = nil, at now: Instant) -> Bool {
        worker.metrics.upstreamTry(upstream: upstream.name, outcome: outcome.metricLabel)
        let (transition, state) = guardian.record(outcome, probe: machine.probe, at: now)
        guardian.recordEndpoint(endpoint ?? endpointIndex, failure: outcome.isFailure, at: now)
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
        if status == 101, upgrade != nil {
            switchingHasInvalidField = false
            return switching = []
        }
        if route.hedge != nil { headArrived(status: status) }
        relayStatus(status, reason: reason)
    }

    private func relayStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        // Held: what the exchange must look at before the client sees it.
        // With upstream_errors: pass, only what the retry rules or a token
        // refresh could act on; any other error streams as it comes.
        let hold = route.passesErrors ? failsTry(status) : status >= 400 || route.retry.configuration.statuses.contains(status)
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
        if switching != nil {
            guard name.allSatisfy({ HTTPBytes.isToken($0) }), value.allSatisfy({ HTTPBytes.isFieldValue($0) }) else {
                return switchingHasInvalidField = true
            }
            switching?.append(
                HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
            return
        }
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
        relay.heldBody.withUnsafeBytes {
            answerWhole(status: relay.status, reason: relay.reason, fields: relay.heldEndToEndFields, body: $0)
        }
        return relay.heldBody.count
    }

    /// An answer written whole, not relayed: `fields`, the proxy's own two
    /// and the route's `RateLimit` fields, then `body`.
    private func answerWhole(status: Int, reason: [UInt8]?, fields: [HTTPField], body: UnsafeRawBufferPointer) {
        request.clearResponseHeaders()
        for field in fields { request.addResponseHeader(field.name, field.value) }
        request.addResponseHeader("X-Request-Id", command.requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(command.attempt))
        rateLimitFields?.stage(on: request)
        request.startReply(status: status, contentLength: body.count, reason: reason)
        if !body.isEmpty { request.send(body, notifyWhenDrained: false) }
        request.endReply()
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
        if let switching, let upgrade {
            if switchingHasInvalidField { return "the upstream's 101 carries an invalid field" }
            return upgrade.refusal(of: switching)
        }
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
        upgradeTry = nil
        switching = nil
        releaseSlot()
        guard !isFinished else { return }
        guard let failure else {
            guard relay.headComplete else { return tryEnded(.failed(.init(.reset, Self.closedInHead))) }
            let retryAfter = relay.retryAfterSeconds.map { Duration.seconds($0) }
            return tryEnded(.answered(status: relay.status, retryAfter: retryAfter, withToken: authToken != nil && tokens != nil))
        }
        tryEnded(.failed(failure.tryFailure))
    }

    private static let closedInHead = "the connection closed inside the response head"

    // MARK: - Fallback

    /// Where a GET's answer is kept and looked for (`StaleKey`): the
    /// upstream, the target as sent (after strip_prefix), the client-facing
    /// scheme and authority with the forwarding fields the client sent,
    /// and a hash of its credentials; the answer's `Vary` fields tell apart
    /// the variants under a key. HEAD is answered from the GET's.
    private func staleKeys(_ staleKey: StaleKey, salt: [UInt8]) -> StaleKey.Keys {
        var reader = staleKey.reader(salt: salt)
        var scheme = "http"
        if let request = request as? HTTPRequest {
            request.forEachRawHeader { reader.field(name: $0, value: $1) }
            if request.arrivedOverTLS { scheme = "https" }
        }
        return reader.keys(upstream: upstream.name, target: command.target, scheme: scheme)
    }

    /// A held answer passed through whole (`upstream_errors: pass`): kept
    /// as a streamed one is.
    private func keepAnswer(fields: [HTTPField], body: [UInt8]) { keepAnswer(fields: KeptFields(fields), body: body) }

    /// The answer streamed whole to the client: kept for later, if the
    /// rules allow (a status worth keeping, no `no-store`, `private` or
    /// `Set-Cookie`), for everyone or only for the same credentials.
    private func keepAnswer(fields: KeptFields, body: [UInt8]) {
        guard let store = worker.shared.stale, let serveStale = route.fallback?.serveStale, let staleKey = route.staleKey
        else { return }
        let keys = staleKeys(staleKey, salt: store.salt)
        guard
            let decision = StaleRules.decide(
                method: command.method, status: relay.status, fields: fields, requestHasCredentials: keys.credentials != nil,
                serveStale: serveStale)
        else { return }
        let now = worker.clock.now()
        let entry = StaleEntry(
            status: relay.status, reason: relay.reason, fields: fields, body: body, receivedAt: now,
            expiresAt: now + decision.keepFor, varyNames: decision.varyNames,
            varyValues: decision.varyNames.map { staleKey.varyValue(name: $0, value: request.header($0), salt: store.salt) },
            path: clientPath)
        store.keep(entry, key: keys.keep(shared: decision.shared))
    }

    /// The path the client asked for (for purges by prefix).
    private var clientPath: String {
        guard let request = request as? HTTPRequest else { return "" }
        return Router.split(target: request.target).path
    }

    /// The kept answer, else the fixed one; false: neither (the problem is answered).
    private func answerFallback(_ fallback: FallbackConfiguration, _ reason: FallbackConfiguration.Reason) -> Bool {
        let method = command.method
        if fallback.serveStale != nil, method == "GET" || method == "HEAD", let store = worker.shared.stale,
            let staleKey = route.staleKey
        {
            let now = worker.clock.now()
            let keys = staleKeys(staleKey, salt: store.salt)
            let found = store.lookup(keys: keys.lookup, at: now) {
                staleKey.varyValue(name: $0, value: request.header($0), salt: store.salt)
            }
            if let entry = found {
                worker.metrics.fallback(route: route, kind: "stale", reason: reason.rawValue)
                // Both terms are at most OutsideValues.maxSeconds (the time kept is
                // under serve_stale), so the sum cannot overflow; it is clamped again.
                var age = min(OutsideValues.maxSeconds, max(0, (now - entry.receivedAt).components.seconds))
                var fields = entry.fields.filter { field in
                    // The upstream's own Age is added to the time kept here (RFC 9111
                    // section 4.2.3); a malformed one counts as absent.
                    guard field.name.lowercased() == "age" else { return true }
                    age = min(OutsideValues.maxSeconds, age + (OutsideValues.deltaSeconds(field.value) ?? 0))
                    return false
                }
                fields.append(HTTPField(name: "Age", value: String(age)))
                fields.append(HTTPField(name: "X-Happypath-Fallback", value: "stale; reason=" + reason.rawValue))
                entry.body.withUnsafeBytes { answerWhole(status: entry.status, reason: entry.reason, fields: fields, body: $0) }
                finalStatus = entry.status
                finalCode = "STALE"
                relay.answered(bytes: entry.body.count)
                return true
            }
        }
        guard let fixed = fallback.response else { return false }
        worker.metrics.fallback(route: route, kind: "fixed", reason: reason.rawValue)
        let fields = [
            HTTPField(name: "Content-Type", value: fixed.contentType),
            HTTPField(name: "X-Happypath-Fallback", value: "fixed; reason=" + reason.rawValue),
        ]
        var body = fixed.body
        let count = body.utf8.count
        body.withUTF8 { answerWhole(status: fixed.status, reason: nil, fields: fields, body: UnsafeRawBufferPointer($0)) }
        finalStatus = fixed.status
        finalCode = "FALLBACK"
        relay.answered(bytes: count)
        return true
    }

    // MARK: - Hedging

    /// The one timer, while a try is in flight on a route with `hedge`: at
    /// the next hedge if one is due before the try's limit, else at the limit.
    private func armTryTimer(at now: Instant) {
        let at = hedgeDueAt.map { min($0, tryLimitAt) } ?? tryLimitAt
        let event = timer ?? worker.loop.takeEvent(target: self)
        timer = event
        event.arm(afterNanoseconds: at.nanoseconds - now.nanoseconds)
    }

    /// The one timer fired while trying: a hedge may be due; the try's limit
    /// may not be reached yet (the head came before the hedge was due, or a
    /// hedge was sent): then the timer is armed again and the machine hears
    /// nothing. Returns whether the machine should hear of it.
    private func tryTimerFired(_ hedge: HedgeConfiguration, at now: Instant) -> Bool {
        if let due = hedgeDueAt, now >= due {
            hedgeDueAt = nil
            hedgeDue(hedge, at: now)
        }
        guard now < tryLimitAt else { return true }
        armTryTimer(at: now)
        return false
    }

    /// A hedge is due with the try still unanswered: send another beside
    /// it if the attempts, the upstream and the budget allow.
    private func hedgeDue(_ hedge: HedgeConfiguration, at now: Instant) {
        var slot = false
        let decision = machine.hedgeDue(
            at: now,
            admit: {
                slot = admitHedge(at: now)
                return slot
            }, budget: { withdrawHedge(at: now) })
        guard case let .send(attempt, limit) = decision else {
            if slot { worker.releaseSlot(guardian: guardian) }
            if case .skip = decision { worker.metrics.hedge(route: route, outcome: "skipped") }
            return
        }
        while command.attempt < attempt { command = command.nextAttempt() }
        let count = upstream.endpoints.count
        let index = count > 1 ? guardian.pickEndpoint(preferred: (lastEndpoint + 1) % count, at: now) : 0
        lastEndpoint = index
        let try_ = HedgeTry(exchange: self, endpointIndex: index, token: authToken, startedAt: now, limitAt: now + limit)
        try_.transfer = start(endpoint: index, limit: limit, token: authToken, handler: try_)
        hedges.append(try_)
        if machine.mayHedge { hedgeDueAt = route.hedgeDue(sentAt: now) }
    }

    /// A retry from the upstream's budget; a refusal is counted
    /// (`happypath_retry_budget_exhausted_total`).
    private func withdrawRetry(at now: Instant) -> Bool {
        if guardian.withdrawRetry(at: now) { return true }
        worker.metrics.retryBudgetExhausted(upstream: upstream.name)
        return false
    }

    /// A hedge from the upstream's budget (its ratio only, no floor). A
    /// refusal counts as the budget exhausted only if a retry would be
    /// refused too: a quiet route's hedges waiting for traffic are only
    /// `skipped`, not a sign of a failing upstream (the alert on
    /// `happypath_retry_budget_exhausted_total`).
    private func withdrawHedge(at now: Instant) -> Bool {
        if guardian.withdrawHedge(at: now) { return true }
        if !guardian.retryAvailable(at: now) { worker.metrics.retryBudgetExhausted(upstream: upstream.name) }
        return false
    }

    /// What a hedge needs besides the budget: the upstream not paused and
    /// reachable, its breaker closed (a half-open breaker's probes are not
    /// hedged), a token if it takes one, and a connection slot free now.
    private func admitHedge(at now: Instant) -> Bool {
        guard guardian.pausedFor(client: pacingKey, at: now) == nil, guardian.reachable.load(ordering: .relaxed) else {
            return false
        }
        if tokens != nil, authToken == nil { return false }
        switch guardian.admit(at: now) {
        case .allow: break
        case .probe:
            abandonProbe()
            return false
        case .reject: return false
        }
        return worker.tryAcquireSlot(guardian: guardian)
    }

    /// A status the retry rules, pacing or a token refresh act on: the try
    /// failed, it is not an answer (it wins no hedge race, and with
    /// `upstream_errors: pass` it is held while the exchange decides).
    private func failsTry(_ status: Int) -> Bool {
        route.retry.configuration.statuses.contains(status)
            || (guardian.hasPacing && guardian.pacing?.on.contains(status) == true)
            || (tokens != nil && machine.settings.refreshOn.contains(status))
    }

    /// The try in flight has its status: no hedge is due any more, and if
    /// the answer is usable, every hedge still out has lost.
    private func headArrived(status: Int) {
        let now = worker.clock.now()
        route.recordTry(sentAt: tryStartedAt, headAt: now)
        // No hedge once a head came (the timer, if armed for it, is armed
        // again for the try's limit when it fires).
        hedgeDueAt = nil
        guard !hedges.isEmpty, !failsTry(status) else { return }
        for other in hedges { lose(other) }
        hedges.removeAll()
        machine.othersCancelled()
        scheduleReap()
    }

    /// A hedge has its status (inside libcurl's callback). A failure is
    /// noted and the others go on; anything else wins: the others are
    /// detached, and the hedge becomes the exchange's try.
    func hedgeHead(_ winner: HedgeTry, status: Int, reason: UnsafeRawBufferPointer) {
        guard let i = hedges.firstIndex(where: { $0 === winner }) else { return }
        let now = worker.clock.now()
        route.recordTry(sentAt: winner.startedAt, headAt: now)
        hedges.remove(at: i)
        if failsTry(status) {
            let end = ExchangeStateMachine.TryEnd.answered(
                status: status, retryAfter: nil, withToken: winner.token != nil && tokens != nil)
            lose(winner, outcome: machine.outcome(of: end))
            _ = machine.tryEnded(end, breakerOpen: false, at: now, random: 0) { false }
            return scheduleReap()
        }
        worker.metrics.hedge(route: route, outcome: "won")
        if let transfer {
            worker.client.detach(transfer)
            losers.append(Loser(transfer: transfer, holdsSlot: holdsSlot, endpointIndex: endpointIndex))
            holdsSlot = false
        }
        for other in hedges { lose(other) }
        hedges.removeAll()
        machine.othersCancelled()
        hedgeDueAt = nil
        adoptHedge(winner, at: now)
        scheduleReap()
        relayStatus(status, reason: reason)
    }

    /// A hedge ended before its status (a connection failure, a timeout):
    /// counted, and the request goes on with the other try.
    func hedgeFinished(_ loser: HedgeTry, _ failure: UpstreamFailure?) {
        guard let i = hedges.firstIndex(where: { $0 === loser }) else { return }
        hedges.remove(at: i)
        worker.releaseSlot(guardian: guardian)
        let now = worker.clock.now()
        let end = ExchangeStateMachine.TryEnd.failed(failure?.tryFailure ?? .init(.reset, Self.closedInHead))
        _ = report(machine.outcome(of: end), endpoint: loser.endpointIndex, at: now)
        worker.metrics.hedge(route: route, outcome: "lost")
        _ = machine.tryEnded(end, breakerOpen: false, at: now, random: 0) { false }
    }

    /// The hedge goes on as the exchange's one try (it won, or the try it
    /// hedged failed), under its own limit.
    private func adoptHedge(_ hedge: HedgeTry, at now: Instant) {
        hedge.adopted = true
        transfer = hedge.transfer
        holdsSlot = true
        endpointIndex = hedge.endpointIndex
        authToken = hedge.token
        tryStartedAt = hedge.startedAt
        tryLimitAt = hedge.limitAt
        relay.reset()
        armTryTimer(at: now)
    }

    private func lose(_ hedge: HedgeTry, outcome: Outcome? = nil) {
        if trace != nil {
            trace?.tryEnded(lostHedge: true, outcome: outcome?.metricLabel ?? "lost", status: nil, at: worker.clock.now())
        }
        worker.client.detach(hedge.transfer)
        losers.append(Loser(transfer: hedge.transfer, holdsSlot: true, endpointIndex: hedge.endpointIndex, outcome: outcome))
        worker.metrics.hedge(route: route, outcome: "lost")
    }

    private func scheduleReap() {
        let event = reapEvent ?? worker.loop.takeEvent(target: self)
        reapEvent = event
        event.arm(after: .zero)
    }

    /// Outside libcurl's callbacks: the losers' transfers go (their
    /// connections closed, not reused), their slots are freed and their
    /// failures counted.
    private func reap(at now: Instant) {
        let gone = losers
        losers.removeAll()
        for loser in gone {
            worker.client.cancel(loser.transfer)
            if loser.holdsSlot { worker.releaseSlot(guardian: guardian) }
            if let outcome = loser.outcome { _ = report(outcome, endpoint: loser.endpointIndex, at: now) }
        }
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
        if event === reapEvent { return reap(at: worker.clock.now()) }
        if let hedge = route.hedge, machine.state == .trying, !tryTimerFired(hedge, at: worker.clock.now()) { return }
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
        upgradeTry?.resume()
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
        upgradeTry?.close()
        upgradeTry = nil
        releaseSlot()
        if !hedges.isEmpty || !losers.isEmpty {
            let now = worker.clock.now()
            for hedge in hedges { lose(hedge) }
            hedges.removeAll()
            reap(at: now)
        }
        hedgeDueAt = nil
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
        reapEvent?.recycle()
        reapEvent = nil
    }

    private func end() {
        recycleTimers()
        worker.finished(self)
    }
}

extension ExchangeStateMachine.Failure {
    /// The way of failing a route's `fallback.on` names (nil: no fallback
    /// answers it: the client's own request, a refused token, shutdown).
    var fallbackReason: FallbackConfiguration.Reason? {
        switch self {
        case .timeout: .timeout
        case .overloaded: .overloaded
        case .circuitOpen: .circuitOpen
        case .unreachable: .unreachable
        case .paused: .paused
        case let .parkExpired(reason, _, _):
            switch reason {
            case .unreachable: .unreachable
            case .circuitOpen: .circuitOpen
            case .paused: .paused
            case .auth: nil
            }
        case let .upstreamAnswer(status): status >= 500 ? .serverError : nil
        case .badGateway, .upstreamTLS, .unavailable: .serverError
        case .tokenRefusedAfterRefresh, .tokenRefreshFailed, .shuttingDown: nil
        }
    }
}

extension UpstreamFailure {
    var tryFailure: ExchangeStateMachine.TryFailure {
        switch self {
        case let .connectFailed(message): .init(.unreachable, message)
        case .timeout: .init(.timeout, "timeout")
        case let .reset(message), let .other(message): .init(.reset, message)
        case let .badResponse(message): .init(.invalidResponse, message)
        case let .tls(message): .init(.tls, message)
        }
    }

    var message: String { tryFailure.message }
}

/// A hedge: a try sent beside the exchange's try in flight. It reports its
/// status or its failure to the exchange, which decides; once adopted (it
/// won, or the try beside it failed) it is the exchange's try like any
/// other and passes everything through.
final class HedgeTry: UpstreamResponseHandler {
    unowned let exchange: Exchange
    var transfer: UpstreamTransfer!
    let endpointIndex: Int
    let token: Token?
    let startedAt: Instant
    /// Its own limit (per_try_timeout or the deadline), kept if it is adopted.
    let limitAt: Instant
    var adopted = false

    init(exchange: Exchange, endpointIndex: Int, token: Token?, startedAt: Instant, limitAt: Instant) {
        self.exchange = exchange
        self.endpointIndex = endpointIndex
        self.token = token
        self.startedAt = startedAt
        self.limitAt = limitAt
    }

    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        if adopted { return exchange.upstreamStatus(status, reason: reason) }
        exchange.hedgeHead(self, status: status, reason: reason)
    }

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if adopted { exchange.upstreamHeader(name: name, value: value) }
    }

    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {
        if adopted { exchange.upstreamInformational(status, fields: fields) }
    }

    func upstreamHeadersComplete() -> String? { adopted ? exchange.upstreamHeadersComplete() : nil }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool { adopted ? exchange.upstreamBody(bytes) : true }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        if adopted { return exchange.upstreamFinished(failure) }
        exchange.hedgeFinished(self, failure)
    }
}
