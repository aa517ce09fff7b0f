import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import HappyPathStore
import Logging

/// One client request from arrival to answer: the driver of its
/// `ExchangeStateMachine`. The machine decides, and keeps the books of what
/// the exchange holds (its slot or place in the queue, its place in the
/// parking lot, the adaptive limit's sample, a tunnel); this performs each
/// action on the real things — the try in flight (a libcurl transfer or an
/// HTTP/2 stream), the client's connection, the slot, the lot, one timer —
/// through its `ExchangeEnvironment`, and feeds the results back as events.
/// Every way out releases what is held in one place (`releaseAll`).
///
/// Each concern beside it has its own file: admission
/// (`Exchange+Admission`), a try and its end (`Exchange+Try`, the end's
/// rules in `TryEndRules`), the try's answer as it comes (`Exchange+Relay`,
/// with `ResponseRelay`), counting a try (`Exchange+Counting`), the slot
/// (`Exchange+Slots`), the answer when the machine gives up
/// (`Exchange+Answer`, decided by `ExchangeAnswer`), serve-stale
/// (`Exchange+Stale`), hedging (`Exchange+Hedging`, its books in
/// `HedgeCoordinator`) and upgrades (`Exchange+Upgrade`).
final class Exchange: UpstreamUpgradeHandler, HTTPRequestObserver, LoopEventTarget {
    /// What the exchange needs from its worker (`ExchangeEnvironment`). The
    /// worker owns every exchange until `finished` (its `active`), and
    /// abandons those left at shutdown.
    let env: any ExchangeEnvironment
    /// The client's connection, or a `DeliverySink` for a delivery round.
    let request: any ExchangeClient
    /// The try's answer goes to the `CoalescedAnswer` of this leader's
    /// group (`coalesce.answer`), not only to `request`. A flag, not a
    /// reference to the client: `request` is a constant, passed on without
    /// a retain and a release at each part of every answer.
    var sharesAnswer = false
    /// Its place in a coalescing group (`coalesce:`; nil: none).
    var coalesce: CoalesceMembership?
    /// What the request is, read once at its start (`ExchangeFacts`).
    let facts: ExchangeFacts
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
    /// The request's life, and the books of what it holds (its slot, its
    /// place in the parking lot, the adaptive limit's sample, a tunnel).
    var machine: ExchangeStateMachine
    var relay = ResponseRelay()
    let startedAt: Instant

    // What this exchange holds, released by `releaseAll`.
    var transfer: (any UpstreamTry)?
    /// An upgrade request (the route's `upgrades`): its tries are
    /// `UpstreamUpgrade`s, not libcurl transfers (Exchange+Upgrade.swift).
    var upgrading: Upgrading?
    /// `kind`, once read.
    var storedKind: UInt64?
    /// This worker's lane of the upstream, from the exchange's first slot
    /// on (its slots, queue and limit); kept so a release or a sample does
    /// not look it up again. A lane is forgotten only while idle, and this
    /// exchange holds a slot or a place whenever it uses it.
    var lane: Lane?
    /// The machine's one timer, and the two one-pass events beside it.
    var timers = ExchangeTimers()
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

    /// Fields added to whatever answer the client gets (a rate-limited
    /// route's `RateLimit-Policy` and `RateLimit`); empty for most routes.
    var rateLimitFields: RateLimitFields?
    /// Whom the upstream's 429 is about (`pacing.scope_429: client`): the
    /// route's rate-limit key, else the client's address; set by the worker
    /// before `start`. A 429 to this request pauses only requests with the
    /// same key.
    var pacingKey = ""
    /// How it ended: for the access log, metrics, traces and the store.
    var result = ExchangeResult()
    /// A traced request's spans so far (nil: not traced, the usual case).
    var trace: RequestTrace?

    init(
        env: any ExchangeEnvironment, request: any ExchangeClient, route: RuntimeRoute, upstream: RuntimeUpstream,
        guardian: UpstreamGuard, command: Command, delivery: ClaimedDelivery? = nil, upgrade: UpgradeRequest? = nil,
        trace: RequestTrace? = nil, bodyStream: RequestBodyStream? = nil
    ) {
        self.bodyStream = bodyStream
        self.trace = trace
        upgrading = upgrade.map { Upgrading(request: $0) }
        self.env = env
        self.request = request
        // One read of the protocol's name serves both (HTTP/1.x requests
        // stop there for gRPC).
        let name = request.protocolName
        let call = request.grpcCall(protocolName: name)
        let isGRPC = call != nil
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
        slotHolder = SlotHolder(priority)
        self.upstream = upstream
        self.guardian = guardian
        self.command = command
        startedAt = env.clock.now()
        // A gRPC call's deadline is the sooner of the route's and its
        // client's (`grpc-timeout`); compared as durations first, so that a
        // client's hours never reach the clock's arithmetic.
        var deadline = command.deadline
        var grpcTimeout: Duration?
        if let timeout = call?.timeout, timeout < route.timeout, startedAt + timeout < deadline {
            deadline = startedAt + timeout
            grpcTimeout = timeout
        }
        facts = ExchangeFacts(
            protocolName: env.logsAccess ? name : "", isGRPC: isGRPC, grpcTimeout: grpcTimeout, priority: priority)
        relay.clock = env.clock
        relay.retryAfterCap = route.retry.configuration.maxRetryAfter
        relay.readsGRPCStatus = isGRPC
        relay.readsGRPCDetails = isGRPC && guardian.pacing?.onResourceExhausted == true
        if isGRPC {
            relay.grpcRetryStatuses = route.retry.configuration.grpcStatuses
            if let web = request.grpcWeb {
                relay.web = GRPCWebAnswer(
                    mode: web, contentType: GRPCWeb.answerContentType(web, request: (request.header("content-type") ?? "").utf8))
            }
        }
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

    func start() {
        request.observer = self
        // One branch for every other route.
        if route.coalesce != nil, joinGroup() { return }
        guardian.recordRequest(at: env.clock.now())
        perform(machine.start())
    }

    // MARK: - Events from the worker

    /// The upstream's queue shed this request (adaptive concurrency, or a
    /// request that matters more took its place): it has left the queue.
    func shed(_ priority: RequestPriority) { perform(machine.shed(priority)) }

    /// The worker hands over a freed connection slot (given back at once
    /// if this request no longer waits for one: `.returnSlot`).
    func slotGranted() { perform(machine.slotGranted(at: env.clock.now())) }

    /// The upstream recovered (the worker already took it out of the lot).
    func replay() {
        guard machine.lot != nil else { return }
        if trace != nil { trace?.parkedChanged(false, at: env.clock.now()) }
        timers.main?.disarm()
        perform(machine.replay())
    }

    /// The token refresh this request waited for failed.
    func authFailed(_ reason: String) { perform(machine.tokenRefreshFailed(reason)) }

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
        if sharesAnswer, let answer = coalesce?.answer { answer.abort() } else { request.abort() }
        // A group's links to its exchanges (and theirs to it) go with it:
        // every member of a shared answer is cut, as at the drain's end.
        if let membership = coalesce {
            coalesce = nil
            membership.group.forget()
            membership.answer?.abort()
            membership.answer?.detach()
        }
    }

    /// Where the worker's parking lot has it (nil: not parked).
    var parked: ParkReason? { machine.lot }

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
            park(reason, limit: limit, probeAfter: probeAfter)
        case .cancelTry:
            if let transfer { transfer.cancel() }
            transfer = nil
            upgradeTry?.close()
            upgradeTry = nil
            // A try that ran out of time says the upstream is at least this slow.
            sampleTry()
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
            timers.main?.disarm()
        case let .follow(limit):
            arm(after: limit)
        case .returnSlot:
            env.releaseSlot(guardian: guardian, slotHolder)
        case let .answer(failure, abandonProbe):
            if abandonProbe { self.abandonProbe() }
            if case let .upstreamAnswer(status) = failure { result.upstreamAnswered = status }
            releaseAll()
            if coalesce != nil { coalesceAnswered(failure) }
            answer(failure)
        case let .finish(ending, abandonProbe):
            if abandonProbe { self.abandonProbe() }
            releaseAll()
            finish(ending)
            if coalesce != nil { coalesceFinished(ending) }
            end()
        }
    }

    private func park(_ reason: ParkReason, limit: Duration, probeAfter: Duration?) {
        if let probeAfter { env.scheduleProbe(guardian: guardian, after: probeAfter) }
        // A connect failure: the next good health check replays, even if
        // the checker never saw the upstream down.
        if reason == .unreachable { guardian.suspect.store(true, ordering: .relaxed) }
        guard env.park(self, reason: reason) else { return perform(machine.parkRefused()) }
        machine.parkAccepted()
        if reason == .paused { env.parkedForPause(self) }
        if trace != nil { trace?.parkedChanged(true, at: env.clock.now()) }
        arm(after: limit)
    }

    /// The answer is over (`.finish`): what the client got, and how it ended.
    private func finish(_ ending: ExchangeStateMachine.Ending) {
        switch ending {
        case .completed where machine.attempt == 0:
            // A follower's shared answer (it sent no try): its end.
            result.status = machine.streamedStatus
            if result.status >= 400 { result.code = ErrorMapper.builtInCode(for: result.status).rawValue }
            request.endReply()
        case .completed:
            result.status = machine.switched ? 101 : relay.status
            // Moved out of the relay (the answer is over): its bytes go to the store uncopied.
            if let kept = relay.takeKeptAnswer() { keepAnswer(fields: kept.fields, body: kept.body) }
            // An error streamed as it came (upstream_errors: pass) is
            // counted under the code its problem would have had.
            if relay.status >= 400 { result.code = ErrorMapper.builtInCode(for: relay.status).rawValue }
            if isGRPC { result.grpcStatus = relay.grpcStatus.clientStatus(httpStatus: relay.status) }
            // (A stored property first: a method call on the relay would copy all of it, on every answer.)
            if relay.web != nil, let frame = relay.webTrailerFrame() {
                frame.withUnsafeBytes { request.send($0, notifyWhenDrained: false) }
            }
            if sharesAnswer, let answer = coalesce?.answer { answer.endReply() } else { request.endReply() }
        case .truncated, .drained:
            result.status = machine.attempt == 0 ? machine.streamedStatus : relay.status
            result.code = "TRUNCATED"
            // A gRPC-Web client between two messages reads a status of the proxy's in the trailer frame.
            let detail =
                ending == .drained
                ? "The proxy shut down before the answer was over; call again."
                : "The upstream's answer was cut off after it began; the messages before this status are whole."
            if relay.web != nil,
                case let answer = GRPCErrorResponse(Problem(.upstreamUnavailable, requestID: command.requestID, detail: detail)),
                let frame = relay.webFailureFrame(answer)
            {
                result.grpcStatus = answer.status
                frame.withUnsafeBytes { request.send($0, notifyWhenDrained: false) }
                return request.endReply()
            }
            // Part of the response is already with the client: the only
            // honest signal left is a broken connection.
            if sharesAnswer, let answer = coalesce?.answer { answer.abort() } else { request.abort() }
        case .clientClosed:
            result.status = 499  // nginx's "client closed request"
            result.code = "CLIENT_CLOSED"
            result.grpcStatus = .cancelled  // what a gRPC server records for a call its client cancelled
            request.abort()
        }
    }

    // MARK: - Timers

    func arm(after delay: Duration) {
        let event = timers.main ?? env.loop.takeEvent(target: self)
        timers.main = event
        event.arm(after: delay)
    }

    func loopEventFired(_ event: LoopEvent) {
        if event === timers.gone {
            // A leader's client left mid-answer: the try goes on for its followers.
            if let answer = coalesce?.answer, coalesce?.leads == true, machine.state == .streaming, answer.leaderLeft() {
                return
            }
            return perform(machine.clientGone())
        }
        if event === hedging.reapEvent { return reap(at: env.clock.now()) }
        if event === timers.stream { return moveSlotToStreams() }
        if route.hedge != nil, machine.state == .trying, !tryTimerFired(at: env.clock.now()) { return }
        perform(machine.timerFired(at: env.clock.now()))
    }

    // MARK: - HTTPRequestObserver

    func requestClientClosed(_ request: HTTPRequest) {
        if isFinished, let answer = coalesce?.answer {
            // A leader that ended while its client still read the shared answer.
            env.loop.schedule(after: .zero) { _ = answer.leaderLeft() }
            return
        }
        // Inside the connection's teardown: finish on the next pass.
        guard !isFinished, timers.gone == nil else { return }
        let event = env.loop.takeEvent(target: self)
        timers.gone = event
        event.arm(after: .zero)
    }

    func requestOutputDrained(_ request: HTTPRequest) {
        if let membership = coalesce, let answer = membership.answer {
            // The leader's client is the answer's member 0, whatever its number in the group.
            return answer.drained(membership.leads ? 0 : membership.member)
        }
        relay.drained()
        transfer?.resume()
        upgradeTry?.resume()
    }

    func requestOutputMustWait(_ request: HTTPRequest) {
        // A shared answer's pace is its fastest member's (CoalescedAnswer).
        guard coalesce?.answer == nil, relay.mustWait() else { return }
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
        if machine.leaveLot() { env.unpark(self) }
        timers.main?.disarm()
    }

    private func recycleTimers() {
        timers.recycle()
        hedging.reapEvent?.recycle()
        hedging.reapEvent = nil
    }

    func end() {
        recycleTimers()
        env.finished(self)
    }
}

/// What an exchange reads once, at its start, of its request.
struct ExchangeFacts {
    /// For the access log: an HTTP/1.1 connection knows only the version
    /// of the request it carries now. Not read when the access log is off
    /// (the read costs ~90 instructions).
    let protocolName: StaticString
    /// The request is a gRPC call (`content-type` gRPC's, over HTTP/2):
    /// its failures are answered as gRPC statuses and it reports
    /// `grpc_status` (docs/grpc.md).
    let isGRPC: Bool
    /// The client's `grpc-timeout`, when it is shorter than the route's
    /// `timeout` and so the exchange's deadline (nil: the route's is).
    let grpcTimeout: Duration?
    /// How much the request matters when its upstream is full: the
    /// route's `priority`, lowered by its `priority_header` if the client asked.
    let priority: RequestPriority
}

/// How an exchange ended, for the access log, metrics, traces and the store.
struct ExchangeResult {
    var status = 0
    var code = "OK"
    /// The status the gRPC call ended with as its client reads it (nil:
    /// none it can read, reported `unknown`); set as the exchange ends.
    var grpcStatus: GRPCStatus?
    /// The problem answered, if the request failed.
    var problem: Problem?
    /// The upstream's own status, when the problem answered is its answer.
    var upstreamAnswered: Int?
    /// A coalesced follower: the request id of the leader whose try answered it.
    var coalescedWith: String?
    /// A leader: the followers its try answered.
    var followers = 0
}

/// The exchange's one timer (try limit, queue wait, backoff, park expiry)
/// and the two events it takes for one loop pass: the client hung up
/// (handled outside the connection's teardown), and an answer's slot moving
/// among the upstream's streams (outside libcurl's callbacks).
struct ExchangeTimers {
    var main: LoopEvent?
    var gone: LoopEvent?
    var stream: LoopEvent?

    mutating func recycle() {
        main?.recycle()
        main = nil
        stream?.recycle()
        stream = nil
        gone?.recycle()
        gone = nil
    }
}

/// An upgrade request's try (Exchange+Upgrade.swift): the route allowed
/// it, the try's own connection, and the upstream's `101` as it is read.
struct Upgrading {
    let request: UpgradeRequest
    var connection: UpstreamUpgrade?
    /// The fields of an upstream's `101`, while its head is read.
    var switching: [HTTPField]?
    /// One of them was not a valid field: the `101` is refused when its head completes.
    var invalidField = false
}

extension Exchange {
    typealias ParkReason = ExchangeStateMachine.ParkReason

    var protocolName: StaticString { facts.protocolName }
    var isGRPC: Bool { facts.isGRPC }
    var grpcTimeout: Duration? { facts.grpcTimeout }
    var priority: RequestPriority { facts.priority }
    var finalStatus: Int { result.status }
    var finalCode: String { result.code }
    var grpcStatus: GRPCStatus? { result.grpcStatus }
    var problem: Problem? { result.problem }
    var upstreamAnswered: Int? { result.upstreamAnswered }
    var bytesOut: Int { relay.bytesOut }
    /// Tries this request sent upstream: a coalesced follower sent none
    /// (the access log's `attempts`, `happypath_request_tries_total`).
    var triesSent: Int { result.coalescedWith == nil ? command.attempt : 0 }

    var upgrade: UpgradeRequest? { upgrading?.request }
    var upgradeTry: UpstreamUpgrade? {
        get { upgrading?.connection }
        set { upgrading?.connection = newValue }
    }
    var switching: [HTTPField]? {
        get { upgrading?.switching }
        set { upgrading?.switching = newValue }
    }
    var switchingHasInvalidField: Bool {
        get { upgrading?.invalidField ?? false }
        set { upgrading?.invalidField = newValue }
    }
}
