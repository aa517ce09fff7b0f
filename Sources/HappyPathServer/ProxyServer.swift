import HappyPathConfig
import HappyPathCore
import HappyPathIO
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The running proxy: `workers` event loops sharing the listen port, plus the
/// admin listener on a loop of its own.
public final class ProxyServer: @unchecked Sendable {
    public let runtime: RuntimeConfiguration
    private let logger: Logger
    private let clock: Clock
    private let workerCount: Int
    private var loops: [EventLoop] = []
    private var workers: [ProxyWorker] = []
    private var adminLoop: EventLoop?
    private var admin: AdminServer?
    private var healthChecker: HealthChecker?
    private var shared: SharedState?
    private let ready = ReadyFlag()
    private let stopped = Mutex(false)
    public private(set) var port = 0
    public private(set) var adminPort = 0

    /// - Parameters:
    ///   - workers: event-loop threads; nil uses the configuration (`auto` = cores).
    public init(configuration: Configuration, workers: Int? = nil, logger: Logger, clock: Clock = MonotonicClock()) {
        runtime = RuntimeConfiguration(configuration)
        self.logger = logger
        self.clock = clock
        workerCount = max(1, workers ?? configuration.workers ?? Self.coreCount)
    }

    static var coreCount: Int { max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }

    /// Binds every listener and starts the loops. Throws if a port cannot be bound.
    public func start() throws(SocketError) {
        EventLoop.initializeLibraries()
        let config = runtime.configuration
        let shared = SharedState(runtime: runtime, logger: logger)
        self.shared = shared
        var bindPort = config.listen.port
        for i in 0..<workerCount {
            let loop = EventLoop()
            // With port 0 the first worker picks the port; the others join it.
            let worker = try ProxyWorker(
                loop: loop, runtime: runtime, shared: shared, host: config.listen.host, port: bindPort,
                workers: workerCount, clock: clock, logger: logger)
            shared.register(worker)
            if i == 0 { bindPort = worker.port }
            loops.append(loop)
            workers.append(worker)
        }
        port = bindPort
        let adminLoop = EventLoop()
        let admin = try AdminServer(
            loop: adminLoop, host: config.admin.listen.host, port: config.admin.listen.port, ready: ready)
        adminPort = admin.server.port
        self.adminLoop = adminLoop
        self.admin = admin
        let checker = HealthChecker(loop: adminLoop, runtime: runtime, shared: shared, logger: logger)
        healthChecker = checker
        for (i, loop) in loops.enumerated() { loop.start(name: "worker-\(i)") }
        let checkerBox = CheckerBox(checker)
        adminLoop.execute { checkerBox.checker.start() }
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

    /// Stops accepting, drops what is in flight, and ends the loops. Returns
    /// when every loop thread has ended. Safe to call more than once.
    public func stop() {
        let already = stopped.withLock { s -> Bool in
            defer { s = true }
            return s
        }
        guard !already else { return }
        ready.value.store(false, ordering: .releasing)
        for (loop, worker) in zip(loops, workers) {
            let box = WorkerBox(worker)
            loop.execute {
                box.worker.shutdown()
                box.loop.stop()
            }
        }
        for loop in loops { loop.join() }
        if let adminLoop, let admin {
            let box = AdminBox(admin, adminLoop, healthChecker)
            adminLoop.execute {
                box.checker?.stop()
                box.admin.server.close()
                box.loop.stop()
            }
            adminLoop.join()
        }
        logger.info("proxy stopped")
    }
}

/// Hands a worker to its own loop's thread (it is only touched there).
private final class WorkerBox: @unchecked Sendable {
    let worker: ProxyWorker
    var loop: EventLoop { worker.loop }
    init(_ worker: ProxyWorker) { self.worker = worker }
}

private final class AdminBox: @unchecked Sendable {
    let admin: AdminServer
    let loop: EventLoop
    let checker: HealthChecker?
    init(_ admin: AdminServer, _ loop: EventLoop, _ checker: HealthChecker?) {
        self.admin = admin
        self.loop = loop
        self.checker = checker
    }
}

private final class CheckerBox: @unchecked Sendable {
    let checker: HealthChecker
    init(_ checker: HealthChecker) { self.checker = checker }
}
