import Foundation
@testable import HappyPathServer
import Synchronization
import Testing

/// Issue 44: the adaptive limit cannot be turned against the clients it
/// protects. The issue's three attacks, through the real proxy (two
/// workers) in front of the demo upstream, with `min_limit: 2` and with
/// the default: a slow path beside a fast one, slow readers of a large
/// answer, and a sheddable flood on a slow path beside critical clients.
@Suite("overload attacks: the adaptive limit under slow paths, slow readers and floods", .serialized)
struct OverloadAttackTests {
    /// `/c/` is critical, `/s/` sheddable, the rest normal; one try, 10 s.
    static func harness(minLimit: String) throws -> AttackStack {
        try AttackStack(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              demo: { endpoints: [{{DEMO}}], adaptive_concurrency: { \(minLimit)max_limit: 100 } }
            routes:
              - { match: { path_prefix: /c/ }, upstream: demo, strip_prefix: /c, priority: critical, retry: { attempts: 1 }, timeout: 10s }
              - { match: { path_prefix: /s/ }, upstream: demo, strip_prefix: /s, priority: sheddable, retry: { attempts: 1 }, timeout: 10s }
              - { match: { path_prefix: / }, upstream: demo, retry: { attempts: 1 }, timeout: 10s }
            """)
    }

    static let minimums = ["min_limit: 2, ", ""]

    /// The attacks run plain processes (`AttackStack`): the thread
    /// sanitizer's pass would only run them again; the address
    /// sanitizer's pass (and a plain `swift test`) runs them.
    static let plainOnce = ProcessInfo.processInfo.environment["TSAN_OPTIONS"] != nil

    /// A kind of request is its route and path, the query left out and
    /// each segment with a digit one wildcard (`/reports/17` is
    /// `/reports/*`: a kind per identifier would never have a baseline).
    @Test(arguments: [
        ("/reports/17", "/reports/18", true), ("/reports/17?x=1", "/reports/a1b2", true),
        ("/users/42/orders", "/users/7/orders", true), ("/ok", "/ok?ms=3", true),
        ("/ok", "/slow", false), ("/users/42/orders", "/users/42/items", false), ("/a/1", "/a", false),
        ("/v1/x", "/v2/x", true), ("/reports/17", "/report/17", false),
    ])
    func aKindIsARouteAndAPathTemplate(a: String, b: String, same: Bool) {
        #expect((Exchange.kind(route: 0, target: a) == Exchange.kind(route: 0, target: b)) == same)
        #expect(Exchange.kind(route: 0, target: a) != Exchange.kind(route: 1, target: a))
    }

    /// 16 clients on a 2 s path, 8 on a fast one of the same route: the
    /// fast clients are served (the issue measured 0–7 %).
    @Test(.disabled(if: plainOnce, "run by the address sanitizer's pass"), arguments: minimums)
    func aSlowPathDoesNotDenyTheFastOne(minLimit: String) throws {
        let h = try Self.harness(minLimit: minLimit)
        let slow = Crowd(port: h.port, clients: 16, target: "/slow?ms=2000")
        let fast = Crowd(port: h.port, clients: 8, target: "/ok")
        // Two rounds of the slow clients at least, and 400 fast requests.
        waitUntil("two rounds of slow answers and 400 fast requests", timeout: 30) {
            slow.answered.load(ordering: .relaxed) >= 32 && fast.total >= 400
        }
        fast.stop()
        slow.stop()
        #expect(fast.availability >= 95, "fast: \(fast.summary); slow: \(slow.summary)")
        // The slow clients are the ones the limit may shed while it learns
        // their kind (4 of 64 in a whole-suite run under the address
        // sanitizer; one request of 64 is 1.6 %): most of them are served.
        #expect(slow.availability >= 90, "slow: \(slow.summary)")
    }

    /// 6 clients reading a large answer at 8 KiB/s beside 4 on a fast path,
    /// with the limit held at 6 (3 slots a worker, which the 6 readers
    /// would hold) and a read-ahead of 256 KiB: past the read-ahead each
    /// slow answer leaves the limit for the upstream's streams, and the
    /// fast clients are served (the issue measured 0 of 8 answered in 10 s).
    /// `max_streams` is split between the workers like the limit, and the
    /// kernel may give one worker 5 or 6 of the readers: 12 (6 a worker)
    /// lets every reader's answer stream whichever worker has it (with 8,
    /// 4 a worker, a fifth reader on one worker kept its slot: a flake about
    /// one run in four). A reader the limit sheds while it learns comes back.
    @Test(.disabled(if: plainOnce, "run by the address sanitizer's pass"))
    func slowReadersDoNotHoldTheSlots() throws {
        let h = try AttackStack(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { read_ahead: 256KiB }
            upstreams:
              demo: { endpoints: [{{DEMO}}], adaptive_concurrency: { min_limit: 2, initial_limit: 6, max_limit: 6, max_streams: 12 } }
            routes:
              - { match: { path_prefix: / }, upstream: demo, retry: { attempts: 1 }, timeout: 10s }
            """)
        let admin = AdminProbe(port: h.adminPort)
        let readers = SlowReaders(port: h.port, count: 6, target: "/bytes?n=67108864")
        defer { readers.stop() }
        // (A loaded AddressSanitizer run took more than 10 s to get six 64 MiB answers streaming.)
        let streaming = waitUntil("six answers streaming apart from the limit", timeout: 30) {
            try admin.metric("happypath_upstream_streaming{upstream=\"demo\"}") == 6
        }
        if !streaming {
            let m = try admin.metrics().filter { $0.key.contains("upstream=\"demo\"") && !$0.key.contains("_bucket") }
            Issue.record("the upstream's series: \(m.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" })")
        }
        let fast = Crowd(port: h.port, clients: 4, target: "/ok")
        waitUntil("400 fast requests", timeout: 30) { fast.total >= 400 }
        fast.stop()
        #expect(fast.availability >= 95, "fast: \(fast.summary)")
        #expect(try admin.metric("happypath_upstream_streaming{upstream=\"demo\"}") == 6)
        readers.stop()
        waitUntil("the streams ended") { try admin.metric("happypath_upstream_streaming{upstream=\"demo\"}") == 0 }
        waitUntil("nothing in flight") { try admin.metric("happypath_upstream_in_flight{upstream=\"demo\"}") == 0 }
    }

    /// The whole upstream ten times slower (every path of it): each kind's
    /// tries are slower than its own baseline, and the limit still falls,
    /// from 20 to its minimum.
    @Test(.disabled(if: plainOnce, "run by the address sanitizer's pass"))
    func theWholeUpstreamSlowingDownStillLowersTheLimit() throws {
        let h = try Self.harness(minLimit: "min_limit: 2, ")
        let admin = AdminProbe(port: h.adminPort)
        let limit = "happypath_upstream_concurrency_limit{upstream=\"demo\"}"
        let a = Crowd(port: h.port, clients: 4, target: "/slow?ms=20")
        let b = Crowd(port: h.port, clients: 4, target: "/c/slow?ms=60")
        defer {
            a.stop()
            b.stop()
        }
        waitUntil("baselines for both kinds") { a.answered.load(ordering: .relaxed) >= 100 && b.answered.load(ordering: .relaxed) >= 40 }
        #expect(try admin.metric(limit) > 2)
        #expect(try HTTP.request(port: h.demoPort, "/_demo/slower?factor=10&ms=60000").status == 200)
        waitUntil("the limit at its minimum", timeout: 30) { try admin.metric(limit) <= 2 }
    }

    /// One client (127.0.0.1) keeps 6 requests going at a limit of 2, the
    /// other 4 waiting; another (127.0.0.2) asks one at a time. A freed
    /// slot goes to the waiting client that holds the fewest: each of the
    /// second client's requests waits for one slot to free, not behind the
    /// first client's queue (without the fair share, about 7 of its
    /// answers would come first). One worker, a queue that never sheds.
    @Test func oneClientCannotKeepAnotherWaitingBehindItsQueue() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams:
              demo: { endpoints: [{{DEMO}}], adaptive_concurrency: { min_limit: 2, initial_limit: 2, max_limit: 16, smoothing: 0.01, queue: { interval: 10s, target: 10s } } }
            routes:
              - { match: { path_prefix: / }, upstream: demo, retry: { attempts: 1 }, timeout: 10s }
            """, workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        // Answers of 1 s: long beside a loaded machine's delay in
        // connecting and sending (a greedy answer completes every 0.5 s).
        let greedy = Crowd(port: h.port, clients: 6, target: "/slow?ms=1000")
        defer { greedy.stop() }
        waitUntil("the greedy client's requests queued") {
            try admin.metric("happypath_upstream_queued{upstream=\"demo\"}") >= 3
        }
        var overtaken: [Int] = []
        for _ in 0..<4 {
            let before = greedy.answered.load(ordering: .relaxed)
            let answer = try HTTP.request(port: h.port, "GET", "/slow?ms=1000", source: "127.0.0.2")
            #expect(answer.status == 200)
            overtaken.append(greedy.answered.load(ordering: .relaxed) - before)
        }
        // One slot to free, then its own second: about 3 greedy answers
        // meanwhile (about 7 behind the greedy queue without the fair share).
        #expect(overtaken.allSatisfy { $0 <= 4 }, "greedy answers before each of the other's: \(overtaken)")
    }

    /// 80 sheddable clients on a 300 ms path beside 4 critical ones: every
    /// critical request is served (the issue measured 50 % at `min_limit: 2`).
    @Test(.disabled(if: plainOnce, "run by the address sanitizer's pass"), arguments: minimums)
    func aSheddableFloodLeavesCriticalTrafficAWayIn(minLimit: String) throws {
        let h = try Self.harness(minLimit: minLimit)
        let flood = Crowd(port: h.port, clients: 80, target: "/s/slow?ms=300")
        let critical = Crowd(port: h.port, clients: 4, target: "/c/slow?ms=300")
        waitUntil("100 critical requests and 400 sheddable ones", timeout: 40) {
            critical.total >= 100 && flood.total >= 400
        }
        critical.stop()
        flood.stop()
        #expect(critical.availability >= 99, "critical: \(critical.summary); sheddable: \(flood.summary)")
    }
}

/// Clients that ask for a large answer and read it at 8 KiB a second
/// (a small receive buffer, so the kernel does not read ahead for them)
/// until stopped.
final class SlowReaders: Sendable {
    private let stopping = Atomic<Bool>(false)
    private let running = Atomic<Int>(0)

    init(port: Int, count: Int, target: String) {
        running.store(count, ordering: .relaxed)
        for _ in 0..<count {
            let thread = Thread { [self] in
                defer { running.subtract(1, ordering: .relaxed) }
                var chunk = [UInt8](repeating: 0, count: 8 << 10)
                // A refusal (the limit shedding while it learns) is asked again, as a client would.
                var connection: TestConnection?
                while connection == nil, !stopping.load(ordering: .relaxed) {
                    guard let c = try? TestConnection(port: port, timeout: 30, receiveBuffer: 16 << 10) else { return }
                    try? c.send("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    let n = recv(c.fd, &chunk, 12, Int32(MSG_WAITALL))
                    if n == 12, String(decoding: chunk[0..<12], as: UTF8.self) == "HTTP/1.1 200" {
                        connection = c
                    } else {
                        Thread.sleep(forTimeInterval: 0.1)
                    }
                }
                guard let c = connection else { return }
                while !stopping.load(ordering: .relaxed) {
                    if recv(c.fd, &chunk, chunk.count, 0) <= 0 { return }
                    // The reader's pace: 8 KiB a second, in tenths.
                    for _ in 0..<10 where !stopping.load(ordering: .relaxed) { Thread.sleep(forTimeInterval: 0.1) }
                }
            }
            thread.start()
        }
    }

    func stop() {
        stopping.store(true, ordering: .relaxed)
        while running.load(ordering: .relaxed) > 0 { Thread.sleep(forTimeInterval: 0.01) }
    }
}

/// `happypath demo-upstream` and `happypath serve` as processes, of the
/// build without a sanitizer when a sanitizer pass names it
/// (`HAPPYPATH_PLAIN_BINARY`, as `ServeProcess(plain:)` does); `yaml` may
/// use `{{DEMO}}` for the demo upstream's URL. Two workers.
final class AttackStack {
    let demo: Process
    let demoPort: Int
    let proxy: ServeProcess
    let port: Int
    let adminPort: Int

    init(_ yaml: String) throws {
        let binary = ProcessInfo.processInfo.environment["HAPPYPATH_PLAIN_BINARY"] ?? happypathBinary
        demo = Process()
        demo.executableURL = URL(fileURLWithPath: binary)
        demo.arguments = ["demo-upstream", "--listen", "127.0.0.1:0"]
        let out = Pipe()
        demo.standardOutput = out
        demo.standardError = FileHandle.nullDevice
        try demo.run()
        // Its first line: "listening on http://127.0.0.1:PORT".
        var text = ""
        while !text.contains("\n") {
            let data = out.fileHandleForReading.availableData
            if data.isEmpty { break }
            text += String(decoding: data, as: UTF8.self)
        }
        let first = text.split(separator: "\n").first.map(String.init) ?? ""
        guard let demoPort = Int(first.split(separator: ":").last ?? ""), demoPort > 0 else {
            demo.terminate()
            throw TestError("the demo upstream said '\(first)'")
        }
        self.demoPort = demoPort
        let config = yaml.replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(demoPort)") + "\nworkers: 2\n"
        proxy = try ServeProcess(config: config, logLevel: "info", plain: true)
        guard let port = proxy.listeningPort(), let adminPort = proxy.adminPort() else {
            demo.terminate()
            throw TestError("the proxy did not start: \(proxy.errors)")
        }
        self.port = port
        self.adminPort = adminPort
    }

    deinit {
        proxy.process.terminate()
        proxy.process.waitUntilExit()
        demo.terminate()
        demo.waitUntilExit()
    }
}
