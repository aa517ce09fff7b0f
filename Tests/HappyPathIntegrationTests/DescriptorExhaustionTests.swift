import Foundation
import HappyPathDemo
import HappyPathServer
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Out of file descriptors, the listener must pause instead of spinning on
/// `accept` (which used to write millions of log lines and burn both cores),
/// and serve again once descriptors are free.
@Suite struct DescriptorExhaustionTests {
    @Test func outOfDescriptorsPausesAcceptingLogsOnceAndRecovers() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        // The proxy under a lowered limit on open files (both soft and hard:
        // it raises the soft limit to the hard one at start).
        let limit = 48
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                workers: 1
                admin: { listen: 127.0.0.1:0 }
                upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
                routes: [ { match: { path_prefix: / }, upstream: demo } ]
                """, logLevel: nil, openFilesLimit: limit)
        let port = try #require(serve.listeningPort())
        let admin = try #require(serve.adminPort())

        func get(_ path: String, on port: Int) -> TestResponse? { try? HTTP.request(port: port, path, timeout: 2) }
        #expect(waitUntil("the first answer") { get("/ok", on: port)?.status == 200 })

        // More idle clients than descriptors: the kernel queues them, the proxy cannot accept them all.
        let started = ContinuousClock.now
        var held: [TestConnection] = []
        for _ in 0..<(limit + 20) { held.append(try TestConnection(port: port, timeout: 2)) }
        #expect(waitUntil("'cannot accept connections' in the log") { serve.errors.contains("cannot accept connections") })
        // Out of descriptors: the table was full when accept() failed. Not
        // exact later on: the proxy's own upstream and health-check sockets
        // come and go on their own schedule, so a sample may fall one short.
        #expect(waitUntil("the descriptor table to be full") { serve.openDescriptors >= limit - 1 })
        // Paused, not spinning: the process is nearly idle while the backlog waits.
        let cpuBefore = cpuTicks(serve.pid)
        let sampleStart = ContinuousClock.now
        // Not an ordering sleep: the span over which the proxy's CPU time is measured.
        Thread.sleep(forTimeInterval: 1)
        let cpuUsed = Double(cpuTicks(serve.pid) - cpuBefore) / Double(sysconf(Int32(_SC_CLK_TCK)))
        // A bound on CPU time, so not exact: paused, the proxy wakes twice a
        // second to fail one accept (well under a 10 ms tick of CPU);
        // spinning, it would take whatever share of a core it can get, which
        // on a busy machine may be well under half of one. So 10%.
        #expect(cpuUsed < 0.1 * seconds(since: sampleStart))

        held.removeAll()  // the clients leave
        #expect(waitUntil("an answer after the clients left") { get("/ok", on: port)?.status == 200 })
        let paused = try #require(Int(exactly: try AdminProbe(port: admin).metric("happypath_accept_paused_total")))
        let elapsed = seconds(since: started)
        // Not exact, it depends on time: the listener pauses for 500 ms
        // after a failed accept, then tries again; so at least one pause,
        // and at most one per 500 ms the clients were held (plus the first).
        #expect(paused >= 1)
        #expect(paused <= 2 + Int(elapsed / 0.5))
        // One line per interval (5 s), not one per failed accept: one line,
        // and one more per 5 s the test took.
        let lines = serve.errors.components(separatedBy: "cannot accept connections").count - 1
        #expect(lines >= 1 && lines <= 1 + Int(elapsed / 5))
    }
}

/// User + system CPU ticks of a process (from /proc/PID/stat).
private func cpuTicks(_ pid: Int32) -> Int {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return 0 }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    // After the command: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    guard fields.count > 13, let user = Int(fields[11]), let system = Int(fields[12]) else { return 0 }
    return user + system
}
