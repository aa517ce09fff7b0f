import Foundation
import HappyPathCore
import PostgresTestServer
import Testing

@testable import HappyPathStore

#if canImport(Glibc)
    import Glibc
#endif

/// Deliver later, end to end: the real proxy with its SQLite store in a
/// fresh directory, real upstreams on loopback (one that is down until the
/// test brings it up), real sockets. Waits are on conditions (what the
/// upstream received, what the status URL says), never on time.
@Suite("Deliver later", .serialized)
struct DeliverLaterTests {
    static let ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

    /// Which store the proxy keeps its deliveries in: the tests that hold
    /// for any store run on both.
    enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case sqlite, postgres
        var testDescription: String { rawValue }
        /// The kinds this machine runs: PostgreSQL only where there is a
        /// server (where there is none, the PostgreSQL suites are skipped
        /// and say why: `PostgresServer.skipReason`).
        static let here: [StoreKind] = PostgresServer.skipReason == nil ? allCases : [.sqlite]
    }

    /// A fresh store: a file in a new directory, or a new database on the
    /// tests' PostgreSQL server (`PostgresServer.freshDatabase`).
    final class StoreDirectory {
        let path = NSTemporaryDirectory() + "happypath-dl-" + UUID().uuidString
        var file: String { path + "/deliveries.db" }
        let url: String?

        init(_ kind: StoreKind = .sqlite) throws {
            url = kind == .postgres ? try PostgresServer.freshDatabase() : nil
        }

        /// A column's values that are not null, read from the store itself.
        func column(_ name: String) throws -> [String] {
            if let url { return try PostgresServer.query(url, "SELECT \(name) FROM happypath_delivery WHERE \(name) IS NOT NULL") }
            return try DeliverLaterTests.column(name, in: file)
        }

        /// The config's `storage` block, with `extra` keys.
        func yaml(_ extra: String) -> String {
            if let url { return "storage: { url: '\(url)' \(extra) }" }
            return "storage: { path: \(file) \(extra) }"
        }

        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    static func yaml(
        upstream: String, store: StoreDirectory, storage: String = "", delivery: String = "",
        upstreamExtra: String = "health_check: { interval: 100ms, timeout: 100ms, unhealthy_after: 1 }"
    ) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        \(store.yaml(storage))
        defaults: { reachability: { park_for: 200ms } }
        upstreams:
          hooks:
            endpoints: [\(upstream)]
            connect_timeout: 200ms
            \(upstreamExtra)
        routes:
          - match: { path_prefix: /hooks/ }
            upstream: hooks
            strip_prefix: /hooks
            timeout: 2s
            delivery: { mode: later, backoff: { base: 50ms, max: 200ms } \(delivery) }
          - match: { path_prefix: / }
            upstream: hooks
        """
    }

    static func json(_ response: TestResponse) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(response.body))) as? [String: Any] ?? [:]
    }

    static func status(_ h: ProxyHarness, _ id: String) throws -> [String: Any] {
        json(try HTTP.request(port: h.port, "/_happypath/deliveries/\(id)"))
    }

    /// The fields of a recorded request head, lower-cased names.
    static func fields(_ head: String) -> [String: String] {
        var out: [String: String] = [:]
        for line in head.components(separatedBy: "\r\n").dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            out[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return out
    }

    @Test(arguments: StoreKind.here) func storedThenDeliveredWithItsRequestIDAndAKey(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let upstream = ScriptedUpstream(responses: [Self.ok]).started()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(upstream.port)", store: store))
        h.scripted.append(upstream)
        let body = Array("{\"order\":42}".utf8)
        let r = try HTTP.request(
            port: h.port, "POST", "/hooks/orders?src=app",
            headers: [("X-Request-Id", "req-42"), ("Content-Type", "application/json")], body: body)
        #expect(r.status == 202)
        let accepted = Self.json(r)
        let id = try #require(accepted["id"] as? String)
        #expect(id.hasPrefix("dlv_") && id.count == 36)
        #expect(accepted["state"] as? String == "queued")
        #expect(r.header("Location") == "/_happypath/deliveries/\(id)")
        #expect(accepted["status_url"] as? String == "/_happypath/deliveries/\(id)")
        #expect(r.header("X-Request-Id") == "req-42")

        guard waitUntil("the upstream receives the request", { upstream.appRequests.count == 1 }) else { return }
        let sent = upstream.appRequests[0]
        #expect(sent.head.hasPrefix("POST /orders?src=app HTTP/1.1"))
        let f = Self.fields(sent.head)
        #expect(f["idempotency-key"] == id)
        #expect(f["x-request-id"] == "req-42")
        #expect(f["content-type"] == "application/json")
        #expect(sent.body == body)
        guard waitUntil("the status says delivered", { try Self.status(h, id)["state"] as? String == "delivered" })
        else { return }
        let s = try Self.status(h, id)
        #expect(s["attempts"] as? Int == 1 && s["status"] as? Int == 200 && s["request_id"] as? String == "req-42")
    }

    @Test(arguments: StoreKind.here) func theClientsIdempotencyKeyIsKeptAndASecondSendIsTheSameDelivery(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: port.url, store: store), holding: [port])
        let first = try HTTP.request(
            port: h.port, "POST", "/hooks/pay", headers: [("Idempotency-Key", "pay-7")], body: Array("a".utf8))
        let second = try HTTP.request(
            port: h.port, "POST", "/hooks/pay", headers: [("Idempotency-Key", "pay-7")], body: Array("a".utf8))
        #expect(first.status == 202 && second.status == 202)
        let id = try #require(Self.json(first)["id"] as? String)
        #expect(Self.json(second)["id"] as? String == id)
        let upstream = ScriptedUpstream(comingUpOn: port) { _ in Self.ok }.started()
        h.scripted.append(upstream)
        guard waitUntil("delivered", { try Self.status(h, id)["state"] as? String == "delivered" }) else { return }
        #expect(upstream.appRequests.count == 1)
        #expect(Self.fields(upstream.appRequests[0].head)["idempotency-key"] == "pay-7")
        let metrics = try AdminProbe(port: h.adminPort).metrics()
        #expect(metrics["happypath_deliveries_total{upstream=\"hooks\",outcome=\"duplicate\"}"] == 1)
        #expect(metrics["happypath_deliveries_total{upstream=\"hooks\",outcome=\"accepted\"}"] == 1)
    }

    /// An empty `Idempotency-Key` is no key: two such POSTs with different
    /// bodies are two deliveries (not one key reused), and each reaches the
    /// upstream with its delivery's own id as its one key.
    @Test(arguments: StoreKind.here) func anEmptyIdempotencyKeyIsNoKey(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: port.url, store: store), holding: [port])
        let first = try HTTP.request(
            port: h.port, "POST", "/hooks/pay", headers: [("Idempotency-Key", "")], body: Array("a".utf8))
        let second = try HTTP.request(
            port: h.port, "POST", "/hooks/pay", headers: [("Idempotency-Key", " ")], body: Array("b".utf8))
        #expect(first.status == 202 && second.status == 202, "\(first.text) \(second.text)")
        let ids = [Self.json(first)["id"] as? String, Self.json(second)["id"] as? String].compactMap { $0 }
        #expect(ids.count == 2 && ids[0] != ids[1])
        let upstream = ScriptedUpstream(comingUpOn: port) { _ in Self.ok }.started()
        h.scripted.append(upstream)
        guard waitUntil("both delivered", { try ids.allSatisfy { try Self.status(h, $0)["state"] as? String == "delivered" } })
        else { return }
        let keys = upstream.appRequests.map { $0.head.lowercased().components(separatedBy: "idempotency-key:").count - 1 }
        #expect(keys == [1, 1])
        #expect(Set(upstream.appRequests.map { Self.fields($0.head)["idempotency-key"] ?? "" }) == Set(ids))
    }

    /// Two clients (their own `Authorization`) that happen to pick the same
    /// key each get their own delivery, and each is delivered with it.
    @Test(arguments: StoreKind.here) func twoClientsWithTheSameKeyEachGetTheirOwnDelivery(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: port.url, store: store), holding: [port])
        let alice = try HTTP.request(
            port: h.port, "POST", "/hooks/pay",
            headers: [("Idempotency-Key", "order-1"), ("Authorization", "Bearer alice")], body: Array("alice".utf8))
        let bob = try HTTP.request(
            port: h.port, "POST", "/hooks/pay",
            headers: [("Idempotency-Key", "order-1"), ("Authorization", "Bearer bob")], body: Array("bob".utf8))
        #expect(alice.status == 202 && bob.status == 202)
        let aliceID = try #require(Self.json(alice)["id"] as? String)
        let bobID = try #require(Self.json(bob)["id"] as? String)
        #expect(aliceID != bobID, "the second client was handed the first one's delivery")
        // Bob sending his request again gets his own delivery back.
        let bobAgain = try HTTP.request(
            port: h.port, "POST", "/hooks/pay",
            headers: [("Idempotency-Key", "order-1"), ("Authorization", "Bearer bob")], body: Array("bob".utf8))
        #expect(bobAgain.status == 202 && Self.json(bobAgain)["id"] as? String == bobID)

        let upstream = ScriptedUpstream(comingUpOn: port) { _ in Self.ok }.started()
        h.scripted.append(upstream)
        guard
            waitUntil("both delivered", {
                try Self.status(h, aliceID)["state"] as? String == "delivered"
                    && Self.status(h, bobID)["state"] as? String == "delivered"
            })
        else { return }
        let bodies = upstream.appRequests.map { String(decoding: $0.body, as: UTF8.self) }
        #expect(bodies.sorted() == ["alice", "bob"])
        // The credential is in the key's scope only as a hash.
        let scopes = try store.column("idem_scope")
        #expect(scopes.count == 2 && scopes.allSatisfy { $0.count == 64 && !$0.contains("alice") && !$0.contains("bob") })
    }

    /// One client reusing its key for a different request gets 422, and
    /// nothing is stored; its first request is unaffected.
    @Test(arguments: StoreKind.here) func aKeyReusedWithAnotherBodyIsRefusedWith422(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: port.url, store: store), holding: [port])
        let headers = [("Idempotency-Key", "order-2"), ("Authorization", "Bearer carol")]
        let first = try HTTP.request(port: h.port, "POST", "/hooks/pay", headers: headers, body: Array("{\"n\":1}".utf8))
        #expect(first.status == 202)
        let changed = try HTTP.request(port: h.port, "POST", "/hooks/pay", headers: headers, body: Array("{\"n\":2}".utf8))
        #expect(changed.status == 422)
        #expect(Self.json(changed)["code"] as? String == "IDEMPOTENCY_KEY_REUSED")
        #expect(Self.json(changed)["retryable"] as? Bool == false)
        #expect(Self.json(changed)["id"] == nil && !changed.text.contains("dlv_"), "nothing of the first delivery is shown")
        let otherTarget = try HTTP.request(port: h.port, "POST", "/hooks/refund", headers: headers, body: Array("{\"n\":1}".utf8))
        #expect(otherTarget.status == 422)
        let same = try HTTP.request(port: h.port, "POST", "/hooks/pay", headers: headers, body: Array("{\"n\":1}".utf8))
        #expect(same.status == 202 && Self.json(same)["id"] as? String == Self.json(first)["id"] as? String)
        // A large body (fingerprinted off the worker's loop): its last byte decides.
        var big = [UInt8](repeating: UInt8(ascii: "b"), count: 300 * 1024)
        let bigHeaders = [("Idempotency-Key", "order-3"), ("Authorization", "Bearer carol")]
        let bigFirst = try HTTP.request(port: h.port, "POST", "/hooks/pay", headers: bigHeaders, body: big)
        let bigSame = try HTTP.request(port: h.port, "POST", "/hooks/pay", headers: bigHeaders, body: big)
        big[big.count - 1] = UInt8(ascii: "c")
        let bigChanged = try HTTP.request(port: h.port, "POST", "/hooks/pay", headers: bigHeaders, body: big)
        #expect(bigFirst.status == 202 && bigSame.status == 202 && bigChanged.status == 422)
        #expect(Self.json(bigSame)["id"] as? String == Self.json(bigFirst)["id"] as? String)

        let admin = AdminProbe(port: h.adminPort)
        let d = try admin.state()["deliveries"] as? [String: Any] ?? [:]
        let stored = ["queued", "in_flight", "delivered", "dead"].reduce(0) { $0 + ((d[$1] as? Int) ?? 0) }
        #expect(stored == 2, "only the first request of each key was stored: \(d)")
        #expect(try admin.metric("happypath_deliveries_total{upstream=\"hooks\",outcome=\"key_reused\"}") == 3)
    }

    /// Without `Authorization`, the route's `delivery.idempotency.client_header`
    /// tells clients apart.
    @Test(arguments: StoreKind.here) func theConfiguredClientHeaderScopesKeysWithoutAuthorization(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(
            Self.yaml(upstream: port.url, store: store, delivery: ", idempotency: { client_header: X-Api-Key }"),
            holding: [port])
        func send(_ apiKey: String?) throws -> String? {
            var headers = [("Idempotency-Key", "k-9")]
            if let apiKey { headers.append(("X-Api-Key", apiKey)) }
            let r = try HTTP.request(port: h.port, "POST", "/hooks/e", headers: headers, body: Array("same".utf8))
            #expect(r.status == 202)
            return Self.json(r)["id"] as? String
        }
        let one = try send("key-one")
        let two = try send("key-two")
        let anonymous = try send(nil)
        #expect(Set([one, two, anonymous].compactMap { $0 }).count == 3)
        #expect(try send("key-one") == one)
    }

    /// One column of every row of the store file, read through the store's
    /// own SQLite layer (read-only, beside the running proxy).
    static func column(_ name: String, in file: String) throws -> [String] {
        let c = try SQLiteConnection(path: file, readOnly: true)
        let s = try c.prepare("SELECT \(name) FROM delivery WHERE \(name) IS NOT NULL")
        var out: [String] = []
        while try s.step() { out.append(s.string(0) ?? "") }
        return out
    }

    @Test(arguments: StoreKind.here) func queuedWhileTheUpstreamIsDownThenEveryOneArrivesOnce(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: port.url, store: store), holding: [port])
        let admin = AdminProbe(port: h.adminPort)
        guard waitUntil("the health check marks the upstream down", { try admin.upstream("hooks")["reachable"] as? Bool == false })
        else { return }
        var ids: [String] = []
        for i in 0..<30 {
            let r = try HTTP.request(port: h.port, "POST", "/hooks/e", body: Array("event \(i)".utf8))
            #expect(r.status == 202)
            if let id = Self.json(r)["id"] as? String { ids.append(id) }
        }
        #expect(ids.count == 30)
        // Down: nothing was tried, nothing counted against max_attempts.
        let queued = try admin.state()["deliveries"] as? [String: Any]
        #expect(queued?["queued"] as? Int == 30)
        #expect(try Self.status(h, ids[0])["attempts"] as? Int == 0)
        #expect(try admin.metric("happypath_deliveries_queued{upstream=\"hooks\"}") == 30)

        let upstream = ScriptedUpstream(comingUpOn: port) { _ in Self.ok }.started()
        h.scripted.append(upstream)
        guard waitUntil("all 30 delivered", { (try admin.state()["deliveries"] as? [String: Any])?["delivered"] as? Int == 30 })
        else { return }
        let keys = upstream.appRequests.compactMap { Self.fields($0.head)["idempotency-key"] }
        #expect(keys.count == 30 && Set(keys) == Set(ids))
        let bodies = Set(upstream.appRequests.map { String(decoding: $0.body, as: UTF8.self) })
        #expect(bodies == Set((0..<30).map { "event \($0)" }))
    }

    @Test(arguments: StoreKind.here) func aRefusalFromTheUpstreamIsDeadWithItsProblemAndCanBeReplayed(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let refusal =
            "HTTP/1.1 422 Unprocessable Content\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n{\"error\":\"bad order id\"}"
        let upstream = ScriptedUpstream(responses: [refusal, Self.ok]).started()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(upstream.port)", store: store))
        h.scripted.append(upstream)
        let r = try HTTP.request(port: h.port, "POST", "/hooks/orders", body: Array("x".utf8))
        let id = try #require(Self.json(r)["id"] as? String)
        guard waitUntil("dead", { try Self.status(h, id)["state"] as? String == "dead" }) else { return }
        let dead = try Self.status(h, id)
        #expect(dead["status"] as? Int == 422 && dead["attempts"] as? Int == 1)
        let error = try #require(dead["error"] as? [String: Any])
        #expect(error["status"] as? Int == 422 && error["code"] as? String == "CLIENT_ERROR")
        #expect(error["request_id"] as? String == dead["request_id"] as? String)
        #expect(upstream.appRequests.count == 1, "a 4xx answer is not tried again")

        let admin = AdminProbe(port: h.adminPort)
        let list = Self.json(try HTTP.request(port: h.adminPort, "/admin/deliveries?state=dead&upstream=hooks"))
        #expect((list["deliveries"] as? [[String: Any]])?.compactMap { $0["id"] as? String } == [id])
        // Replayed by the operator: the upstream now takes it.
        let replay = try HTTP.request(port: h.adminPort, "POST", "/admin/deliveries/\(id)/replay")
        #expect(replay.status == 200)
        guard waitUntil("delivered after the replay", { try Self.status(h, id)["state"] as? String == "delivered" })
        else { return }
        #expect(upstream.appRequests.count == 2)
        let again = try HTTP.request(port: h.adminPort, "POST", "/admin/deliveries/\(id)/replay")
        #expect(again.status == 409)
        #expect(try admin.metric("happypath_deliveries_total{upstream=\"hooks\",outcome=\"dead\"}") == 1)
    }

    @Test(arguments: StoreKind.here) func aFullStoreAnswersOverloadedAndKeepsWhatItHolds(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(
            Self.yaml(upstream: port.url, store: store, storage: ", max_bytes: 1MiB"), holding: [port])
        let body = [UInt8](repeating: UInt8(ascii: "z"), count: 300 * 1024)
        var statuses: [Int] = []
        var last: TestResponse?
        for _ in 0..<4 {
            let r = try HTTP.request(port: h.port, "POST", "/hooks/big", body: body)
            statuses.append(r.status)
            last = r
        }
        #expect(statuses == [202, 202, 202, 503])
        let refused = try #require(last)
        #expect(Self.json(refused)["code"] as? String == "OVERLOADED")
        #expect(refused.header("Retry-After") == "5")
        let upstream = ScriptedUpstream(comingUpOn: port) { _ in Self.ok }.started()
        h.scripted.append(upstream)
        let admin = AdminProbe(port: h.adminPort)
        guard waitUntil("the three stored are delivered", { (try admin.state()["deliveries"] as? [String: Any])?["delivered"] as? Int == 3 })
        else { return }
        #expect(upstream.appRequests.count == 3, "the refused one was never stored, so never sent")
    }

    @Test(arguments: StoreKind.here) func unknownDeliveriesAndWrongMethodsAreClearErrors(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let port = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: port.url, store: store), holding: [port])
        let missing = try HTTP.request(port: h.port, "/_happypath/deliveries/dlv_nope")
        #expect(
            missing.status == 404 && Self.json(missing)["code"] as? String == "NOT_FOUND",
            "\(missing.status) \(String(decoding: missing.body, as: UTF8.self))")
        let post = try HTTP.request(port: h.port, "POST", "/_happypath/deliveries/dlv_nope", body: [])
        #expect(post.status == 400)
        let badFilter = try HTTP.request(port: h.adminPort, "/admin/deliveries?state=lost")
        #expect(badFilter.status == 400)
        let purge = try HTTP.request(port: h.adminPort, "POST", "/admin/deliveries/purge")
        #expect(purge.status == 200 && Self.json(purge)["purged"] as? Int == 0)
    }

    /// Nothing lost across `kill -9`: the proxy as a process, killed twice
    /// while delivering, restarted on the same store each time.
    @Test func nothingAcceptedIsLostWhenTheProxyIsKilledTwice() throws {
        let store = try StoreDirectory()
        let port = RefusingPort()
        let config = Self.yaml(upstream: port.url, store: store, delivery: ", max_attempts: 1000")
        var proxy = try ServeProcess(config: config, logLevel: "info")
        guard let firstPort = proxy.listeningPort() else { return }
        let total = 600
        let accepted = Locked<[String]>([])
        let refused = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            for i in stride(from: worker, to: total, by: 8) {
                guard let r = try? HTTP.request(port: firstPort, "POST", "/hooks/n", body: Array("n=\(i)".utf8)) else {
                    refused.withLock { $0 += 1 }
                    continue
                }
                if r.status == 202, let id = Self.json(r)["id"] as? String {
                    accepted.withLock { $0.append(id) }
                } else {
                    refused.withLock { $0 += 1 }
                }
            }
        }
        let ids = Set(accepted.withLock { $0 })
        #expect(ids.count == total && refused.withLock { $0 } == 0)

        // A slow upstream, so rounds are in flight when the proxy is killed.
        let upstream = ScriptedUpstream(comingUpOn: port) { _ in "DELAY:5\n" + Self.ok }.started()
        defer { upstream.stop() }
        func keys() -> [String] { upstream.appRequests.compactMap { Self.fields($0.head)["idempotency-key"] } }
        var recovered = 0
        for fraction in [0.2, 0.6] {
            guard waitUntil("\(Int(fraction * 100))% delivered", timeout: 60, { Double(Set(keys()).count) >= fraction * Double(total) })
            else { return }
            kill(proxy.pid, SIGKILL)
            _ = proxy.waitForExit()
            proxy = try ServeProcess(config: config, logLevel: "info")
            // Logged on stderr before `proxy started` (the same stream, so in
            // order; stdout's `listening on` may be read first): the rounds
            // in flight at the kill.
            guard proxy.listeningPort() != nil, proxy.adminPort() != nil else { return }
            for line in proxy.errors.split(separator: "\n") where line.contains("queued again") {
                let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
                recovered += (object?["count"] as? Int) ?? Int(object?["count"] as? String ?? "") ?? 0
            }
        }
        guard let adminPort = proxy.adminPort() else { return }
        let admin = AdminProbe(port: adminPort)
        // A round in flight at both kills (requeued at the first, claimed
        // again before the second) is set aside as one that may have crashed
        // the proxy: dead, not lost. The operator's replay delivers it.
        guard
            waitUntil("every accepted request delivered or set aside", timeout: 120, {
                let d = try admin.state()["deliveries"] as? [String: Any]
                let delivered = d?["delivered"] as? Int ?? 0
                let dead = d?["dead"] as? Int ?? 0
                return delivered + dead == total && d?["queued"] as? Int == 0 && d?["in_flight"] as? Int == 0
            })
        else { return }
        let setAside = (Self.json(try HTTP.request(port: adminPort, "/admin/deliveries?state=dead&limit=1000"))["deliveries"]
            as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        #expect(setAside.count <= recovered, "only rounds in flight at a kill are set aside")
        for id in setAside {
            let status = Self.json(try HTTP.request(port: adminPort, "/admin/deliveries/\(id)"))
            let detail = (status["error"] as? [String: Any])?["detail"] as? String ?? ""
            #expect(detail.contains("crashed the proxy"), "\(id) dead for another reason: \(detail)")
            #expect(try HTTP.request(port: adminPort, "POST", "/admin/deliveries/\(id)/replay").status == 200)
        }
        guard
            waitUntil("every accepted request delivered", timeout: 120, {
                let d = try admin.state()["deliveries"] as? [String: Any]
                return d?["delivered"] as? Int == total && d?["queued"] as? Int == 0 && d?["in_flight"] as? Int == 0
            })
        else { return }
        let received = keys()
        #expect(Set(received) == ids, "every request that got 202 arrived")
        let duplicates = received.count - Set(received).count
        // Only rounds in flight at a kill may arrive twice. A delivery set
        // aside at the second start was counted as recovered once (at the
        // first) and may arrive three times: its two rounds and the replay.
        #expect(
            duplicates <= recovered + setAside.count && recovered <= 2 * 64,
            "duplicates \(duplicates), recovered \(recovered), set aside \(setAside.count)")
        // That the kills found rounds in flight is the test's own setup (the
        // upstream answers slowly), not the proxy's promise: under
        // ThreadSanitizer a kill once found none in one run of four, and the
        // rest of the test still held. Checked everywhere else.
        if ProcessInfo.processInfo.environment["TSAN_OPTIONS"] == nil {
            #expect(recovered > 0, "the kills found rounds in flight (the upstream answers slowly)")
        }
        // A duplicate carries the same key and the same request id.
        var requestIDs: [String: Set<String>] = [:]
        for r in upstream.appRequests {
            let f = Self.fields(r.head)
            if let key = f["idempotency-key"], let rid = f["x-request-id"] { requestIDs[key, default: []].insert(rid) }
        }
        #expect(requestIDs.values.allSatisfy { $0.count == 1 })
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit())
    }

    /// A delivery whose round is in flight each time the proxy is killed
    /// (an upstream that takes the request and never answers; `kill -9`
    /// while it waits), at two starts in a row, is set aside at the next
    /// start: dead, reason `crashed_the_proxy`, a log line with its id, and
    /// never sent a third time.
    @Test func aDeliveryInFlightAtTwoKillsInARowIsSetAsideNotSentAThirdTime() throws {
        let store = try StoreDirectory()
        let upstream = ScriptedUpstream(responses: ["HOLD"]).started()
        defer { upstream.stop() }
        let config = Self.yaml(upstream: "http://127.0.0.1:\(upstream.port)", store: store)
            .replacingOccurrences(of: "timeout: 2s", with: "timeout: 60s")
        var proxy = try ServeProcess(config: config, logLevel: "info")
        guard let port = proxy.listeningPort() else { return }
        let accepted = try HTTP.request(port: port, "POST", "/hooks/boom", body: Array("boom".utf8))
        let id = try #require(Self.json(accepted)["id"] as? String)
        for round in 1...2 {
            guard waitUntil("round \(round) reaches the upstream", { upstream.appRequests.count == round }) else { return }
            kill(proxy.pid, SIGKILL)
            _ = proxy.waitForExit()
            proxy = try ServeProcess(config: config, logLevel: "info")
            guard proxy.listeningPort() != nil else { return }
        }
        guard let adminPort = proxy.adminPort(), let proxyPort = proxy.listeningPort() else { return }
        guard
            waitUntil("the log line that sets it aside", {
                proxy.errors.split(separator: "\n").contains { $0.contains("crashed the proxy") && $0.contains(id) }
            })
        else { return }
        let line = try #require(proxy.errors.split(separator: "\n").first { $0.contains("crashed the proxy") })
        let logged = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
        #expect(logged["id"] as? String == id && logged["reason"] as? String == "crashed_the_proxy", "\(line)")
        let status = Self.json(try HTTP.request(port: proxyPort, "/_happypath/deliveries/\(id)"))
        #expect(status["state"] as? String == "dead" && status["attempts"] as? Int == 2, "\(status)")
        let error = status["error"] as? [String: Any] ?? [:]
        #expect((error["detail"] as? String ?? "").contains("crashed the proxy"), "\(error)")
        let dead = Self.json(try HTTP.request(port: adminPort, "/admin/deliveries?state=dead"))
        #expect((dead["deliveries"] as? [[String: Any]])?.map { $0["id"] as? String } == [id])
        let state = try AdminProbe(port: adminPort).state()["deliveries"] as? [String: Any]
        #expect(state?["dead"] as? Int == 1 && state?["queued"] as? Int == 0 && state?["in_flight"] as? Int == 0)
        #expect(upstream.appRequests.count == 2, "never sent a third time")
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit())
    }

    /// SIGTERM while rounds are running: they finish (no new ones start),
    /// the process exits 0, and after a restart the rest is delivered with
    /// nothing sent twice.
    @Test(arguments: StoreKind.here) func sigtermLetsRunningRoundsFinishAndLosesNothing(kind: StoreKind) throws {
        let store = try StoreDirectory(kind)
        let upstream = ScriptedUpstream(responses: ["DELAY:300\n" + Self.ok]).started()
        defer { upstream.stop() }
        let config = Self.yaml(upstream: "http://127.0.0.1:\(upstream.port)", store: store)
        var proxy = try ServeProcess(config: config, logLevel: "info")
        guard let port = proxy.listeningPort() else { return }
        var ids: [String] = []
        for i in 0..<5 {
            let r = try HTTP.request(port: port, "POST", "/hooks/t", body: Array("t\(i)".utf8))
            if let id = Self.json(r)["id"] as? String { ids.append(id) }
        }
        #expect(ids.count == 5)
        guard waitUntil("a round reaches the upstream", { upstream.appRequests.count >= 1 }) else { return }
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit(timeout: 15))
        #expect(proxy.process.terminationStatus == 0)
        proxy = try ServeProcess(config: config, logLevel: "info")
        guard proxy.listeningPort() != nil, let adminPort = proxy.adminPort() else { return }
        #expect(!proxy.errors.contains("queued again"), "no round was cut short")
        guard
            waitUntil("all five delivered", timeout: 30, {
                (try AdminProbe(port: adminPort).state()["deliveries"] as? [String: Any])?["delivered"] as? Int == 5
            })
        else { return }
        let keys = upstream.appRequests.compactMap { Self.fields($0.head)["idempotency-key"] }
        #expect(keys.count == 5 && Set(keys) == Set(ids), "each arrived once")
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit())
    }
}
