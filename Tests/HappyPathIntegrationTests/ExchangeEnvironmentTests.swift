import HappyPathConfig
import HappyPathCore
import HappyPathDemo
import HappyPathIO
import HappyPathPolicies
import Logging
import Testing

@testable import HappyPathServer

/// An exchange needs only its `ExchangeEnvironment`, not a worker: here one
/// is driven on a real loop against the real demo upstream through an
/// environment of the test's own, which grants every slot and counts what
/// the exchange asks of it.
@Suite struct ExchangeEnvironmentTests {
    /// An environment without a worker: the transports on its own loop,
    /// slots always free, parking refused, everything it is asked counted.
    final class TestEnvironment: ExchangeEnvironment, @unchecked Sendable {
        let clock: Clock = MonotonicClock()
        let loop: EventLoop
        let logger = Logger.happypath(level: .critical)
        let logsAccess = false
        let idleTimeout: Duration = .seconds(5)
        let maxTrailerBytes = 8192
        let metrics = WorkerMetrics(ProxyMetrics())
        let tunnelsOpen = InFlightCount()
        var stale: StaleStore? { nil }
        let transports: UpstreamTransports
        private var seed: UInt64 = 1
        /// What the exchange asked for, by name (on the loop; read once it ended).
        let asked = Locked<[String: Int]>([:])
        let ended = Locked<(status: Int, code: String, attempts: Int)?>(nil)
        /// The exchange's stored properties, as the runtime lists them.
        let storedProperties = Locked(0)

        init(loop: EventLoop) {
            self.loop = loop
            let curl = UpstreamClient(loop: loop, maxConnectionsPerHost: 4, maxCachedConnections: 4)
            transports = UpstreamTransports(
                curl: curl,
                h2: HTTP2UpstreamClient(
                    loop: loop, clock: { MonotonicClock().now() },
                    limits: HTTP2ClientLimits(maxHeadBytes: 8192, maxHeadFields: 100), maxConnectionsPerEndpoint: 4))
        }

        private func count(_ what: String) { asked.withLock { $0[what, default: 0] += 1 } }

        func random() -> UInt64 {
            seed = seed &* 6_364_136_223_846_793_005 &+ 1
            return seed >> 11
        }
        func startTry(_ request: UpstreamRequest, handler: UpstreamResponseHandler) -> any UpstreamTry {
            count("try")
            return transports.start(request, handler: handler)
        }
        func nextEndpointIndex(for guardian: UpstreamGuard, count: Int) -> Int { 0 }
        func acquireSlot(_ exchange: Exchange, guardian: UpstreamGuard, at now: Instant)
            -> ConcurrencyLimiter<Exchange>.Acquisition
        {
            count("acquire")
            return .granted
        }
        func tryAcquireSlot(guardian: UpstreamGuard, _ holder: SlotHolder) -> Bool { false }
        func releaseSlot(guardian: UpstreamGuard, _ holder: SlotHolder) { count("release") }
        func releaseSlot(_ lane: Lane, _ holder: SlotHolder) { count("release") }
        func leaveQueue(_ exchange: Exchange, lane: Lane) {}
        func moveToStreams(_ lane: Lane, _ holder: SlotHolder) -> Bool { false }
        func streamEnded(_ lane: Lane) {}
        func giveBack(_ slot: HeldSlot) {}
        func sampleTry(_ lane: Lane, from start: Instant, to end: Instant, inFlight: Int, kind: UInt64) {}
        func park(_ exchange: Exchange, reason: Exchange.ParkReason) -> Bool {
            count("park \(reason.rawValue)")
            return false
        }
        func unpark(_ exchange: Exchange) {}
        func parkedForPause(_ exchange: Exchange) {}
        func scheduleProbe(guardian: UpstreamGuard, after: Duration) {}
        func paused(_ guardian: UpstreamGuard, until: Instant) {}
        func recovered(_ guardian: UpstreamGuard) {}
        func startRefresh(guardian: UpstreamGuard) {}
        func tunnelOpened(_ tunnel: Tunnel, route: RuntimeRoute, upstream: RuntimeUpstream, slotOf slot: HeldSlot?) {}
        /// The exchange in flight, held here as a worker holds its own
        /// (`active`) until it finishes (on the loop).
        var active: Exchange?

        func finished(_ exchange: Exchange) {
            // Let go as the worker does: the client no longer reports to it.
            exchange.request.observer = nil
            active = nil
            ended.withLock { $0 = (exchange.finalStatus, exchange.finalCode, exchange.command.attempt) }
        }
    }

    /// The client's side: the status it was answered.
    final class RecordingClient: ExchangeClient, @unchecked Sendable {
        var observer: HTTPRequestObserver?
        var status = 0
        var ended = false
        func header(_ name: String) -> String? { nil }
        func forEachRawHeader(_ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void) {}
        var protocolName: StaticString { "HTTP/1.1" }
        func clearResponseHeaders() {}
        func addResponseHeader(_ name: String, _ value: String) {}
        func addResponseHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {}
        func removeResponseHeaders(nominatedBy connectionValue: UnsafeRawBufferPointer) {}
        func addResponseTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {}
        func startReply(status: Int, contentLength: Int?, reason: [UInt8]?) { self.status = status }
        func sendInformational(status: Int, fields: UnsafeRawBufferPointer) {}
        func send(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained: Bool) {}
        var pendingOutput: Int { 0 }
        var outputRoom: Int { Int.max }
        func permitReadAhead() {}
        func endReply() { ended = true }
        func abort() {}
        func reply(status: Int, headers: [HTTPField], body: String?) {
            self.status = status
            ended = true
        }
        var isRefusedGRPCCall: Bool { false }
        var grpcWeb: GRPCWeb.Mode? { nil }
    }

    /// Runs one GET of `path` through an exchange on `route` of `yaml`'s
    /// configuration; returns the environment once the exchange ended.
    func run(_ path: String, yaml: String) throws -> TestEnvironment? {
        let configuration = try ConfigLoader.parse(yaml, file: "test.yaml")
        let runtime = RuntimeConfiguration(configuration)
        let loop = EventLoop()
        let env = TestEnvironment(loop: loop)
        let shared = SharedState(runtime: runtime, logger: env.logger, events: EventBus(loop: loop))
        loop.start(name: "exchange-env")
        defer {
            // The transports end on their loop, then the loop's thread is joined.
            let shut = Locked(false)
            loop.execute {
                env.transports.shutdown()
                shut.withLock { $0 = true }
            }
            waitUntil("the transports shut down") { shut.withLock { $0 } }
            loop.stop()
            loop.join()
            loop.close()
        }
        let client = RecordingClient()
        let route = runtime.routes[0]
        loop.execute {
            let command = Command(
                requestID: "env-1", method: "GET", target: path, headers: HeaderBlock([HTTPField(name: "Host", value: "x")]),
                body: .empty, routeIndex: 0, upstream: runtime.upstreams[0].name,
                deadline: env.clock.now() + route.timeout)
            let exchange = Exchange(
                env: env, request: client, route: route, upstream: runtime.upstreams[0], guardian: shared.guards[0],
                command: command)
            env.storedProperties.withLock { $0 = Mirror(reflecting: exchange).children.count }
            env.active = exchange
            exchange.start()
        }
        guard waitUntil("the exchange to end", { env.ended.withLock { $0 } != nil }) else { return nil }
        #expect(client.status == env.ended.withLock { $0 }?.status, "the client got the status the exchange ended with")
        return env
    }

    static func yaml(_ demo: DemoUpstream, retry: String = "{ attempts: 1 }") -> String {
        """
        listen: 127.0.0.1:0
        upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
        routes: [ { match: { path_prefix: / }, upstream: demo, retry: \(retry) } ]
        """
    }

    @Test func anAnswerGoesToTheClientThroughTheEnvironment() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let env = try #require(try run("/ok", yaml: Self.yaml(demo)))
        #expect(env.ended.withLock { $0 }?.status == 200)
        #expect(env.ended.withLock { $0 }?.code == "OK")
        let asked = env.asked.withLock { $0 }
        #expect(asked["try"] == 1 && asked["acquire"] == 1 && asked["release"] == 1, "\(asked)")
        // Issue 47: what the exchange keeps is grouped (its facts, timers,
        // result, upgrade) and its life's books are the machine's. Issue 50
        // added two: where the answer goes, and its coalescing group.
        let stored = env.storedProperties.withLock { $0 }
        #expect(stored > 0 && stored <= 27, "the exchange has \(stored) stored properties")
    }

    @Test func retriesTakeAndGiveBackASlotEach() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let env = try #require(
            try run("/status/503", yaml: Self.yaml(demo, retry: "{ attempts: 3, backoff: { base: 1ms, max: 2ms } }")))
        let ended = env.ended.withLock { $0 }
        #expect(ended?.attempts == 3, "the machine retried through the environment")
        #expect(ended?.status == 503)
        let asked = env.asked.withLock { $0 }
        #expect(asked["try"] == 3 && asked["acquire"] == 3 && asked["release"] == 3, "\(asked)")
    }

    @Test func aParkRefusedByTheEnvironmentIsAnswered() throws {
        // Nothing listens on the port the guard names: the connect fails, the
        // exchange asks to park, the environment refuses, the client is answered.
        let closed = RefusingPort()
        let env = try #require(
            try run(
                "/ok",
                yaml: """
                    listen: 127.0.0.1:0
                    upstreams: { down: { endpoints: [http://127.0.0.1:\(closed.port)], reachability: { park_for: 5s } } }
                    routes: [ { match: { path_prefix: / }, upstream: down, retry: { attempts: 1 } } ]
                    """))
        #expect(env.asked.withLock { $0 }["park unreachable"] == 1)
        let ended = env.ended.withLock { $0 }
        #expect(ended?.status == 503, "\(String(describing: ended))")
    }
}
