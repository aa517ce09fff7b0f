import HappyPathAdmin
import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// The admin API's actions on an upstream (docs/operations.md, "Admin
/// actions"): drain an endpoint and undrain it, force the breaker open or
/// closed and release it. `POST` only, so the listener's cross-site rule
/// applies to each as to a delivery replay; each is logged and published
/// as an event with `by`, the admin client's address, and the time.
///
/// - `POST /admin/upstreams/{name}/endpoints/{i}/drain` (`i` from 0, as
///   `/admin/state` lists them) and `.../undrain`
/// - `POST /admin/upstreams/{name}/breaker/open`, `.../closed`, `.../auto`
extension AdminServer {
    func upstreamsAPI(_ request: HTTPRequest, path: String, name: String, action: AdminAction.UpstreamAction) {
        let requestID = ids.requestID()
        func refuse(_ status: Int, _ code: ProblemCode, _ detail: String) {
            Self.respond(request, .init(status, code, detail), requestID: requestID)
        }
        let unknown = "No admin resource at \(path). " + AdminAction.upstreamsUsage
        guard let u = runtime.upstreams.firstIndex(where: { $0.name == name }), u < shared.guards.count else {
            return refuse(404, .notFound, "No upstream named '\(name)'.")
        }
        let guardian = shared.guards[u]
        let by = request.peerAddress
        switch action {
        case let .endpoint(index, drain):
            let endpoints = runtime.upstreams[u].endpoints
            guard let i = Int(index), endpoints.indices.contains(i) else {
                return refuse(
                    404, .notFound, "Upstream '\(name)' has endpoints 0 to \(endpoints.count - 1); got '\(index)'.")
            }
            let url = endpoints[i].url
            switch drain {
            case true?:
                guard guardian.drain(endpoint: i, url: url, by: by) == .drained else {
                    return refuse(
                        409, .clientError,
                        "\(url) is the last endpoint of '\(name)' not drained: draining it would leave none to send to.")
                }
            case false?:
                _ = guardian.undrain(endpoint: i, url: url, by: by)
            case nil:
                return refuse(404, .noRoute, unknown)
            }
            let drained = guardian.rotation(at: clock.now())[i] == .drained
            request.reply(
                status: 200, headers: Self.json,
                body: "{\"upstream\":\(JSON.quote(name)),\"endpoint\":\(i),\"url\":\(JSON.quote(url)),\"drained\":\(drained)}\n")
        case let .breaker(breaker):
            let forced: CircuitBreakerStateMachine.Forced?
            switch breaker {
            case .open?: forced = .open
            case .closed?: forced = .closed
            case .auto?: forced = nil
            case nil: return refuse(404, .noRoute, unknown)
            }
            let state = guardian.forceBreaker(forced, by: by, at: clock.now())
            // Requests parked behind the breaker go now that it lets tries through.
            if state == .closed { shared.recovered(guardian) }
            let said = forced.map { JSON.quote($0.rawValue) } ?? "null"
            request.reply(
                status: 200, headers: Self.json,
                body: "{\"upstream\":\(JSON.quote(name)),\"state\":\(JSON.quote(state.name)),\"forced\":\(said)}\n")
        case .unknown:
            refuse(404, .noRoute, unknown)
        }
    }

    /// Fills in what `/admin/state` and the page show beyond the counters:
    /// each endpoint in rotation, ejected until when or drained; a forced
    /// breaker; the pause's reason; the last health check. Read under the
    /// guard's locks, on the admin loop.
    func operatorView(of guardian: UpstreamGuard, h2Client: Bool, into u: inout AdminSnapshot.Upstream, at now: Instant) {
        let rotation = guardian.rotation(at: now)
        for (i, e) in u.endpoints.enumerated() where i < rotation.count {
            u.endpoints[i] = AdminSnapshot.Endpoint(url: e.url, rotation[i], at: now)
        }
        if let forced = guardian.breakerForced { u.breaker = .forced(forced) }
        if u.pausedFor != nil { u.pauseCause = guardian.pauseCause }
        u.healthCheck = guardian.lastHealthCheck.withLock { $0 }.map {
            AdminSnapshot.HealthCheck(age: now - $0.at, healthy: $0.healthy, endpoints: $0.endpoints)
        }
        u.concurrency = guardian.concurrencyReading
        if h2Client {
            let c = guardian.h2Counters
            u.h2 = AdminSnapshot.H2Client(
                connections: c.connections.now, streams: c.streams.now, opened: c.opened.now, replayed: c.replayed.now,
                goaways: c.goaways.now)
        }
    }
}
