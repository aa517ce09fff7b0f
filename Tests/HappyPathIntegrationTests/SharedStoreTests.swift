import Foundation
import HappyPathCore
import PostgresTestServer
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Deliver later on the shared PostgreSQL store (`storage.url`), end to
/// end: real proxies as processes, a real PostgreSQL server, real upstreams.
@Suite("Shared delivery store", .serialized, .needsPostgreSQL)
struct SharedStoreTests {
    typealias DL = DeliverLaterTests

    static func yaml(upstream: String, url: String, storage: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        storage: { url: '\(url)', lease: 5s \(storage) }
        defaults: { reachability: { park_for: 200ms } }
        upstreams:
          hooks:
            endpoints: [\(upstream)]
            connect_timeout: 200ms
            health_check: { interval: 100ms, timeout: 100ms, unhealthy_after: 1 }
        routes:
          - match: { path_prefix: /hooks/ }
            upstream: hooks
            strip_prefix: /hooks
            timeout: 2s
            delivery: { mode: later, max_attempts: 1000, backoff: { base: 50ms, max: 200ms } }
        """
    }

    /// Two proxies on one database: requests accepted by either, status
    /// and `Idempotency-Key` answered by both, one proxy killed with -9
    /// while delivering; the other delivers what it left once the leases end.
    @Test func twoProxiesShareTheQueueAndOneKilledLosesNothing() throws {
        let url = try PostgresServer.freshDatabase()
        let port = RefusingPort()
        // Room for a loaded machine: a round that times out and goes again,
        // or a live replica whose lease ran out before its renewal, would
        // arrive twice beside A's rounds in flight at the kill (the bound
        // below). Twice seen on a 2-core machine building in parallel.
        let config = Self.yaml(upstream: port.url, url: url)
            .replacingOccurrences(of: "lease: 5s", with: "lease: 10s").replacingOccurrences(of: "timeout: 2s", with: "timeout: 10s")
        let a = try ServeProcess(config: config, logLevel: "info")
        let b = try ServeProcess(config: config, logLevel: "info")
        guard let portA = a.listeningPort(), let portB = b.listeningPort(), let adminB = b.adminPort() else { return }

        let total = 1000
        let accepted = Locked<[String]>([])
        let refused = Locked<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            for i in stride(from: worker, to: total, by: 8) {
                let r = try? HTTP.request(port: i % 2 == 0 ? portA : portB, "POST", "/hooks/n", body: Array("n=\(i)".utf8))
                if let r, r.status == 202, let id = DL.json(r)["id"] as? String {
                    accepted.withLock { $0.append(id) }
                } else {
                    refused.withLock { $0.append("\(r?.status ?? 0)") }
                }
            }
        }
        let ids = Set(accepted.withLock { $0 })
        #expect(ids.count == total, "refused: \(refused.withLock { $0 }.prefix(5))")

        // Either proxy answers for a delivery the other accepted.
        let someID = try #require(ids.first)
        let fromA = try HTTP.request(port: portA, "/_happypath/deliveries/\(someID)")
        let fromB = try HTTP.request(port: portB, "/_happypath/deliveries/\(someID)")
        #expect(fromA.status == 200 && fromB.status == 200)
        #expect(DL.json(fromA)["state"] as? String == "queued" && DL.json(fromB)["state"] as? String == "queued")
        // The same key through either proxy is one delivery.
        let keyed = try HTTP.request(port: portA, "POST", "/hooks/k", headers: [("Idempotency-Key", "same")], body: [1])
        let again = try HTTP.request(port: portB, "POST", "/hooks/k", headers: [("Idempotency-Key", "same")], body: [1])
        let keyedID = try #require(DL.json(keyed)["id"] as? String)
        #expect(keyed.status == 202 && again.status == 202 && DL.json(again)["id"] as? String == keyedID)

        // A slow upstream, so rounds are in flight on both when A is killed.
        let upstream = ScriptedUpstream(comingUpOn: port) { _ in "DELAY:20\n" + DL.ok }.started()
        defer { upstream.stop() }
        func keys() -> [String] { upstream.appRequests.compactMap { DL.fields($0.head)["idempotency-key"] } }
        guard waitUntil("a fifth delivered", timeout: 60, { Set(keys()).count >= total / 5 }) else { return }
        kill(a.pid, SIGKILL)
        _ = a.waitForExit()
        let admin = AdminProbe(port: adminB)
        guard
            waitUntil("every accepted request delivered by the proxy left", timeout: 120, {
                let d = try admin.state()["deliveries"] as? [String: Any]
                return d?["delivered"] as? Int == total + 1 && d?["queued"] as? Int == 0 && d?["in_flight"] as? Int == 0
            })
        else { return }
        let received = keys()
        #expect(ids.isSubset(of: Set(received)), "every request that got 202 arrived")
        let duplicates = received.count - Set(received).count
        // Only A's rounds in flight at the kill may arrive twice (a proxy runs at most 64 at once).
        #expect(duplicates <= 64, "duplicates \(duplicates)")
        let last = try HTTP.request(port: portB, "/_happypath/deliveries/\(someID)")
        #expect(DL.json(last)["state"] as? String == "delivered")
        b.signal(SIGTERM)
        #expect(b.waitForExit())
    }

    /// `happypath check --connect` reaches the database, or says why not
    /// (never with the password).
    @Test func checkConnectReachesTheDatabaseOrSaysWhyNot() throws {
        let url = try PostgresServer.freshDatabase()
        func check(_ url: String) throws -> (status: Int32, out: String, err: String) {
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
            defer { try? FileManager.default.removeItem(at: file) }
            try Self.yaml(upstream: "http://127.0.0.1:9", url: url).write(to: file, atomically: true, encoding: .utf8)
            return try runProcess(happypathBinary, ["check", "--connect", "--config", file.path], timeout: 30)
        }
        let ok = try check(url)
        #expect(ok.status == 0, "\(ok.err)")
        #expect(ok.out.contains("storage.url: connected to postgres://happypath@127.0.0.1:") && ok.out.contains("none yet"), "\(ok.out)")
        let down = try check("postgres://happypath:s3cret@127.0.0.1:\(PostgresServer.freePort())/x?connect_timeout=2")
        #expect(down.status == 1)
        #expect(down.err.contains("storage.url: cannot connect to PostgreSQL") && down.err.contains(":***@"), "\(down.err)")
        #expect(!down.err.contains("s3cret"))
    }

    /// The database stopped and started while the proxy runs: requests are
    /// refused with 503 STORE_UNAVAILABLE meanwhile (not ready, with
    /// `storage.required`), everything accepted before is delivered after.
    @Test func aDatabaseRestartRefusesMeanwhileAndLosesNothing() throws {
        let server = try PostgresServer()
        let port = RefusingPort()
        let proxy = try ServeProcess(
            config: Self.yaml(upstream: port.url, url: server.url, storage: ", required: true"), logLevel: "info")
        guard let proxyPort = proxy.listeningPort(), let adminPort = proxy.adminPort() else { return }
        guard waitUntil("ready once connected", { try HTTP.request(port: adminPort, "/readyz").status == 200 }) else { return }
        var ids: Set<String> = []
        for i in 0..<50 {
            let r = try HTTP.request(port: proxyPort, "POST", "/hooks/n", body: Array("n=\(i)".utf8))
            #expect(r.status == 202)
            if let id = DL.json(r)["id"] as? String { ids.insert(id) }
        }
        server.stop()
        let down = try HTTP.request(port: proxyPort, "POST", "/hooks/n", body: [1])
        #expect(down.status == 503 && DL.json(down)["code"] as? String == "STORE_UNAVAILABLE")
        #expect(down.header("Retry-After") != nil)
        #expect((DL.json(down)["detail"] as? String ?? "").contains("PostgreSQL database cannot be reached"))
        let notReady = try HTTP.request(port: adminPort, "/readyz")
        #expect(notReady.status == 503 && String(decoding: notReady.body, as: UTF8.self).contains("storage.required"))
        try server.start()
        guard
            waitUntil("accepting again", timeout: 60, {
                let r = try HTTP.request(port: proxyPort, "POST", "/hooks/n", body: Array("after".utf8))
                if r.status == 202, let id = DL.json(r)["id"] as? String { ids.insert(id) }
                return r.status == 202
            })
        else { return }
        #expect(try HTTP.request(port: adminPort, "/readyz").status == 200)
        let upstream = ScriptedUpstream(comingUpOn: port) { _ in DL.ok }.started()
        defer { upstream.stop() }
        guard
            waitUntil("everything accepted delivered", timeout: 60, {
                let keys = Set(upstream.appRequests.compactMap { DL.fields($0.head)["idempotency-key"] })
                return ids.isSubset(of: keys)
            })
        else { return }
        #expect(proxy.errors.contains("the delivery store cannot write"), "the outage was logged")
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit())
    }

    /// The database down for longer than a doubling backoff would take to
    /// grow past 10 s (1, 2, 4, 8 s: its fifth try would come 15 s after the
    /// first failure, the sixth at 31 s): once it is back, `later` routes
    /// answer 202 again within about 2 s, not after the next doubled wait.
    @Test func laterRoutesAnswerAgainWithinTwoSecondsOfTheDatabaseComingBack() throws {
        let server = try PostgresServer()
        let port = RefusingPort()
        let proxy = try ServeProcess(config: Self.yaml(upstream: port.url, url: server.url), logLevel: "info")
        guard let proxyPort = proxy.listeningPort(), let adminPort = proxy.adminPort() else { return }
        guard
            waitUntil("accepting", { try HTTP.request(port: proxyPort, "POST", "/hooks/n", body: [1]).status == 202 })
        else { return }
        server.stop()
        let admin = AdminProbe(port: adminPort)
        guard
            waitUntil("the writer noticed the outage", {
                try admin.metric("happypath_delivery_store_errors_total{kind=\"unreachable\"}") >= 1
            })
        else { return }
        // What is tested is a long outage: the database stays down 17 s.
        let down = ContinuousClock.now
        waitUntil("17 s of outage", timeout: 30) { seconds(since: down) >= 17 }
        try server.start()
        let back = ContinuousClock.now
        guard
            waitUntil("accepting again", timeout: 40, {
                try HTTP.request(port: proxyPort, "POST", "/hooks/n", body: [2], timeout: 5).status == 202
            })
        else { return }
        let took = seconds(since: back)
        #expect(took < 2.5, "202 again \(took) s after the database came back")
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit())
    }
}
