import Foundation
import Synchronization
import Testing

/// Issue 35 (docs/overload.md): an upstream's adaptive concurrency limit
/// and route priorities, through the real proxy in front of the demo
/// upstream. One worker, so the limit and the queue are the whole upstream's.
@Suite("overload: adaptive concurrency and priorities") struct OverloadTests {
    /// A limit of one try in flight and a queue of one (that sheds nothing
    /// on its own within these tests: `queue` says when it does); `/c/` is
    /// critical (its clients may lower it with X-Priority), the rest sheddable.
    static func harness(
        priorityHeader: Bool = false, maxLimit: Int = 1, queue: String = "{ interval: 10s, target: 10s }"
    ) throws -> ProxyHarness {
        let header = priorityHeader ? ", priority_header: X-Priority" : ""
        return try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              demo: { endpoints: [{{DEMO}}], adaptive_concurrency: { min_limit: 1, initial_limit: 1, max_limit: \(maxLimit), queue: \(queue) } }
            routes:
              - { match: { path_prefix: /c/ }, upstream: demo, strip_prefix: /c, priority: critical\(header) }
              - { match: { path_prefix: / }, upstream: demo, priority: sheddable\(header) }
            """, workers: 1)
    }

    /// One request in flight (a slow critical one: a critical request
    /// never waits behind lower priorities alone) and one queued behind
    /// it, on `queued`'s path with its fields.
    static func fillSlotAndQueue(_ h: ProxyHarness, queued: String, fields: String = "") throws -> (
        TestConnection, TestConnection
    ) {
        let admin = AdminProbe(port: h.adminPort)
        let first = try TestConnection(port: h.port)
        try first.send("GET /c/slow?ms=600 HTTP/1.1\r\nHost: x\r\n\r\n")
        waitUntil("the slow request in flight") { try admin.metric("happypath_upstream_in_flight{upstream=\"demo\"}") == 1 }
        let second = try TestConnection(port: h.port)
        try second.send("GET \(queued) HTTP/1.1\r\nHost: x\r\n\(fields)\r\n")
        waitUntil("a request queued") { try admin.metric("happypath_upstream_queued{upstream=\"demo\"}") == 1 }
        return (first, second)
    }

    @Test func aCriticalRequestTakesTheQueuedPlaceOfASheddableOneWhichIsAnsweredOverloaded() throws {
        let h = try Self.harness()
        let (first, sheddable) = try Self.fillSlotAndQueue(h, queued: "/slow?ms=1")
        let critical = try TestConnection(port: h.port)
        try critical.send("GET /c/slow?ms=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        let shed = try sheddable.readResponse()
        #expect(shed.status == 503)
        #expect(shed.json["code"] as? String == "OVERLOADED")
        #expect(shed.header("Retry-After") == "1")
        #expect((shed.json["detail"] as? String)?.contains("sheddable") == true, "\(shed.text)")
        #expect(try first.readResponse().status == 200)
        let served = try critical.readResponse()
        #expect(served.status == 200, "\(served.text)")
        let admin = AdminProbe(port: h.adminPort)
        #expect(try admin.metric("happypath_upstream_shed_total{upstream=\"demo\",priority=\"sheddable\"}") == 1)
        #expect(try admin.metric("happypath_upstream_shed_total{upstream=\"demo\",priority=\"critical\"}") == 0)
        waitUntil("nothing in flight") { try admin.metric("happypath_upstream_in_flight{upstream=\"demo\"}") == 0 }
        #expect(try admin.metric("happypath_upstream_queued{upstream=\"demo\"}") == 0)
        #expect(try admin.metric("happypath_upstream_concurrency_limit{upstream=\"demo\"}") == 1)
    }

    @Test func aQueueThatStoodShedsItsLateSheddableRequestsAndServesTheCriticalOne() throws {
        let h = try Self.harness(maxLimit: 2, queue: "{ interval: 100ms, target: 5ms }")
        let (first, sheddable) = try Self.fillSlotAndQueue(h, queued: "/slow?ms=1")
        let critical = try TestConnection(port: h.port)
        try critical.send("GET /c/slow?ms=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("two queued") { try admin.metric("happypath_upstream_queued{upstream=\"demo\"}") == 2 }
        // The slow request ends: the queue stood past 100 ms and the
        // sheddable request waited past 5 ms, so it is shed; the slot goes
        // to the critical one.
        #expect(try first.readResponse().status == 200)
        let shed = try sheddable.readResponse()
        #expect(shed.status == 503 && shed.json["code"] as? String == "OVERLOADED", "\(shed.text)")
        #expect((shed.json["detail"] as? String)?.contains("sheddable request waited") == true, "\(shed.text)")
        #expect(try critical.readResponse().status == 200)
        #expect(try admin.metric("happypath_upstream_shed_total{upstream=\"demo\",priority=\"sheddable\"}") == 1)
    }

    @Test func aRequestOfTheSamePriorityDoesNotDisplaceButIsRefusedItself() throws {
        let h = try Self.harness()
        let (first, queued) = try Self.fillSlotAndQueue(h, queued: "/slow?ms=1")
        let refused = try HTTP.request(port: h.port, "/slow?ms=1")
        #expect(refused.status == 503)
        #expect(refused.json["code"] as? String == "OVERLOADED")
        #expect((refused.json["detail"] as? String)?.contains("queue is full") == true, "\(refused.text)")
        #expect(try first.readResponse().status == 200)
        #expect(try queued.readResponse().status == 200)
    }

    @Test func aClientMayLowerItsPriorityButNotRaiseIt() throws {
        let h = try Self.harness(priorityHeader: true)
        // A critical route's request lowered to sheddable is displaced by a plain critical one.
        let (first, lowered) = try Self.fillSlotAndQueue(h, queued: "/c/slow?ms=1", fields: "X-Priority: sheddable\r\n")
        let critical = try TestConnection(port: h.port)
        try critical.send("GET /c/slow?ms=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        let shed = try lowered.readResponse()
        #expect(shed.status == 503 && (shed.json["detail"] as? String)?.contains("sheddable") == true, "\(shed.text)")
        #expect(try first.readResponse().status == 200)
        #expect(try critical.readResponse().status == 200)
        // A sheddable route's request that asks for critical stays sheddable:
        // it does not displace the sheddable request already queued.
        let (again, queued) = try Self.fillSlotAndQueue(h, queued: "/slow?ms=1")
        let raised = try HTTP.request(port: h.port, "/slow?ms=1", headers: [("X-Priority", "critical")])
        #expect(raised.status == 503 && raised.json["code"] as? String == "OVERLOADED")
        #expect(try again.readResponse().status == 200)
        #expect(try queued.readResponse().status == 200)
    }

    @Test func theLimitIsLearnedFromTrafficAndAnnouncedOnTheEventStream() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              demo: { endpoints: [{{DEMO}}], adaptive_concurrency: { min_limit: 1, initial_limit: 1, max_limit: 16, smoothing: 0.5 } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """, workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        #expect(try admin.metric("happypath_upstream_concurrency_limit{upstream=\"demo\"}") == 1)
        let events = try TestConnection(port: h.adminPort, timeout: 10)
        try events.send("GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        // Four clients at once against an upstream that is never slower
        // (80 ms, long beside this machine's jitter): every sample is near
        // the baseline with the limit used, so it grows. They stop once it
        // has grown (or after 30 s).
        let failures = Atomic<Int>(0)
        let grown = Atomic<Bool>(false)
        let port = h.port
        let group = DispatchGroup()
        let until = Date().addingTimeInterval(30)
        for _ in 0..<4 {
            DispatchQueue.global().async(group: group) {
                while !grown.load(ordering: .relaxed), Date() < until {
                    // The upstream's answer, or OVERLOADED (a queue that stood while the limit was low).
                    let answer = try? HTTP.request(port: port, "/slow?ms=80")
                    let overloaded = answer?.status == 503 && answer?.json["code"] as? String == "OVERLOADED"
                    if answer?.status != 200 && !overloaded { failures.add(1, ordering: .relaxed) }
                }
            }
        }
        waitUntil("the limit grew from 1 to 3", timeout: 30) {
            try admin.metric("happypath_upstream_concurrency_limit{upstream=\"demo\"}") >= 3
        }
        grown.store(true, ordering: .relaxed)
        group.wait()
        #expect(failures.load(ordering: .relaxed) == 0)
        #expect(try admin.metric("happypath_upstream_latency_baseline_seconds{upstream=\"demo\"}") > 0.079)
        #expect(try admin.metric("happypath_upstream_latency_recent_seconds{upstream=\"demo\"}") > 0.079)
        waitUntil("nothing in flight") { try admin.metric("happypath_upstream_in_flight{upstream=\"demo\"}") == 0 }
        var stream = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !stream.contains("event: concurrency_limit") {
            let n = recv(events.fd, &chunk, chunk.count, 0)
            if n <= 0 { break }
            stream += String(decoding: chunk[0..<n], as: UTF8.self)
        }
        #expect(stream.contains("event: concurrency_limit"))
        #expect(stream.contains("\"upstream\":\"demo\""))
    }
}
