import HappyPathConfig
import HappyPathCore
import HappyPathIO
import Logging

/// Active health checks (`health_check`), on the admin loop with upstream
/// clients of its own. An upstream is reachable while any endpoint answers
/// at all: its path with a status below 500, or a reset of the stream — or,
/// with a gRPC check (`health_check.grpc`, the default for an upstream
/// serving gRPC routes), gRPC's `Health/Check` with anything but
/// `NOT_SERVING`, `UNAVAILABLE` or a 5xx (`GRPCHealthCheck.Verdict`). When an upstream turns reachable again
/// — or answers after a worker reported it suspect — every worker replays
/// the commands it parked for it.
final class HealthChecker: LoopEventTarget {
    private let loop: EventLoop
    private let runtime: RuntimeConfiguration
    private let shared: SharedState
    private let logger: Logger
    private let client: UpstreamTransports
    private var states: [UpstreamCheck]
    private var timers: [LoopEvent] = []
    private var probes: [ObjectIdentifier: HealthProbe] = [:]
    private var stopped = false

    private struct UpstreamCheck {
        var inFlight = 0
        var anySuccess = false
        /// Endpoints that answered healthy in the check in flight.
        var healthy = 0
        var consecutiveFailures = 0
        var consecutiveSuccesses = 0
    }

    init(loop: EventLoop, runtime: RuntimeConfiguration, shared: SharedState, logger: Logger) {
        self.loop = loop
        self.runtime = runtime
        self.shared = shared
        self.logger = logger
        // A `protocol: h2` upstream is checked on a pool of the admin
        // loop's own: a worker's busy or stalled streams never delay a probe.
        client = UpstreamTransports(
            curl: UpstreamClient(loop: loop, maxConnectionsPerHost: 4, maxCachedConnections: 16),
            h2: HTTP2UpstreamClient(loop: loop, clock: { MonotonicClock().now() }, maxConnectionsPerEndpoint: 1))
        states = Array(repeating: UpstreamCheck(), count: runtime.upstreams.count)
    }

    /// On the admin loop.
    func start() {
        for u in runtime.upstreams.indices {
            let timer = loop.takeEvent(target: self, tag: u)
            timers.append(timer)
            timer.arm(after: interval(u))
        }
    }

    /// On the admin loop. Probes in flight are cancelled first: they point
    /// at this checker and its client.
    func stop() {
        stopped = true
        for t in timers { t.recycle() }
        timers.removeAll()
        for probe in probes.values { probe.abandon() }
        probes.removeAll()
        client.shutdown()
    }

    private func interval(_ u: Int) -> Duration { runtime.upstreams[u].healthCheck.interval }

    func loopEventFired(_ event: LoopEvent) {
        let u = event.tag
        guard !stopped else { return }
        // A paused upstream (pacing) gets no health checks: it asked for
        // nothing until the pause ends, and the first request after it is the probe.
        let paused = u < shared.guards.count && shared.guards[u].pausedFor(at: MonotonicClock().now()) != nil
        if states[u].inFlight == 0, !paused { check(u) }
        event.arm(after: interval(u))
    }

    private func check(_ u: Int) {
        let upstream = runtime.upstreams[u]
        let settings = upstream.healthCheck
        let timeout = settings.timeout
        states[u].inFlight = upstream.endpoints.count
        states[u].anySuccess = false
        states[u].healthy = 0
        let userAgent = HTTPField(name: "User-Agent", value: "happypath-health-check")
        for endpoint in upstream.endpoints {
            let probe = HealthProbe(
                checker: self, upstreamIndex: u, grpc: settings.grpc == nil ? nil : GRPCHealthCheck.Answer())
            probes[ObjectIdentifier(probe)] = probe
            var request = UpstreamRequest(
                origin: endpoint.origin, target: endpoint.basePath + settings.path, method: "GET",
                headers: HeaderBlock([userAgent]), body: .empty, sendsBody: false,
                connectTimeout: min(timeout, upstream.connectTimeout), idleTimeout: timeout, tls: upstream.tls,
                connectTo: endpoint.connectTo, httpVersion: endpoint.httpVersion)
            if upstream.speaksH2, u < shared.guards.count { request.h2Counters = shared.guards[u].h2Counters }
            if let grpc = settings.grpc {
                // A unary call (gRPC over HTTP/2): POST, framed body, and `te: trailers`, which gRPC servers require.
                request.target = endpoint.basePath + GRPCHealthCheck.path
                request.method = "POST"
                request.headers = HeaderBlock([
                    HTTPField(name: "content-type", value: "application/grpc"), HTTPField(name: "te", value: "trailers"),
                    userAgent,
                ])
                request.body = grpcRequestBody(service: grpc.service)
                request.sendsBody = true
            }
            probe.transfer = client.start(request, handler: probe)
            probe.arm(loop: loop, timeout: timeout)
        }
    }

    /// The `Health/Check` request's body, made once per service and shared
    /// by every probe (libcurl reads it while a probe is in flight).
    private var grpcRequestBodies: [String: RequestBody] = [:]

    private func grpcRequestBody(service: String) -> RequestBody {
        if let body = grpcRequestBodies[service] { return body }
        let body = RequestBody(GRPCHealthCheck.request(service: service))
        grpcRequestBodies[service] = body
        return body
    }

    /// A gRPC check's answer was not SERVING: what it said, at debug level
    /// (a turn to unreachable is logged at warning).
    fileprivate func grpcNote(_ u: Int, alive: Bool, _ reason: String) {
        logger.debug(
            alive ? "grpc health check: answered, not SERVING (counted alive)" : "grpc health check: not serving",
            metadata: ["upstream": "\(runtime.upstreams[u].name)", "reason": "\(reason)"])
    }

    fileprivate func finished(_ probe: HealthProbe, _ u: Int, healthy: Bool) {
        probes[ObjectIdentifier(probe)] = nil
        guard !stopped else { return }
        states[u].inFlight -= 1
        if healthy {
            states[u].anySuccess = true
            states[u].healthy += 1
        }
        guard states[u].inFlight == 0 else { return }
        let settings = runtime.upstreams[u].healthCheck
        let guardian = shared.guards[u]
        let reading = HealthCheckReading(
            at: MonotonicClock().now(), healthy: states[u].healthy, endpoints: runtime.upstreams[u].endpoints.count)
        guardian.lastHealthCheck.withLock { $0 = reading }
        let name = runtime.upstreams[u].name
        if states[u].anySuccess {
            states[u].consecutiveFailures = 0
            states[u].consecutiveSuccesses += 1
            let wasReachable = guardian.reachable.load(ordering: .relaxed)
            if !wasReachable, states[u].consecutiveSuccesses >= settings.healthyAfter {
                guardian.reachable.store(true, ordering: .relaxed)
                logger.info("upstream reachable again", metadata: ["upstream": "\(name)"])
                shared.events.publish("upstream_reachable", [("upstream", name)])
            }
            if guardian.reachable.load(ordering: .relaxed),
                !wasReachable || guardian.suspect.exchange(false, ordering: .relaxed)
            {
                shared.recovered(guardian)
            }
        } else {
            states[u].consecutiveSuccesses = 0
            states[u].consecutiveFailures += 1
            if guardian.reachable.load(ordering: .relaxed), states[u].consecutiveFailures >= settings.unhealthyAfter {
                guardian.reachable.store(false, ordering: .relaxed)
                logger.warning("upstream unreachable: health checks failing", metadata: ["upstream": "\(name)"])
                shared.events.publish("upstream_unreachable", [("upstream", name)])
            }
        }
    }
}

/// One health request's result, bounded by its own timer. The checker owns
/// it (its `probes`) until it reports or the checker stops.
private final class HealthProbe: UpstreamResponseHandler, LoopEventTarget {
    let checker: HealthChecker
    let upstreamIndex: Int
    var transfer: (any UpstreamTry)?
    var status = 0
    /// A gRPC check's answer as it arrives; nil for an HTTP check.
    var grpc: GRPCHealthCheck.Answer?
    var timer: LoopEvent?
    var reported = false

    init(checker: HealthChecker, upstreamIndex: Int, grpc: GRPCHealthCheck.Answer?) {
        self.checker = checker
        self.upstreamIndex = upstreamIndex
        self.grpc = grpc
    }

    func arm(loop: EventLoop, timeout: Duration) {
        let t = loop.takeEvent(target: self)
        timer = t
        t.arm(after: timeout)
    }

    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        self.status = status
        grpc?.received(status: status)
    }

    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {}

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        grpc?.received(header: name, value: value)
    }

    func upstreamHeadersComplete() -> String? { nil }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        grpc?.received(body: bytes)
        return true
    }

    func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        grpc?.received(trailer: name, value: value)
    }

    /// A server that answers at all is reachable: any status below 500, an
    /// HTTP/2 stream reset (a gRPC server without the path resets it), or
    /// a gRPC answer other than NOT_SERVING and UNAVAILABLE. Only a failed
    /// connect, a timeout, a dropped connection, a 5xx and those two count
    /// against it.
    func upstreamFinished(_ failure: UpstreamFailure?) {
        transfer = nil
        if case .streamReset? = failure { return report(true) }
        if failure == nil, let grpc {
            let verdict = grpc.verdict
            switch verdict {
            case .serving: break
            case let .alive(reason): checker.grpcNote(upstreamIndex, alive: true, reason)
            case let .down(reason): checker.grpcNote(upstreamIndex, alive: false, reason)
            }
            report(verdict.isUp)
        } else {
            report(failure == nil && status > 0 && status < 500)
        }
    }

    func loopEventFired(_ event: LoopEvent) {
        transfer?.cancel()
        transfer = nil
        report(false)
    }

    private func report(_ healthy: Bool) {
        guard !reported else { return }
        reported = true
        timer?.recycle()
        timer = nil
        checker.finished(self, upstreamIndex, healthy: healthy)
    }

    /// The checker stops: cancel quietly.
    func abandon() {
        reported = true
        timer?.recycle()
        timer = nil
        transfer?.cancel()
        transfer = nil
    }
}
