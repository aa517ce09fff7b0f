import CoreMetrics
import Foundation
import HappyPathConfig
import HappyPathAdmin
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import HappyPathStore
import Synchronization

/// The admin listener, on its own loop so a busy proxy worker never delays a
/// probe: `/healthz`, `/readyz`, `/metrics`, `/admin/state`, `/admin/events`,
/// and `/status`, the same state as a page (docs/operations.md, "The status page").
/// Answers only its own paths, and only to loopback clients unless
/// `admin.allow_remote` says otherwise (read from the current configuration,
/// so a reload that changes it takes effect at the next request); refuses
/// what a browser could have been tricked into sending (a foreign `Host`, a
/// cross-site POST: `AdminAccessPolicy`), `admin.allowed_hosts` read the
/// same way, and a request that repeats a field those rules read. Every
/// answer carries `X-Content-Type-Options: nosniff` and `Cache-Control:
/// no-store` (`answerFields`).
///
/// Anyone who can reach the port can hold its connections, so they are
/// bounded like the proxy listener's, with fixed limits of their own: at
/// most `maxConnections` at once (more wait in the kernel's backlog), a
/// head within `headDeadline`, `limits.max_header_bytes` (at most 16 KiB),
/// 100 header fields, bodies of 64 KiB counted in `limits.max_buffered_bytes`.
/// An idle flood on this port then holds a few dozen descriptors, never
/// the ones the proxy port needs.
final class AdminServer: HTTPServerDelegate {
    private let ready: ReadyFlag
    // Internal, not private: the admin API's actions are in extensions
    // (AdminServer+Upstreams.swift).
    var shared: SharedState
    var runtime: RuntimeConfiguration
    let clock: Clock
    private(set) var server: HTTPServer!
    let adminLoop: EventLoop
    var ids = IdentifierGenerator()
    /// Earlier readings of the route totals, for rates (on the admin loop).
    private var routeRates = RouteRates()

    init(
        loop: EventLoop, configuration: Configuration, ready: ReadyFlag, shared: SharedState, runtime: RuntimeConfiguration,
        clock: Clock
    ) throws(SocketError) {
        self.ready = ready
        adminLoop = loop
        self.shared = shared
        self.runtime = runtime
        self.clock = clock
        var limits = HTTPServerLimits(
            maxHeaderBytes: min(16 * 1024, configuration.limits.maxHeaderBytes), maxBodyBytes: 64 * 1024,
            timeout: Self.headDeadline, bodyBudget: shared.bodies, connections: ConnectionBudget(limit: Self.maxConnections))
        // What waits for the admin listener's clients (event streams above
        // all) is counted, apart from the proxy's clients' output.
        limits.memory = shared.adminMemory
        server = try HTTPServer(
            loop: loop, host: configuration.admin.listen.host, port: configuration.admin.listen.port, reusePort: false,
            limits: limits, delegate: self)
    }

    /// Connections the admin listener holds at once: a scraper, probes,
    /// a few operators and their `/admin/events` streams fit many times
    /// over; more wait in the kernel's backlog until one closes.
    static let maxConnections = 64
    /// A head must arrive whole within this (else 408), and a connection
    /// is closed after this long idle, or when its client has not read
    /// its output for this long (an `/admin/events` stream included). An
    /// hour before, which let idle connections pile up.
    static let headDeadline: Duration = .seconds(5)

    static let json = [HTTPField(name: "Content-Type", value: "application/json")]

    /// A reload: the state page shows the new configuration. On the admin loop.
    func update(runtime: RuntimeConfiguration, shared: SharedState) {
        self.runtime = runtime
        self.shared = shared
    }

    func serve(_ request: HTTPRequest) {
        Self.stageAnswerFields(request)
        if !runtime.configuration.admin.allowRemote, !Self.isLoopback(request.peerAddress) {
            Self.respond(
                request,
                Problem(
                    .forbidden, requestID: ids.requestID(),
                    detail: "The admin listener answers loopback clients only (admin.allow_remote)."))
            return
        }
        // Before any path is looked at: a refused request learns nothing,
        // not even which paths exist.
        if let detail = AdminAccessPolicy.checkSingleFields(Self.singleFieldCounts(request)) {
            Self.respond(request, Problem(.badRequest, requestID: ids.requestID(), detail: detail))
            return
        }
        let admin = runtime.configuration.admin
        let access = AdminAccessPolicy(allowedHosts: admin.allowedHosts, listenHost: admin.listen.host)
        let host = request.header("Host")
        var verdict = access.checkHost(host, localAddress: request.localAddress)
        if verdict == .allow {
            verdict = access.checkCrossSite(
                method: request.method, host: host, origin: request.header("Origin"),
                fetchSite: request.header("Sec-Fetch-Site"), contentType: request.header("Content-Type"))
        }
        if case let .refuse(detail) = verdict {
            Self.respond(request, Problem(.forbidden, requestID: ids.requestID(), detail: detail))
            return
        }
        let (path, query) = Router.split(target: request.target)
        if AdminAction.isDeliveries(path), shared.deliveries == nil {
            return Self.respond(
                request,
                Problem(.notFound, requestID: ids.requestID(), detail: "No route delivers later (delivery.mode: later)."))
        }
        switch AdminAction.parse(method: request.method, path: path, query: query) {
        case let .refused(refusal):
            Self.respond(request, refusal, requestID: ids.requestID())
        case .healthz:
            request.reply(status: 200, headers: Self.json, body: "{\"status\":\"ok\"}\n")
        case .readyz:
            readyz(request)
        case .metrics:
            guard let deliveries = shared.deliveries else { return metrics(request, stats: nil) }
            // The store's gauges are read on its reader thread; the answer
            // is written back here, on the admin loop.
            let box = LoopBound((request: request, server: self), on: adminLoop)
            let loop = adminLoop
            deliveries.readGauges { stats in loop.execute { box.value.server.metrics(box.value.request, stats: stats) } }
        case .state:
            withSnapshot(request) { request, s in request.reply(status: 200, headers: Self.json, body: s.json) }
        case .root:
            request.reply(status: 302, headers: [HTTPField(name: "Location", value: "/status")], body: "")
        case .status:
            withSnapshot(request) { request, s in
                request.reply(
                    status: 200, headers: StatusPage.headers.map { HTTPField(name: $0.0, value: $0.1) },
                    body: StatusPage.render(s, events: s.events))
            }
        case .statusScript:
            request.reply(
                status: 200, headers: StatusPage.scriptHeaders.map { HTTPField(name: $0.0, value: $0.1) }, body: StatusPage.script
            )
        case .statusStyle:
            request.reply(
                status: 200, headers: StatusPage.styleHeaders.map { HTTPField(name: $0.0, value: $0.1) }, body: StatusPage.style)
        case .events:
            shared.events.subscribe(request)
        case let .purgeStale(prefix):
            purgeStale(request, prefix: prefix)
        case let .upstream(name, action):
            upstreamsAPI(request, path: path, name: name, action: action)
        case let .listDeliveries(q):
            guard let deliveries = deliveries(for: request) else { return }
            listDeliveries(request, q, deliveries)
        case .purgeDeliveries:
            guard let deliveries = deliveries(for: request) else { return }
            purgeDeliveries(request, deliveries)
        case let .delivery(id):
            guard let deliveries = deliveries(for: request) else { return }
            withDelivery(id, request, deliveries) { request, record, _, _ in
                request.reply(status: 200, headers: Self.json, body: Deliveries.json(record) + "\n")
            }
        case let .replayDelivery(id):
            guard let deliveries = deliveries(for: request) else { return }
            withDelivery(id, request, deliveries) { request, record, server, requestID in
                server.replay(request, record: record, deliveries: deliveries, requestID: requestID)
            }
        }
    }

    private func readyz(_ request: HTTPRequest) {
        guard ready.value.load(ordering: .acquiring) else {
            return request.reply(status: 503, headers: Self.json, body: "{\"status\":\"not ready\"}\n")
        }
        // storage.required: not ready while the store cannot write.
        if runtime.configuration.storage.required, let store = shared.deliveries?.store, !store.writable {
            let why = store.unavailable?.message ?? "not connected to the database yet"
            request.reply(
                status: 503, headers: Self.json,
                body: "{\"status\":\"not ready\",\"reason\":\(JSON.quote("the delivery store cannot write (storage.required): " + why))}\n")
            return
        }
        request.reply(status: 200, headers: Self.json, body: "{\"status\":\"ready\"}\n")
    }

    /// `/metrics`, with the delivery store's gauges from `stats` (read before).
    private func metrics(_ request: HTTPRequest, stats: StoreStats?) {
        if let stats { shared.deliveries?.recordGauges(stats, into: shared.metrics) }
        if let exporter = shared.tracer?.exporter {
            shared.metrics.spans(
                exported: exporter.exported.load(ordering: .relaxed), dropped: exporter.dropped.load(ordering: .relaxed))
        }
        shared.metrics.eventSubscribersDropped(shared.events.dropped.load(ordering: .relaxed))
        let now = clock.now()
        for g in shared.guards { shared.metrics.concurrency(upstream: g.name, g.concurrencyReading) }
        for (g, u) in zip(shared.guards, runtime.upstreams) where u.speaksH2 {
            shared.metrics.h2Client(upstream: g.name, g.h2Counters)
        }
        for g in shared.guards where g.pacing != nil {
            shared.metrics.paused(upstream: g.name, scope: .upstream, seconds: g.pausedFor(at: now)?.seconds ?? 0)
            guard g.pausesClients else { continue }
            let clients = g.clientPauses(at: now)
            shared.metrics.paused(upstream: g.name, scope: .client, seconds: clients.longest?.seconds ?? 0)
            shared.metrics.pausedClients(upstream: g.name, count: clients.count)
        }
        shared.checkMemoryPressure()
        request.reply(
            status: 200, headers: [HTTPField(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")],
            body: shared.metrics.exposition(
                bodies: shared.bodies, connections: shared.connections, tunnels: shared.tunnels.current,
                http2: (shared.http2Connections.current, shared.http2Streams.current),
                parkedLimit: runtime.configuration.limits.maxParked,
                memory: shared.memoryReading))
    }

    /// The admin listener holds `maxConnections`: counted, so a flood shows.
    func acceptCapped(limit: Int) {
        let c = acceptCappedCounter ?? shared.metrics.counter("happypath_admin_accept_capped_total", [])
        acceptCappedCounter = c
        c.increment()
    }
    private var acceptCappedCounter: CoreMetrics.Counter?

    func reject(_ request: HTTPRequest, reason: HTTP1Refusal) {
        Self.respond(
            request, ProblemResponder.problem(for: reason, requestID: ids.requestID(), limits: server.limits))
    }

    func reject(_ request: HTTPRequest, refusal: HTTP2RequestRefusal) {
        Self.respond(
            request, ProblemResponder.problem(for: refusal, requestID: ids.requestID(), limits: server.limits))
    }

    // MARK: - What every answer carries

    /// Every admin answer carries these, once: a browser never reads one
    /// as another type than it says (an answer that quotes a path or a
    /// header is never run as a script or rendered as a page), and no cache,
    /// the browser's or one in between, keeps the state, the metrics or a
    /// delivery's request. Staged where a request enters (`serve`), so
    /// JSON, metrics, the page and its assets, the redirect and the event
    /// stream have them whatever built the answer (none of those names
    /// either field again); `respond` gives them to problems, whose answer
    /// starts from no fields.
    static let answerFields = [
        HTTPField(name: "X-Content-Type-Options", value: "nosniff"), HTTPField(name: "Cache-Control", value: "no-store"),
    ]

    static func stageAnswerFields(_ request: HTTPRequest) {
        for field in answerFields { request.addResponseHeader(field.name, field.value) }
    }

    /// A refusal `AdminAction` (or a check after it) gave, as its problem.
    static func respond(_ request: HTTPRequest, _ refusal: AdminAction.Refusal, requestID: String) {
        var problem = Problem(refusal.code, requestID: requestID, detail: refusal.detail)
        problem.status = refusal.status
        respond(request, problem)
    }

    /// A problem answer on the admin listener: ProblemResponder's, which
    /// clears what was staged and writes `Cache-Control: no-store` itself,
    /// with `X-Content-Type-Options: nosniff` back.
    static func respond(_ request: HTTPRequest, _ problem: Problem) {
        ProblemResponder.respond(request, problem, extraHeaders: [answerFields[0]])
    }

    /// How many times each of `AdminAccessPolicy.singleFields` came, names
    /// compared case-insensitively: one pass over the head, no copies.
    static func singleFieldCounts(_ request: HTTPRequest) -> [Int] {
        var counts = [Int](repeating: 0, count: singleFieldNames.count)
        request.forEachRawHeader { name, _ in
            for (i, wanted) in singleFieldNames.enumerated() where name.count == wanted.count {
                if wanted.withUnsafeBytes({ HTTPBytes.equalsIgnoringCase(name, $0) }) { counts[i] += 1 }
            }
        }
        return counts
    }
    private static let singleFieldNames = AdminAccessPolicy.singleFields.map { Array($0.utf8) }

    // MARK: - Fallback

    /// `POST /admin/fallback/purge[?prefix=/catalog/]`: drops the answers
    /// kept for `fallback.serve_stale` whose path starts with the prefix
    /// (all of them without one), and says how many went.
    private func purgeStale(_ request: HTTPRequest, prefix: String) {
        let requestID = ids.requestID()
        guard let stale = shared.stale else {
            return Self.respond(
                request, Problem(.notFound, requestID: requestID, detail: "No route keeps answers (fallback.serve_stale)."))
        }
        if let refusal = AdminAction.stalePrefixRefusal(prefix) { return Self.respond(request, refusal, requestID: requestID) }
        let purged = stale.purge(pathPrefix: prefix)
        request.reply(
            status: 200, headers: Self.json,
            body: "{\"prefix\":\(JSON.quote(prefix)),\"purged\":\(purged.entries),\"bytes\":\(purged.bytes)}\n")
    }

    // MARK: - Deliveries

    /// `GET /admin/deliveries[?state=&upstream=&limit=&after=]`, `GET
    /// /admin/deliveries/{id}`, `POST /admin/deliveries/{id}/replay`, `POST
    /// /admin/deliveries/purge` (docs/deliver-later.md). The store, or 404
    /// when no route delivers later (any more: a reload may have let it go).
    private func deliveries(for request: HTTPRequest) -> Deliveries? {
        if let deliveries = shared.deliveries { return deliveries }
        Self.respond(
            request, Problem(.notFound, requestID: ids.requestID(), detail: "No route delivers later (delivery.mode: later)."))
        return nil
    }

    /// A read the store's readers were too busy to take: 503, to try again
    /// shortly (a busy store is not an empty one, nor a missing delivery).
    private static func busy(_ request: HTTPRequest, _ error: StoreError, requestID: String) {
        var p = Problem(
            .storeUnavailable, requestID: requestID, detail: "The delivery store is busy (\(error.message)); try again shortly.")
        p.retryAfterSeconds = 1
        respond(request, p)
    }

    private func listDeliveries(_ request: HTTPRequest, _ q: AdminAction.DeliveryQuery, _ deliveries: Deliveries) {
        // `AdminAction` checked the name against the store's.
        let state = q.state.flatMap(DeliveryState.init(name:))
        let requestID = ids.requestID()
        let box = LoopBound(request, on: adminLoop)
        let loop = adminLoop
        let pageSize = q.limit
        deliveries.store.list(state: state, upstream: q.upstream, after: q.after, limit: pageSize) { result in
            if case let .failure(error) = result, error.isBusy {
                return loop.execute { Self.busy(box.value, error, requestID: requestID) }
            }
            // A store that cannot be read lists nothing, as before it opened.
            let records = (try? result.get()) ?? []
            let next = records.count == pageSize ? records.last.map { "\"\($0.cursor)\"" } ?? "null" : "null"
            let body = "{\"deliveries\":[\(records.map(Deliveries.json).joined(separator: ","))],\"next\":\(next)}\n"
            loop.execute { box.value.reply(status: 200, headers: Self.json, body: body) }
        }
    }

    private func purgeDeliveries(_ request: HTTPRequest, _ deliveries: Deliveries) {
        let box = LoopBound(request, on: adminLoop)
        let loop = adminLoop
        deliveries.purge(by: request.peerAddress) { count in
            loop.execute { box.value.reply(status: 200, headers: Self.json, body: "{\"purged\":\(count)}\n") }
        }
    }

    /// Reads delivery `id` on the store's reader thread, then runs `body`
    /// with it on the admin loop (404 when there is none, 503 when the
    /// readers are busy).
    private func withDelivery(
        _ id: String, _ request: HTTPRequest, _ deliveries: Deliveries,
        _ body: @escaping (HTTPRequest, DeliveryRecord, AdminServer, String) -> Void
    ) {
        let requestID = ids.requestID()
        let box = LoopBound((request: request, server: self, body: body), on: adminLoop)
        let loop = adminLoop
        deliveries.store.record(id: id) { result in
            loop.execute {
                if case let .failure(error) = result, error.isBusy {
                    return Self.busy(box.value.request, error, requestID: requestID)
                }
                guard let record = (try? result.get()) ?? nil else {
                    let detail = "No delivery \(id) (or it was purged)."
                    return Self.respond(box.value.request, Problem(.notFound, requestID: requestID, detail: detail))
                }
                box.value.body(box.value.request, record, box.value.server, requestID)
            }
        }
    }

    /// `POST /admin/deliveries/{id}/replay`, once the delivery was read: on the admin loop.
    private func replay(_ request: HTTPRequest, record: DeliveryRecord, deliveries: Deliveries, requestID: String) {
        let id = record.id
        // A new max_age from now: the route's, if the route still delivers later.
        let (routePath, _) = Router.split(target: record.target)
        let maxAge = runtime.router.route(path: routePath, method: record.method).map {
            runtime.routes[$0].delivery.maxAge
        } ?? DeliveryPolicy.Configuration().maxAge
        let loop = adminLoop
        let box = LoopBound((request: request, server: self), on: adminLoop)
        deliveries.replay(id: id, maxAge: maxAge, by: request.peerAddress) { result in
            switch result {
            case .replayed:
                deliveries.store.record(id: id) { after in
                    let body = ((try? after.get()) ?? nil).map(Deliveries.json) ?? "{}"
                    loop.execute { box.value.request.reply(status: 200, headers: Self.json, body: body + "\n") }
                }
            case .notDead, .unknown:
                loop.execute {
                    let request = box.value.request
                    switch result {
                    case .replayed: break
                    case let .notDead(state):
                        var conflict = Problem(
                            .clientError, requestID: requestID,
                            detail: "Only a dead delivery can be replayed; \(id) is \(state.name).")
                        conflict.status = 409
                        Self.respond(request, conflict)
                    case .unknown:
                        Self.respond(
                            request, Problem(.notFound, requestID: requestID, detail: "No delivery \(id) (or it was purged)."))
                    }
                }
            }
        }
    }

    static func isLoopback(_ address: String) -> Bool {
        address.hasPrefix("127.") || address == "::1" || address.hasPrefix("::ffff:127.")
    }

    /// Everything `/admin/state` and `/status` show, read once: counters
    /// and the guards' locks, no store query, nothing on a worker's loop.
    func snapshot() -> AdminSnapshot {
        let now = clock.now()
        let config = runtime.configuration
        var upstreams: [AdminSnapshot.Upstream] = []
        for (u, upstream) in runtime.upstreams.enumerated() {
            let guardian = shared.guards[u]
            let ejected = guardian.ejected(at: now)
            let breaker = guardian.breakerReading(at: now)
            upstreams.append(
                AdminSnapshot.Upstream(
                    name: upstream.name, reachable: guardian.reachable.load(ordering: .relaxed),
                    breaker: AdminSnapshot.Breaker(breaker.state, at: now), breakerFailures: breaker.failures,
                    retriesLeft: guardian.retriesLeft(at: now),
                    endpoints: upstream.endpoints.enumerated().map {
                        AdminSnapshot.Endpoint(url: $1.url, ejected: ejected.contains($0))
                    },
                    parked: Exchange.ParkReason.allCases.map { ($0.rawValue, guardian.parkedCount($0)) },
                    token: guardian.tokens.map { source in
                        (source.settings.kind.rawValue, source.expiresIn(at: now).map { Int($0.seconds.rounded()) })
                    },
                    pausedFor: guardian.pausedFor(at: now), pausedClients: guardian.clientPauses(at: now).count))
            // What an operator needs beyond it: when an ejection ends, drains,
            // a forced breaker, the pause's reason, the last health check.
            operatorView(of: guardian, h2Client: upstream.speaksH2, into: &upstreams[upstreams.count - 1], at: now)
        }
        var snapshot = AdminSnapshot(
            takenAt: Date(), ready: ready.value.load(ordering: .relaxed), inFlight: shared.inFlight.current,
            parked: shared.parked.current, maxParked: shared.parked.limit, bufferedBytes: shared.bodies.current,
            maxBufferedBytes: shared.bodies.limit, deliveries: shared.deliveries?.stateSnapshot(),
            rateLimits: runtime.routes.compactMap { route in
                route.rateLimit.map {
                    (route.label, $0.keys, $0.queued.load(ordering: .relaxed))
                }
            },
            fallback: shared.stale.map {
                ($0.usage.entries, $0.usage.bytes, $0.maxBytes)
            },
            configSource: config.source, loadedAt: shared.loadedAt, upstreams: upstreams)
        let reading = shared.memoryReading
        snapshot.memory = reading.pools
        snapshot.spooled = reading.spooled
        snapshot.cluster = shared.cluster?.reading()
        return snapshot
    }

    /// The snapshot with what the metrics registry counts per route (read
    /// from the route series' handles, `RouteSeriesBook`, on the admin loop,
    /// with the rates since an earlier reading), the last events, and, where a route delivers
    /// later, each upstream's oldest pending delivery: read on the store's
    /// reader thread as for `/metrics`, the answer written back here.
    private func withSnapshot(_ request: HTTPRequest, _ answer: @escaping (HTTPRequest, AdminSnapshot) -> Void) {
        var s = snapshot()
        s.routes = RouteTotals.read(shared.metrics.routeSeries.readings(), routes: runtime.routes.map(\.label))
        s.windows = routeRates.read(s.routes, at: clock.now())
        s.events = shared.events.recent
        guard let deliveries = shared.deliveries else { return answer(request, s) }
        let box = LoopBound((request: request, snapshot: s, answer: answer), on: adminLoop)
        let loop = adminLoop
        let clock = self.clock
        deliveries.readGauges { stats in
            let now = clock.wallMilliseconds()
            let pending = stats.pending.sorted { $0.key < $1.key }.map {
                (upstream: $0.key, count: $0.value.count, oldest: Duration.milliseconds(max(0, now - $0.value.oldest)))
            }
            loop.execute {
                var s = box.value.snapshot
                s.deliveries?.pending = pending
                box.value.answer(box.value.request, s)
            }
        }
    }
}

/// Atomic<Bool> is not copyable; the admin server and the proxy share one through this box.
final class ReadyFlag: Sendable {
    let value = Atomic<Bool>(false)
}
