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
    private(set) var server: HTTPServer!
    let client: UpstreamClient
    var ids = IdentifierGenerator()
    /// An upstream silent this long in mid-response is cut (limits.client_timeout).
    let idleTimeout: Duration
    /// Exchanges in flight, retained here until they finish.
    private var active: [ObjectIdentifier: Exchange] = [:]
    /// Swapped by a reload; exchanges keep the ones they started with.
    private(set) var runtime: RuntimeConfiguration
    private(set) var shared: SharedState
    let metrics: WorkerMetrics
    private let workers: Int
    /// Per upstream (keyed by its guard, which survives a reload of an
    /// unchanged upstream): round-robin position, parked exchanges (the
    /// reachability and auth listeners' lot), the half-open probe timer,
    /// and the slots for tries in flight on this worker with their bounded queue.
    private var lanes: [ObjectIdentifier: Lane] = [:]
    /// Drain ran out of time: freed slots go to nobody (no new tries).
    private var stopping = false
    /// EMFILE pauses since the last log line about them.
    private var acceptPauses = 0
    private var lastAcceptPauseLog: Instant?

    /// The deliver-later store and dispatcher (nil: no route delivers later).
    var deliveries: Deliveries?

    /// Requests waiting in a route's rate-limit queue, owned here until their turn.
    private var queued: [ObjectIdentifier: QueuedRequest] = [:]
    let rateLimitMetrics: RateLimitMetrics

    /// Token refreshes running on this worker, owned here until they report.
    private var refreshes: [ObjectIdentifier: TokenRefresh] = [:]

    /// Owned by the worker's `lanes` (until shutdown empties them).
    final class Lane: LoopEventTarget {
        let worker: ProxyWorker
        let guardian: UpstreamGuard
        var nextEndpoint = 0
        /// Parked exchanges; each holds one of the process's `max_parked` places.
        var parked = ParkingLot<Exchange>()
        var probeTimer: LoopEvent?
        /// Fires when the upstream's pause (pacing) should be over.
        var pauseTimer: LoopEvent?
        /// Tries in flight on this worker, and the queue waiting for a slot.
        var slots: ConcurrencyLimiter<Exchange>

        init(worker: ProxyWorker, guardian: UpstreamGuard, slots: ConcurrencyLimiter<Exchange>.Configuration) {
            self.worker = worker
            self.guardian = guardian
            self.slots = ConcurrencyLimiter(slots)
        }

        func loopEventFired(_ event: LoopEvent) {
            if event.tag == Self.pauseTag { return worker.pauseDue(self) }
            worker.probeDue(self)
        }

        static let pauseTag = 1
    }

    private func lane(_ guardian: UpstreamGuard) -> Lane {
        if let lane = lanes[ObjectIdentifier(guardian)] { return lane }
        // The worker's share of the upstream's connections: a guard's
        // `connections` never changes, so neither does its lane's limit.
        let lane = Lane(worker: self, guardian: guardian, slots: .init(connections: guardian.connections, workers: workers))
        lanes[ObjectIdentifier(guardian)] = lane
        return lane
    }

    init(
        loop: EventLoop, runtime: RuntimeConfiguration, shared: SharedState, host: String, port: Int, workers: Int,
        clock: Clock, logger: Logger, accessLog: AccessLogSettings
    ) throws(SocketError) {
        self.loop = loop
        self.accessLog = AccessLog(settings: accessLog, loop: loop)
        self.runtime = runtime
        self.shared = shared
        self.workers = workers
        metrics = WorkerMetrics(shared.metrics)
        rateLimitMetrics = RateLimitMetrics(shared.metrics.registry)
        self.clock = clock
        self.logger = logger
        idleTimeout = runtime.configuration.limits.clientTimeout
        let caps = runtime.connectionCaps(workers: workers)
        client = UpstreamClient(loop: loop, maxConnectionsPerHost: caps.perHost, maxCachedConnections: caps.cached)
        let limits = runtime.configuration.limits
        server = try HTTPServer(
            loop: loop, host: host, port: port, reusePort: true,
            limits: HTTPServerLimits(
                maxHeaderBytes: limits.maxHeaderBytes, maxBodyBytes: limits.maxRequestBody, timeout: limits.clientTimeout,
                bodyBudget: shared.bodies, path: runtime.configuration.pathNormalization,
                connections: shared.connections),
            delegate: self)
    }

    var port: Int { server.port }

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
            let id = validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
            return deliveries.status(request, path: path, requestID: id, worker: self)
        }
        guard let routeIndex = runtime.router.route(path: path, method: method) else {
            return noRoute(request, method: method, path: path)
        }
        let route = runtime.routes[routeIndex]
        if !route.allowTrace, method.utf8.count == 5, Self.echoesRequest(method) {
            return traceRefused(request, route: route)
        }
        guard let upstreamTarget = Router.upstreamTarget(path: path, query: query, stripPrefix: route.stripPrefix) else {
            return prefixLeavesDotSegment(request, path: path, route: route)
        }
        var fields: RateLimitFields?
        if let limit = route.rateLimit {
            let key = RateLimitKey.of(request, limit.configuration.key, trusted: runtime.configuration.trustedProxies)
            let now = clock.now()
            switch limit.admit(key: key, at: now) {
            case let .pass(limitFields):
                fields = limitFields
            case let .wait(delay):
                let waiting = QueuedRequest(
                    worker: self, request: request, route: route, limit: limit, key: key, target: upstreamTarget, at: now)
                queued[ObjectIdentifier(waiting)] = waiting
                shared.inFlight.add(1)
                rateLimitMetrics.limited(route: route.label, outcome: "queued")
                rateLimitMetrics.queueDepth(route: route.label, limit.queued.load(ordering: .relaxed))
                return waiting.start(after: delay)
            case let .refuse(retryAfter, limitFields):
                return rateLimited(request, route: route, retryAfter: retryAfter, fields: limitFields)
            }
        }
        dispatch(request, route: route, method: method, target: upstreamTarget, fields: fields)
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
        dispatch(waiting.request, route: waiting.route, method: waiting.request.method, target: waiting.target, fields: fields)
    }

    /// Over the route's rate limit: 429 RATE_LIMITED with when to come back.
    private func rateLimited(_ request: HTTPRequest, route: RuntimeRoute, retryAfter: Int, fields: RateLimitFields) {
        rateLimitMetrics.limited(route: route.label, outcome: "rejected")
        let id = validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
        var problem = Problem(
            .rateLimited, requestID: id,
            detail: "Over this route's rate limit (rate_limit on \(route.label)); a token is due in \(retryAfter) s.")
        problem.retryAfterSeconds = retryAfter
        ProblemResponder.respond(request, problem, extraHeaders: fields.fields)
    }

    /// The request goes on: stored for later, or an exchange with its upstream.
    private func dispatch(
        _ request: HTTPRequest, route: RuntimeRoute, method: String, target upstreamTarget: String, fields: RateLimitFields?
    ) {
        if route.delivery.mode == .later {
            let command = makeCommand(request, method: method, target: upstreamTarget, route: route)
            guard let deliveries else {
                // A reload cannot add a later route without the store (RestartOnlyKeys); kept safe anyway.
                return ProblemResponder.answer(
                    request,
                    Problem(.overloaded, requestID: command.requestID, detail: "The delivery store is not open; restart the proxy."))
            }
            return deliveries.accept(request, command: command, route: route, worker: self)
        }
        let exchange = Exchange(
            worker: self, request: request, route: route, upstream: runtime.upstreams[route.upstreamIndex],
            guardian: shared.guards[route.upstreamIndex],
            command: makeCommand(request, method: method, target: upstreamTarget, route: route))
        exchange.rateLimitFields = fields
        active[ObjectIdentifier(exchange)] = exchange
        shared.inFlight.add(1)
        exchange.start()
    }

    func reject(_ request: HTTPRequest, reason: HTTP1Refusal) {
        let id = validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
        logger.debug(
            "request refused",
            metadata: ["request_id": "\(id)", "reason": "\(reason.rawValue)", "peer": "\(request.peerAddress)"])
        metrics.refused(reason)
        ProblemResponder.respond(request, ProblemResponder.problem(for: reason, requestID: id, limits: server.limits))
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
        let id = validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
        ProblemResponder.respond(request, Problem(.noRoute, requestID: id, detail: "No route matches \(method) \(path)."))
    }

    /// TRACE, and Microsoft's TRACK, in any case: methods are case-sensitive,
    /// but upstreams that upper-case them would echo the request all the same.
    static func echoesRequest(_ method: String) -> Bool {
        var m = method
        return m.withUTF8 { b in
            let raw = UnsafeRawBufferPointer(b)
            return HTTPBytes.equals(raw, "trace") || HTTPBytes.equals(raw, "track")
        }
    }

    /// TRACE asks the upstream to echo the request back, credentials and
    /// cookies included (cross-site tracing): answered here, 405, unless the
    /// route sets `allow_trace`.
    private func traceRefused(_ request: HTTPRequest, route: RuntimeRoute) {
        let id = validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
        let allowed = route.allowedMethods.filter { !Self.echoesRequest($0) }.joined(separator: ", ")
        ProblemResponder.respond(
            request,
            Problem(
                .methodNotAllowed, requestID: id,
                detail: "\(request.method) is not forwarded on this route; set allow_trace: true on the route to forward it."),
            extraHeaders: [HTTPField(name: "Allow", value: allowed)])
    }

    /// `strip_prefix` ends inside a path segment and removing it would send
    /// the upstream a dot-segment (`/pub../x` → `/../x`).
    private func prefixLeavesDotSegment(_ request: HTTPRequest, path: String, route: RuntimeRoute) {
        let id = validRequestID(request.header("X-Request-Id")) ?? ids.requestID()
        ProblemResponder.respond(
            request,
            Problem(
                .badRequest, requestID: id,
                detail: "The path \(path) would reach the upstream with a dot-segment once the route's strip_prefix is removed."))
    }

    /// Out of descriptors: the listener pauses (see HTTPServer). One log
    /// line per interval, however often it happens; every pause is counted.
    func acceptCapped(limit: Int) {
        metrics.acceptCapped()
        acceptPauses += 1
        let now = clock.now()
        if let last = lastAcceptPauseLog, now - last < .seconds(5) { return }
        lastAcceptPauseLog = now
        logger.warning(
            "the process holds limits.max_connections client connections; new ones wait in the backlog",
            metadata: [
                "max_connections": "\(limit)", "pauses_since_last_log": "\(acceptPauses)",
                "hint": "raise limits.max_connections if the machine has room, or lower client_timeout to close idle clients sooner",
            ])
        acceptPauses = 0
    }

    func acceptPaused(errno code: Int32, pause: Duration) {
        metrics.acceptPaused()
        acceptPauses += 1
        let now = clock.now()
        if let last = lastAcceptPauseLog, now - last < .seconds(5) { return }
        lastAcceptPauseLog = now
        logger.error(
            "cannot accept connections: \(String(cString: strerror(code))); pausing the listener",
            metadata: [
                "pause_ms": "\(pause.nanoseconds / 1_000_000)", "pauses_since_last_log": "\(acceptPauses)",
                "hint": "raise the open-files limit (ulimit -n / LimitNOFILE) or lower the number of idle clients",
            ])
        acceptPauses = 0
    }

    // MARK: - Commands

    /// Snapshots the request: headers as they go upstream (hop-by-hop
    /// removed, forwarding headers added) written once into one block, the
    /// body, the deadline.
    private func makeCommand(_ request: HTTPRequest, method: String, target: String, route: RuntimeRoute) -> Command {
        // Room for every field (each gains an 8-byte prefix) and the five
        // added ones, so the block is allocated once.
        let headers = HeaderBlock(capacity: request.headBytes * 2 + 384)
        var requestID: String?
        var host: UnsafeRawBufferPointer?
        var forwardedFor: [UnsafeRawBufferPointer] = []
        var hasForwardedProto = false
        var hasForwardedHost = false
        var hasTraceparent = false
        // Fields a `Connection` header names are hop-by-hop for this request
        // (one pass over the head, however many tokens it lists).
        let nominated = request.connectionNominatesFields ? request.nominatedFields() : []
        var index = -1
        // The raw bytes stay valid until the request is answered, which is
        // after this returns.
        request.forEachRawHeader { name, value in
            index += 1
            if !nominated.isEmpty, nominated[index] { return }
            if HopByHop.isHopByHop(name) { return }
            switch name.count {
            case 4 where HTTPBytes.equals(name, "host"):
                host = value
                return
            case 6 where HTTPBytes.equals(name, "expect"):
                return  // the edge already answered 100-continue
            case 11 where HTTPBytes.equals(name, "traceparent"):
                hasTraceparent = true
            case 12 where HTTPBytes.equals(name, "x-request-id"):
                if requestID == nil { requestID = validRequestID(value) }
                return  // added back below, exactly once
            case 14 where HTTPBytes.equals(name, "content-length"):
                return  // libcurl sends the length of the body it sends
            case 15 where HTTPBytes.equals(name, "x-forwarded-for"):
                // Several lines form one list (RFC 9110 section 5.3).
                forwardedFor.append(value)
                return
            case 16 where HTTPBytes.equals(name, "x-forwarded-host"):
                hasForwardedHost = true
            case 17 where HTTPBytes.equals(name, "x-forwarded-proto"):
                hasForwardedProto = true
            default: break
            }
            headers.append(name: name, value: value)
        }
        let id = requestID ?? ids.requestID()
        headers.append(name: "X-Request-Id", value: id)
        var peer = request.peerAddress
        peer.withUTF8 { peerBytes in
            let length = forwardedFor.reduce(peerBytes.count) { $0 + $1.count + 2 }
            headers.append(name: "X-Forwarded-For", valueLength: length) { out in
                var i = 0
                for part in forwardedFor {
                    for b in part {
                        out[i] = b
                        i += 1
                    }
                    out[i] = UInt8(ascii: ",")
                    out[i + 1] = UInt8(ascii: " ")
                    i += 2
                }
                for b in peerBytes {
                    out[i] = b
                    i += 1
                }
            }
        }
        if !hasForwardedProto { headers.append(name: "X-Forwarded-Proto", value: "http" as StaticString) }
        if !hasForwardedHost, let host { headers.append(name: "X-Forwarded-Host", value: host) }
        if !hasTraceparent {
            headers.append(name: "traceparent", valueLength: IdentifierGenerator.traceparentLength) {
                ids.writeTraceparent(into: $0)
            }
        }

        return Command(
            requestID: id, method: method, target: target, headers: headers, body: request.takeBody(),
            routeIndex: route.index,
            upstream: runtime.upstreams[route.upstreamIndex].name, deadline: clock.now() + route.timeout)
    }

    private func validRequestID(_ value: UnsafeRawBufferPointer) -> String? {
        guard !value.isEmpty, value.count <= 128, value.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") })
        else { return nil }
        return String(decoding: value, as: UTF8.self)
    }

    /// A client's X-Request-Id is kept if it is a sane token; anything else
    /// (too long, control characters) is replaced so logs stay clean.
    private func validRequestID(_ value: String?) -> String? {
        guard let value, !value.isEmpty, value.utf8.count <= 128,
            value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") })
        else { return nil }
        return value
    }

    // MARK: - Exchanges

    func nextEndpointIndex(for guardian: UpstreamGuard, count: Int) -> Int {
        let l = lane(guardian)
        let i = l.nextEndpoint % count
        l.nextEndpoint = (i + 1) % count
        return i
    }

    // MARK: - Concurrency limit

    /// A slot for one try; else a place in the upstream's queue; else
    /// overloaded (OVERLOADED).
    func acquireSlot(_ exchange: Exchange, guardian: UpstreamGuard) -> ConcurrencyLimiter<Exchange>.Acquisition {
        lane(guardian).slots.acquire(exchange)
    }

    /// A slot for a hedge, only if one is free now and nobody waits for one.
    func tryAcquireSlot(guardian: UpstreamGuard) -> Bool { lane(guardian).slots.tryAcquire() }

    /// A try ended: its slot goes to the longest-waiting exchange (none
    /// once drain ran out of time).
    func releaseSlot(guardian: UpstreamGuard) {
        if case let .handedOver(next) = lane(guardian).slots.release(handOver: !stopping) { next.slotGranted() }
    }

    func leaveQueue(_ exchange: Exchange, guardian: UpstreamGuard) { lane(guardian).slots.leave(exchange) }

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
        let l = lane(guardian)
        guard l.probeTimer == nil else { return }
        let event = loop.takeEvent(target: l)
        l.probeTimer = event
        event.arm(after: after)
    }

    fileprivate func probeDue(_ l: Lane) {
        l.probeTimer?.recycle()
        l.probeTimer = nil
        guard let probe = l.parked.takeProbe(places: shared.parked) else { return }
        leftLot([probe], guardian: l.guardian)
        probe.replay()
    }

    // MARK: - Pacing

    /// The upstream paused itself until `at`: this worker wakes what it
    /// parked for the pause then (a later, longer pause re-arms).
    func schedulePauseEnd(guardian: UpstreamGuard, at until: Instant) {
        let l = lane(guardian)
        let event = l.pauseTimer ?? loop.takeEvent(target: l, tag: Lane.pauseTag)
        l.pauseTimer = event
        let now = clock.now()
        event.arm(after: until > now ? until - now : .zero)
    }

    fileprivate func pauseDue(_ l: Lane) {
        let now = clock.now()
        if let left = l.guardian.pausedFor(at: now) {
            // Extended since: wait for the new end.
            l.pauseTimer?.arm(after: left)
            return
        }
        l.pauseTimer?.recycle()
        l.pauseTimer = nil
        if l.guardian.endPause(at: now) { shared.metrics.paused(upstream: l.guardian.name, seconds: 0) }
        replayPaused(l)
    }

    /// Requests parked for the pause go, in the order they arrived (the
    /// concurrency limit still applies: the slot queue takes the rest).
    private func replayPaused(_ l: Lane) {
        let paused = l.parked.takeAll(for: [.paused], places: shared.parked)
        guard !paused.isEmpty else { return }
        leftLot(paused, guardian: l.guardian)
        shared.metrics.replayed(upstream: l.guardian.name, count: paused.count)
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
        let kept = Set(shared.guards.map(ObjectIdentifier.init))
        for (key, l) in lanes where !kept.contains(key) {
            // A reload that changed the upstream ends its pause: what waited goes now.
            if l.guardian.endPause(at: clock.now(), early: true) {
                shared.metrics.paused(upstream: l.guardian.name, seconds: 0)
            }
            l.pauseTimer?.recycle()
            l.pauseTimer = nil
            let parked = l.parked.takeAll(places: shared.parked)
            leftLot(parked, guardian: l.guardian)
            for exchange in parked { exchange.replay() }
            // Nothing of the old upstream left on this worker: forget its lane.
            if l.parked.isEmpty, l.slots.isIdle, l.probeTimer == nil, l.pauseTimer == nil {
                lanes[key] = nil
            }
        }
    }

    // MARK: - Deliver later

    /// One delivery round of a stored request, run as an exchange whose
    /// answer goes to the store. Routed again: the configuration may have
    /// changed since it was stored.
    func deliver(_ delivery: ClaimedDelivery) {
        guard let deliveries else { return }
        let (path, query) = Router.split(target: delivery.target)
        guard !stopping, let routeIndex = runtime.router.route(path: path, method: delivery.method) else {
            if stopping {
                return deliveries.roundFailed(delivery, .postpone(at: clock.wallMilliseconds()))
            }
            let problem = Problem(
                .noRoute, requestID: delivery.requestID,
                detail: "No route matches \(delivery.method) \(path) any more; the delivery cannot be sent.")
            return deliveries.roundFailed(delivery, .dead(status: nil, problem: problem.json()))
        }
        let route = runtime.routes[routeIndex]
        let upstream = runtime.upstreams[route.upstreamIndex]
        // Stored targets were normalized at the edge; the check stays for
        // rows stored before paths were normalized.
        let normalized = PathNormalizer.normalize(path, runtime.configuration.pathNormalization)
        guard case let .success(normalPath) = normalized, normalPath == path,
            let target = Router.upstreamTarget(path: path, query: query, stripPrefix: route.stripPrefix)
        else {
            let problem = Problem(
                .badRequest, requestID: delivery.requestID,
                detail: "The stored path \(path) is not a normalized path (dot-segments); the delivery cannot be sent.")
            return deliveries.roundFailed(delivery, .dead(status: nil, problem: problem.json()))
        }
        let command = Command(
            requestID: delivery.requestID, method: delivery.method, target: target,
            headers: HeaderBlock(lines: delivery.headers), body: delivery.body, routeIndex: route.index,
            upstream: upstream.name, deadline: clock.now() + route.timeout)
        let exchange = Exchange(
            worker: self, request: DeliverySink(), route: route, upstream: upstream,
            guardian: shared.guards[route.upstreamIndex], command: command, delivery: delivery)
        active[ObjectIdentifier(exchange)] = exchange
        exchange.start()
    }

    func finished(_ exchange: Exchange) {
        guard active.removeValue(forKey: ObjectIdentifier(exchange)) != nil else { return }
        let duration = clock.now() - exchange.startedAt
        if let delivery = exchange.delivery {
            deliveries?.roundEnded(exchange, delivery: delivery, random: Double(ids.next() % 1_000_000) / 1_000_000)
            logAccess(exchange, duration: duration)
            return
        }
        shared.inFlight.add(-1)
        metrics.request(route: exchange.route, code: exchange.finalCode, duration: duration)
        logAccess(exchange, duration: duration)
    }

    private func logAccess(_ exchange: Exchange, duration: Duration) {
        // The access log: one line per client request (info level).
        if accessLog.enabled {
            let command = exchange.command
            accessLog.append(
                AccessRecord(
                    requestID: command.requestID, method: command.method, route: exchange.route.label,
                    upstream: exchange.upstream.name, status: exchange.finalStatus, code: exchange.finalCode,
                    attempts: command.attempt, durationMicros: duration.nanoseconds / 1000, bytes: exchange.bytesOut))
        }
    }

    /// Drain: no new connections; what is open is still served.
    func stopAccepting() { server.stopAccepting() }

    /// Drain timed out: every exchange still here gets its answer now.
    func answerEverything() {
        stopping = true
        for exchange in Array(active.values) { exchange.answerNow() }
    }

    /// Drops everything in flight and closes the listener, in order: the
    /// requests (their transfers and timers), the refreshes, the lanes, the
    /// client connections, libcurl, and the access log's last lines. On the loop.
    func shutdown() {
        for l in lanes.values {
            l.probeTimer?.recycle()
            l.probeTimer = nil
            l.pauseTimer?.recycle()
            l.pauseTimer = nil
            l.slots.removeAllWaiters()
            leftLot(l.parked.takeAll(places: shared.parked), guardian: l.guardian)
        }
        for waiting in queued.values { waiting.abandon() }
        shared.inFlight.add(-queued.count)
        queued.removeAll()
        for exchange in active.values { exchange.abandon() }
        shared.inFlight.add(-active.values.filter { $0.delivery == nil }.count)
        active.removeAll()
        for refresh in refreshes.values { refresh.abandon() }
        refreshes.removeAll()
        lanes.removeAll()
        server.close()
        client.shutdown()
        accessLog.flush()
    }
}
