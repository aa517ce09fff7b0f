import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathStore
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The running proxy: `workers` event loops sharing the listen port, plus the
/// admin listener (and health checks, and the event stream) on a loop of its own.
///
/// `@unchecked Sendable`: it is driven from one controlling thread (the
/// main thread's signal loop, or a test), which alone calls `reload`,
/// `drain` and `stop` and changes its `var`s; what runs on the loops is
/// reached through `LoopBound`, `stopped` is locked and `ready` atomic.
public final class ProxyServer: @unchecked Sendable {
    public private(set) var runtime: RuntimeConfiguration
    private let logger: Logger
    private let accessLog: AccessLogSettings
    private let clock: Clock
    private let workerCount: Int
    private var loops: [EventLoop] = []
    /// Each worker belongs to its loop: this thread only hands it jobs.
    private var workers: [LoopBound<ProxyWorker>] = []
    private var adminLoop: EventLoop?
    /// The admin server and the health checker belong to the admin loop.
    private var admin: LoopBound<AdminServer>?
    private var healthChecker: LoopBound<HealthChecker>?
    private var shared: SharedState?
    /// The event bus of `/admin/events` (nil before `start`): the tests publish on it.
    var events: EventBus? { shared?.events }
    /// The deliver-later store and dispatcher, if a route delivers later.
    private var deliveries: Deliveries?
    private let ready = ReadyFlag()
    private let stopped = Locked(false)
    /// The first listener's port (where a single `listen` binds).
    public private(set) var port = 0
    /// Every listener's port, in the configuration's order.
    public private(set) var ports: [Int] = []
    public private(set) var adminPort = 0

    /// - Parameters:
    ///   - workers: event-loop threads; nil uses the configuration (`auto` = cores).
    ///   - accessLog: nil writes JSON lines to stderr when `logger` is at `info` or below.
    public init(
        configuration: Configuration, workers: Int? = nil, logger: Logger, accessLog: AccessLogSettings? = nil,
        clock: Clock = MonotonicClock()
    ) {
        runtime = RuntimeConfiguration(configuration)
        self.logger = logger
        self.accessLog = accessLog ?? AccessLogSettings(level: logger.logLevel, format: .json)
        self.clock = clock
        workerCount = max(1, workers ?? configuration.workers ?? Self.coreCount)
    }

    static var coreCount: Int { max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }

    /// Opens the delivery store (if a route delivers later), binds every
    /// listener and starts the loops. Throws a `SocketError` if a port
    /// cannot be bound, a `StoreError` if the store cannot be opened.
    public func start() throws {
        EventLoop.initializeLibraries()
        let config = runtime.configuration
        let adminLoop = EventLoop()
        self.adminLoop = adminLoop
        let shared = SharedState(runtime: runtime, logger: logger, events: EventBus(loop: adminLoop))
        self.shared = shared
        if config.usesStore {
            let writes = shared.metrics.timer("happypath_delivery_store_write_seconds", [])
            let onWrite: @Sendable (Double) -> Void = { writes.recordNanoseconds(Int64($0 * 1e9)) }
            let s = config.storage
            // A PostgreSQL store connects on its own thread: the proxy starts
            // even when the database cannot be reached (later routes then
            // answer 503 STORE_UNAVAILABLE until it can).
            let store: any DeliveryStoring =
                if let url = s.url {
                    PostgresDeliveryStore(
                        settings: PostgresStoreSettings(
                            url: url, pool: s.pool, lease: s.lease, maxBytes: s.maxBytes, retention: s.retention),
                        clock: clock, onWrite: onWrite)
                } else {
                    try DeliveryStore(
                        settings: StoreSettings(path: s.path, sync: s.sync, maxBytes: s.maxBytes, retention: s.retention),
                        clock: clock, onWrite: onWrite)
                }
            let deliveries = Deliveries(
                store: store, settings: config.storage, loop: adminLoop, shared: shared, clock: clock, logger: logger)
            self.deliveries = deliveries
            shared.deliveries = deliveries
        }
        checkSpool(shared.spool)
        if let tracing = config.tracing {
            let tracer = Tracer(tracing, version: ProxyServer.version, clock: clock)
            tracer.exporter.start()
            shared.tracer = tracer
            self.tracer = tracer
        }
        if let cluster = config.cluster {
            shared.cluster = ClusterState(
                cluster, links: workerCount, logger: logger, events: shared.events, metrics: shared.metrics)
        }
        let contexts = try Self.certificates(config)
        shared.metrics.certificateExpiry(config, contexts)
        var listeners = zip(config.listeners, contexts).map { l, tls in
            ProxyWorker.BoundListener(host: l.address.host, port: l.address.port, tls: tls, http2: config.http2(for: l))
        }
        for i in 0..<workerCount {
            let loop = EventLoop()
            // With port 0 the first worker picks the port; the others join it.
            let worker = try ProxyWorker(
                loop: loop, runtime: runtime, shared: shared, listeners: listeners,
                workers: workerCount, clock: clock, logger: logger, accessLog: accessLog)
            // Bound while its loop is not running yet.
            let bound = LoopBound(worker, on: loop)
            shared.register(bound)
            worker.deliveries = deliveries
            deliveries?.register(bound)
            if let cluster = shared.cluster {
                let link = try ClusterLink(worker: worker, state: cluster, first: i == 0)
                worker.cluster = link
                loop.execute(with: bound) { $0.cluster?.start() }
            }
            if i == 0 {
                for (j, p) in worker.ports.enumerated() { listeners[j].port = p }
            }
            loops.append(loop)
            workers.append(bound)
        }
        ports = listeners.map(\.port)
        port = ports[0]
        let admin = try AdminServer(
            loop: adminLoop, configuration: config, ready: ready, shared: shared, runtime: runtime, clock: clock)
        adminPort = admin.server.port
        self.admin = LoopBound(admin, on: adminLoop)
        let checker = HealthChecker(loop: adminLoop, runtime: runtime, shared: shared, logger: logger)
        let boundChecker = LoopBound(checker, on: adminLoop)
        healthChecker = boundChecker
        for (i, loop) in loops.enumerated() { loop.start(name: "worker-\(i)") }
        adminLoop.execute(with: boundChecker) { $0.start() }
        if let deliveries { adminLoop.execute { deliveries.start() } }
        adminLoop.start(name: "admin")
        ready.value.store(true, ordering: .releasing)
        logger.info(
            "proxy started",
            metadata: [
                "listen": "\(config.listen.host):\(port)", "admin": "\(config.admin.listen.host):\(adminPort)",
                "workers": "\(workerCount)", "routes": "\(config.routes.count)",
                "upstreams": "\(config.upstreams.count)", "config": "\(config.source)",
            ])
    }

    /// The spool directory at start: what a killed process may have left
    /// there goes, and a directory no file can be made in is said once (the
    /// proxy runs on: slow clients' answers then wait in their upstream
    /// transfers, as with `limits.read_ahead: 0`, and bodies stay in memory).
    private func checkSpool(_ spool: Spool) {
        let removed = spool.sweep()
        if removed > 0 {
            logger.info("spool files left by an earlier process removed", metadata: ["spool_dir": "\(spool.directory)", "files": "\(removed)"])
        }
        let fd = spool.openFile()
        if fd >= 0 {
            close(fd)
        } else {
            let reason = String(cString: strerror(errno))
            logger.warning(
                "storage.spool_dir: cannot make a spool file; answers are not read ahead of slow clients, bodies are kept in memory",
                metadata: ["spool_dir": "\(spool.directory)", "error": "\(reason)"])
        }
    }

    /// Each TLS listener's certificates, read now (nil for a plain one).
    static func certificates(_ config: Configuration) throws(TLSSetupError) -> [TLSServerContext?] {
        var out: [TLSServerContext?] = []
        for listener in config.listeners {
            guard let tls = listener.tls else {
                out.append(nil)
                continue
            }
            do {
                out.append(
                    try TLSServerContext(
                        certificates: tls.certificates,
                        minimumTLS13: tls.minVersion == .tls13,
                        offerH2: config.http2(for: listener) != nil && tls.alpn.contains("h2")))
            } catch {
                throw TLSSetupError(description: "listen \(listener.address): \(error.description)")
            }
        }
        return out
    }

    /// SIGHUP: switch to `configuration` (already validated by the loader).
    /// New commands use it; commands in flight finish under the old one. An
    /// upstream whose definition did not change keeps its breaker, budget
    /// and token. Every key takes effect except the few `RestartOnlyKeys`;
    /// changing one of those refuses the whole reload. Returns the reasons
    /// it was refused (nothing changed then).
    public func reload(_ configuration: Configuration) -> [String] {
        guard let shared, let adminLoop else { return ["the server is not running"] }
        func refused(_ problems: [String]) -> [String] {
            shared.events.publish(
                "config_rejected", [("source", configuration.source), ("problems", problems.joined(separator: "; "))])
            return problems
        }
        let problems = RestartOnlyKeys.changes(from: runtime.configuration, to: configuration, cores: Self.coreCount)
        guard problems.isEmpty else { return refused(problems) }
        // Certificates are read first: a pair that does not load refuses the
        // whole reload, and every listener keeps the ones it has.
        let contexts: [TLSServerContext?]
        do {
            contexts = try Self.certificates(configuration)
        } catch {
            return refused(["\(error.description); the certificates in use are kept"])
        }
        shared.metrics.certificateExpiry(configuration, contexts)
        // Routes whose rate limit did not change keep their buckets and queues.
        let newRuntime = RuntimeConfiguration(configuration, previous: runtime)
        let newShared = SharedState(runtime: newRuntime, logger: logger, events: shared.events, previous: shared)
        deliveries?.update(shared: newShared)
        for worker in workers {
            worker.loop.execute(with: worker) {
                $0.apply(runtime: newRuntime, shared: newShared)
                $0.useCertificates(contexts)
            }
        }
        // The checker is made here and given to the admin loop; the admin
        // server and the old checker already belong to it.
        let checker = HealthChecker(loop: adminLoop, runtime: newRuntime, shared: newShared, logger: logger)
        let fresh = LoopBound(handing: checker, to: adminLoop)
        let (admin, retired) = (admin, healthChecker)
        adminLoop.execute {
            retired?.value.stop()
            fresh.value.start()
            admin?.value.update(runtime: newRuntime, shared: newShared)
        }
        healthChecker = fresh
        runtime = newRuntime
        self.shared = newShared
        logger.info(
            "configuration reloaded", metadata: ["config": "\(configuration.source)", "routes": "\(configuration.routes.count)"])
        newShared.events.publish("config_reloaded", [("source", configuration.source)])
        return []
    }

    /// Runs `body` on worker `index`'s loop, where its delegate methods
    /// run (tests: the events an HTTP/2 connection reports, called as it would).
    func onWorker(_ index: Int = 0, _ body: @escaping @Sendable (ProxyWorker) -> Void) {
        let worker = workers[index]
        worker.loop.execute(with: worker, body)
    }

    /// A reload was refused before it reached the server (the file has errors).
    public func reloadRejected(source: String, problems: [String]) {
        shared?.events.publish("config_rejected", [("source", source), ("problems", problems.joined(separator: "; "))])
    }

    /// Graceful stop (SIGTERM): stop accepting, `/readyz` turns 503, let
    /// in-flight and parked commands finish until `timeout`, answer what is
    /// left with its error, then stop. Blocks the calling thread.
    public func drain(timeout: Duration) {
        guard let shared else { return stop() }
        ready.value.store(false, ordering: .releasing)
        logger.info("draining", metadata: ["in_flight": "\(shared.inFlight.current)", "timeout": "\(timeout.configText)"])
        for worker in workers { worker.loop.execute(with: worker) { $0.stopAccepting() } }
        // Delivery rounds: none start from now on; those running may finish
        // (a round cut short is queued again, and may then arrive twice).
        deliveries?.stop()
        let rounds = { self.deliveries?.roundsInFlight ?? 0 }
        let deadline = clock.now() + timeout
        while shared.inFlight.current > 0 || rounds() > 0, clock.now() < deadline {
            usleep(20_000)
        }
        let left = shared.inFlight.current
        if left > 0 || rounds() > 0 {
            logger.warning(
                "drain timeout: answering what is left",
                metadata: ["in_flight": "\(left)", "delivery_rounds": "\(rounds())"])
            for worker in workers { worker.loop.execute(with: worker) { $0.answerEverything() } }
            let grace = clock.now() + .seconds(1)
            while shared.inFlight.current > 0 || rounds() > 0, clock.now() < grace { usleep(20_000) }
        }
        stop()
    }

    /// Stops accepting, drops what is in flight, and ends the loops. Returns
    /// when every loop thread has ended. Safe to call more than once.
    /// The exporter of spans (`tracing`), stopped after the loops.
    private var tracer: Tracer?
    /// The version spans name their instrumentation scope with.
    public static let version = "0.1.0"

    public func stop() {
        let already = stopped.withLock { s -> Bool in
            defer { s = true }
            return s
        }
        guard !already else { return }
        ready.value.store(false, ordering: .releasing)
        // No new delivery rounds; those running are dropped with the workers
        // and queued again when the store closes, after the loops end.
        deliveries?.stop()
        for worker in workers {
            worker.loop.execute(with: worker) {
                $0.shutdown()
                $0.loop.stop()
            }
        }
        for loop in loops { loop.join() }
        if let adminLoop, let admin {
            let (checker, events) = (healthChecker, shared?.events)
            adminLoop.execute {
                checker?.value.stop()
                events?.closeAll()
                admin.value.server.close()
                adminLoop.stop()
            }
            adminLoop.join()
        }
        deliveries?.close()
        deliveries = nil
        // The spans of the requests answered during the drain go out last,
        // within the exporter's flush budget (2 s): a collector that never
        // answers cannot hold the stop past it.
        if let exporter = tracer?.exporter {
            exporter.stop()
            let dropped = exporter.dropped.load(ordering: .relaxed)
            if dropped > 0 {
                logger.warning(
                    "spans were not exported: the collector did not take them, or the flush at stop ran out of time",
                    metadata: [
                        "dropped": "\(dropped)", "dropped_at_stop": "\(exporter.droppedAtStop.load(ordering: .relaxed))",
                        "flush_budget": "\(exporter.flushBudget.configText)", "endpoint": "\(exporter.endpoint)",
                    ])
            }
        }
        tracer = nil
        // Every loop has stopped. What holds an event on a loop's base goes
        // first (workers with their listeners, libcurl clients and requests;
        // the admin side), then each loop's idle timers; the bases are freed
        // when the last of their users is gone (see `EventLoop`).
        shared?.forgetWorkers()
        workers.removeAll()
        admin = nil
        healthChecker = nil
        shared = nil
        for loop in loops { loop.close() }
        adminLoop?.close()
        loops.removeAll()
        adminLoop = nil
        logger.info("proxy stopped")
    }
}
