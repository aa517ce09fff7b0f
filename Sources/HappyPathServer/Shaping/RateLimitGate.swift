import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Synchronization

/// A worker's rate-limit gate (docs/shaping.md): a request on a limited
/// route passes with its `RateLimit` fields, waits in the route's queue
/// (`QueuedRequest`, owned here until its turn or until it leaves), or is
/// refused 429. A request with a body is judged at its head (`holdsBody`,
/// `bodyHeld`), before any of its body is kept. On the worker's loop.
final class RateLimitGate {
    /// Alive: the worker owns its gate (`ProxyWorker.gate`) and outlives it.
    unowned let worker: ProxyWorker
    let loop: EventLoop
    let clock: Clock
    let metrics: RateLimitMetrics
    /// Requests waiting in a route's rate-limit queue, owned here until their turn.
    private var queued: [ObjectIdentifier: QueuedRequest] = [:]
    /// The limited route `holdsBody` found for the head now held (same pass).
    private var heldRoute: RuntimeRoute?

    init(worker: ProxyWorker, metrics: RateLimitMetrics) {
        self.worker = worker
        loop = worker.loop
        clock = worker.clock
        self.metrics = metrics
    }

    /// What the route's limit says of a request about to go on.
    enum Verdict {
        /// It goes on, with the fields for its answer and its key (the
        /// pacing key, and whom an adaptive upstream's slots are shared between).
        case pass(RateLimitFields, key: String)
        /// The gate took it over: it waits for its turn, or was refused.
        case taken
    }

    /// A request on `route` (which has `limit`) whose `target` upstream is known.
    func admit(_ request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, target: String) -> Verdict {
        if let decided = request.headDecision {
            // A request with a body: judged at its head, before the body was read.
            let admission = unsafeDowncast(decided, to: HeadAdmission.self)
            return .pass(admission.fields, key: admission.key)
        }
        // A long key is its digest from here on: the bucket, the queue and pacing keep it bounded.
        let limitKey = key(request, limit)
        let now = clock.now()
        guard let (decision, by) = decide(request, route: route, limit: limit, key: limitKey, target: target, at: now) else {
            return .taken
        }
        if case let .pass(fields) = decision { return .pass(fields, key: limitKey.text) }
        decided(decision, limit: by, request: request, route: route, key: limitKey, target: target, at: now)
        return .taken
    }

    /// What the route's limit says now, and the limit that said it (a
    /// cluster limit's local share while Redis is away); nil: the cluster
    /// link asked Redis and holds the request until `decided`.
    private func decide(
        _ request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, key: RateLimitBucketKey, target: String?,
        at now: Instant
    ) -> (RouteRateLimit.Decision, RouteRateLimit)? {
        guard let cluster = limit.cluster, let link = worker.cluster else { return (limit.admit(key: key, at: now), limit) }
        // `scope: cluster`: a leased token, Redis's answer later, or the local share.
        switch link.admit(request, route: route, limit: limit, cluster: cluster, key: key, target: target, at: now) {
        case .asked: return nil
        case let .decided(decision, by): return (decision, by)
        }
    }

    /// A decision that does not let the request go on at once (it waits, or
    /// is refused), or any decision that came later (Redis's answer, or the
    /// local share after Redis was too slow) for a request the cluster link
    /// held. `target` nil: a head whose body is read once it may go on; a
    /// refusal there is answered at the head (the connection closes after
    /// the 429 and the body is never read).
    func decided(
        _ decision: RouteRateLimit.Decision, limit: RouteRateLimit, request: HTTPRequest, route: RuntimeRoute,
        key: RateLimitBucketKey, target: String?, at now: Instant
    ) {
        switch decision {
        case let .pass(fields):
            guard let target else {
                request.headDecision = HeadAdmission(fields, key: key)
                return request.readBody()
            }
            worker.dispatch(request, route: route, method: request.method, target: target, fields: fields, key: key.text)
        case let .wait(delay, ticket):
            enqueue(request, route: route, limit: limit, key: key, ticket: ticket, target: target, delay: delay, at: now)
        case let .refuse(retryAfter, fields):
            rateLimited(request, route: route, retryAfter: retryAfter, fields: fields)
        }
    }

    private func key(_ request: HTTPRequest, _ limit: RouteRateLimit) -> RateLimitBucketKey {
        RateLimitBucketKey(RateLimitKey.of(request, limit.configuration.key, trusted: worker.runtime.configuration.trustedProxies))
    }

    /// Waits in the route's queue for its turn (`target` nil: a head whose body is read after it).
    private func enqueue(
        _ request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, key: RateLimitBucketKey, ticket: UInt64,
        target: String?, delay: Duration, at now: Instant
    ) {
        let waiting = QueuedRequest(
            gate: self, request: request, route: route, limit: limit, key: key, ticket: ticket, target: target, at: now)
        queued[ObjectIdentifier(waiting)] = waiting
        worker.shared.inFlight.add(1)
        metrics.limited(route: route.label, outcome: "queued")
        metrics.queueDepth(route: route.label, limit.queued.load(ordering: .relaxed))
        waiting.start(after: delay)
    }

    /// A request with a body on a rate-limited route is judged at its head:
    /// a client over the limit is refused (or waits) before any of its body
    /// is kept, so its stalled uploads cannot take the body budget from
    /// other clients. What `serve` answers before the limit (no route, a
    /// refused TRACE, a prefix that leaves a dot-segment) is left to it.
    func holdsBody(_ request: HTTPRequest) -> Bool {
        let runtime = worker.runtime
        guard runtime.hasRateLimits, !request.isAsteriskForm else { return false }
        let (path, query) = Router.split(target: request.target)
        if let deliveries = worker.deliveries, path.hasPrefix(deliveries.statusPrefix) { return false }
        let method = request.method
        // A CORS preflight is answered by the proxy (`serve`), never counted: not held either.
        if method.utf8.count == 7, method == "OPTIONS", request.header("Access-Control-Request-Method") != nil { return false }
        guard let routeIndex = runtime.router.route(path: path, method: method) else { return false }
        let route = runtime.routes[routeIndex]
        // An extended CONNECT's body is a tunnel's bytes, which never end: it is judged when served.
        guard route.rateLimit != nil, request.connectProtocol == nil,
            route.allowTrace || method.utf8.count != 5 || !RouteProblems.echoesRequest(method),
            Router.upstreamTarget(path: path, query: query, stripPrefix: route.stripPrefix) != nil
        else { return false }
        heldRoute = route
        worker.routed(request, to: route)
        return true
    }

    func bodyHeld(_ request: HTTPRequest) {
        guard let route = heldRoute, let limit = route.rateLimit else { return request.readBody() }
        heldRoute = nil
        let key = key(request, limit)
        let now = clock.now()
        guard let (decision, by) = decide(request, route: route, limit: limit, key: key, target: nil, at: now) else { return }
        decided(decision, limit: by, request: request, route: route, key: key, target: nil, at: now)
    }

    /// A request's turn came after its wait in a rate-limit queue, or it left.
    func leftQueue(_ waiting: QueuedRequest, served: Bool) {
        guard queued.removeValue(forKey: ObjectIdentifier(waiting)) != nil else { return }
        worker.shared.inFlight.add(-1)
        waiting.limit.dequeued()
        metrics.queueDepth(route: waiting.route.label, waiting.limit.queued.load(ordering: .relaxed))
        guard served else { return }
        let now = clock.now()
        metrics.waited(route: waiting.route.label, now - waiting.queuedAt)
        // A cluster limit's token was reserved in Redis for now: nothing is left of the burst.
        let fields =
            waiting.limit.cluster != nil
            ? waiting.limit.fields(remaining: 0, untilFullNs: waiting.limit.configuration.interval.nanoseconds)
            : waiting.limit.fields(key: waiting.key, at: now)
        guard let target = waiting.target else {
            // Its turn came at its head: now its body, then `serve`.
            waiting.request.headDecision = HeadAdmission(fields, key: waiting.key)
            return waiting.request.readBody()
        }
        worker.dispatch(
            waiting.request, route: waiting.route, method: waiting.request.method, target: target, fields: fields,
            key: waiting.key.text)
    }

    /// Over the route's rate limit: 429 RATE_LIMITED with when to come back.
    private func rateLimited(_ request: HTTPRequest, route: RuntimeRoute, retryAfter: Int, fields: RateLimitFields) {
        metrics.limited(route: route.label, outcome: "rejected")
        let problem = RouteProblems.rateLimited(
            route: route, retryAfter: retryAfter, requestID: worker.requestID(of: request))
        ProblemResponder.respond(request, problem, extraHeaders: fields.fields)
    }

    /// Drain ran out of time: requests still waiting for a token get their
    /// 503 now (their turn would come after the drain), not a closed connection.
    func answerEverything() {
        for waiting in Array(queued.values) {
            waiting.answerNow(RouteProblems.shuttingDown(requestID: worker.requestID(of: waiting.request)))
        }
    }

    /// The worker shuts down: every waiting request is dropped, unanswered.
    func abandonAll() {
        for waiting in queued.values { waiting.abandon() }
        worker.shared.inFlight.add(-queued.count)
        queued.removeAll()
    }
}

/// A request waiting in a route's queue for its token (`over_limit:
/// queue`). It holds no upstream connection, only a pooled timer; a client
/// that goes away leaves the queue at once and gives its token back, and
/// the requests behind it on its key move up (`moveUp`). A request with a
/// body waits at its head (`target` nil): the body is read after its turn.
final class QueuedRequest: LoopEventTarget, HTTPRequestObserver {
    /// The gate that queued it, which owns it (its `queued`) until it leaves.
    let gate: RateLimitGate
    let request: HTTPRequest
    let route: RuntimeRoute
    let limit: RouteRateLimit
    let key: RateLimitBucketKey
    let ticket: UInt64
    /// Where it goes upstream; nil for a head whose body is not read yet
    /// (`serve` routes it again once the body is in).
    let target: String?
    let queuedAt: Instant
    private var timer: LoopEvent?
    private var gone = false

    init(
        gate: RateLimitGate, request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, key: RateLimitBucketKey,
        ticket: UInt64, target: String?, at now: Instant
    ) {
        self.gate = gate
        self.request = request
        self.route = route
        self.limit = limit
        self.key = key
        self.ticket = ticket
        self.target = target
        queuedAt = now
    }

    func start(after delay: Duration) {
        request.observer = self
        let event = gate.loop.takeEvent(target: self)
        timer = event
        // Registered to hear of moves; someone in front may have left already.
        if let due = limit.enqueue(self, ticket: ticket, on: gate.loop) {
            let now = gate.clock.now()
            return event.arm(after: due > now ? due - now : .zero)
        }
        event.arm(after: delay)
    }

    /// Someone in front on the same key left: its turn is at `due` now.
    func moveUp(to due: Instant) {
        guard let timer, !gone else { return }
        let now = gate.clock.now()
        timer.arm(after: due > now ? due - now : .zero)
    }

    func loopEventFired(_ event: LoopEvent) {
        event.recycle()
        timer = nil
        request.observer = nil
        if gone {
            request.abort()
            return gate.leftQueue(self, served: false)
        }
        limit.served(ticket: ticket, key: key)
        gate.leftQueue(self, served: true)
    }

    func requestClientClosed(_ request: HTTPRequest) {
        // Inside the connection's teardown: leave on the next pass.
        guard !gone else { return }
        gone = true
        limit.leave(ticket: ticket, key: key, at: gate.clock.now())
        timer?.arm(after: .zero)
    }

    func requestOutputDrained(_ request: HTTPRequest) {}

    /// The drain ended before its turn: it leaves the queue (its token goes
    /// back) with `problem` as its answer.
    func answerNow(_ problem: Problem) {
        timer?.recycle()
        timer = nil
        request.observer = nil
        if !gone { limit.leave(ticket: ticket, key: key, at: gate.clock.now()) }
        gate.leftQueue(self, served: false)
        if gone { return request.abort() }
        ProblemResponder.respond(request, problem)
    }

    /// The worker is shutting down: no answer.
    func abandon() {
        timer?.recycle()
        timer = nil
        request.observer = nil
        if !gone { limit.served(ticket: ticket, key: key) }  // out of the route's queue, nobody told
        request.abort()
    }
}

