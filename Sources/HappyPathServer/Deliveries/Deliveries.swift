import CoreMetrics
import Foundation
import HappyPathConfig
import HappyPathAdmin
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import HappyPathStore
import Logging
import Prometheus
import Synchronization

/// Deliver later (docs/deliver-later.md): requests on a `delivery.mode:
/// later` route are stored in the `DeliveryStore` and answered 202; the
/// dispatcher takes due deliveries from the store and hands each to a worker,
/// which runs it as an ordinary exchange (retries, budget, breaker,
/// parking, credentials) whose answer goes to a `DeliverySink`; the round's
/// end goes back to the store as delivered, queued again, or dead.
///
/// Threads: `accept` and `roundEnded` run on worker loops, the dispatcher's
/// tick on the admin loop, store replies on the store's writer thread; what
/// they share is atomic or locked.
final class Deliveries: Sendable {
    /// Delivery rounds running at once in the whole process.
    static let maxInFlight = 64
    /// How often the dispatcher looks for due deliveries (it is also woken
    /// when a round ends, a request is stored, or an upstream recovers).
    static let tick: Duration = .milliseconds(100)
    static let purgeEvery: Duration = .seconds(600)
    /// A store that keeps failing is logged at most once in this (its first
    /// failure at once): a full disk fails every write, and one line per
    /// refused request would fill the log on the same disk.
    static let storeErrorLogEvery: Duration = .seconds(60)

    let store: any DeliveryStoring
    let settings: StorageConfiguration
    /// `status_path` and a slash: requests under it are status requests.
    let statusPrefix: String
    private let clock: Clock
    private let logger: Logger
    private let loop: EventLoop
    private let state: Locked<(shared: SharedState, workers: [LoopBound<ProxyWorker>])>
    private let inFlight = Atomic<Int>(0)
    private let claiming = Atomic<Bool>(false)
    private let nextWorker = Atomic<Int>(0)
    private let stopped = Atomic<Bool>(false)
    /// The dispatcher's tick and when it last purged: the admin loop's only.
    private let dispatcher: LoopBound<(ticker: LoopTimer?, lastPurge: Instant)>
    /// Whether the store's writes are failing, when that was last logged,
    /// and the failures since (writer thread, and `start`).
    private let storeFailures = Locked<(failing: Bool, lastLog: Instant?, unlogged: Int)>((false, nil, 0))
    /// `happypath_delivery_store_errors_total{kind}`, every kind made at
    /// start so the series exist (at 0) before the first failure.
    private let storeErrorCounters: [StoreErrorKind: Prometheus.Counter]

    init(store: any DeliveryStoring, settings: StorageConfiguration, loop: EventLoop, shared: SharedState, clock: Clock,
        logger: Logger)
    {
        self.store = store
        self.settings = settings
        statusPrefix = settings.statusPath + "/"
        self.loop = loop
        self.clock = clock
        self.logger = logger
        state = Locked((shared, []))
        dispatcher = LoopBound((nil, clock.now()), on: loop)
        var counters: [StoreErrorKind: Prometheus.Counter] = [:]
        let errors = MetricNameDescriptor(
            namespace: "happypath", metricName: "delivery_store_errors", unitName: "total",
            helpText: "Writes the delivery store could not make, by kind: full (no space left), io (an I/O error), unreachable (its database), database (a refused statement), other.")
        for kind in StoreErrorKind.allCases {
            counters[kind] = shared.metrics.registry.makeCounter(descriptor: errors, labels: [("kind", kind.rawValue)])
        }
        storeErrorCounters = counters
        if store.recovered > 0 {
            logger.warning(
                "deliveries that were in flight when the proxy stopped are queued again (they may arrive twice)",
                metadata: ["count": "\(store.recovered)", "store": "\(settings.name)"])
        }
    }

    var metrics: ProxyMetrics { state.withLock { $0.shared.metrics } }
    var events: EventBus { state.withLock { $0.shared.events } }

    /// The workers that run delivery rounds; called once before the loops start.
    func register(_ worker: LoopBound<ProxyWorker>) {
        state.withLock { $0.workers.append(worker) }
    }

    /// A reload: skip decisions read the new upstream guards.
    func update(shared: SharedState) { state.withLock { $0.shared = shared } }

    // MARK: - Dispatcher (admin loop)

    /// On the admin loop: the periodic tick and the purge every `purgeEvery`.
    func start() {
        store.observe { [self] health in storeHealth(health) }
        // Opened on a disk that refuses writes: the proxy serves anyway, and
        // `later` routes answer 503 until the store opens (`storeHealth`).
        if let error = store.unavailable { storeHealth(.failed(error)) }
        store.start()
        if store.recovered > 0 { events.publish("deliveries_recovered", [("count", String(store.recovered))]) }
        scheduleTick()
    }

    // MARK: - The store's health (writer thread)

    /// Counts every failed write, logs (at most once per
    /// `storeErrorLogEvery`) and sends an event when writes start failing
    /// and when they work again.
    func storeHealth(_ health: StoreHealth) {
        switch health {
        case let .failed(error):
            storeErrorCounters[error.kind]?.increment()
            let now = clock.now()
            let (first, log, unlogged) = storeFailures.withLock { s -> (Bool, Bool, Int) in
                let first = !s.failing
                s.failing = true
                if let last = s.lastLog, now - last < Self.storeErrorLogEvery {
                    s.unlogged += 1
                    return (first, false, 0)
                }
                s.lastLog = now
                defer { s.unlogged = 0 }
                return (first, true, s.unlogged)
            }
            if log {
                logger.error(
                    "the delivery store cannot write: later routes answer 503 STORE_UNAVAILABLE until it can",
                    metadata: [
                        "kind": "\(error.kind.rawValue)", "error": "\(error.message)", "store": "\(settings.name)",
                        "failures_not_logged": "\(unlogged)",
                    ])
            }
            if first {
                events.publish("delivery_store_unavailable", [("kind", error.kind.rawValue), ("error", error.message)])
            }
        case let .writable(requeued):
            let was = storeFailures.withLock { s in
                defer { s.failing = false }
                return s.failing
            }
            if requeued > 0 {
                logger.warning(
                    "deliveries that were in flight when the proxy stopped are queued again (they may arrive twice)",
                    metadata: ["count": "\(requeued)", "store": "\(settings.name)"])
                events.publish("deliveries_recovered", [("count", String(requeued))])
            }
            if was {
                logger.info("the delivery store writes again", metadata: ["store": "\(settings.name)"])
                events.publish("delivery_store_available", [])
            }
            kick()
        }
    }

    private func scheduleTick() {
        dispatcher.value.ticker = loop.schedule(after: Self.tick) { [self] in
            dispatch()
            if clock.now() - dispatcher.value.lastPurge >= Self.purgeEvery {
                dispatcher.value.lastPurge = clock.now()
                purge(by: "retention") { _ in }
            }
            if !stopped.load(ordering: .relaxed) { scheduleTick() }
        }
    }

    /// Delivery rounds started and not yet recorded in the store.
    var roundsInFlight: Int { inFlight.load(ordering: .relaxed) }

    /// No new rounds; the store is closed by `close` once the workers stopped.
    /// From any thread: no claim starts after this returns; the tick is
    /// cancelled on its own loop.
    func stop() {
        stopped.store(true, ordering: .relaxed)
        let dispatcher = self.dispatcher
        loop.execute {
            dispatcher.value.ticker?.cancel()
            dispatcher.value.ticker = nil
        }
    }

    /// Commits what is left (round ends included) and closes the store.
    func close() {
        store.close()
        state.withLock { $0.workers.removeAll() }
    }

    /// `happypath_deliveries_total`, its handles made once per label pair
    /// (an accept costs a lookup, not a registry search).
    private let counters = Locked<[String: [String: CoreMetrics.Counter]]>([:])

    private func count(upstream: String, outcome: String) {
        let counter = counters.withLock { table -> CoreMetrics.Counter in
            if let c = table[upstream]?[outcome] { return c }
            let c = metrics.counter("happypath_deliveries_total", [("upstream", upstream), ("outcome", outcome)])
            table[upstream, default: [:]][outcome] = c
            return c
        }
        counter.increment()
    }

    /// Wakes the dispatcher from any thread.
    func kick() {
        guard !stopped.load(ordering: .relaxed) else { return }
        loop.execute { [self] in dispatch() }
    }

    /// Takes due deliveries (up to the free rounds) and hands them to the workers.
    private func dispatch() {
        guard !stopped.load(ordering: .relaxed) else { return }
        let room = Self.maxInFlight - inFlight.load(ordering: .relaxed)
        guard room > 0, !claiming.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let now = clock.now()
        // An upstream known down or with its circuit open gets no rounds: they
        // would only park or fail, and count against max_attempts. They are
        // woken when it recovers (`recovered`).
        let skipping = state.withLock { s in
            s.shared.guards.filter { g in
                if !g.reachable.load(ordering: .relaxed) { return true }
                if g.pausedFor(at: now) != nil { return true }
                if case let .open(until) = g.breakerState, until > now { return true }
                return false
            }.map(\.name)
        }
        store.claim(limit: room, skipping: skipping) { [self] claimed, setAside in
            self.claimed(claimed, setAside: setAside, room: room)
        }
    }

    /// On the store's writer thread (or at once on the dispatcher's loop,
    /// nothing claimed, when the writer's queue is full).
    private func claimed(_ claimed: [ClaimedDelivery], setAside: [SetAside], room: Int) {
        for e in setAside {
            count(upstream: e.upstream, outcome: "dead")
            if e.reason == .crashedTheProxy {
                logger.error(
                    "delivery set aside: a round of it was in flight when the proxy crashed, at two starts in a row (it crashed the proxy)",
                    metadata: ["id": "\(e.id)", "upstream": "\(e.upstream)", "reason": "\(e.reason.rawValue)"])
            }
            events.publish("delivery_dead", [("id", e.id), ("upstream", e.upstream), ("reason", e.reason.rawValue)])
        }
        inFlight.wrappingAdd(claimed.count, ordering: .relaxed)
        claiming.store(false, ordering: .releasing)
        if stopped.load(ordering: .relaxed) {
            // Claimed as the proxy began to stop: back to the queue, unsent.
            for delivery in claimed { roundFailed(delivery, .postpone(at: clock.wallMilliseconds())) }
            return
        }
        let workers = state.withLock { $0.workers }
        guard !workers.isEmpty else { return }
        for delivery in claimed {
            let i = nextWorker.wrappingAdd(1, ordering: .relaxed).oldValue % workers.count
            workers[i].loop.execute(with: workers[i]) { [self] in run(delivery, on: $0) }
        }
        // A full page: more may be due now.
        if claimed.count == room { kick() }
    }

    /// An upstream recovered: its queued deliveries are due now.
    func recovered(upstream: String) {
        store.wake(upstream: upstream)
        kick()
    }

    // MARK: - A round (worker loop)

    /// One delivery round of a stored request, run on `worker` as an
    /// exchange whose answer goes to the store. Routed again: the
    /// configuration may have changed since it was stored.
    func run(_ delivery: ClaimedDelivery, on worker: ProxyWorker) {
        if worker.stopping { return roundFailed(delivery, .postpone(at: worker.clock.wallMilliseconds())) }
        let runtime = worker.runtime
        let shared = worker.shared
        var trace: RequestTrace?
        switch ForwardedRequest.command(
            for: delivery, runtime: runtime, now: worker.clock.now(), tracer: shared.tracer, ids: &worker.ids, trace: &trace)
        {
        case let .undeliverable(problem):
            roundFailed(delivery, .dead(status: nil, problem: problem.json()))
        case let .command(command, route):
            let exchange = Exchange(
                env: worker, request: DeliverySink(), route: route, upstream: runtime.upstreams[route.upstreamIndex],
                guardian: shared.guards[route.upstreamIndex], command: command, delivery: delivery, trace: trace)
            // The dispatcher is one client of the upstream: a 429 to a
            // round holds the rounds, not the clients sending live requests.
            exchange.pacingKey = "deliver-later"
            exchange.slotHolder.client = "deliver-later".hashValue
            worker.started(exchange)
        }
    }

    // MARK: - A round ended (worker loop)

    /// The round's result to the store: delivered, queued again after a
    /// backoff, or dead with its problem.
    func roundEnded(_ exchange: Exchange, delivery: ClaimedDelivery, random: Double) {
        let now = clock.wallMilliseconds()
        let route = exchange.route
        let status = exchange.finalStatus
        let answered = exchange.problem == nil || exchange.upstreamAnswered != nil
        let decision = DeliveryPolicy.decide(
            status: exchange.upstreamAnswered ?? status, answeredByUpstream: answered, attempts: delivery.attempts,
            limits: .init(
                maxAttempts: delivery.maxAttempts, expiresAt: delivery.expiresAt,
                backoffBase: route.delivery.backoffBase, backoffMax: route.delivery.backoffMax),
            now: now, random: random)
        let problem = exchange.problem?.json() ?? "{}"
        // The upstream's own status (a 500 stays 500, not the problem's 503).
        let upstreamStatus = exchange.upstreamAnswered ?? (exchange.problem == nil ? status : nil)
        let outcome: DeliveryOutcome
        switch decision {
        case .delivered:
            outcome = .delivered(status: status)
        case let .retry(at):
            outcome = .retry(at: at, status: upstreamStatus, problem: problem)
        case let .dead(reason):
            outcome = .dead(status: upstreamStatus, problem: problem)
            logger.warning(
                "delivery dead",
                metadata: [
                    "id": "\(delivery.id)", "request_id": "\(delivery.requestID)", "upstream": "\(delivery.upstream)",
                    "reason": "\(reason.rawValue)", "code": "\(exchange.finalCode)", "attempts": "\(delivery.attempts)",
                ])
            events.publish(
                "delivery_dead",
                [("id", delivery.id), ("upstream", delivery.upstream), ("reason", reason.rawValue), ("code", exchange.finalCode)])
        }
        finish(delivery, outcome)
    }

    /// A round that could not start (no route for it any more, or no room).
    func roundFailed(_ delivery: ClaimedDelivery, _ outcome: DeliveryOutcome) { finish(delivery, outcome) }

    private func finish(_ delivery: ClaimedDelivery, _ outcome: DeliveryOutcome) {
        if let label = outcome.metricLabel { count(upstream: delivery.upstream, outcome: label) }
        store.finish(id: delivery.id, outcome) { [self] in
            inFlight.wrappingSubtract(1, ordering: .relaxed)
            kick()
        }
    }

    // MARK: - Accepting (worker loop)

    /// Stores the request, then answers 202 (or 503 OVERLOADED if it could not be stored).
    func accept(_ request: HTTPRequest, command: Command, route: RuntimeRoute, worker: ProxyWorker) {
        let id = Self.newID()
        // A blank Idempotency-Key is no key (IdempotencyKey): the delivery's
        // own id takes its place, so the upstream sees one key, never an empty one.
        let clientKey = IdempotencyKey.value(in: command.headers)
        var headers = clientKey == nil ? command.headers.lines(dropping: "idempotency-key") : command.headers.lines
        if clientKey == nil { headers.append(contentsOf: Array("Idempotency-Key: \(id)\r\n".utf8)) }
        let upstream = command.upstream
        // The key's scope and the request's fingerprint, hashed only when
        // the client sent a key (docs/deliver-later.md, "Idempotency-Key").
        var scope: String?
        if clientKey != nil {
            let clientHeader = route.delivery.idempotencyClientHeader
            let client = IdempotencyScope.client(
                authorization: command.headers.value(for: "authorization"), headerName: clientHeader,
                headerValue: clientHeader.flatMap { Self.field($0, in: command.headers) })
            scope = IdempotencyScope.scope(route: route.label, upstream: upstream, client: client)
        }
        var delivery = NewDelivery(
            id: id, upstream: upstream, route: route.label, idempotencyKey: clientKey, idempotencyScope: scope,
            requestID: command.requestID, method: command.method, target: request.target, headers: headers,
            body: command.body, maxAttempts: route.delivery.maxAttempts,
            expiresAt: clock.wallMilliseconds() + route.delivery.maxAge.nanoseconds / 1_000_000)
        let waiting = LoopBound((request: request, worker: worker), on: worker.loop)
        let requestID = command.requestID
        worker.shared.inFlight.add(1)
        @Sendable func submit(_ delivery: NewDelivery) {
            store.submit(delivery) { [self] result in
                waiting.loop.execute {
                    let (request, worker) = waiting.value
                    worker.shared.inFlight.add(-1)
                    self.stored(result, request, requestID: requestID, upstream: upstream)
                }
            }
        }
        guard clientKey != nil else { return submit(delivery) }
        guard delivery.body.count > Self.inlineFingerprintBytes else {
            delivery.fingerprint = Self.fingerprint(delivery)
            return submit(delivery)
        }
        // A large body is hashed off the worker's loop (10 MiB take about
        // 45 ms), so the other requests of this loop do not wait for it.
        let keyed = delivery
        DispatchQueue.global().async {
            var d = keyed
            d.fingerprint = Self.fingerprint(d)
            submit(d)
        }
    }

    /// Bodies up to this are fingerprinted on the worker's loop (a few
    /// hundred microseconds at most); larger ones on a global queue.
    static let inlineFingerprintBytes = 64 * 1024

    static func fingerprint(_ d: NewDelivery) -> String {
        IdempotencyScope.fingerprint(
            method: d.method, target: d.target, body: UnsafeRawBufferPointer(start: d.body.baseAddress, count: d.body.count))
    }

    /// The first value of the field `name` (any case), for a name from the configuration.
    static func field(_ name: String, in headers: HeaderBlock) -> String? {
        let wanted = Array(name.lowercased().utf8)
        var found: String?
        headers.forEach { n, v, _ in
            guard found == nil, n.count == wanted.count else { return }
            for i in 0..<n.count {
                let b = n[i]
                if (b >= 0x41 && b <= 0x5A ? b | 0x20 : b) != wanted[i] { return }
            }
            found = String(decoding: v, as: UTF8.self)
        }
        return found
    }

    /// On the worker's loop, after the commit.
    private func stored(_ result: SubmitResult, _ request: HTTPRequest, requestID: String, upstream: String) {
        switch result {
        case let .stored(id):
            count(upstream: upstream, outcome: "accepted")
            accepted(request, id: id, state: .queued, requestID: requestID)
            kick()
        case let .existing(id, state):
            count(upstream: upstream, outcome: "duplicate")
            accepted(request, id: id, state: state, requestID: requestID)
        case .keyReused:
            count(upstream: upstream, outcome: "key_reused")
            ProblemResponder.respond(
                request,
                Problem(
                    .idempotencyKeyReused, requestID: requestID,
                    detail: "This Idempotency-Key was already sent with another request (method, target or body) "
                        + "on this route; the request was not stored."))
        case let .full(held, max):
            count(upstream: upstream, outcome: "refused")
            events.publish("delivery_store_full", [("held_bytes", String(held)), ("max_bytes", String(max))])
            var p = Problem(
                .overloaded, requestID: requestID,
                detail: "The delivery store is full (storage.max_bytes, \(max) bytes); the request was not stored.")
            p.retryAfterSeconds = 5
            ProblemResponder.respond(request, p)
        case let .failed(error):
            // A failed write is logged, counted and announced by
            // `storeHealth`; a writer too busy to take it (`isBusy`) is
            // counted here only, as refused.
            count(upstream: upstream, outcome: "refused")
            var p = Problem(.storeUnavailable, requestID: requestID, detail: Self.unavailableDetail(error))
            p.retryAfterSeconds = 5
            ProblemResponder.respond(request, p)
        }
    }

    /// The `detail` of a 503 STORE_UNAVAILABLE: what the disk or the database did, never `storage.max_bytes`.
    static func unavailableDetail(_ error: StoreError) -> String {
        if error.code == StoreError.writerBusy {
            return "The delivery store is behind: \(error.message), as many as it holds (requests arrive faster "
                + "than its disk or database commits them); the request was not stored. Retry after a pause."
        }
        let cause =
            switch error.kind {
            case .full: "the disk it is on is full"
            case .io: "the disk it is on failed a read or write (I/O error)"
            case .other: "SQLite refused the write"
            case .unreachable: "its PostgreSQL database cannot be reached"
            case .database: "PostgreSQL refused the write"
            }
        return "The delivery store cannot write (\(cause)); the request was not stored."
    }

    private func accepted(_ request: HTTPRequest, id: String, state: DeliveryState, requestID: String) {
        let url = settings.statusPath + "/" + id
        request.reply(
            status: 202,
            headers: [
                HTTPField(name: "Content-Type", value: "application/json"),
                HTTPField(name: "Location", value: url),
                HTTPField(name: "X-Request-Id", value: requestID),
            ],
            body: "{\"id\":\(JSON.quote(id)),\"state\":\(JSON.quote(state.name)),\"status_url\":\(JSON.quote(url))}\n")
    }

    /// `dlv_` and 32 hex digits from the system's random source: a status
    /// URL cannot be guessed from another.
    static func newID() -> String {
        var g = SystemRandomNumberGenerator()
        let (a, b) = (g.next() as UInt64, g.next() as UInt64)
        return "dlv_" + IdentifierGenerator.hex(a) + IdentifierGenerator.hex(b)
    }

    // MARK: - Status (worker loop: the proxy's listener; admin loop)

    /// `GET {status_path}/{id}` on the proxy's listener. The read runs on
    /// the store's reader thread; the answer is written back on the
    /// worker's loop. Until then the request counts as in flight (a drain
    /// waits for it).
    func status(_ request: HTTPRequest, path: String, requestID: String, worker: ProxyWorker) {
        guard request.method == "GET" || request.method == "HEAD" else {
            return ProblemResponder.answer(
                request, Problem(.badRequest, requestID: requestID, detail: "A delivery's status is read with GET."))
        }
        let id = String(path.dropFirst(settings.statusPath.count + 1))
        let waiting = LoopBound((request: request, worker: worker), on: worker.loop)
        worker.shared.inFlight.add(1)
        store.record(id: id) { [self] found in
            waiting.loop.execute {
                let (request, worker) = waiting.value
                worker.shared.inFlight.add(-1)
                self.answerStatus(request, id: id, found, requestID: requestID)
            }
        }
    }

    /// On the worker's loop, after the read.
    private func answerStatus(
        _ request: HTTPRequest, id: String, _ found: Result<DeliveryRecord?, StoreError>, requestID: String
    ) {
        let record: DeliveryRecord
        switch found {
        case let .failure(error):
            // Opened on a disk that refuses writes, the file may not be
            // readable yet either: not knowing is not "no such delivery".
            var p = Problem(
                .storeUnavailable, requestID: requestID,
                detail: "The delivery store cannot be read now (\(error.message)); try again later.")
            p.retryAfterSeconds = 5
            return ProblemResponder.answer(request, p)
        case .success(nil):
            return ProblemResponder.answer(
                request, Problem(.notFound, requestID: requestID, detail: "No delivery \(id) (or it was purged)."))
        case let .success(found?):
            record = found
        }
        request.reply(
            status: 200,
            headers: [HTTPField(name: "Content-Type", value: "application/json"), HTTPField(name: "Cache-Control", value: "no-store")],
            body: Self.json(record) + "\n")
    }

    static func json(_ r: DeliveryRecord) -> String {
        func time(_ ms: Int64) -> String {
            JSON.quote(Date(timeIntervalSince1970: Double(ms) / 1000).formatted(.iso8601))
        }
        var out =
            "{\"id\":\(JSON.quote(r.id)),\"state\":\(JSON.quote(r.state.name)),\"attempts\":\(r.attempts),"
            + "\"max_attempts\":\(r.maxAttempts),\"upstream\":\(JSON.quote(r.upstream)),"
            + "\"request_id\":\(JSON.quote(r.requestID)),\"method\":\(JSON.quote(r.method)),"
            + "\"target\":\(JSON.quote(r.target)),\"created_at\":\(time(r.createdAt)),\"updated_at\":\(time(r.updatedAt))"
        if r.state == .queued, r.attempts > 0 { out += ",\"next_attempt_at\":\(time(r.nextAttemptAt))" }
        if let s = r.lastStatus { out += ",\"status\":\(s)" }
        if r.state == .dead, let p = r.lastProblem { out += ",\"error\":\(p)" }
        return out + "}"
    }

    // MARK: - Admin

    /// `by`: who asked (the admin client's address, or `retention` for the
    /// proxy's own purge every 10 minutes), logged and in the event.
    func purge(by: String, reply: @escaping @Sendable (Int) -> Void) {
        store.purge { [self] count in
            if count > 0 {
                logger.info("deliveries purged", metadata: ["count": "\(count)", "by": "\(by)"])
                events.publish("deliveries_purged", [("count", String(count)), ("by", by)])
            }
            reply(count)
        }
    }

    /// `by`: who asked (the admin client's address), logged and in the event.
    func replay(id: String, maxAge: Duration, by: String, reply: @escaping @Sendable (ReplayResult) -> Void) {
        store.replay(id: id, expiresAt: clock.wallMilliseconds() + maxAge.nanoseconds / 1_000_000) { [self] result in
            if case .replayed = result {
                logger.info("delivery replayed", metadata: ["id": "\(id)", "by": "\(by)"])
                events.publish("delivery_replayed", [("id", id), ("by", by)])
                kick()
            }
            reply(result)
        }
    }

    /// Reads what the `/metrics` gauges need (on the store's reader
    /// thread: the oldest pending delivery of each upstream is an indexed
    /// look-up); `reply` runs there, or at once on the caller's thread
    /// when the readers are busy.
    func readGauges(reply: @escaping @Sendable (StoreStats) -> Void) {
        store.stats(reply: reply)
    }

    /// Records the gauges from `stats`; on the admin loop, without SQLite.
    func recordGauges(_ stats: StoreStats, into metrics: ProxyMetrics) {
        metrics.gauge("happypath_delivery_store_bytes", []).record(stats.heldBytes)
        metrics.gauge("happypath_delivery_store_max_bytes", []).record(stats.maxBytes)
        // Not read because the readers were busy: the pending gauges keep
        // their last values rather than read as empty.
        guard !stats.readersBusy else { return }
        let now = clock.wallMilliseconds()
        for (upstream, pending) in stats.pending {
            metrics.gauge("happypath_deliveries_queued", [("upstream", upstream)]).record(pending.count)
            metrics.gauge("happypath_delivery_oldest_queued_seconds", [("upstream", upstream)])
                .record(Double(max(0, now - pending.oldest)) / 1000)
        }
        // Upstreams whose queue emptied since the last scrape read zero.
        for g in state.withLock({ $0.shared.guards }) where stats.pending[g.name] == nil {
            metrics.gauge("happypath_deliveries_queued", [("upstream", g.name)]).record(0)
            metrics.gauge("happypath_delivery_oldest_queued_seconds", [("upstream", g.name)]).record(0)
        }
    }

    /// For `/admin/state` and the status page: the counts the store keeps (no SQLite).
    func stateSnapshot() -> AdminSnapshot.Deliveries {
        let kept = store.counts
        var d = AdminSnapshot.Deliveries(
            counts: DeliveryState.allCases.map { ($0.name, kept[$0]) }, heldBytes: store.heldBytes, maxBytes: store.maxBytes,
            roundsInFlight: inFlight.load(ordering: .relaxed), store: settings.name, writable: store.unavailable == nil)
        d.problem = store.unavailable?.message
        return d
    }
}

extension DeliveryOutcome {
    /// The `outcome` of `happypath_deliveries_total` a round's end counts
    /// as (nil: queued again, counted when it ends for good).
    var metricLabel: String? {
        switch self {
        case .delivered: "delivered"
        case .dead: "dead"
        case .retry, .postpone: nil
        }
    }
}
