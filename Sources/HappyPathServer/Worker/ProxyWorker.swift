import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import HappyPathStore
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// One event loop's share of the proxy: its listener (sharing the port with
/// the other workers), its libcurl multi handle and connection pool, and the
/// exchanges in flight on it. Everything here runs on `loop`'s thread.
final class ProxyWorker: HTTPServerDelegate {
    let loop: EventLoop
    let clock: Clock
    let logger: Logger
    /// One line per finished request, written in batches.
    let accessLog: AccessLog
    /// One per listener, in the configuration's order (the first is `server`).
    private(set) var servers: [HTTPServer] = []
    var server: HTTPServer { servers[0] }
    let client: UpstreamClient
    /// libcurl and the proxy's own HTTP/2 client: what a try starts on.
    let transports: UpstreamTransports
    var ids = IdentifierGenerator()
    /// An upstream silent this long in mid-response is cut (limits.client_timeout).
    let idleTimeout: Duration
    /// Exchanges in flight, retained here until they finish.
    private var active: [ObjectIdentifier: Exchange] = [:]
    /// Tunnels open on this worker's connections (docs/websocket.md).
    private var tunnels: [ObjectIdentifier: Tunnel] = [:]
    /// Swapped by a reload; exchanges keep the ones they started with.
    private(set) var runtime: RuntimeConfiguration
    private(set) var shared: SharedState
    let metrics: WorkerMetrics
    let workers: Int
    /// Per upstream (keyed by its guard, which survives a reload of an
    /// unchanged upstream): round-robin position, parked exchanges (the
    /// reachability and auth listeners' lot), the half-open probe timer,
    /// and the slots for tries in flight on this worker with their bounded queue.
    private var lanes: [ObjectIdentifier: Lane] = [:]
    /// Drain ran out of time: freed slots go to nobody (no new tries).
    private(set) var stopping = false
    /// Listener pauses (EMFILE, max_connections): one log line per 5 s.
    var acceptPauseLog = LogThrottle(every: .seconds(5))

    /// The deliver-later store and dispatcher (nil: no route delivers later).
    var deliveries: Deliveries?

    /// Requests waiting in a route's rate-limit queue, owned here until their turn.
    private var queued: [ObjectIdentifier: QueuedRequest] = [:]
    let rateLimitMetrics: RateLimitMetrics

    /// Token refreshes running on this worker, owned here until they report.
    private var refreshes: [ObjectIdentifier: TokenRefresh] = [:]

    func lane(_ guardian: UpstreamGuard) -> Lane {
        if let lane = lanes[ObjectIdentifier(guardian)] { return lane }
        // The worker's share of the upstream's connections (a guard's
        // `connections` never changes), or of its adaptive limit.
        let slots: ConcurrencyLimiter<Exchange>.Configuration =
            guardian.adaptive.map {
                .init(
                    adaptive: $0.limit, queue: $0.queue, connections: guardian.connections, workers: workers,
                    maxStreams: $0.maxStreams ?? $0.limit.maxLimit,
                    minPerWorker: $0.minLimitGiven ? nil : ConcurrencyLimiter<Exchange>.Configuration.defaultMinPerWorker)
            } ?? .init(connections: guardian.connections, workers: workers)
        let lane = Lane(worker: self, guardian: guardian, slots: slots)
        lanes[ObjectIdentifier(guardian)] = lane
        return lane
    }

    init(
        loop: EventLoop, runtime: RuntimeConfiguration, shared: SharedState, listeners: [BoundListener], workers: Int,
        clock: Clock, logger: Logger, accessLog: AccessLogSettings
    ) throws(SocketError) {
        self.loop = loop
        self.accessLog = AccessLog(settings: accessLog, loop: loop)
        self.runtime = runtime
        self.shared = shared
        self.workers = workers
        metrics = WorkerMetrics(shared.metrics)
        rateLimitMetrics = RateLimitMetrics(shared.metrics)
        self.clock = clock
        self.logger = logger
        idleTimeout = runtime.configuration.limits.clientTimeout
        let caps = runtime.connectionCaps(workers: workers)
        let curl = UpstreamClient(loop: loop, maxConnectionsPerHost: caps.perHost, maxCachedConnections: caps.cached)
        client = curl
        let configuration = runtime.configuration
        let limits = configuration.limits
        transports = UpstreamTransports(
            curl: curl,
            h2: HTTP2UpstreamClient(
                loop: loop, clock: { [clock] in clock.now() },
                limits: HTTP2ClientLimits(maxHeadBytes: limits.maxHeaderBytes, maxHeadFields: limits.maxHeaders),
                maxConnectionsPerEndpoint: caps.perHost))
        transports.h2.memory = shared.connectionMemory.upstreamH2
        for listener in listeners {
            var serverLimits = HTTPServerLimits(
                maxHeaderBytes: limits.maxHeaderBytes, maxBodyBytes: limits.maxRequestBody, timeout: limits.clientTimeout,
                maxFields: limits.maxHeaders, bodyBudget: shared.bodies, path: configuration.pathNormalization,
                connections: shared.connections,
                http2: listener.http2.map {
                    HTTP2ServerSettings(
                        maxConcurrentStreams: $0.maxConcurrentStreams, initialStreamWindow: $0.initialStreamWindow,
                        initialConnectionWindow: $0.initialConnectionWindow, drainTimeout: configuration.drainTimeout)
                })
            serverLimits.connectionBuffer = limits.connectionBuffer
            serverLimits.clientShares = shared.clientShares
            serverLimits.memory = shared.connectionMemory
            serverLimits.memoryPressure = shared.memoryPressure
            serverLimits.spool = shared.spool
            servers.append(
                try HTTPServer(
                    loop: loop, host: listener.host, port: listener.port, reusePort: true, limits: serverLimits,
                    delegate: self, tls: listener.tls))
        }
        openLanes()
    }

    /// A lane for every upstream from the start (and each new one at a
    /// reload): an upstream's limit gauge is then the sum of every
    /// worker's share before any traffic, not one worker's.
    private func openLanes() {
        for guardian in shared.guards { _ = lane(guardian) }
    }

    /// Where a worker's listener binds (port 0: the first worker picks
    /// one, the others join it) and its certificates, if it speaks TLS.
    struct BoundListener {
        var host: String
        var port: Int
        var tls: TLSServerContext?
        /// What the listener offers of HTTP/2 (nil: HTTP/1.1 only).
        var http2: HTTP2Configuration?
    }

    var port: Int { server.port }
    var ports: [Int] { servers.map(\.port) }

    /// A reload's certificates, for new connections (nil where plain).
    func useCertificates(_ contexts: [TLSServerContext?]) {
        for (server, context) in zip(servers, contexts) where server.tls != nil { server.tls = context }
    }

    // MARK: - HTTPServerDelegate

    func serve(_ request: HTTPRequest) {
        let target = request.target
        let method = request.method
        if request.isAsteriskForm {
            // `OPTIONS *` asks about the server, not a resource: answered here.
            return request.reply(
                status: 200, headers: [HTTPField(name: "Allow", value: "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")])
        }
        let (path, query) = Router.split(target: target)
        if let deliveries, path.hasPrefix(deliveries.statusPrefix) {
            let id = requestID(of: request)
            return deliveries.status(request, path: path, requestID: id, worker: self)
        }
        guard let routeIndex = runtime.router.route(path: path, method: method) else {
            return noRoute(request, method: method, path: path)
        }
        let route = runtime.routes[routeIndex]
        if !route.allowTrace, method.utf8.count == 5, RouteProblems.echoesRequest(method) {
            let (problem, allow) = RouteProblems.traceRefused(method: method, route: route, requestID: requestID(of: request))
            ProblemResponder.respond(request, problem, extraHeaders: [allow])
            return
        }
        guard let upstreamTarget = Router.upstreamTarget(path: path, query: query, stripPrefix: route.stripPrefix) else {
            ProblemResponder.respond(
                request, RouteProblems.prefixLeavesDotSegment(path: path, requestID: requestID(of: request)))
            return
        }
        var fields: RateLimitFields?
        var key: String?
        if let limit = route.rateLimit {
            if let decided = request.headDecision {
                // A request with a body: judged at its head, before the body was read.
                let admission = unsafeDowncast(decided, to: HeadAdmission.self)
                fields = admission.fields
                key = admission.key
            } else {
                // A long key is its digest from here on: the bucket, the queue and pacing keep it bounded.
                let limitKey = rateLimitKey(request, limit)
                key = limitKey.text
                let now = clock.now()
                switch limit.admit(key: limitKey, at: now) {
                case let .pass(limitFields):
                    fields = limitFields
                case let .wait(delay, ticket):
                    return enqueue(
                        request, route: route, limit: limit, key: limitKey, ticket: ticket, target: upstreamTarget,
                        delay: delay, at: now)
                case let .refuse(retryAfter, limitFields):
                    return rateLimited(request, route: route, retryAfter: retryAfter, fields: limitFields)
                }
            }
        }
        dispatch(request, route: route, method: method, target: upstreamTarget, fields: fields, key: key)
    }

    private func rateLimitKey(_ request: HTTPRequest, _ limit: RouteRateLimit) -> RateLimitBucketKey {
        RateLimitBucketKey(RateLimitKey.of(request, limit.configuration.key, trusted: runtime.configuration.trustedProxies))
    }

    /// Waits in the route's queue for its turn (`target` nil: a head whose body is read after it).
    private func enqueue(
        _ request: HTTPRequest, route: RuntimeRoute, limit: RouteRateLimit, key: RateLimitBucketKey, ticket: UInt64,
        target: String?, delay: Duration, at now: Instant
    ) {
        let waiting = QueuedRequest(
            worker: self, request: request, route: route, limit: limit, key: key, ticket: ticket, target: target, at: now)
        queued[ObjectIdentifier(waiting)] = waiting
        shared.inFlight.add(1)
        rateLimitMetrics.limited(route: route.label, outcome: "queued")
        rateLimitMetrics.queueDepth(route: route.label, limit.queued.load(ordering: .relaxed))
        waiting.start(after: delay)
    }

    /// The limited route `holdsBody` found for the head now held (same pass).
    private var heldRoute: RuntimeRoute?

    /// A request with a body on a rate-limited route is judged at its head:
    /// a client over the limit is refused (or waits) before any of its body
    /// is kept, so its stalled uploads cannot take the body budget from
    /// other clients. What `serve` answers before the limit (no route, a
    /// refused TRACE, a prefix that leaves a dot-segment) is left to it.
    func holdsBody(_ request: HTTPRequest) -> Bool {
        guard runtime.hasRateLimits, !request.isAsteriskForm else { return false }
        let (path, query) = Router.split(target: request.target)
        if let deliveries, path.hasPrefix(deliveries.statusPrefix) { return false }
        let method = request.method
        guard let routeIndex = runtime.router.route(path: path, method: method) else { return false }
        let route = runtime.routes[routeIndex]
        guard route.rateLimit != nil, route.allowTrace || method.utf8.count != 5 || !RouteProblems.echoesRequest(method),
            Router.upstreamTarget(path: path, query: query, stripPrefix: route.stripPrefix) != nil
        else { return false }
        heldRoute = route
        return true
    }

    /// An HTTP/2 body streams to its upstream as it arrives, except on a
    /// route that stores requests (`delivery: later` needs the whole body)
    /// and for requests no route takes (answered without their body).
    func streamsBody(_ request: HTTPRequest) -> Bool {
        guard !request.isAsteriskForm else { return false }
        let (path, _) = Router.split(target: request.target)
        if let deliveries, path.hasPrefix(deliveries.statusPrefix) { return false }
        guard let routeIndex = runtime.router.route(path: path, method: request.method) else { return false }
        let route = runtime.routes[routeIndex]
        guard route.delivery.mode == .now else { return false }
        // Sent again after it began only by a retry or by a replay after a
        // token refresh (a 401): without either, no copy is kept for one.
        request.keepsStreamedBody = route.retry.configuration.attempts > 1 || shared.guards[route.upstreamIndex].tokens != nil
        return true
    }

    func bodyHeld(_ request: HTTPRequest) {
        guard let route = heldRoute, let limit = route.rateLimit else { return request.readBody() }
        heldRoute = nil
        let key = rateLimitKey(request, limit)
        let now = clock.now()
        switch limit.admit(key: key, at: now) {
        case let .pass(fields):
            request.headDecision = HeadAdmission(fields, key: key)
            request.readBody()
        case let .wait(delay, ticket):
            enqueue(request, route: route, limit: limit, key: key, ticket: ticket, target: nil, delay: delay, at: now)
        case let .refuse(retryAfter, fields):
            // Answered at the head: the connection closes after the 429 and the body is never read.
            rateLimited(request, route: route, retryAfter: retryAfter, fields: fields)
        }
    }

    /// A request's turn came after its wait in a rate-limit queue, or it left.
    func leftQueue(_ waiting: QueuedRequest, served: Bool) {
        guard queued.removeValue(forKey: ObjectIdentifier(waiting)) != nil else { return }
        shared.inFlight.add(-1)
        waiting.limit.dequeued()
        rateLimitMetrics.queueDepth(route: waiting.route.label, waiting.limit.queued.load(ordering: .relaxed))
        guard served else { return }
        let now = clock.now()
        rateLimitMetrics.waited(route: waiting.route.label, now - waiting.queuedAt)
        let fields = waiting.limit.fields(key: waiting.key, at: now)
        guard let target = waiting.target else {
            // Its turn came at its head: now its body, then `serve`.
            waiting.request.headDecision = HeadAdmission(fields, key: waiting.key)
            return waiting.request.readBody()
        }
        dispatch(
            waiting.request, route: waiting.route, method: waiting.request.method, target: target, fields: fields,
            key: waiting.key.text)
    }

    /// Over the route's rate limit: 429 RATE_LIMITED with when to come back.
    private func rateLimited(_ request: HTTPRequest, route: RuntimeRoute, retryAfter: Int, fields: RateLimitFields) {
        rateLimitMetrics.limited(route: route.label, outcome: "rejected")
        let problem = RouteProblems.rateLimited(route: route, retryAfter: retryAfter, requestID: requestID(of: request))
        ProblemResponder.respond(request, problem, extraHeaders: fields.fields)
    }

    /// The request goes on: stored for later, or an exchange with its
    /// upstream. `key`: its rate-limit key, if the route has a limit.
    private func dispatch(
        _ request: HTTPRequest, route: RuntimeRoute, method: String, target upstreamTarget: String, fields: RateLimitFields?,
        key: String?
    ) {
        if route.delivery.mode == .later {
            let (command, trace) = makeCommand(request, method: method, target: upstreamTarget, route: route)
            if let trace, let tracer = shared.tracer {
                // The accepting request's span: until the request is handed to the store.
                tracer.exporter.submit(
                    trace.spans(
                        tracer: tracer, endedAt: clock.now(), method: method, route: route.label,
                        upstream: runtime.upstreams[route.upstreamIndex].name, status: 0, code: "DELIVER_LATER", attempts: 0))
            }
            guard let deliveries else {
                // A reload cannot add a later route without the store (RestartOnlyKeys); kept safe anyway.
                return ProblemResponder.answer(
                    request,
                    Problem(.overloaded, requestID: command.requestID, detail: "The delivery store is not open; restart the proxy."))
            }
            return deliveries.accept(request, command: command, route: route, worker: self)
        }
        let (command, trace) = makeCommand(request, method: method, target: upstreamTarget, route: route)
        let exchange = Exchange(
            worker: self, request: request, route: route, upstream: runtime.upstreams[route.upstreamIndex],
            guardian: shared.guards[route.upstreamIndex], command: command,
            upgrade: UpgradeRequest.of(request, method: method, route: route), trace: trace,
            bodyStream: request.takeBodyStream())
        exchange.rateLimitFields = fields
        if exchange.guardian.pausesClients { exchange.pacingKey = pacingKey(request, route: route, rateLimitKey: key) }
        if exchange.guardian.adaptive != nil {
            // Whom the upstream's slots are shared between (issue 44): the
            // client as the route's rate limit knows it, else its address
            // (the connection's own text, made once, unless a trusted proxy
            // names the client).
            let trusted = runtime.configuration.trustedProxies
            let client =
                key.flatMap { $0.isEmpty ? nil : $0 }
                ?? (trusted.isEmpty ? request.peerAddress : RateLimitKey.clientIP(request, trusted: trusted))
            exchange.slotHolder.client = Self.clientHash(client)
        }
        active[ObjectIdentifier(exchange)] = exchange
        shared.inFlight.add(1)
        exchange.start()
    }

    /// FNV-1a of a client's key (a bucket of an adaptive upstream's slots).
    static func clientHash(_ key: String) -> Int {
        var key = key
        return key.withUTF8 { bytes in
            var h: UInt64 = 0xcbf2_9ce4_8422_2325
            for b in bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
            return Int(truncatingIfNeeded: h ^ (h >> 29))
        }
    }

    /// Whom an upstream's 429 to this request is about: the client as the
    /// route's rate limit knows it (its `key`: a header's value, or the
    /// address), else its address after `trusted_proxies`. A limit keyed
    /// by `route` makes the route's clients one: a 429 holds that route.
    private func pacingKey(_ request: HTTPRequest, route: RuntimeRoute, rateLimitKey: String?) -> String {
        if let rateLimitKey { return rateLimitKey.isEmpty ? "r:" + route.label : rateLimitKey }
        return RateLimitKey.clientIP(request, trusted: runtime.configuration.trustedProxies)
    }

    /// `Expect: 100-continue`: the client is invited to send its body only
    /// if a route will take it.
    func admit(_ request: HTTPRequest) -> Bool {
        let (path, _) = Router.split(target: request.target)
        guard runtime.router.route(path: path, method: request.method) != nil else {
            noRoute(request, method: request.method, path: path)
            return false
        }
        return true
    }

    private func noRoute(_ request: HTTPRequest, method: String, path: String) {
        ProblemResponder.respond(request, RouteProblems.noRoute(method: method, path: path, requestID: requestID(of: request)))
    }

    // MARK: - Commands

    /// The client's X-Request-Id if it is a sane token, else a new one.
    func requestID(of request: HTTPRequest) -> String {
        ForwardedRequest.validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
    }

    private func makeCommand(_ request: HTTPRequest, method: String, target: String, route: RuntimeRoute)
        -> (Command, RequestTrace?)
    {
        var trace: RequestTrace?
        let now = clock.now()
        let upstream = runtime.upstreams[route.upstreamIndex]
        let command = ForwardedRequest.command(
            from: request, method: method, target: target, route: route, upstream: upstream.name,
            passesTrailers: upstream.speaksH2, deadline: now + route.timeout, ids: &ids, tracer: shared.tracer,
            trace: &trace, now: now)
        return (command, trace)
    }

    // MARK: - Exchanges

    func nextEndpointIndex(for guardian: UpstreamGuard, count: Int) -> Int {
        let l = lane(guardian)
        let i = l.nextEndpoint % count
        l.nextEndpoint = (i + 1) % count
        return i
    }

    // MARK: - Parking lot

    /// False when the process-wide `max_parked` is reached.
    func park(_ exchange: Exchange, reason: Exchange.ParkReason) -> Bool {
        let l = lane(exchange.guardian)
        switch l.parked.park(exchange, reason: reason, arrivedAt: exchange.startedAt, places: shared.parked) {
        case .full: return false
        case .alreadyParked: return true
        case .parked: break
        }
        exchange.guardian.parkedChanged(reason, by: 1)
        shared.events.publish(
            "command_parked",
            [("upstream", exchange.upstream.name), ("reason", reason.rawValue), ("request_id", exchange.command.requestID)])
        logger.debug(
            "command parked",
            metadata: [
                "request_id": "\(exchange.command.requestID)", "upstream": "\(exchange.upstream.name)",
                "reason": "\(reason.rawValue)",
            ])
        return true
    }

    func unpark(_ exchange: Exchange) {
        if let reason = lane(exchange.guardian).parked.unpark(exchange, places: shared.parked) {
            exchange.guardian.parkedChanged(reason, by: -1)
        }
    }

    /// Counts out of the lot what it gave back, by reason (the per-upstream gauges).
    private func leftLot(_ exchanges: [Exchange], guardian: UpstreamGuard) {
        for exchange in exchanges { if let reason = exchange.parked { guardian.parkedChanged(reason, by: -1) } }
    }

    /// The upstream is reachable again (health check) or its circuit closed:
    /// replay every command parked for it (for those reasons) on this worker,
    /// in arrival order.
    func replayParked(guardian: UpstreamGuard, reasons: Set<Exchange.ParkReason>) {
        guard let l = lanes[ObjectIdentifier(guardian)], !l.parked.isEmpty else { return }
        let parked = l.parked.takeAll(for: reasons, places: shared.parked)
        guard !parked.isEmpty else { return }
        leftLot(parked, guardian: guardian)
        logger.info("replaying parked commands", metadata: ["upstream": "\(guardian.name)", "count": "\(parked.count)"])
        shared.events.publish("commands_replayed", [("upstream", guardian.name), ("count", String(parked.count))])
        shared.metrics.replayed(upstream: guardian.name, count: parked.count)
        for exchange in parked { exchange.replay() }
    }

    /// A token refresh ended (on any worker).
    func authDone(guardian: UpstreamGuard, failure: String?) {
        if let failure {
            for exchange in lane(guardian).parked.waiters(for: .auth) { exchange.authFailed(failure) }
        } else {
            replayParked(guardian: guardian, reasons: [.auth])
        }
    }

    /// Starts the single refresh for this upstream on this worker's loop.
    func startRefresh(guardian: UpstreamGuard) {
        guard let source = guardian.tokens else { return }
        let refresh = TokenRefresh(worker: self, guardian: guardian, source: source)
        refreshes[ObjectIdentifier(refresh)] = refresh
        refresh.start()
    }

    func refreshEnded(_ refresh: TokenRefresh) { refreshes[ObjectIdentifier(refresh)] = nil }

    /// Releases one parked command as the half-open probe once `after` passed.
    func scheduleProbe(guardian: UpstreamGuard, after: Duration) {
        lane(guardian).armProbe(after: after)
    }

    func probeDue(_ l: Lane) {
        guard let probe = l.parked.takeProbe(places: shared.parked) else { return }
        leftLot([probe], guardian: l.guardian)
        probe.replay()
    }

    // MARK: - Pacing

    /// The upstream paused itself until `at`: this worker wakes what it
    /// parked for the pause then (a later, longer pause re-arms).
    func schedulePauseEnd(guardian: UpstreamGuard, at until: Instant) {
        lane(guardian).armPause(at: until, now: clock.now())
    }

    /// `exchange` parked for a pause (the upstream's or its client's own):
    /// its lane wakes at that pause's end, if not before.
    func parkedForPause(_ exchange: Exchange) {
        let now = clock.now()
        guard let left = exchange.guardian.pausedFor(client: exchange.pacingKey, at: now) else { return }
        lane(exchange.guardian).armPause(at: now + left, now: now)
    }

    func pauseDue(_ l: Lane) {
        let now = clock.now()
        l.cancelPause()
        // Extended since: wait for the new end.
        if let left = l.guardian.pausedFor(at: now) { return l.armPause(at: now + left, now: now) }
        if l.guardian.endPause(at: now) { shared.metrics.paused(upstream: l.guardian.name, scope: .upstream, seconds: 0) }
        replayPaused(l, at: now)
    }

    /// Requests parked for a pause that is over go, in the order they
    /// arrived (the concurrency limit still applies: the slot queue takes
    /// the rest); those whose client's own pause lasts stay, and the lane
    /// wakes again at the first of their ends.
    private func replayPaused(_ l: Lane, at now: Instant) {
        let guardian = l.guardian
        let paused = l.parked.takeAll(for: [.paused], places: shared.parked) {
            guardian.pausedFor(client: $0.pacingKey, at: now) == nil
        }
        var next: Duration?
        for held in l.parked.waiters(for: .paused) {
            if let left = guardian.pausedFor(client: held.pacingKey, at: now) { next = min(next ?? left, left) }
        }
        if let next { l.armPause(at: now + next, now: now) }
        guard !paused.isEmpty else { return }
        leftLot(paused, guardian: guardian)
        shared.metrics.replayed(upstream: guardian.name, count: paused.count)
        for exchange in paused { exchange.replay() }
    }

    // MARK: - Reload

    /// New commands use the new configuration; exchanges in flight keep
    /// theirs. Commands parked for an upstream that the new configuration
    /// changed or removed are replayed now (under their own configuration).
    /// libcurl's connection caps follow the new `max_connections`.
    func apply(runtime: RuntimeConfiguration, shared: SharedState) {
        self.runtime = runtime
        self.shared = shared
        let caps = runtime.connectionCaps(workers: workers)
        client.setConnectionLimits(perHost: caps.perHost, cached: caps.cached)
        transports.h2.maxConnectionsPerEndpoint = caps.perHost
        let kept = Set(shared.guards.map(ObjectIdentifier.init))
        for (key, l) in lanes where !kept.contains(key) {
            // A reload that changed the upstream ends its pause: what waited goes now.
            if l.guardian.endPause(at: clock.now(), early: true) {
                shared.metrics.paused(upstream: l.guardian.name, scope: .upstream, seconds: 0)
            }
            l.cancelPause()
            let parked = l.parked.takeAll(places: shared.parked)
            leftLot(parked, guardian: l.guardian)
            for exchange in parked { exchange.replay() }
            // Nothing of the old upstream left on this worker: forget its lane.
            if l.isIdle {
                l.close()
                lanes[key] = nil
            }
        }
        openLanes()
    }

    // MARK: - Deliver later

    /// One delivery round of a stored request, run as an exchange whose
    /// answer goes to the store. Routed again: the configuration may have
    /// changed since it was stored.
    func deliver(_ delivery: ClaimedDelivery) {
        guard let deliveries else { return }
        if stopping { return deliveries.roundFailed(delivery, .postpone(at: clock.wallMilliseconds())) }
        var trace: RequestTrace?
        switch ForwardedRequest.command(
            for: delivery, runtime: runtime, now: clock.now(), tracer: shared.tracer, ids: &ids, trace: &trace)
        {
        case let .undeliverable(problem):
            deliveries.roundFailed(delivery, .dead(status: nil, problem: problem.json()))
        case let .command(command, route):
            let exchange = Exchange(
                worker: self, request: DeliverySink(), route: route, upstream: runtime.upstreams[route.upstreamIndex],
                guardian: shared.guards[route.upstreamIndex], command: command, delivery: delivery, trace: trace)
            // The dispatcher is one client of the upstream: a 429 to a
            // round holds the rounds, not the clients sending live requests.
            exchange.pacingKey = "deliver-later"
            exchange.slotHolder.client = "deliver-later".hashValue
            active[ObjectIdentifier(exchange)] = exchange
            exchange.start()
        }
    }

    func finished(_ exchange: Exchange) {
        guard active.removeValue(forKey: ObjectIdentifier(exchange)) != nil else { return }
        if let trace = exchange.trace, let tracer = shared.tracer {
            tracer.exporter.submit(
                trace.spans(
                    tracer: tracer, endedAt: clock.now(), method: exchange.command.method, route: exchange.route.label,
                    upstream: exchange.upstream.name, status: exchange.finalStatus, code: exchange.finalCode,
                    attempts: exchange.command.attempt))
        }
        let duration = clock.now() - exchange.startedAt
        if let delivery = exchange.delivery {
            deliveries?.roundEnded(exchange, delivery: delivery, random: Double(ids.next() % 1_000_000) / 1_000_000)
            logAccess(exchange, duration: duration)
            return
        }
        shared.inFlight.add(-1)
        metrics.request(route: exchange.route, code: exchange.finalCode, duration: duration, tries: exchange.command.attempt)
        if exchange.isGRPC { metrics.grpcCall(route: exchange.route, status: exchange.grpcStatus) }
        logAccess(exchange, duration: duration)
    }

    private func logAccess(_ exchange: Exchange, duration: Duration) {
        // The access log: one line per client request (info level).
        if accessLog.enabled {
            let command = exchange.command
            accessLog.append(
                AccessRecord(
                    requestID: command.requestID, method: command.method, protocolName: exchange.protocolName,
                    route: exchange.route.label, upstream: exchange.upstream.name, status: exchange.finalStatus,
                    code: exchange.finalCode, attempts: command.attempt, durationMicros: duration.nanoseconds / 1000,
                    bytes: exchange.bytesOut, grpcStatus: exchange.isGRPC ? GRPCCall.label(exchange.grpcStatus) : nil))
        }
    }

    /// Drain: no new connections; what is open is still served.
    func stopAccepting() { for s in servers { s.stopAccepting() } }

    /// Drain timed out: every exchange still here gets its answer now,
    /// and every tunnel closes.
    func answerEverything() {
        stopping = true
        // Requests still waiting for a rate-limit token: their turn comes
        // after the drain, so they get their 503 now, not a closed connection.
        for waiting in Array(queued.values) {
            waiting.answerNow(RouteProblems.shuttingDown(requestID: requestID(of: waiting.request)))
        }
        for exchange in Array(active.values) { exchange.answerNow() }
        for tunnel in Array(tunnels.values) { tunnel.shutdown() }
    }

    /// An exchange ended in a tunnel: kept (and counted in flight, so a
    /// drain waits for it until `drain_timeout`) until it closes. Already
    /// counted in `happypath_tunnels_open` (before its 101 was written).
    /// `slotOf`: the upstream's slot the tunnel holds, given back (to the
    /// longest-waiting request, if any) when it closes.
    func tunnelOpened(_ tunnel: Tunnel, route: RuntimeRoute, upstream: RuntimeUpstream, slotOf slot: HeldSlot?) {
        // The client may have gone as it opened (its first bytes could not be written).
        guard !tunnel.isClosed else {
            shared.tunnels.add(-1)
            if let slot { giveBack(slot) }
            return
        }
        let id = ObjectIdentifier(tunnel)
        tunnels[id] = tunnel
        shared.inFlight.add(1)
        let name = upstream.name
        // Alive: the worker holds the tunnel (`tunnels`) and closes every one in `shutdown()`,
        // before the proxy lets go of the worker; `onClose` is cleared as it is called.
        tunnel.onClose = { [unowned self] summary in
            tunnels[id] = nil
            shared.inFlight.add(-1)
            shared.tunnels.add(-1)
            if let slot { giveBack(slot) }
            metrics.tunnelClosed(upstream: name, summary)
            logger.info(
                "tunnel closed",
                metadata: [
                    "upstream": "\(name)", "route": "\(route.label)", "reason": "\(summary.reason.rawValue)",
                    "bytes_to_upstream": "\(summary.bytesToUpstream)", "bytes_to_client": "\(summary.bytesToClient)",
                    "duration_ms": "\(summary.duration.nanoseconds / 1_000_000)",
                ])
        }
    }

    /// Drops everything in flight and closes the listener, in order: the
    /// requests (their transfers and timers), the refreshes, the lanes, the
    /// client connections, libcurl, and the access log's last lines. On the loop.
    func shutdown() {
        for l in lanes.values {
            l.cancelTimers()
            l.slots.removeAllWaiters()
            leftLot(l.parked.takeAll(places: shared.parked), guardian: l.guardian)
        }
        for waiting in queued.values { waiting.abandon() }
        shared.inFlight.add(-queued.count)
        queued.removeAll()
        for exchange in active.values { exchange.abandon() }
        shared.inFlight.add(-active.values.filter { $0.delivery == nil }.count)
        active.removeAll()
        for tunnel in Array(tunnels.values) { tunnel.shutdown() }
        for refresh in refreshes.values { refresh.abandon() }
        refreshes.removeAll()
        lanes.removeAll()
        for s in servers { s.close() }
        transports.shutdown()
        accessLog.flush()
    }
}
