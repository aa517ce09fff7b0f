import Foundation
import HappyPathCore
import HappyPathDemo
import SmallDisk
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Answers read ahead of slow clients (`limits.read_ahead`, docs/http2.md
/// "Memory", docs/configuration.md): a client that does not read holds
/// neither its upstream connection nor the upstream's slot once the
/// upstream sent its last byte, over HTTP/1.1 and HTTP/2; the client still
/// gets every byte, in order; a full spool disk makes the answer wait for
/// its client instead; and no spool file outlives the process.
@Suite(.serialized) struct ReadAheadTests {
    /// One upstream connection in all (one worker, `max_connections: 1`):
    /// a second request is served only once the first transfer let it go.
    static func yaml(readAhead: String = "64MiB", spoolDir: String? = nil) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { client_timeout: 60s, connection_buffer: 64KiB, read_ahead: \(readAhead) }
        \(spoolDir.map { "storage: { spool_dir: \($0) }" } ?? "")
        upstreams:
          demo: { endpoints: [{{DEMO}}], max_connections: 1 }
        routes:
          - match: { path_prefix: / }
            upstream: demo
            timeout: 60s
            retry: { attempts: 1 }
        """
    }

    /// curl fetching `path` into a pipe the test does not read yet: once the
    /// pipe and curl's socket fill, curl stops reading, as a client on a
    /// slow link does. `finish` reads the whole answer.
    final class StalledClient {
        let process = Process()
        let pipe = Pipe()

        init(port: Int, _ path: String, http2: Bool) throws {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            process.arguments =
                ["-sS", "--max-time", "120", "-o", "-"] + (http2 ? ["--http2-prior-knowledge"] : [])
                + ["http://127.0.0.1:\(port)\(path)"]
            process.standardOutput = pipe
            process.standardError = FileHandle.nullDevice
            try process.run()
        }

        /// Every byte of the answer (curl exits at its end).
        func finish() -> Data {
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return data
        }

        func stop() {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
    }

    /// Byte i of the demo's `/bytes` is i % 251.
    static func isDemoPattern(_ data: Data) -> Bool {
        data.withUnsafeBytes { raw in
            var k = 0
            for b in raw {
                if b != UInt8(k) { return false }
                k = k == 250 ? 0 : k + 1
            }
            return true
        }
    }

    static let size = 50_000_000

    /// A client that stopped reading a 50 MB answer: the upstream sends it
    /// all (into the connection's bound, then the spool), its one connection
    /// is free, and another request is answered while the first client
    /// still reads nothing; then the first client gets every byte in order,
    /// and the spool is empty again.
    @Test(arguments: [false, true])
    func aStalledReaderFreesItsUpstreamOnceTheUpstreamIsDone(http2: Bool) throws {
        let h = try ProxyHarness(Self.yaml(), workers: 1)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let slow = try StalledClient(port: h.port, "/bytes?n=\(Self.size)", http2: http2)
        defer { slow.stop() }
        // Most of the answer waits in the spool (the rest in sockets and pipes).
        #expect(waitUntil("the answer read ahead", timeout: 30) { try admin.metric("happypath_spool_bytes") >= 30e6 })
        #expect(try HTTP.request(port: h.port, "/ok", timeout: 10).status == 200, "the upstream's one connection is free")
        let data = slow.finish()
        #expect(data.count == Self.size)
        #expect(Self.isDemoPattern(data), "the bytes came out of order or changed")
        #expect(waitUntil("the spool empty") { try admin.metric("happypath_spool_bytes") == 0 })
        let state = try admin.state()
        #expect(state["spooled_bytes"] as? Int == 0)
    }

    /// `limits.read_ahead` bounds what one answer spools: a stalled client
    /// of a 50 MB answer holds 4 MiB on disk (and a read more), and its
    /// upstream transfer waits for it beyond; once it leaves (killed), its
    /// connection is seen gone and the spool is empty. (Over HTTP/2 the
    /// stream's drain once spun: its memory was below half the bound while
    /// its spool had no room, and each drain asked for the next.)
    @Test(arguments: [false, true])
    func oneAnswerSpoolsAtMostReadAhead(http2: Bool) throws {
        let h = try ProxyHarness(Self.yaml(readAhead: "4MiB"), workers: 1)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let slow = try StalledClient(port: h.port, "/bytes?n=\(Self.size)", http2: http2)
        defer { slow.stop() }
        var last = -1.0
        var same = 0
        #expect(waitUntil("the spool settled", timeout: 30) {
            let now = try admin.metric("happypath_spool_bytes")
            same = now == last && now > 0 ? same + 1 : 0
            last = now
            return same >= 3
        })
        #expect(last >= Double(3 << 20) && last <= Double((4 << 20) + (64 << 10)), "\(last) bytes spooled for one answer")
        slow.stop()
        #expect(waitUntil("the spool empty") { try admin.metric("happypath_spool_bytes") == 0 })
        #expect(try admin.metric("happypath_client_connections") == 0, "the client's connection is gone")
    }

    /// A spool directory on a full disk: nothing is read ahead, the answer
    /// waits in its upstream transfer for the client (as with `read_ahead: 0`),
    /// and arrives whole.
    @Test func aFullSpoolDiskMakesTheAnswerWaitForItsClient() throws {
        guard let disk = SmallDisk(bytes: 1 << 20) else { return }
        disk.fill()
        let h = try ProxyHarness(Self.yaml(spoolDir: disk.path), workers: 1)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let size = 8_000_000
        let slow = try StalledClient(port: h.port, "/bytes?n=\(size)", http2: false)
        defer { slow.stop() }
        // The connection's bound fills; what does not fit waits upstream.
        #expect(waitUntil("the connection's bound filled") {
            try admin.metric(#"happypath_memory_bytes{pool="client_output"}"#) >= 60 * 1024
        })
        #expect(try admin.metric("happypath_spool_bytes") == 0)
        // At most one read of the transfer waits in memory past the bound.
        #expect(try admin.metric(#"happypath_memory_bytes{pool="client_output"}"#) <= Double(64 * 1024 + 64 * 1024 + 16 * 1024))
        let data = slow.finish()
        #expect(data.count == size && Self.isDemoPattern(data))
        // Space again: the next slow client's answer is read ahead.
        disk.free()
        let next = try StalledClient(port: h.port, "/bytes?n=\(size)", http2: false)
        defer { next.stop() }
        #expect(waitUntil("read ahead once the disk has room") { try admin.metric("happypath_spool_bytes") > 0 })
        #expect(next.finish().count == size)
    }

    /// Spool files have no name (`O_TMPFILE`, or unlinked at once): while
    /// an answer is spooled, and after `kill -9` and a restart, the spool
    /// directory is empty.
    @Test func theSpoolDirectoryIsEmptyAfterKillNine() throws {
        let dir = NSTemporaryDirectory() + "happypath-spool-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let yaml = Self.yaml(spoolDir: dir).replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(demo.port)")
        let serve = try ServeProcess(config: "workers: 1\n" + yaml, logLevel: "info")
        let port = try #require(serve.listeningPort())
        let admin = AdminProbe(port: try #require(serve.adminPort()))
        let slow = try StalledClient(port: port, "/bytes?n=\(Self.size)", http2: false)
        defer { slow.stop() }
        #expect(waitUntil("the answer read ahead", timeout: 30) { try admin.metric("happypath_spool_bytes") >= 10e6 })
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).isEmpty, "a spool file has a name")
        serve.signal(SIGKILL)
        serve.process.waitUntilExit()
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).isEmpty)
        let again = try ServeProcess(config: "workers: 1\n" + yaml, logLevel: "error")
        let port2 = try #require(again.listeningPort())
        #expect(try HTTP.request(port: port2, "/ok").status == 200)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).isEmpty)
    }

    /// An event stream keeps its client's pace (its events are worth
    /// nothing late): its `content-type`, parameters aside, is never read ahead.
    @Test func anEventStreamIsNeverReadAhead() {
        func check(_ value: String) -> Bool {
            var v = value
            return v.withUTF8 { ResponseRelay.isEventStream(UnsafeRawBufferPointer($0)) }
        }
        #expect(check("text/event-stream"))
        #expect(check("Text/Event-Stream; charset=utf-8"))
        #expect(check("text/event-stream;charset=utf-8"))
        #expect(!check("text/event-streams"))
        #expect(!check("text/plain"))
        #expect(!check("text/event"))
        #expect(!check(""))
    }
}
