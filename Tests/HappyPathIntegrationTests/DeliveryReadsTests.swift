import Foundation
import HappyPathCore
import Synchronization
import Testing

@testable import HappyPathStore

/// Reads of the delivery store (status URLs, `/metrics`, `/admin/state`)
/// next to proxied traffic, over a store with a large backlog: none of them
/// may hold up a worker loop (docs/deliver-later.md, "Reads").
@Suite("Delivery reads", .serialized)
struct DeliveryReadsTests {
    static let backlog = 100_000

    final class Scrapes: Sendable {
        let done = Atomic<Int>(0)
        let stop = Atomic<Bool>(false)
        let ended = Atomic<Bool>(false)
    }

    /// `count` queued deliveries for `hooks`, none due for a day (so the
    /// dispatcher claims none of them), inserted in one statement on the
    /// writer's connection: a few hundred milliseconds, not one request each.
    static func fillBacklog(path: String, count: Int) throws {
        let store = try DeliveryStore(
            settings: StoreSettings(path: path, sync: .normal, maxBytes: 1 << 30, retention: .seconds(86_400)),
            clock: MonotonicClock())
        store.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let later = now + 86_400_000
        let done = DispatchSemaphore(value: 0)
        store.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(count))
            INSERT INTO delivery (id, upstream, route, request_id, method, target, headers, body, payload_bytes,
              max_attempts, next_attempt_at, expires_at, created_at, updated_at)
            SELECT 'dlv_backlog_' || i, 'hooks', '/hooks/', 'req-' || i, 'POST', '/hooks/x', X'', zeroblob(512), 526,
              50, \(later), \(later), \(now), \(now) FROM n
            """
        ) { done.signal() }
        done.wait()
        store.close()
    }

    /// The slowest of `latencies` but the worst `1 / fraction`-th (seconds).
    static func percentile(_ latencies: [Double], _ p: Double) -> Double {
        let sorted = latencies.sorted()
        guard !sorted.isEmpty else { return 0 }
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
    }

    /// With 100,000 deliveries in the store, `/metrics` and `/admin/state`
    /// scraped back to back do not delay proxied requests or status reads
    /// on the worker loops (the old `GROUP BY state` took about 80 ms per
    /// scrape, under a lock the status reads waited for).
    @Test func scrapesOverALargeBacklogDoNotDelayProxiedRequests() throws {
        let directory = try DeliverLaterTests.StoreDirectory()
        try FileManager.default.createDirectory(atPath: directory.path, withIntermediateDirectories: true)
        try Self.fillBacklog(path: directory.file, count: Self.backlog)
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            storage: { path: \(directory.file) }
            upstreams:
              hooks:
                endpoints: [{{DEMO}}]
            routes:
              - match: { path_prefix: /hooks/ }
                upstream: hooks
                delivery: { mode: later }
              - match: { path_prefix: /api/ }
                upstream: hooks
                strip_prefix: /api
            """)
        let admin = AdminProbe(port: h.adminPort)
        let queued = "happypath_deliveries_queued{upstream=\"hooks\"}"
        #expect(try admin.metric(queued) == Double(Self.backlog))
        #expect((try admin.state()["deliveries"] as? [String: Any])?["queued"] as? Int == Self.backlog)

        /// Proxied GETs and status reads, one after another; each one's latency.
        func traffic(_ n: Int) throws -> (proxied: [Double], status: [Double]) {
            var proxied: [Double] = []
            var status: [Double] = []
            for i in 0..<n {
                let start = ContinuousClock.now
                let r = try HTTP.request(port: h.port, "/api/ok")
                proxied.append(seconds(since: start))
                #expect(r.status == 200)
                let readStart = ContinuousClock.now
                let s = try HTTP.request(port: h.port, "/_happypath/deliveries/dlv_backlog_\(i + 1)")
                status.append(seconds(since: readStart))
                #expect(s.status == 200)
            }
            return (proxied, status)
        }
        _ = try traffic(20)  // warm: connections to the upstream, the reader
        let quiet = try traffic(200)

        let scrapes = Scrapes()
        let adminPort = h.adminPort
        let scraper = Thread {
            while !scrapes.stop.load(ordering: .relaxed) {
                _ = try? HTTP.request(port: adminPort, "/metrics")
                _ = try? HTTP.request(port: adminPort, "/admin/state")
                scrapes.done.add(1, ordering: .relaxed)
            }
            scrapes.ended.store(true, ordering: .releasing)
        }
        scraper.start()
        guard waitUntil("the first scrape", { scrapes.done.load(ordering: .relaxed) > 0 }) else { return }
        let busy = try traffic(200)
        scrapes.stop.store(true, ordering: .relaxed)
        let scraped = scrapes.done.load(ordering: .relaxed)
        waitUntil("the scraper ends", { scrapes.ended.load(ordering: .acquiring) })

        let ms = { (x: Double) in (x * 1000).formatted(.number.precision(.fractionLength(2))) }
        let report =
            "quiet p50/p95 proxied \(ms(Self.percentile(quiet.proxied, 0.5)))/\(ms(Self.percentile(quiet.proxied, 0.95))) ms, "
            + "status \(ms(Self.percentile(quiet.status, 0.5)))/\(ms(Self.percentile(quiet.status, 0.95))) ms; "
            + "scraping (\(scraped) scrapes) p50/p95 proxied "
            + "\(ms(Self.percentile(busy.proxied, 0.5)))/\(ms(Self.percentile(busy.proxied, 0.95))) ms, "
            + "status \(ms(Self.percentile(busy.status, 0.5)))/\(ms(Self.percentile(busy.status, 0.95))) ms, "
            + "max proxied \(ms(busy.proxied.max() ?? 0)) ms, max status \(ms(busy.status.max() ?? 0)) ms"
        print("DeliveryReadsTests: \(report)")
        #expect(scraped >= 5, "too few scrapes ran to matter: \(report)")
        // Generous bounds for a loaded two-core machine; a scrape that
        // stalled the loops would cost about 80 ms to most of these.
        #expect(Self.percentile(busy.proxied, 0.95) < 0.020, "\(report)")
        #expect(Self.percentile(busy.status, 0.95) < 0.020, "\(report)")
        #expect(try admin.metric(queued) == Double(Self.backlog), "the counts stayed exact")
    }
}
