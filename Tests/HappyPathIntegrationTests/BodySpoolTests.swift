import Foundation
import HappyPathCore
import HappyPathDemo
import SmallDisk
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Request bodies kept in spool files (`limits.body_in_memory`,
/// docs/configuration.md): a large body is kept for retries on disk, not in
/// the process's memory, and is sent again intact; a full spool disk keeps
/// it in memory within `max_buffered_bytes`, and past that the client gets
/// a clean 503 with `Retry-After`.
@Suite(.serialized) struct BodySpoolTests {
    static func yaml(endpoints: [Int], spoolDir: String? = nil, limits: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        workers: 1
        limits: { max_request_body: 256MiB, client_timeout: 60s\(limits) }
        \(spoolDir.map { "storage: { spool_dir: \($0) }" } ?? "")
        upstreams:
          demo: { endpoints: [\(endpoints.map { "http://127.0.0.1:\($0)" }.joined(separator: ", "))] }
        routes:
          - match: { path_prefix: / }
            upstream: demo
            timeout: 120s
            retry: { attempts: 2, on: [503], per_try_timeout: 60s, backoff: { base: 10ms, max: 10ms } }
        """
    }

    /// Two demo upstreams: `down` in an outage (it reads each body and
    /// answers 503), `up` echoing each body's length and hash.
    static func outageAndEcho() throws -> (down: DemoUpstream, up: DemoUpstream) {
        let down = try DemoUpstream(host: "127.0.0.1", port: 0)
        down.start()
        let up = try DemoUpstream(host: "127.0.0.1", port: 0)
        up.start()
        #expect(try HTTP.request(port: down.port, "POST", "/_demo/outage?ms=600000&status=503", body: []).status == 200)
        return (down, up)
    }

    /// The process's own memory (`RssAnon`: not the page cache a mapped
    /// spool file's pages belong to).
    static func anonymousBytes(_ pid: Int32) -> Int {
        let status = readSmallFile("/proc/\(pid)/status") ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("RssAnon:") } ?? ""
        return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
    }

    /// A 200 MiB PUT to a route that retries 503: one endpoint is in an
    /// outage (it reads the body and answers 503), the other echoes the
    /// body's length and hash. Both requests are answered 200 with the
    /// body's own hash, one of them on its second try (sent again from the
    /// spool file), while the proxy's own memory stays flat: the body is
    /// in the spool file, not in the process.
    @Test func aLargeUploadIsRetriedIntactFromItsSpoolFile() throws {
        let (down, up) = try Self.outageAndEcho()
        defer { down.stop(); up.stop() }
        // A client address may spool an eighth of max_spooled_bytes: 256 MiB here.
        let serve = try ServeProcess(
            config: Self.yaml(endpoints: [down.port, up.port], limits: ", max_spooled_bytes: 2GiB"), plain: true)
        let port = try #require(serve.listeningPort())
        let size = 200 << 20
        var body = [UInt8](repeating: 0x5A, count: size)
        for i in stride(from: 0, to: size, by: 4093) { body[i] = UInt8(truncatingIfNeeded: i >> 12) }
        let hash = fnv1a(body)
        let before = Self.anonymousBytes(serve.pid)
        let peak = Locked(0)
        let sampling = Locked(true)
        let pid = serve.pid
        let sampler = Thread {
            while sampling.withLock({ $0 }) {
                let now = Self.anonymousBytes(pid)
                peak.withLock { $0 = max($0, now) }
                usleep(20_000)
            }
        }
        sampler.start()
        var attempts: [String] = []
        for _ in 0..<2 {
            let r = try HTTP.request(port: port, "PUT", "/echo", body: body, timeout: 120)
            #expect(r.status == 200)
            #expect(r.json["body_bytes"] as? Int == size)
            #expect(r.json["body_fnv1a64"] as? String == hash, "the body sent again changed")
            attempts.append(r.header("X-Happypath-Attempts") ?? "")
        }
        sampling.withLock { $0 = false }
        #expect(attempts.contains("2"), "no request was retried: \(attempts)")
        let grown = peak.withLock { $0 } - before
        print("a 200 MiB body retried: the proxy's own memory grew by \(grown >> 10) KiB at most")
        if serve.isPlain {
            #expect(grown < 32 << 20, "the proxy's own memory grew by \(grown >> 20) MiB for a 200 MiB body")
        }
    }

    /// A chunked 8 MiB PUT (its length learned as it arrives) through a
    /// memory budget of 1 MiB (a client's share: 128 KiB): past
    /// `body_in_memory` it goes on in a spool file that grows, is retried
    /// from it intact after the first endpoint's 503, and the share is
    /// given back once it is answered.
    @Test func aChunkedUploadGrowsInItsSpoolFileAndIsRetriedIntact() throws {
        let (down, up) = try Self.outageAndEcho()
        defer { down.stop(); up.stop() }
        let h = try ProxyHarness(
            Self.yaml(endpoints: [down.port, up.port], limits: ", max_buffered_bytes: 1MiB").replacingOccurrences(
                of: "workers: 1\n", with: ""), workers: 1)
        defer { h.stop() }
        let size = 8 << 20
        let body = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 13) }
        var attempts: [String] = []
        for _ in 0..<2 {
            let c = try TestConnection(port: h.port, timeout: 60)
            try c.send("PUT /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            for start in stride(from: 0, to: size, by: 100_000) {
                let piece = Array(body[start..<min(start + 100_000, size)])
                try c.send(Array((String(piece.count, radix: 16) + "\r\n").utf8) + piece + Array("\r\n".utf8))
            }
            try c.send("0\r\n\r\n")
            let r = try c.readResponse()
            #expect(r.status == 200, "\(r.status) \(String(decoding: r.body, as: UTF8.self))")
            #expect(r.json["body_bytes"] as? Int == size)
            #expect(r.json["body_fnv1a64"] as? String == fnv1a(body), "the body sent again changed")
            attempts.append(r.header("X-Happypath-Attempts") ?? "")
        }
        #expect(attempts.contains("2"), "no request was retried: \(attempts)")
        let admin = AdminProbe(port: h.adminPort)
        #expect(waitUntil("the spool and the bodies given back") {
            let m = try admin.metrics()
            return m["happypath_spool_bytes"] == 0 && m["happypath_memory_bytes{pool=\"request_bodies\"}"] == 0
        })
    }

    /// A spool disk that is full: the body is kept in memory while it fits
    /// `max_buffered_bytes` (answered as usual); a larger one gets 503
    /// OVERLOADED with `Retry-After` before it is read, and the process
    /// goes on.
    @Test func aFullSpoolDiskFallsBackToMemoryThenTo503() throws {
        guard let disk = SmallDisk(bytes: 16 << 20) else { return }
        disk.fill()
        let h = try ProxyHarness(
            Self.yaml(endpoints: [], spoolDir: disk.path, limits: ", max_buffered_bytes: 8MiB")
                .replacingOccurrences(of: "endpoints: []", with: "endpoints: [{{DEMO}}]")
                .replacingOccurrences(of: "workers: 1\n", with: ""),
            workers: 1)
        defer { h.stop() }
        // A client's memory share is an eighth of max_buffered_bytes: 1 MiB.
        let small = [UInt8](repeating: 0x41, count: 512 << 10)
        let fits = try HTTP.request(port: h.port, "PUT", "/echo", body: small)
        #expect(fits.status == 200)
        #expect(fits.json["body_fnv1a64"] as? String == fnv1a(small))
        let large = [UInt8](repeating: 0x42, count: 3 << 20)
        let refused = try HTTP.request(port: h.port, "PUT", "/echo", body: large)
        #expect(refused.status == 503)
        #expect(refused.header("Retry-After") != nil)
        #expect(refused.json["code"] as? String == "OVERLOADED")
        // Room on the disk again: the same body is spooled and answered.
        disk.free()
        let spooled = try HTTP.request(port: h.port, "PUT", "/echo", body: large)
        #expect(spooled.status == 200)
        #expect(spooled.json["body_fnv1a64"] as? String == fnv1a(large))
        #expect(try HTTP.request(port: h.port, "/ok").status == 200)
    }
}
