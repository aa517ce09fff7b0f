import Foundation
import HappyPathCore
import SmallDisk
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The delivery store on a disk that fills up: the real proxy as a process,
/// its store on a small tmpfs that the test fills with a filler file and
/// frees again. Waits are on conditions (answers, metrics, log lines).
@Suite("Deliver later on a full disk", .serialized)
struct DeliveryStoreDiskTests {
    static let ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

    static func yaml(store: String, later: String, now: String) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        storage: { path: \(store), max_bytes: 1MiB }
        upstreams:
          hooks: { endpoints: [\(later)], connect_timeout: 200ms }
          site: { endpoints: [\(now)] }
        routes:
          - match: { path_prefix: /hooks/ }
            upstream: hooks
            delivery: { mode: later, max_attempts: 1000000, backoff: { base: 50ms, max: 100ms } }
          - match: { path_prefix: / }
            upstream: site
        """
    }

    static func post(_ port: Int, _ body: [UInt8]) throws -> TestResponse {
        try HTTP.request(port: port, "POST", "/hooks/e", body: body)
    }

    static func code(_ r: TestResponse) -> String? { r.json["code"] as? String }

    static func metrics(_ port: Int) throws -> String { try HTTP.request(port: port, "/metrics", timeout: 5).text }

    /// While running, a full disk refuses the write as a store error (not
    /// "store full"), counted, logged, and the next write works once there
    /// is room. Stopped and started on a full disk, the proxy serves its
    /// `now` routes, its `later` routes answer 503 until the disk has room,
    /// and every request stored before is delivered.
    @Test func aFullDiskIsAStoreErrorAndTheProxyStartsOnOne() throws {
        guard let disk = SmallDisk(bytes: 4 << 20) else { return }
        let down = RefusingPort()
        let site = ScriptedUpstream(responses: [Self.ok]).started()
        defer { site.stop() }
        let config = Self.yaml(store: disk.path + "/deliveries.db", later: down.url, now: "http://127.0.0.1:\(site.port)")

        // Running when the disk fills.
        var proxy = try ServeProcess(config: config, logLevel: "info")
        guard let port = proxy.listeningPort(), let adminPort = proxy.adminPort() else { return }
        var accepted: [String] = []
        for i in 0..<3 {
            let r = try Self.post(port, Array("before \(i)".utf8))
            #expect(r.status == 202)
            if let id = r.json["id"] as? String { accepted.append(id) }
        }
        disk.fill()
        // Larger than the space the -wal file already has: it must grow.
        let refused = try Self.post(port, [UInt8](repeating: UInt8(ascii: "z"), count: 512 * 1024))
        #expect(refused.status == 503)
        #expect(Self.code(refused) == "STORE_UNAVAILABLE", "not OVERLOADED: the disk is full, not storage.max_bytes")
        let detail = refused.json["detail"] as? String ?? ""
        #expect(detail.contains("disk") && !detail.contains("max_bytes"), "\(detail)")
        #expect(refused.header("Retry-After") == "5")
        let exposition = try Self.metrics(adminPort)
        #expect(exposition.contains("# HELP happypath_delivery_store_errors_total "))
        #expect(exposition.contains("# TYPE happypath_delivery_store_errors_total counter"))
        #expect((metricSamples(exposition)["happypath_delivery_store_errors_total{kind=\"full\"}"] ?? 0) >= 1)
        #expect(metricSamples(exposition)["happypath_delivery_store_errors_total{kind=\"io\"}"] == 0)
        guard waitUntil("the error log line", { proxy.errors.contains("the delivery store cannot write") }) else { return }
        disk.free()
        let afterRoom = try Self.post(port, Array("after room".utf8))
        #expect(afterRoom.status == 202, "the next write tries again")
        if let id = afterRoom.json["id"] as? String { accepted.append(id) }
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit(timeout: 15))

        // Started on a full disk.
        disk.fill()
        proxy = try ServeProcess(config: config, logLevel: "info")
        guard let port2 = proxy.listeningPort(), let admin2 = proxy.adminPort() else { return }
        let now = try HTTP.request(port: port2, "/page")
        #expect(now.status == 200, "a route that delivers now serves normally")
        let later = try Self.post(port2, Array("while full".utf8))
        #expect(later.status == 503 && Self.code(later) == "STORE_UNAVAILABLE")
        let admin = AdminProbe(port: admin2)
        #expect((try admin.state()["deliveries"] as? [String: Any])?["writable"] as? Bool == false)
        #expect(try admin.metric("happypath_delivery_store_errors_total{kind=\"full\"}") >= 1)
        #expect(proxy.errors.contains("the delivery store cannot write"))
        // A stored delivery is never reported missing: its status, or "cannot read now".
        let status = try HTTP.request(port: port2, "/_happypath/deliveries/\(accepted[0])")
        #expect(
            (status.status == 200 && status.json["state"] as? String == "queued")
                || (status.status == 503 && Self.code(status) == "STORE_UNAVAILABLE"),
            "\(status.status) \(status.text)")

        // Room again: the store opens by itself (checked every second).
        let events = try TestConnection(port: admin2, timeout: 5)
        try events.send("GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        var stream = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        func read(until text: String) {
            while !stream.contains(text) {
                let n = recv(events.fd, &chunk, chunk.count, 0)
                if n <= 0 { return }
                stream += String(decoding: chunk[0..<n], as: UTF8.self)
            }
        }
        read(until: ": happypath events")
        disk.free()
        read(until: "event: delivery_store_available")
        #expect(stream.contains("event: delivery_store_available"))
        var last: TestResponse?
        guard
            waitUntil(
                "a later route accepts again",
                {
                    last = try Self.post(port2, Array("after restart".utf8))
                    return last?.status == 202
                })
        else { return }
        if let id = last?.json["id"] as? String { accepted.append(id) }
        #expect((try admin.state()["deliveries"] as? [String: Any])?["writable"] as? Bool == true)

        // Nothing stored before was lost: all of it is delivered.
        let upstream = ScriptedUpstream(comingUpOn: down) { _ in Self.ok }.started()
        defer { upstream.stop() }
        guard
            waitUntil(
                "every accepted request delivered", timeout: 20,
                {
                    (try admin.state()["deliveries"] as? [String: Any])?["delivered"] as? Int == accepted.count
                })
        else { return }
        let keys = upstream.appRequests.compactMap { DeliverLaterTests.fields($0.head)["idempotency-key"] }
        #expect(Set(keys) == Set(accepted) && accepted.count == 5)
        proxy.signal(SIGTERM)
        #expect(proxy.waitForExit(timeout: 15))
    }
}
