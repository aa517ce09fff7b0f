import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import Synchronization

/// The admin listener, on its own loop so a busy proxy worker never delays a
/// probe: `/healthz`, `/readyz`, `/metrics`, `/admin/state`, `/admin/events`.
/// Answers only its own paths, and only to loopback clients unless
/// `admin.allow_remote` says otherwise (read from the current configuration,
/// so a reload that changes it takes effect at the next request).
final class AdminServer: HTTPServerDelegate {
    private let ready: ReadyFlag
    private var shared: SharedState
    private var runtime: RuntimeConfiguration
    private let clock: Clock
    private(set) var server: HTTPServer!
    private var ids = IdentifierGenerator()

    init(
        loop: EventLoop, configuration: Configuration, ready: ReadyFlag, shared: SharedState, runtime: RuntimeConfiguration,
        clock: Clock
    ) throws(SocketError) {
        self.ready = ready
        self.shared = shared
        self.runtime = runtime
        self.clock = clock
        server = try HTTPServer(
            loop: loop, host: configuration.admin.listen.host, port: configuration.admin.listen.port, reusePort: false,
            limits: HTTPServerLimits(maxHeaderBytes: 16 * 1024, maxBodyBytes: 64 * 1024, timeout: .seconds(3600)),
            delegate: self)
    }

    static let json = [HTTPField(name: "Content-Type", value: "application/json")]

    /// A reload: the state page shows the new configuration. On the admin loop.
    func update(runtime: RuntimeConfiguration, shared: SharedState) {
        self.runtime = runtime
        self.shared = shared
    }

    func serve(_ request: HTTPRequest) {
        if !runtime.configuration.admin.allowRemote, !Self.isLoopback(request.peerAddress) {
            ProblemResponder.respond(
                request,
                Problem(
                    .forbidden, requestID: ids.requestID(),
                    detail: "The admin listener answers loopback clients only (admin.allow_remote)."))
            return
        }
        guard request.method == "GET" || request.method == "HEAD" else {
            ProblemResponder.respond(
                request, Problem(.badRequest, requestID: ids.requestID(), detail: "The admin API is read-only: use GET."))
            return
        }
        switch Router.split(target: request.target).path {
        case "/healthz":
            request.reply(status: 200, headers: Self.json, body: "{\"status\":\"ok\"}\n")
        case "/readyz":
            if ready.value.load(ordering: .acquiring) {
                request.reply(status: 200, headers: Self.json, body: "{\"status\":\"ready\"}\n")
            } else {
                request.reply(status: 503, headers: Self.json, body: "{\"status\":\"not ready\"}\n")
            }
        case "/metrics":
            request.reply(
                status: 200, headers: [HTTPField(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")],
                body: shared.metrics.exposition(bodies: shared.bodies))
        case "/admin/state":
            request.reply(status: 200, headers: Self.json, body: state())
        case "/admin/events":
            shared.events.subscribe(request)
        default:
            ProblemResponder.respond(
                request,
                Problem(
                    .noRoute, requestID: ids.requestID(),
                    detail: "The admin listener serves /healthz, /readyz, /metrics, /admin/state and /admin/events."))
        }
    }

    func reject(_ request: HTTPRequest, reason: HTTP1Refusal) {
        ProblemResponder.respond(
            request, ProblemResponder.problem(for: reason, requestID: ids.requestID(), limits: server.limits))
    }

    static func isLoopback(_ address: String) -> Bool {
        address.hasPrefix("127.") || address == "::1" || address.hasPrefix("::ffff:127.")
    }

    /// Each upstream's endpoints, health, breaker and parked counts, token
    /// expiry (never the token), and where the config came from.
    private func state() -> String {
        let now = clock.now()
        let config = runtime.configuration
        var upstreams: [String] = []
        for (u, upstream) in runtime.upstreams.enumerated() {
            let guardian = shared.guards[u]
            let parked = Exchange.ParkReason.allCases.map {
                "\(JSON.quote($0.rawValue)):\(guardian.parkedCount($0))"
            }
            let ejected = guardian.ejected(at: now)
            let endpoints = upstream.endpoints.enumerated().map { i, e in
                "{\"url\":\(JSON.quote(e.url)),\"ejected\":\(ejected.contains(i))}"
            }
            var token = "null"
            if let source = guardian.tokens {
                let expires = source.expiresIn(at: now).map { String(Int($0.seconds.rounded())) } ?? "null"
                token = "{\"kind\":\(JSON.quote(source.settings.kind.rawValue)),\"expires_in_s\":\(expires)}"
            }
            let breaker = guardian.breakerState
            var breakerJSON = "{\"state\":\(JSON.quote(breaker.name))"
            if case let .open(until) = breaker { breakerJSON += ",\"open_for_s\":\(max(0, (until - now).seconds))" }
            breakerJSON += "}"
            upstreams.append(
                """
                {"name":\(JSON.quote(upstream.name)),"reachable":\(guardian.reachable.load(ordering: .relaxed)),\
                "circuit_breaker":\(breakerJSON),"endpoints":[\(endpoints.joined(separator: ","))],\
                "parked":{\(parked.joined(separator: ","))},"auth":\(token)}
                """)
        }
        let loaded = shared.loadedAt.formatted(.iso8601)
        return """
            {"ready":\(ready.value.load(ordering: .relaxed)),"in_flight":\(shared.inFlight.current),\
            "parked":\(shared.parked.current),"max_parked":\(shared.parked.limit),\
            "buffered_bytes":\(shared.bodies.current),"max_buffered_bytes":\(shared.bodies.limit),\
            "config":{"source":\(JSON.quote(config.source)),"loaded_at":\(JSON.quote(loaded))},\
            "upstreams":[\(upstreams.joined(separator: ","))]}

            """
    }
}

/// Atomic<Bool> is not copyable; the admin server and the proxy share one through this box.
final class ReadyFlag: Sendable {
    let value = Atomic<Bool>(false)
}
