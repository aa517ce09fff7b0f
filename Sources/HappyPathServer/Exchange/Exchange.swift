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
///
/// Each concern beside it has its own file: admission
/// (`Exchange+Admission`), the try's answer as it comes
/// (`Exchange+Relay`, with `ResponseRelay`), counting a try
/// (`Exchange+Counting`), the answer when the machine gives up
/// (`Exchange+Answer`, decided by `ExchangeAnswer`), serve-stale
/// (`Exchange+Stale`), hedging (`Exchange+Hedging`, its books in
/// `HedgeCoordinator`) and upgrades (`Exchange+Upgrade`).
final class Exchange: UpstreamUpgradeHandler, HTTPRequestObserver, LoopEventTarget {
    typealias ParkReason = ExchangeStateMachine.ParkReason

    /// What the exchange needs from its worker (`ExchangeEnvironment`). The
    /// worker owns every exchange until `finished` (its `active`), and
    /// abandons those left at shutdown.
    let env: any ExchangeEnvironment
    /// The client's connection, or a `DeliverySink` for a delivery round.
    let request: any ExchangeClient
    /// For the access log, read at the start: an HTTP/1.1 connection
    /// knows only the version of the request it carries now. Not read
    /// when the access log is off (the read costs ~90 instructions).
    let protocolName: StaticString
    /// The request is a gRPC call (`content-type` gRPC's, over HTTP/2),
    /// read once at the start: its failures are answered as gRPC statuses
    /// and it reports `grpc_status` (docs/grpc.md).
    let isGRPC: Bool
    /// The client's `grpc-timeout`, when it is shorter than the route's
    /// `timeout` and so the exchange's deadline (nil: the route's is).
    private(set) var grpcTimeout: Duration?
    /// The status the gRPC call ended with as its client reads it (nil:
    /// none it can read, reported `unknown`); set as the exchange ends.
    var grpcStatus: GRPCStatus?
    /// The stored request this round delivers (nil: a client waits on `request`).
    let delivery: ClaimedDelivery?
    let route: RuntimeRoute
    let upstream: RuntimeUpstream
    let guardian: UpstreamGuard
    /// The request as sent upstream; its `attempt` follows the machine's.
    var command: Command
    /// The body as it streams from the client (an HTTP/2 request handed
    /// over at its head), read by each try instead of `command.body`.
    let bodyStream: RequestBodyStream?
    var machine: ExchangeStateMachine
    var relay = ResponseRelay()
    let startedAt: Instant

    // What this exchange holds, released by `releaseAll`.
    var transfer: (any UpstreamTry)?
    /// An upgrade request (the route's `upgrades`): its tries are
    /// `UpstreamUpgrade`s, not libcurl transfers (Exchange+Upgrade.swift).
    let upgrade: UpgradeRequest?
    var upgradeTry: UpstreamUpgrade?
    /// The fields of an upstream's `101`, while its head is read.
    var switching: [HTTPField]?
    /// One of them was not a valid field: the `101` is refused when its head completes.
    var switchingHasInvalidField = false
    /// The `101` went to the client: the exchange ended in a tunnel.
    var switched = false
    var holdsSlot = false
    var isQueued = false
    /// How much the request matters when its upstream is full: the
    /// route's `priority`, lowered by its `priority_header` if the client asked.
    let priority: RequestPriority
    /// When the try in flight was sent, and the tries in flight then (an
    /// adaptive upstream's latency sample; nil: none to take).
    var sampleFrom: (at: Instant, inFlight: Int)?
    /// The sample read at the response head, inside libcurl's header
    /// callback, and given to the limit as the try ends (`applySample`): a
    /// limit that grows hands slots to waiters at once, whose tries start
    /// then, and libcurl refuses to add a transfer inside its callbacks.
    var measured: (from: Instant, to: Instant, inFlight: Int)?
    /// `kind`, once read.
    var storedKind: UInt64?
    /// This worker's lane of the upstream, from the exchange's first slot
    /// on (its slots, queue and limit); kept so a release or a sample does
    /// not look it up again. A lane is forgotten only while idle, and this
    /// exchange holds a slot or a place whenever it uses it.
    var lane: Lane?
    /// Where the worker's parking lot has it (nil: not parked).
    private(set) var parked: ParkReason?
    /// The machine's one timer (try limit, queue wait, backoff, park expiry).
    var timer: LoopEvent?
    /// The client hung up: handled on the next loop pass, outside the connection's teardown.
    private var goneEvent: LoopEvent?
    /// Moves the slot of an answer that streams out of the adaptive limit,
    /// on the next pass (not inside libcurl's callbacks: a slot handed over
    /// starts a transfer).
    var streamEvent: LoopEvent?
    /// The slot this exchange holds was moved among the upstream's streams
    /// (`ConcurrencyLimiter.moveToStreams`): given back with `streamEnded`.
    var slotStreams = false
    /// Whom the slot is held for: the request's priority and its client
    /// (set by the worker before `start` on an adaptive upstream).
    var slotHolder = SlotHolder()

    /// Hedges beside the try in flight (only routes with `hedge:`;
    /// nothing is allocated for others): Exchange+Hedging.swift.
    var hedging = HedgeCoordinator()

    /// The endpoint of the latest try (a retry prefers the next one).
    var endpointIndex = -1
    /// The token the latest try carries.
    var authToken: Token?
    var tokens: TokenSource? { guardian.tokens }

    /// For the access log and metrics.
    /// Fields added to whatever answer the client gets (a rate-limited
    /// route's `RateLimit-Policy` and `RateLimit`); empty for most routes.
    var rateLimitFields: RateLimitFields?
    /// Whom the upstream's 429 is about (`pacing.scope_429: client`): the
    /// route's rate-limit key, else the client's address; set by the worker
    /// before `start`. A 429 to this request pauses only requests with the
    /// same key.
    var pacingKey = ""
    var finalStatus = 0
    var finalCode = "OK"
    /// The problem answered, if the request failed.
    var problem: Problem?
    /// The upstream's own status, when the problem answered is its answer.
    private(set) var upstreamAnswered: Int?
    var bytesOut: Int { relay.bytesOut }

    init(
        env: any ExchangeEnvironment, request: any ExchangeClient, route: RuntimeRoute, upstream: RuntimeUpstream,
        guardian: UpstreamGuard, command: Command, delivery: ClaimedDelivery? = nil, upgrade: UpgradeRequest? = nil,
        trace: RequestTrace? = nil, bodyStream: RequestBodyStream? = nil
    ) {
        self.bodyStream = bodyStream
        self.trace = trace
        self.upgrade = upgrade
        self.env = env
        self.request = request
        // One read of the protocol's name serves both (HTTP/1.x requests
        // stop there for gRPC).
        let name = request.protocolName
        protocolName = env.logsAccess ? name : ""
        let call = request.grpcCall(protocolName: name)
        isGRPC = call != nil
        self.delivery = delivery
        self.route = route
        var priority = route.priority
        if let header = route.priorityHeader {
            command.headers.forEach { name, value, _ in
                // `header` is lowercased; the field's name may be in any case.
                if name.count == header.utf8.count, header.utf8.elementsEqual(name.lazy.map(HTTPBytes.lower)) {
                    priority = RequestPriority.lowered(priority, by: value)
                }
            }
        }
        self.priority = priority
        slotHolder = SlotHolder(priority)
        self.upstream = upstream
        self.guardian = guardian
        self.command = command
        startedAt = env.clock.now()
        // A gRPC call's deadline is the sooner of the route's and its
        // client's (`grpc-timeout`); compared as durations first, so that a
        // client's hours never reach the clock's arithmetic.
        var deadline = command.deadline
        if let timeout = call?.timeout, timeout < route.timeout, startedAt + timeout < deadline {
            deadline = startedAt + timeout
            grpcTimeout = timeout
        }
        relay.clock = env.clock
        relay.retryAfterCap = route.retry.configuration.maxRetryAfter
        relay.readsGRPCStatus = isGRPC
        relay.readsGRPCDetails = isGRPC && guardian.pacing?.onResourceExhausted == true
        if isGRPC { relay.grpcRetryStatuses = route.retry.configuration.grpcStatuses }
        machine = ExchangeStateMachine(
            .init(
                deadline: deadline, retry: route.retry, parkFor: route.parkFor,
                parkWhileOpen: upstream.whileOpen == .park, endpoints: upstream.endpoints.count, method: command.method,
                // A gRPC call on a route that says its methods are idempotent counts as keyed.
                hasIdempotencyKey: IdempotencyKey.isPresent(in: command.headers) || (isGRPC && route.grpcIdempotent),
                refreshOn: Set(guardian.tokens?.refreshOn ?? []),
                hedgeMaxExtra: upgrade == nil ? route.hedge?.maxExtra ?? 0 : 0))
        if route.fallback?.serveStale != nil, command.method == "GET", delivery == nil, upgrade == nil,
            let store = env.stale
        {
            relay.kept = ResponseRelay.KeptAnswer(limit: store.maxEntryBytes)
        }
    }

    var isFinished: Bool { machine.state == .finished }

    /// A traced request's spans so far (nil: not traced, the usual case).
    var trace: RequestTrace?

    func start() {
        request.observer = self
        guardian.recordRequest(at: env.clock.now())
        perform(machine.start())
    }

    // MARK: - Events from the worker

    /// The upstream's queue shed this request (adaptive concurrency, or a
    /// request that matters more took its place): it has left the queue.
    func shed(_ priority: RequestPriority) {
        guard isQueued else { return }
        isQueued = false
        timer?.disarm()
        perform(machine.shed(priority))
    }

    /// The worker hands over a freed connection slot.
    func slotGranted() {
        guard isQueued else { return env.releaseSlot(guardian: guardian, slotHolder) }
        isQueued = false
        holdsSlot = true
        timer?.disarm()
        perform(machine.slotGranted(at: env.clock.now()))
    }

    /// The upstream recovered (the worker already took it out of the lot).
    func replay() {
        guard parked != nil else { return }
        parked = nil
        if trace != nil { trace?.parkedChanged(false, at: env.clock.now()) }
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
        if let transfer { transfer.cancel() }
        transfer = nil
        upgradeTry?.close()
        upgradeTry = nil
        for hedge in hedging.removeAll() { hedge.transfer.cancel() }
        for loser in hedging.removeLosers() { loser.transfer.cancel() }
        recycleTimers()
        request.abort()
    }

    // MARK: - Actions

    func perform(_ action: ExchangeStateMachine.Action) {
        switch action {
        case .none:
            break
        case .admit:
            admit()
        case let .send(attempt, limit):
            send(attempt: attempt, limit: limit)
        case let .waitForSlot(limit):
            arm(after: limit)
        case .withdrawRetry:
            perform(machine.retryBudget(granted: withdrawRetry(at: env.clock.now())))
        case let .backOff(delay):
            env.metrics.retry(upstream: upstream.name)
            arm(after: delay)
        case let .park(reason, limit, probeAfter):
            if let probeAfter { env.scheduleProbe(guardian: guardian, after: probeAfter) }
            // A connect failure: the next good health check replays, even if
            // the checker never saw the upstream down.
            if reason == .unreachable { guardian.suspect.store(true, ordering: .relaxed) }
            guard env.park(self, reason: reason) else { return perform(machine.parkRefused()) }
            parked = reason
            if reason == .paused { env.parkedForPause(self) }
            if trace != nil { trace?.parkedChanged(true, at: env.clock.now()) }
            arm(after: limit)
        case .cancelTry:
            if let transfer { transfer.cancel() }
            transfer = nil
            upgradeTry?.close()
            upgradeTry = nil
            // A try that ran out of time says the upstream is at least this slow.
            if sampleFrom != nil { sampleTry() }
            releaseSlot()
            tryEnded(.failed(.init(.timeout, "timeout")))
        case .tokenRefused:
            guard let tokens, let authToken else { return admit() }
            switch tokens.refused(generation: authToken.generation) {
            case .retryWith:
                admit()
            case let .wait(start):
                if start { env.startRefresh(guardian: guardian) }
                perform(machine.admitted(.park(.auth, probeAfter: nil), at: env.clock.now()))
            }
        case .stream:
            timer?.disarm()
        case let .answer(failure, abandonProbe):
            if abandonProbe { self.abandonProbe() }
            if case let .upstreamAnswer(status) = failure { upstreamAnswered = status }
            releaseAll()
            answer(failure)
        case let .finish(ending, abandonProbe):
            if abandonProbe { self.abandonProbe() }
            releaseAll()
            switch ending {
            case .completed:
                finalStatus = switched ? 101 : relay.status
                // Moved out of the relay (the answer is over): its bytes go to the store uncopied.
                if let kept = relay.takeKeptAnswer() { keepAnswer(fields: kept.fields, body: kept.body) }
                // An error streamed as it came (upstream_errors: pass) is
                // counted under the code its problem would have had.
                if relay.status >= 400 { finalCode = ErrorMapper.builtInCode(for: relay.status).rawValue }
                if isGRPC { grpcStatus = relay.grpcStatus.clientStatus(httpStatus: relay.status) }
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
                grpcStatus = .cancelled  // what a gRPC server records for a call its client cancelled
                request.abort()
            }
            end()
        }
    }

    private func send(attempt: Int, limit: Duration) {
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
            sampleFrom = (env.clock.now(), lane.slots.inFlight)
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

    /// A try ended: count it (metrics, breaker, endpoint), then let the machine decide.
    func tryEnded(_ end: ExchangeStateMachine.TryEnd) {
        if let bodyStream {
            if let failure = bodyStream.failure, case .failed = end {
                // The try broke off because the client's body did: not the upstream's failure.
                return perform(machine.requestBodyFailed(tooLarge: failure == .tooLarge))
            }
            machine.bodyReplayable = bodyStream.replayable
        }
        let now = env.clock.now()
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
        if guardian.hasPacing, let withoutWait = pacing(end, at: now) {
            // The upstream asked for a pause: its answer is pacing, not a
            // failure, so the breaker does not count it (metrics do). A retry
            // waits for the pause with the others (parked, woken when it
            // ends or a reload ends it), not on a Retry-After of its own.
            end = withoutWait
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

    // MARK: - Timers

    private func arm(after delay: Duration) {
        let event = timer ?? env.loop.takeEvent(target: self)
        timer = event
        event.arm(after: delay)
    }

    func loopEventFired(_ event: LoopEvent) {
        if event === goneEvent {
            return perform(machine.clientGone())
        }
        if event === hedging.reapEvent { return reap(at: env.clock.now()) }
        if event === streamEvent { return moveSlotToStreams() }
        if route.hedge != nil, machine.state == .trying, !tryTimerFired(at: env.clock.now()) { return }
        perform(machine.timerFired(at: env.clock.now()))
    }

    // MARK: - HTTPRequestObserver

    func requestClientClosed(_ request: HTTPRequest) {
        // Inside the connection's teardown: finish on the next pass.
        guard !isFinished, goneEvent == nil else { return }
        let event = env.loop.takeEvent(target: self)
        goneEvent = event
        event.arm(after: .zero)
    }

    func requestOutputDrained(_ request: HTTPRequest) {
        relay.drained()
        transfer?.resume()
        upgradeTry?.resume()
    }

    func requestOutputMustWait(_ request: HTTPRequest) {
        guard relay.mustWait() else { return }
        transfer?.pauseReceiving()
        answerStreams()
    }

    /// Everything this exchange holds, let go: the try, the slot or queue
    /// place, the parking place, the timer.
    func releaseAll() {
        if let transfer { transfer.cancel() }
        transfer = nil
        upgradeTry?.close()
        upgradeTry = nil
        releaseSlot()
        releaseHedges()
        if parked != nil {
            env.unpark(self)
            parked = nil
        }
        timer?.disarm()
    }

    private func recycleTimers() {
        timer?.recycle()
        timer = nil
        streamEvent?.recycle()
        streamEvent = nil
        goneEvent?.recycle()
        goneEvent = nil
        hedging.reapEvent?.recycle()
        hedging.reapEvent = nil
    }

    func end() {
        recycleTimers()
        env.finished(self)
    }
}
