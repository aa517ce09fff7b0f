import Foundation
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
    /// `name{labels} value` lines of a Prometheus text exposition, by series.
    func samples(_ text: String) -> [String: Double] {
        var out: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            out[String(line[..<space])] = value
        }
        return out
    }

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
        let until = Date().addingTimeInterval(5)
        repeat {
            text = try HTTP.request(port: h.adminPort, "/metrics").text
        } while samples(text)["happypath_request_duration_seconds_count{route=\"/\"}"] != 3 && Date() < until
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
        try events.send("GET /admin/events HTTP/1.1\r\nHost: x\r\n\r\n")
        Thread.sleep(forTimeInterval: 0.1)
        _ = try HTTP.request(port: h.port, "/x")
        var received = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        let deadline = Date().addingTimeInterval(3)
        while !received.contains("event: breaker_opened"), Date() < deadline {
            let n = recv(events.fd, &chunk, chunk.count, 0)
            if n <= 0 { break }
            received += String(decoding: chunk[0..<n], as: UTF8.self)
        }
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
        let client = try TestConnection(port: h.port)
        try client.send("GET /slow?ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        Thread.sleep(forTimeInterval: 0.2)
        let drained = Mutex(false)
        let proxy = h.proxy
        let t = Thread {
            proxy.drain(timeout: .seconds(5))
            drained.withLock { $0 = true }
        }
        t.start()
        Thread.sleep(forTimeInterval: 0.2)
        let readyz = try HTTP.request(port: h.adminPort, "/readyz")
        #expect(readyz.status == 503)
        let r = try client.readResponse()
        #expect(r.status == 200)
        #expect(r.json["delayed_ms"] as? Int == 1000)
        let deadline = Date().addingTimeInterval(3)
        while !drained.withLock({ $0 }), Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
        #expect(drained.withLock { $0 })
    }

    @Test func sigtermDuringAnUpstreamCallDeliversItAndExitsZero() throws {
        #expect(
            FileManager.default.isExecutableFile(atPath: happypathBinary),
            "\(happypathBinary) is built by `swift build --build-tests`")
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let port = closedPort()
        let admin = closedPort()
        let config = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        try """
        listen: 127.0.0.1:\(port)
        admin: { listen: 127.0.0.1:\(admin) }
        upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
        routes: [ { match: { path_prefix: / }, upstream: demo } ]
        """.write(to: config, atomically: true, encoding: .utf8)
        let out = Pipe()
        let process = try startServe(config: config.path, stdout: out)
        defer { if process.isRunning { process.terminate() } }
        // Wait for "listening on" (bounded: the read happens on another thread).
        let firstLine = Mutex("")
        Thread {
            let d = out.fileHandleForReading.availableData; firstLine.withLock { $0 = String(decoding: d, as: UTF8.self) }
        }.start()
        let until = Date().addingTimeInterval(5)
        while firstLine.withLock({ $0.isEmpty }), Date() < until { Thread.sleep(forTimeInterval: 0.02) }
        #expect(firstLine.withLock { $0 }.contains("listening on http://127.0.0.1:\(port)"))
        let client = try TestConnection(port: port)
        try client.send("GET /slow?ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        Thread.sleep(forTimeInterval: 0.2)
        kill(process.processIdentifier, SIGTERM)
        let r = try client.readResponse()
        #expect(r.status == 200)
        let exitBy = Date().addingTimeInterval(5)
        while process.isRunning, Date() < exitBy { Thread.sleep(forTimeInterval: 0.02) }
        #expect(!process.isRunning)
        if !process.isRunning { #expect(process.terminationStatus == 0) }
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
        let h = try ProxyHarness(base + "\nroutes: [ { match: { path_prefix: /old }, upstream: u } ]")
        _ = try HTTP.request(port: h.port, "/old")  // opens the breaker
        #expect(try HTTP.request(port: h.port, "/new").json["code"] as? String == "NO_ROUTE")
        var next = try ConfigLoader.parse(
            base + "\nroutes: [ { match: { path_prefix: /new }, upstream: u } ]", file: "test.yaml")
        // Another listen address is refused: that needs a restart.
        next.listen.port = h.port + 1
        #expect(h.proxy.reload(next) == ["listen cannot change on reload (restart to apply)"])
        #expect(try HTTP.request(port: h.port, "/new").json["code"] as? String == "NO_ROUTE")
        #expect(h.proxy.reload(withPorts(next, like: h.proxy.runtime.configuration)).isEmpty)
        Thread.sleep(forTimeInterval: 0.1)
        let r = try HTTP.request(port: h.port, "/new")
        #expect(r.json["code"] as? String == "CIRCUIT_OPEN")  // routed now, and the breaker is still open
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
        let port = closedPort()
        let adminPort = closedPort()
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        func write(_ routes: String) throws {
            try """
            listen: 127.0.0.1:\(port)
            admin: { listen: 127.0.0.1:\(adminPort) }
            upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
            routes: \(routes)
            """.write(to: file, atomically: true, encoding: .utf8)
        }
        try write("[ { match: { path_prefix: /ok }, upstream: demo } ]")
        let process = try startServe(config: file.path)
        defer { if process.isRunning { process.terminate() } }
        func get(_ path: String) -> Int? { try? HTTP.request(port: port, path, timeout: 2).status }
        let until = Date().addingTimeInterval(5)
        while get("/ok") != 200, Date() < until { Thread.sleep(forTimeInterval: 0.05) }
        #expect(get("/ok") == 200)
        // Broken: unknown key. The old routes keep working.
        try write("[ { match: { path_prefix: /echo }, upstream: demo, bogus: 1 } ]")
        kill(process.processIdentifier, SIGHUP)
        Thread.sleep(forTimeInterval: 0.3)
        #expect(process.isRunning)
        #expect(get("/ok") == 200)
        #expect(get("/echo") == 404)
        // Good: the new route takes effect.
        try write("[ { match: { path_prefix: /echo }, upstream: demo } ]")
        kill(process.processIdentifier, SIGHUP)
        Thread.sleep(forTimeInterval: 0.3)
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
