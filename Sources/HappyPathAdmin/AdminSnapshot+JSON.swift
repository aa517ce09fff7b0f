import Foundation
import HappyPathCore
import HappyPathPolicies

/// `GET /admin/state`: the snapshot as JSON (docs/operations.md). Times
/// are ISO 8601 (UTC), the snapshot's wall clock plus a monotonic duration;
/// durations are seconds.
extension AdminSnapshot {
    public var json: String {
        let upstreams = self.upstreams.map { upstreamJSON($0) }
        let limits = rateLimits.map {
            "{\"route\":\(JSON.quote($0.route)),\"keys\":\($0.keys),\"queued\":\($0.queued)}"
        }
        let fallback =
            self.fallback.map { "{\"entries\":\($0.entries),\"bytes\":\($0.bytes),\"max_bytes\":\($0.maxBytes)}" } ?? "null"
        return """
            {"ready":\(ready),"in_flight":\(inFlight),\
            "parked":\(parked),"max_parked":\(maxParked),\
            "buffered_bytes":\(bufferedBytes),"max_buffered_bytes":\(maxBufferedBytes),\
            "memory":{\(memory.map { "\(JSON.quote($0.pool)):\($0.bytes)" }.joined(separator: ","))},\
            "spooled_bytes":\(spooled),\
            "deliveries":\(deliveriesJSON),\
            "cluster":\(clusterJSON),\
            "rate_limits":[\(limits.joined(separator: ","))],"fallback":\(fallback),\
            "config":{"source":\(JSON.quote(configSource)),"loaded_at":\(JSON.quote(loadedAt.formatted(.iso8601)))},\
            "upstreams":[\(upstreams.joined(separator: ","))],\
            "routes":[\(routes.map { routeJSON($0) }.joined(separator: ","))]}

            """
    }

    /// `takenAt + d` as ISO 8601.
    func at(_ d: Duration) -> String { JSON.quote(takenAt.addingTimeInterval(d.seconds).formatted(.iso8601)) }

    func upstreamJSON(_ u: Upstream) -> String {
        let parked = u.parked.map { "\(JSON.quote($0.reason)):\($0.count)" }
        let endpoints = u.endpoints.map { e in
            "{\"url\":\(JSON.quote(e.url)),\"ejected\":\(e.ejected),"
                + "\"ejected_until\":\(e.ejectedFor.map { at($0) } ?? "null"),\"drained\":\(e.drained)}"
        }
        let paused = u.pausedFor.map { at($0) } ?? "null"
        var token = "null"
        if let t = u.token {
            token = "{\"kind\":\(JSON.quote(t.kind)),\"expires_in_s\":\(t.expiresIn.map(String.init) ?? "null")}"
        }
        var breaker = "{\"state\":\(JSON.quote(u.breaker.name))"
        if case let .open(left) = u.breaker { breaker += ",\"open_for_s\":\(max(0, left.seconds))" }
        // Only when an operator forced it: an automatic breaker reads as before.
        if let forced = u.breaker.forcedTo { breaker += ",\"forced\":\(JSON.quote(forced.rawValue))" }
        breaker += "}"
        let f = u.breakerFailures
        let failures = "{\"consecutive\":\(f.consecutive),\"requests\":\(f.requests),\"failed\":\(f.failed)}"
        var health = "null"
        if let h = u.healthCheck {
            health =
                "{\"healthy_endpoints\":\(h.healthy),\"endpoints\":\(h.endpoints),"
                + "\"checked_at\":\(at(.zero - h.age)),\"age_s\":\(max(0, h.age.seconds))}"
        }
        let c = u.concurrency
        func ms(_ seconds: Double) -> String { c.adaptive && seconds > 0 ? String(Double(Int(seconds * 10_000)) / 10) : "null" }
        let concurrency =
            "{\"limit\":\(c.limit),\"in_flight\":\(c.inFlight),\"queued\":\(c.queued),\"streaming\":\(c.streaming),"
            + "\"adaptive\":\(c.adaptive),"
            + "\"baseline_ms\":\(ms(c.baseline)),\"recent_ms\":\(ms(c.recent))}"
        var h2 = "null"
        if let c = u.h2 {
            h2 =
                "{\"connections\":\(c.connections),\"streams\":\(c.streams),\"connections_opened\":\(c.opened),"
                + "\"streams_replayed\":\(c.replayed),\"goaways\":\(c.goaways)}"
        }
        return """
            {"name":\(JSON.quote(u.name)),"reachable":\(u.reachable),"health_check":\(health),"concurrency":\(concurrency),\
            "circuit_breaker":\(breaker),"endpoints":[\(endpoints.joined(separator: ","))],\
            "parked":{\(parked.joined(separator: ","))},"auth":\(token),"paused_until":\(paused),\
            "pause_cause":\(u.pausedFor == nil || u.pauseCause == 0 ? "null" : String(u.pauseCause)),\
            "paused_clients":\(u.pausedClients),"breaker_failures":\(failures),"retries_left":\(u.retriesLeft),\
            "h2":\(h2)}
            """
    }

    var clusterJSON: String {
        guard let c = cluster else { return "null" }
        return "{\"mode\":\(JSON.quote(c.mode)),\"since\":\(JSON.quote(c.since.formatted(.iso8601))),"
            + "\"replicas\":\(c.replicas),\"reason\":\(c.reason.map(JSON.quote) ?? "null"),\"redis\":\(JSON.quote(c.redis))}"
    }

    var deliveriesJSON: String {
        guard let d = deliveries else { return "null" }
        var json = "{" + d.counts.map { "\(JSON.quote($0.state)):\($0.count)" }.joined(separator: ",")
        json += ",\"held_bytes\":\(d.heldBytes),\"max_bytes\":\(d.maxBytes),\"rounds_in_flight\":\(d.roundsInFlight)"
        json += ",\"store\":\(JSON.quote(d.store)),\"writable\":\(d.writable)"
        json += ",\"store_problem\":\(d.problem.map(JSON.quote) ?? "null")"
        json += ",\"oldest_pending_s\":\(d.oldestPending.map { String(max(0, $0.seconds)) } ?? "null")"
        if let pending = d.pending {
            let each = pending.map {
                "{\"upstream\":\(JSON.quote($0.upstream)),\"count\":\($0.count),\"oldest_s\":\(max(0, $0.oldest.seconds))}"
            }
            json += ",\"pending\":[\(each.joined(separator: ","))]"
        } else {
            json += ",\"pending\":null"
        }
        return json + "}"
    }

    func routeJSON(_ r: RouteTotals) -> String {
        func number(_ v: Double?) -> String {
            guard let v else { return "null" }
            return v.isFinite ? String(v) : "null"
        }
        func bound(_ v: Double?) -> String {
            guard let v else { return "null" }
            return v.isFinite ? String(v) : "\"+Inf\""
        }
        let kinds = r.fallbacksByKind.sorted { $0.key < $1.key }.map { "\(JSON.quote($0.key)):\(number($0.value))" }
        var json = """
            {"route":\(JSON.quote(r.route)),"requests":\(number(r.requests)),"errors":\(number(r.errors)),\
            "tries":\(number(r.tries)),"p50_s":\(bound(r.p50)),"p99_s":\(bound(r.p99)),\
            "hedges_won":\(number(r.hedgesWon)),"hedges_lost":\(number(r.hedgesLost)),\
            "fallbacks":{\(kinds.joined(separator: ","))},"rate_limited":\(number(r.rateLimited)),\
            "coalesced":\(number(r.coalesced)),"window":
            """
        if let w = windows[r.route] {
            json += """
                {"seconds":\(number(w.seconds)),"requests_per_s":\(number(w.requestsPerSecond)),\
                "error_ratio":\(number(w.errorRatio)),"p50_s":\(bound(w.p50)),"p99_s":\(bound(w.p99)),\
                "tries_per_request":\(number(w.triesPerRequest))}
                """
        } else {
            json += "null"
        }
        return json + "}"
    }
}
