import Foundation
import HappyPathCore
import HappyPathConfig
import HappyPathDemo
import Logging
import Synchronization
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Metrics, admin state, live events, access log, drain.
@Suite("operations") struct OperationsTests {
    func samples(_ text: String) -> [String: Double] { metricSamples(text) }

    @Test func metricsParseAndMove() throws {
        let (h, _) = try ProxyHarness.scripted(
            [http(503), http(200, "ok"), http(500), http(500)],
            defaults:
                "{ retry: { on: [503], attempts: 2 }, circuit_breaker: { consecutive_failures: 2, while_open: fail }, reachability: { park_for: 0s } }"
        )
        let before = try HTTP.request(port: h.adminPort, "/metrics")
        #expect(before.status == 200)
        #expect(before.header("Content-Type")?.hasPrefix("text/plain") == true)
        #expect(samples(before.text)["happypath_circuit_state{upstream=\"u\"}"] == 0)
        #expect(try HTTP.request(port: h.port, "/a").status == 200)  // 503, retried, 200
        _ = try HTTP.request(port: h.port, "/b")  // 500: first failure
        _ = try HTTP.request(port: h.port, "/c")  // 500: second, breaker opens
        // A request is counted just after its answer is written: wait for the third.
        var text = ""
        waitUntil("the third request in /metrics") {
            text = try HTTP.request(port: h.adminPort, "/metrics").text
            return samples(text)["happypath_request_duration_seconds_count{route=\"/\"}"] == 3
        }
        let s = samples(text)
        #expect(s["happypath_requests_total{route=\"/\",code=\"OK\"}"] == 1)
        #expect(s["happypath_requests_total{route=\"/\",code=\"UPSTREAM_UNAVAILABLE\"}"] == 2)
        #expect(s["happypath_retries_total{upstream=\"u\"}"] == 1)
        #expect(s["happypath_upstream_tries_total{upstream=\"u\",outcome=\"server_error\"}"] == 3)
        #expect(s["happypath_upstream_tries_total{upstream=\"u\",outcome=\"success\"}"] == 1)
        #expect(s["happypath_circuit_state{upstream=\"u\"}"] == 2)
        #expect(s["happypath_request_duration_seconds_count{route=\"/\"}"] == 3)
        #expect(text.contains("# TYPE happypath_request_duration_seconds histogram"))
        #expect(s["happypath_parked_commands{upstream=\"u\",reason=\"unreachable\"}"] == 0)
    }

    /// A proxy whose breaker opens on the first 500 from `up` and then fails fast.
    func oneFailureOpensTheBreaker(_ up: ScriptedUpstream) throws -> ProxyHarness {
        try ProxyHarness(
            ProxyHarness.single(
                upstream: "http://127.0.0.1:\(up.port)",
                defaults:
                    "{ retry: { on: [500], attempts: 1 }, circuit_breaker: { consecutive_failures: 1, while_open: fail }, reachability: { park_for: 0s } }"
            ))
    }

    @Test func adminStateReflectsAnOpenBreaker() throws {
        let up = ScriptedUpstream(responses: [http(500)]).started()
        defer { up.stop() }
        let h = try oneFailureOpensTheBreaker(up)
        let closed = try HTTP.request(port: h.adminPort, "/admin/state").json
        let first = (closed["upstreams"] as? [[String: Any]])?.first
        #expect((first?["circuit_breaker"] as? [String: Any])?["state"] as? String == "closed")
        _ = try HTTP.request(port: h.port, "/x")
        let open = try HTTP.request(port: h.adminPort, "/admin/state").json
        let upstream = (open["upstreams"] as? [[String: Any]])?.first
        #expect(upstream?["name"] as? String == "u")
        #expect((upstream?["circuit_breaker"] as? [String: Any])?["state"] as? String == "open")
        #expect(upstream?["reachable"] as? Bool == true)
        #expect((open["config"] as? [String: Any])?["source"] as? String == "test.yaml")
    }

    @Test func eventStreamDeliversBreakerOpened() throws {
        let up = ScriptedUpstream(responses: [http(500)]).started()
        defer { up.stop() }
        let h = try oneFailureOpensTheBreaker(up)
        let events = try TestConnection(port: h.adminPort, timeout: 5)
        try events.send("GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1:\(h.adminPort)\r\n\r\n")
        var received = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        /// Reads the stream until it contains `text` (or ends, or stays
        /// silent for the connection's 5 s receive timeout).
        func read(until text: String) {
            while !received.contains(text) {
                let n = recv(events.fd, &chunk, chunk.count, 0)
                if n <= 0 { return }
                received += String(decoding: chunk[0..<n], as: UTF8.self)
            }
        }
        // The stream's opening comment comes once the subscription is in place.
        read(until: ": happypath events")
        #expect(received.contains(": happypath events"))
        _ = try HTTP.request(port: h.port, "/x")
        read(until: "event: breaker_opened")
        #expect(received.contains("text/event-stream"))
        #expect(received.contains("event: breaker_opened"))
        #expect(received.contains("\"upstream\":\"u\""))
    }

    @Test func drainDeliversTheResponseInFlightAndTurnsReadyzOff() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams: { demo: { endpoints: [{{DEMO}}] } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """)
        let admin = AdminProbe(port: h.adminPort)
        let client = try TestConnection(port: h.port)
        try client.send("GET /slow?ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        waitUntil("the slow request in flight") { try admin.inFlight() == 1 }
        let drained = Locked(false)
        let proxy = h.proxy
        let t = Thread {
            proxy.drain(timeout: .seconds(5))
            drained.withLock { $0 = true }
        }
        t.start()
        waitUntil("/readyz to turn 503") { try HTTP.request(port: h.adminPort, "/readyz").status == 503 }
        let readyz = try HTTP.request(port: h.adminPort, "/readyz")
        #expect(readyz.status == 503)
        // ...while the response is still in flight.
        #expect(try admin.inFlight() == 1)
        #expect(!Edge.readable(client, ms: 0))
        let r = try client.readResponse()
        #expect(r.status == 200)
        #expect(r.json["delayed_ms"] as? Int == 1000)
        #expect(waitUntil("drain() to return") { drained.withLock { $0 } })
    }

    @Test func sigtermDuringAnUpstreamCallDeliversItAndExitsZero() throws {
        #expect(
            FileManager.default.isExecutableFile(atPath: happypathBinary),
            "\(happypathBinary) is built by `swift build --build-tests`")
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
                routes: [ { match: { path_prefix: / }, upstream: demo } ]
                """)
        // The first line says where it listens: "listening on http://127.0.0.1:PORT".
        let port = try #require(serve.listeningPort())
        #expect(serve.output.hasPrefix("listening on http://127.0.0.1:\(port)\n"))
        serve.waitForSignalHandlers()
        let client = try TestConnection(port: port)
        try client.send("GET /slow?ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        waitUntil("the request at the upstream") { demo.hits.load(ordering: .relaxed) == 1 }
        serve.signal(SIGTERM)
        let r = try client.readResponse()
        #expect(r.status == 200)
        #expect(serve.waitForExit())
        #expect(!serve.process.isRunning)
        if !serve.process.isRunning { #expect(serve.process.terminationStatus == 0) }
    }
}

@Suite("reload") struct ReloadTests {
    @Test func goodReloadTakesEffectAndKeepsBreakerState() throws {
        let up = ScriptedUpstream(responses: [http(500)]).started()
        defer { up.stop() }
        let base = """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { retry: { on: [500], attempts: 1 }, circuit_breaker: { consecutive_failures: 1, while_open: fail }, reachability: { park_for: 0s } }
            upstreams:
              u: { endpoints: [http://127.0.0.1:\(up.port)] }
            """
        // One worker: a reload reaches each worker's loop in its own time,
        // and the first request that sees the new routes on the only worker
        // tells that the reload has taken effect everywhere.
        let h = try ProxyHarness(base + "\nroutes: [ { match: { path_prefix: /old }, upstream: u } ]", workers: 1)
        _ = try HTTP.request(port: h.port, "/old")  // opens the breaker
        #expect(try HTTP.request(port: h.port, "/new").json["code"] as? String == "NO_ROUTE")
        var next = try ConfigLoader.parse(
            base + "\nroutes: [ { match: { path_prefix: /new }, upstream: u } ]", file: "test.yaml")
        // Another listen address is refused: that needs a restart.
        next.listen.port = h.port + 1
        #expect(h.proxy.reload(next) == ["listen cannot change on reload (restart to apply)"])
        #expect(try HTTP.request(port: h.port, "/new").json["code"] as? String == "NO_ROUTE")
        #expect(h.proxy.reload(withPorts(next, like: h.proxy.runtime.configuration)).isEmpty)
        // The first answer that is not NO_ROUTE is the one checked.
        var routed: TestResponse?
        waitUntil("the worker to take the new routes") {
            let r = try HTTP.request(port: h.port, "/new")
            if r.json["code"] as? String == "NO_ROUTE" { return false }
            routed = r
            return true
        }
        let r = try #require(routed)
        #expect(r.json["code"] as? String == "CIRCUIT_OPEN")  // routed now, and the breaker is still open
        #expect(up.appRequests.count == 1)  // only the /old that opened it
        #expect(try HTTP.request(port: h.port, "/old").json["code"] as? String == "NO_ROUTE")
    }

    func withPorts(_ c: Configuration, like old: Configuration) -> Configuration {
        var c = c
        c.listen = old.listen
        c.admin = old.admin
        return c
    }

    @Test func sighupWithABrokenFileKeepsServingAndAGoodOneTakesEffect() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        // One worker: the first request that sees a new route on it tells
        // that the reload took effect (with more, each applies it on its own loop).
        func config(_ routes: String) -> String {
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            workers: 1
            upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
            routes: \(routes)
            """
        }
        let serve = try ServeProcess(config: config("[ { match: { path_prefix: /ok }, upstream: demo } ]"))
        let port = try #require(serve.listeningPort())
        serve.waitForSignalHandlers()
        func get(_ path: String) -> Int? { try? HTTP.request(port: port, path, timeout: 2).status }
        #expect(get("/ok") == 200)
        // Broken: unknown key. The old routes keep working.
        try serve.rewriteConfig(config("[ { match: { path_prefix: /echo }, upstream: demo, bogus: 1 } ]"))
        serve.signal(SIGHUP)
        waitUntil("the reload to be refused") { serve.errors.contains("configuration reload refused") }
        #expect(serve.process.isRunning)
        #expect(get("/ok") == 200)
        #expect(get("/echo") == 404)
        // Good: the new route takes effect.
        try serve.rewriteConfig(config("[ { match: { path_prefix: /echo }, upstream: demo } ]"))
        serve.signal(SIGHUP)
        var first: Int?
        waitUntil("the new routes") {
            first = get("/echo")
            return first != 404
        }
        #expect(first == 200)
        #expect(get("/echo") == 200)
        #expect(get("/ok") == 404)
    }
}

@Suite struct AdminAccessTests {
    @Test(arguments: [
        ("127.0.0.1", true), ("127.8.9.10", true), ("::1", true), ("::ffff:127.0.0.1", true), ("10.0.0.1", false),
        ("::ffff:10.0.0.1", false), ("192.168.1.2", false), ("", false),
    ])
    func onlyLoopbackPeersAreAdmitted(address: String, admitted: Bool) {
        #expect(AdminServer.isLoopback(address) == admitted)
    }
}
