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
        let port = closedPort()
        let admin = closedPort()
        let config = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        try """
        listen: 127.0.0.1:\(port)
        workers: 1
        admin: { listen: 127.0.0.1:\(admin) }
        upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
        routes: [ { match: { path_prefix: / }, upstream: demo } ]
        """.write(to: config, atomically: true, encoding: .utf8)

        // The proxy in a shell that lowers both limits (the proxy raises the
        // soft limit to the hard one at start).
        let limit = 48
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [
            "-c", "ulimit -Sn \(limit) && ulimit -Hn \(limit) && exec '\(happypathBinary)' serve --config '\(config.path)'",
        ]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = out
        try process.run()
        defer { if process.isRunning { process.terminate() } }
        let log = Mutex("")
        Thread {
            while true {
                let data = out.fileHandleForReading.availableData
                if data.isEmpty { return }
                log.withLock { $0 += String(decoding: data, as: UTF8.self) }
            }
        }.start()

        func get(_ path: String, on port: Int) -> TestResponse? { try? HTTP.request(port: port, path, timeout: 2) }
        func waitFor(_ seconds: Double, _ condition: () -> Bool) -> Bool {
            let until = Date().addingTimeInterval(seconds)
            while !condition() {
                if Date() > until { return false }
                Thread.sleep(forTimeInterval: 0.02)
            }
            return true
        }
        #expect(waitFor(5) { get("/ok", on: port)?.status == 200 })

        // More idle clients than descriptors: the kernel queues them, the proxy cannot accept them all.
        var held: [TestConnection] = []
        for _ in 0..<(limit + 20) { held.append(try TestConnection(port: port, timeout: 2)) }
        let pid = process.processIdentifier
        func openDescriptors() -> Int {
            (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? 0
        }
        #expect(waitFor(5) { openDescriptors() >= limit - 1 })
        #expect(waitFor(5) { log.withLock { $0.contains("cannot accept connections") } })
        // Paused, not spinning: the process is nearly idle while the backlog waits.
        let cpuBefore = cpuTicks(pid)
        let sampleStart = Date()
        _ = waitFor(1) { false }  // a one-second sample of its CPU time
        let cpuUsed = Double(cpuTicks(pid) - cpuBefore) / Double(sysconf(Int32(_SC_CLK_TCK)))
        #expect(cpuUsed < 0.5 * Date().timeIntervalSince(sampleStart))

        held.removeAll()  // the clients leave
        #expect(waitFor(5) { get("/ok", on: port)?.status == 200 })
        let metrics = get("/metrics", on: admin)?.text ?? ""
        let paused = metrics.split(separator: "\n").first { $0.hasPrefix("happypath_accept_paused_total ") }
        #expect(Int(paused?.split(separator: " ").last ?? "") ?? 0 > 0)
        // One line per interval, not one per failed accept.
        let lines = log.withLock { $0 }.components(separatedBy: "cannot accept connections").count - 1
        #expect(lines >= 1 && lines <= 3)
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
