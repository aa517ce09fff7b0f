import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging


/// One event loop's share of the proxy: its listeners (sharing the port
/// with the other workers), its transports (libcurl's multi handle, the
/// proxy's own HTTP/2 client), the exchanges in flight on it, and the
/// services they use, each a type in its own folder: the rate-limit gate
/// (Shaping/), the upstreams' lanes and slots (Lanes/), parking and the
/// breaker's probes (Parking/), pauses (Pacing/), token refreshes (Auth/),
/// tunnels (Tunnels/), delivery rounds (Deliveries/), a reload and the
/// drain's end and shutdown (Lifecycle/). The worker wires them: it routes
/// each request, starts its exchange, and counts its end.
/// Everything here runs on `loop`'s thread.
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
    /// Swapped by a reload; exchanges keep the ones they started with.
    private(set) var runtime: RuntimeConfiguration
    private(set) var shared: SharedState
    let metrics: WorkerMetrics
    let workers: Int
    /// Drain ran out of time: no new tries (the lanes hand freed slots to
    /// nobody), no new delivery rounds.
    var stopping: Bool { lanes.stopping }
    /// The listener's pauses and memory pressure, counted and logged.
    var listenerLog: ListenerLog

    /// The deliver-later store and dispatcher (nil: no route delivers later).
    var deliveries: Deliveries?

    // The services, each owned here for the worker's life (they hold it
    // unowned), made at the end of `init`.
    private(set) var gate: RateLimitGate!
    private(set) var lanes: Lanes!
    private(set) var parking: Parking!
    private(set) var pacing: PauseWaits!
    private(set) var probes: Probes!
    private(set) var refreshes: TokenRefreshes!
    private(set) var tunnels: WorkerTunnels!
    /// Requests on `coalesce:` routes, grouped by key (this worker's only).
    private(set) var coalescing: Coalescing?
    /// The Redis link (`cluster.redis`; nil: none), set before the loop runs.
    var cluster: ClusterLink?

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
        self.clock = clock
        self.logger = logger
        listenerLog = ListenerLog(logger: logger, metrics: metrics)
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
            let serverLimits = runtime.serverLimits(http2: listener.http2, shared: shared)
            servers.append(
                try HTTPServer(
                    loop: loop, host: listener.host, port: listener.port, reusePort: true, limits: serverLimits,
                    delegate: self, tls: listener.tls))
        }
        gate = RateLimitGate(worker: self, metrics: RateLimitMetrics(shared.metrics))
        lanes = Lanes(worker: self)
        parking = Parking(worker: self)
        probes = Probes(worker: self)
        pacing = PauseWaits(worker: self)
        refreshes = TokenRefreshes(worker: self)
        tunnels = WorkerTunnels(worker: self)
        coalescing = Coalescing(
            // Without read-ahead (0), an answer past the connection's buffer is large.
            bound: limits.connectionBuffer, largeAbove: max(limits.readAhead, limits.connectionBuffer), metrics: metrics,
            memory: shared.connectionMemory.coalesced)
        lanes.open(shared.guards)
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
        if method.utf8.count == 7, method == "OPTIONS", let origin = request.header("Origin"),
            let wanted = request.header("Access-Control-Request-Method"), corsPreflight(request, path: path, origin: origin, method: wanted)
        {
            return
        }
        guard let routeIndex = runtime.router.route(path: path, method: method) else {
            return noRoute(request, method: method, path: path)
        }
        let route = runtime.routes[routeIndex]
        if let name = request.connectProtocol, !route.upgrades.contains(name) {
            return refuseTunnel(request, protocol: name, route: route)
        }
        routed(request, to: route)
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
        guard let limit = route.rateLimit else {
            return dispatch(request, route: route, method: method, target: upstreamTarget, fields: nil, key: nil)
        }
        guard case let .pass(fields, key) = gate.admit(request, route: route, limit: limit, target: upstreamTarget) else {
            return
        }
        dispatch(request, route: route, method: method, target: upstreamTarget, fields: fields, key: key)
    }

    /// A CORS preflight for a route with `cors`: answered here, 204, with
    /// the route's CORS fields if the origin, method and headers are
    /// allowed, else none (the browser then refuses the call). False: the
    /// route the preflight asks about has no `cors`, and the OPTIONS request
    /// goes on as any other.
    private func corsPreflight(_ request: HTTPRequest, path: String, origin: String, method: String) -> Bool {
        guard let routeIndex = runtime.router.route(path: path, method: method), let cors = runtime.routes[routeIndex].cors
        else { return false }
        switch cors.preflight(origin: origin, method: method, requestHeaders: request.header("Access-Control-Request-Headers")) {
        case let .allowed(fields):
            request.reply(status: 204, headers: fields + [HTTPField(name: "X-Request-Id", value: requestID(of: request))])
        case let .refused(why):
            logger.debug("CORS preflight refused", metadata: ["route": "\(runtime.routes[routeIndex].label)", "why": "\(why)"])
            request.reply(status: 204, headers: [HTTPField(name: "X-Request-Id", value: requestID(of: request))])
        }
        return true
    }

    /// What a request's route makes of it before anything answers it (also
    /// a refusal at its head, `RateLimitGate.holdsBody`): a gRPC-Web call
    /// on a `grpc:` route, the CORS fields of an allowed origin.
    @inline(__always) func routed(_ request: HTTPRequest, to route: RuntimeRoute) {
        if route.grpc { request.grpcWeb = Self.grpcWebMode(request) }
        if let cors = route.cors, let origin = request.header("Origin"), let fields = cors.answerFields(origin: origin) {
            request.answerFields = fields
        }
    }

    /// An HTTP/2 extended CONNECT (RFC 8441) for a protocol its route does
    /// not tunnel: 501, saying which the route takes.
    private func refuseTunnel(_ request: HTTPRequest, protocol name: String, route: RuntimeRoute) {
        let takes = route.upgrades.isEmpty ? "tunnels nothing (no upgrades)" : "tunnels only \(route.upgrades.joined(separator: ", ")) (upgrades)"
        let detail = "An extended CONNECT for '\(name)' reached route \(route.label), which \(takes)."
        ProblemResponder.respond(request, Problem(.notImplemented, requestID: requestID(of: request), detail: detail))
    }

    /// A gRPC-Web call's mode, from its `content-type` (nil: not gRPC-Web).
    /// Read in place: a gRPC call's own content type costs no allocation.
    static func grpcWebMode(_ request: HTTPRequest) -> GRPCWeb.Mode? {
        var mode: GRPCWeb.Mode?
        var seen = false
        request.forEachRawHeader { name, value in
            guard !seen, name.count == 12, HTTPBytes.equals(name, "content-type") else { return }
            seen = true
            mode = GRPCWeb.mode(contentType: value)
        }
        return mode
    }

    /// A request with a body on a rate-limited route is judged at its head (`RateLimitGate`).
    func holdsBody(_ request: HTTPRequest) -> Bool { gate.holdsBody(request) }
    func bodyHeld(_ request: HTTPRequest) { gate.bodyHeld(request) }

    /// An HTTP/2 body streams to its upstream as it arrives, except on a
    /// route that stores requests (`delivery: later` needs the whole body)
    /// and for requests no route takes (answered without their body).
    func streamsBody(_ request: HTTPRequest) -> Bool {
        guard !request.isAsteriskForm else { return false }
        // An extended CONNECT's body is its tunnel's bytes (RFC 8441), which
        // never end: they stream (held within the stream's window, never
        // kept: a tunnel is never sent twice), whatever answers the request.
        if request.connectProtocol != nil {
            request.keepsStreamedBody = false
            return true
        }
        let (path, _) = Router.split(target: request.target)
        if let deliveries, path.hasPrefix(deliveries.statusPrefix) { return false }
        guard let routeIndex = runtime.router.route(path: path, method: request.method) else { return false }
        let route = runtime.routes[routeIndex]
        guard route.delivery.mode == .now else { return false }
        // A gRPC-Web text body is decoded whole before it goes (one
        // message: gRPC-Web calls are unary or server streaming).
        if route.grpc, Self.grpcWebMode(request) == .text { return false }
        // Sent again after it began only by a retry or by a replay after a
        // token refresh (a 401): without either, no copy is kept for one.
        request.keepsStreamedBody = route.retry.configuration.attempts > 1 || shared.guards[route.upstreamIndex].tokens != nil
        return true
    }

    /// The request goes on: stored for later, or an exchange with its
    /// upstream. `key`: its rate-limit key, if the route has a limit.
    func dispatch(
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
        // A tunnel's bytes are the tunnel's to read, never a try's body
        // (only a streamed body asks: HTTP/1.1 pays nothing).
        var bodyStream = request.takeBodyStream()
        if bodyStream != nil, request.connectProtocol != nil { bodyStream = nil }
        var body: RequestBody?
        if let web = request.grpcWeb, bodyStream == nil {
            switch GRPCWebRequest.body(request.takeBody(), mode: web) {
            case let .success(decoded): body = decoded
            case let .failure(refusal):
                // A gRPC status (INTERNAL, gRPC's word for a 400), as the server's own would be.
                ProblemResponder.respond(request, Problem(.badRequest, requestID: requestID(of: request), detail: refusal.detail))
                return
            }
        }
        let (command, trace) = makeCommand(request, method: method, target: upstreamTarget, route: route, body: body)
        let exchange = Exchange(
            env: self, request: request, route: route, upstream: runtime.upstreams[route.upstreamIndex],
            guardian: shared.guards[route.upstreamIndex], command: command,
            upgrade: UpgradeRequest.of(request, method: method, route: route), trace: trace,
            bodyStream: bodyStream)
        exchange.rateLimitFields = fields
        let trusted = runtime.configuration.trustedProxies
        if exchange.guardian.pausesClients {
            exchange.pacingKey = PauseWaits.clientKey(request, route: route, rateLimitKey: key, trusted: trusted)
        }
        if exchange.guardian.adaptive != nil {
            exchange.slotHolder.client = Lanes.slotClient(request, rateLimitKey: key, trusted: trusted)
        }
        shared.inFlight.add(1)
        started(exchange)
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

    private func makeCommand(
        _ request: HTTPRequest, method: String, target: String, route: RuntimeRoute, body: RequestBody? = nil
    ) -> (Command, RequestTrace?) {
        var trace: RequestTrace?
        let now = clock.now()
        let upstream = runtime.upstreams[route.upstreamIndex]
        let command = ForwardedRequest.command(
            from: request, method: method, target: target, route: route, upstream: upstream.name,
            passesTrailers: upstream.speaksH2, deadline: now + route.timeout, ids: &ids, tracer: shared.tracer,
            trace: &trace, now: now, body: body)
        return (command, trace)
    }

    // MARK: - Reload

    /// New commands use the new configuration; exchanges in flight keep
    /// theirs. What else it changes on this worker: `WorkerReload`.
    func apply(runtime: RuntimeConfiguration, shared: SharedState) {
        self.runtime = runtime
        self.shared = shared
        WorkerReload.carryOver(self)
    }

    // MARK: - The end of an exchange

    /// An exchange (a request's, a delivery round's), owned here until it finishes.
    func started(_ exchange: Exchange) {
        active[ObjectIdentifier(exchange)] = exchange
        exchange.start()
    }

    func finished(_ exchange: Exchange) {
        guard active.removeValue(forKey: ObjectIdentifier(exchange)) != nil else { return }
        if let trace = exchange.trace, let tracer = shared.tracer {
            tracer.exporter.submit(
                trace.spans(
                    tracer: tracer, endedAt: clock.now(), method: exchange.command.method, route: exchange.route.label,
                    upstream: exchange.upstream.name, status: exchange.finalStatus, code: exchange.finalCode,
                    attempts: exchange.triesSent))
        }
        let duration = clock.now() - exchange.startedAt
        if let delivery = exchange.delivery {
            deliveries?.roundEnded(exchange, delivery: delivery, random: Double(ids.next() % 1_000_000) / 1_000_000)
            accessLog.append(exchange, duration: duration)
            return
        }
        shared.inFlight.add(-1)
        metrics.request(route: exchange.route, code: exchange.finalCode, duration: duration, tries: exchange.triesSent)
        if exchange.isGRPC { metrics.grpcCall(route: exchange.route, status: exchange.grpcStatus) }
        accessLog.append(exchange, duration: duration)
    }

    /// Drain: no new connections; what is open is still served.
    func stopAccepting() { for s in servers { s.stopAccepting() } }

    /// Drain timed out: every exchange still here gets its answer now,
    /// and every tunnel closes (`WorkerShutdown`).
    func answerEverything() { WorkerShutdown.answerEverything(self) }

    /// Drops everything in flight and closes the listeners (`WorkerShutdown`). On the loop.
    func shutdown() { WorkerShutdown.shutdown(self) }

    /// The exchanges in flight now (for a drain or the shutdown).
    var exchanges: Dictionary<ObjectIdentifier, Exchange>.Values { active.values }

    /// The shutdown abandoned every exchange: none is kept any more.
    func forgetExchanges() { active.removeAll() }
}
