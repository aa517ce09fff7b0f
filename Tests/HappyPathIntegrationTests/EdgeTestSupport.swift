import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Helpers shared by the edge tests (EdgeParserTests, EdgeConnectionTests,
/// ResponseReframingTests): raw bytes on the client socket, the upstream's
/// recorded heads, the admin `/metrics` text.
enum Edge {
    /// The proxy in front of a scripted upstream, with a config of our own:
    /// `yaml` uses `{{UP}}` for the scripted upstream's base URL.
    static func harness(_ yaml: String, responses: [String], workers: Int = 1) throws -> (ProxyHarness, ScriptedUpstream) {
        let upstream = ScriptedUpstream(responses: responses).started()
        do {
            let h = try ProxyHarness(
                yaml.replacingOccurrences(of: "{{UP}}", with: "http://127.0.0.1:\(upstream.port)"), workers: workers)
            h.scripted.append(upstream)
            return (h, upstream)
        } catch {
            upstream.stop()
            throw error
        }
    }

    /// `ProxyHarness.scripted` on one worker (these tests start many
    /// harnesses side by side; one loop each keeps the machine quieter).
    static func scripted(_ responses: [String], defaults: String = "{ reachability: { park_for: 0s } }") throws -> (
        ProxyHarness, ScriptedUpstream
    ) {
        try harness(ProxyHarness.single(upstream: "{{UP}}", defaults: defaults), responses: responses)
    }

    /// Field lines of a recorded request head, as (lower-cased name, value).
    static func fields(_ head: String) -> [(name: String, value: String)] {
        head.components(separatedBy: "\r\n").dropFirst().compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (
                String(line[..<colon]).lowercased(),
                String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces)
            )
        }
    }

    static func values(_ head: String, _ name: String) -> [String] {
        fields(head).filter { $0.name == name.lowercased() }.map(\.value)
    }

    static func requestLine(_ head: String) -> String {
        head.components(separatedBy: "\r\n").first ?? ""
    }

    /// How many times a response carries the header `name`.
    static func count(_ response: TestResponse, _ name: String) -> Int {
        response.headers.filter { $0.name.lowercased() == name.lowercased() }.count
    }

    /// Reads one head (up to and including its empty line) straight from the
    /// socket, one byte at a time, so nothing after it is consumed. Only
    /// before the TestConnection has buffered anything.
    static func readRawHead(_ c: TestConnection) throws -> String {
        var bytes: [UInt8] = []
        var b: UInt8 = 0
        while !bytes.ends(with: [13, 10, 13, 10]) {
            let n = recv(c.fd, &b, 1, 0)
            guard n == 1 else { throw TestError("connection ended after \(bytes.count) head bytes (errno \(errno))") }
            bytes.append(b)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Reads exactly `n` bytes straight from the socket.
    static func readRaw(_ c: TestConnection, _ n: Int) throws -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while out.count < n {
            let got = chunk.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, min($0.count, n - out.count), 0) }
            guard got > 0 else { throw TestError("connection ended after \(out.count) of \(n) bytes") }
            out += chunk[0..<got]
        }
        return out
    }

    /// Waits up to `ms` for the socket to become readable (data or end of stream).
    static func readable(_ c: TestConnection, ms: Int32) -> Bool {
        var p = pollfd(fd: c.fd, events: Int16(POLLIN), revents: 0)
        return poll(&p, 1, ms) > 0
    }

    /// Reads straight from the socket until the peer closes: every byte it
    /// sent (nil if the receive timed out first).
    static func readToEnd(_ c: TestConnection) -> [UInt8]? {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                out += chunk[0..<n]
                continue
            }
            if n == 0 { return out }
            if errno == EAGAIN || errno == EWOULDBLOCK { return nil }
            return out  // reset: gone
        }
    }

    /// `happypath_requests_refused_total{reason=...,status=...}` on the admin port (0 if absent).
    static func refusedCount(adminPort: Int, reason: String, status: Int) throws -> Double {
        let text = try HTTP.request(port: adminPort, "/metrics").text
        for line in text.split(separator: "\n") where line.hasPrefix("happypath_requests_refused_total{") {
            guard line.contains("reason=\"\(reason)\""), line.contains("status=\"\(status)\""),
                let space = line.lastIndex(of: " ")
            else { continue }
            return Double(line[line.index(after: space)...]) ?? -1
        }
        return 0
    }
}
