import Foundation
import HappyPathCore
import HappyPathServer
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// WebSocket through the proxy (docs/websocket.md): a raw RFC 6455 client
/// and upstream in Python, real sockets both sides.
@Suite(.serialized) struct WebSocketTests {
    /// The Python upstream (`WebSocketPeers.server`), killed with the test.
    final class Upstream {
        let process = Process()
        let port: Int
        /// What it printed after its port, line by line.
        let said = Locked<[String]>([])

        init(tls: TestCertificates.Pair? = nil) throws {
            let output = Pipe()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-u", "-c", WebSocketPeers.server] + (tls.map { [$0.cert, $0.key] } ?? [])
            process.standardOutput = output
            try process.run()
            var line = Data()
            while !line.contains(UInt8(ascii: "\n")) {
                let chunk = output.fileHandleForReading.availableData
                guard !chunk.isEmpty else { break }
                line.append(chunk)
            }
            guard let port = Int(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
            else {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                throw TestError("the WebSocket upstream did not start")
            }
            self.port = port
            // Lines after the port (the first chunk may hold some already).
            let rest = line.firstIndex(of: UInt8(ascii: "\n")).map { Data(line[line.index(after: $0)...]) } ?? Data()
            collectLines(from: output.fileHandleForReading, after: rest, into: said)
        }

        deinit {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    static func yaml(upstream: String, extra: String = "", listen: String = "127.0.0.1:0", idle: String = "5m") -> String {
        """
        listen: \(listen)
        admin: { listen: 127.0.0.1:0 }
        defaults: { reachability: { park_for: 0s }, retry: { backoff: { base: 1ms, max: 2ms } } }
        upstreams:
          ws: { endpoints: [\(upstream)] \(extra) }
        routes:
          - { match: { path_prefix: /plain/ }, upstream: ws }
          - { match: { path_prefix: / }, upstream: ws, upgrades: [websocket], upgrades_idle_timeout: \(idle) }
        """
    }

    /// Runs the Python client; its output lines.
    func client(_ arguments: [String], timeout: Double = 60) throws -> [String] {
        let r = try runProcess("/usr/bin/python3", ["-c", WebSocketPeers.client] + arguments, timeout: timeout)
        guard r.status == 0 else { throw TestError("the WebSocket client failed: \(r.err)") }
        return r.out.split(separator: "\n").map(String.init)
    }

    func series(_ name: String, _ reason: String) -> String {
        "\(name){upstream=\"ws\",reason=\"\(reason)\"}"
    }

    @Test func tenMegabytesEachWayArriveWholeAndTheCloseHandshakeEndsBothSides() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)"), holding: [up])
        defer { h.stop() }
        let out = try client(["\(h.port)", "/chat/echo", "echo", "10000000"])
        #expect(out.first == "xff 127.0.0.1", "the upgrade went upstream with the forwarded fields")
        #expect(out.last == "echo True close True eof True")
        let admin = AdminProbe(port: h.adminPort)
        // The upstream answers the client's close frame and closes first.
        waitUntil("the tunnel counted closed") { try admin.metric(series("happypath_tunnels_total", "upstream_closed")) == 1 }
        let metrics = try admin.metrics()
        #expect(metrics["happypath_tunnel_bytes_total{upstream=\"ws\",direction=\"to_upstream\"}"] ?? 0 > 10_000_000)
        #expect(metrics["happypath_tunnel_bytes_total{upstream=\"ws\",direction=\"to_client\"}"] ?? 0 > 10_000_000)
        #expect(metrics["happypath_tunnels_open"] == 0)
        #expect(metrics["happypath_requests_total{route=\"/\",code=\"OK\"}"] == 1, "the upgrade counts as a request")
    }

    /// An upstream that reads nothing after its 101: the client's bytes
    /// that the proxy has read and the upstream's socket has not taken are
    /// counted (`happypath_memory_bytes{pool="tunnels"}`), at most about
    /// the tunnel's high water (256 KiB) and a read, and given back when
    /// the tunnel closes. The admin listener's own output has a pool too.
    @Test func bytesWaitingForADeafUpstreamAreCountedAndGivenBack() throws {
        let up = try Upstream()
        let h = try ProxyHarness(
            Self.yaml(upstream: "http://127.0.0.1:\(up.port)", idle: "2s"), holding: [up])
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let tunnels = #"happypath_memory_bytes{pool="tunnels"}"#
        #expect(try admin.metrics()[#"happypath_memory_bytes{pool="admin_output"}"#] != nil)
        let c = try TestConnection(port: h.port, timeout: 10)
        try c.send(
            "GET /x/deaf HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        // The 101's head (readResponse takes a 1xx for an interim answer).
        let fd = c.fd
        var head: [UInt8] = []
        var byte: UInt8 = 0
        while !head.ends(with: Array("\r\n\r\n".utf8)), recv(fd, &byte, 1, 0) == 1 { head.append(byte) }
        #expect(String(decoding: head, as: UTF8.self).hasPrefix("HTTP/1.1 101"))
        let chunk = [UInt8](repeating: 0x42, count: 64 * 1024)
        var flags = fcntl(fd, F_GETFL)
        flags |= O_NONBLOCK
        _ = fcntl(fd, F_SETFL, flags)
        // Sends until the kernel takes no more: the proxy stopped reading it.
        #expect(waitUntil("the proxy to stop reading the client", timeout: 20) {
            let n = chunk.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n < 0, errno == EAGAIN else { return false }
            return try admin.metric(tunnels) >= 128 * 1024
        })
        let held = try admin.metric(tunnels)
        #expect(held <= Double(256 * 1024 + 64 * 1024), "\(held) bytes queued for the upstream")
        shutdown(fd, Int32(SHUT_RDWR))
        #expect(waitUntil("the tunnel's bytes given back", timeout: 30) { try admin.metric(tunnels) == 0 })
    }

    @Test func theUpstreamClosingFirstClosesTheClientAfterItsLastBytes() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)"), holding: [up])
        defer { h.stop() }
        // The upstream sends its 101, a frame and a close in one write: the
        // frames after the head reach the client, then the end.
        #expect(try client(["\(h.port)", "/close", "close"]).last == "closed-by-upstream True")
        waitUntil("closed as the upstream's") {
            try AdminProbe(port: h.adminPort).metric(series("happypath_tunnels_total", "upstream_closed")) == 1
        }
    }

    @Test func theClientHangingUpClosesTheUpstream() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)"), holding: [up])
        defer { h.stop() }
        #expect(try client(["\(h.port)", "/echo", "hangup"]).last == "hung-up")
        waitUntil("closed as the client's") {
            try AdminProbe(port: h.adminPort).metric(series("happypath_tunnels_total", "client_closed")) == 1
        }
    }

    @Test func anAnswerOtherThan101IsAnsweredAsAnyOther() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)"), holding: [up])
        defer { h.stop() }
        let out = try client(["\(h.port)", "/refuse", "echo"])
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(out.last!.utf8)) as? [String: Any])
        #expect(answer["status"] as? Int == 403)
        let body = try #require(try JSONSerialization.jsonObject(with: Data((answer["body"] as! String).utf8)) as? [String: Any])
        #expect(body["code"] as? String == "FORBIDDEN", "normalized like any 403")
        #expect((body["upstream_body"] as? [String: Any])?["error"] as? String == "no sockets for you")
        #expect(answer["upgrade"] as? String == "-", "no Upgrade reaches the client")
    }

    @Test func aRouteWithoutUpgradesForwardsAPlainRequest() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)"), holding: [up])
        defer { h.stop() }
        let out = try client(["\(h.port)", "/plain/x", "echo"])
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(out.last!.utf8)) as? [String: Any])
        #expect(answer["status"] as? Int == 200)
        #expect(answer["body"] as? String == "plain /plain/x upgrade=-", "Upgrade was dropped as hop-by-hop")
    }

    @Test func anUnreachableUpstreamIsRetriedThenAnsweredWithTheUsualProblem() throws {
        let down = RefusingPort()
        let h = try ProxyHarness(Self.yaml(upstream: down.url), holding: [down])
        defer { h.stop() }
        let out = try client(["\(h.port)", "/echo", "echo"])
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(out.last!.utf8)) as? [String: Any])
        #expect(answer["status"] as? Int == 503)
        let body = try #require(try JSONSerialization.jsonObject(with: Data((answer["body"] as! String).utf8)) as? [String: Any])
        #expect(body["code"] as? String == "UPSTREAM_UNREACHABLE")
        #expect(body["attempts"] as? Int == 3, "connect failures follow the route's retry rules")
    }

    @Test func fiveHundredIdleTunnelsStayOpenUntilTheIdleTimeoutClosesThem() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)", extra: ", max_connections: 1000", idle: "3s"), holding: [up])
        defer { h.stop() }
        let out = try client(["\(h.port)", "/echo", "many", "500", "\(h.adminPort)"], timeout: 120)
        #expect(out.contains("open 500.0"), "\(out)")
        #expect(out.contains("echoed 500"))
        #expect(out.contains("idle-closed 500"))
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("every tunnel counted closed for idleness") { try admin.metric(series("happypath_tunnels_total", "idle")) == 500 }
        #expect(try admin.metric("happypath_tunnels_open") == 0)
    }

    /// A tunnel is an open connection to its upstream: it holds one of the
    /// upstream's `max_connections` slots until it closes. An upgrade at
    /// the limit waits in the upstream's queue like any request, one past
    /// the queue gets 503 OVERLOADED, and a tunnel that closes hands its
    /// slot to the upgrade that has waited longest.
    @Test func tunnelsCountAgainstTheUpstreamsMaxConnections() throws {
        let up = try Upstream()
        let h = try ProxyHarness(
            Self.yaml(upstream: "http://127.0.0.1:\(up.port)", extra: ", max_connections: 2"), workers: 1, holding: [up])
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        func upgrade() throws -> TestConnection {
            let c = try TestConnection(port: h.port, timeout: 10)
            try c.send(
                "GET /chat/echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                    + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            return c
        }
        var first: TestConnection? = try upgrade()
        #expect(try Edge.readRawHead(first!).hasPrefix("HTTP/1.1 101 "))
        let second = try upgrade()
        #expect(try Edge.readRawHead(second).hasPrefix("HTTP/1.1 101 "))
        // Both slots are held by the tunnels: the next two upgrades wait for one.
        let third = try upgrade()
        waitUntil("the third upgrade waits") { try admin.inFlight() == 3 }
        let fourth = try upgrade()
        waitUntil("the fourth upgrade waits") { try admin.inFlight() == 4 }
        // Slots and queue are full: the usual overloaded answer.
        let fifth = try upgrade()
        let refused = try fifth.readResponse()
        #expect(refused.status == 503)
        #expect(refused.json["code"] as? String == "OVERLOADED")
        #expect(try admin.metric("happypath_tunnels_open") == 2)

        // A tunnel closes: its slot goes to the upgrade that waited longest.
        first = nil
        #expect(try Edge.readRawHead(third).hasPrefix("HTTP/1.1 101 "))
        waitUntil("two tunnels open again") { try admin.metric("happypath_tunnels_open") == 2 }
        #expect(try admin.inFlight() == 3, "two tunnels, and the fourth upgrade still waiting")
        _ = (first, second, fourth)
    }

    @Test func overTLSAtBothEnds() throws {
        let certs = try TestCertificates()
        let pair = try certs.make("ws", names: ["localhost"])
        let up = try Upstream(tls: pair)
        let yaml = Self.yaml(
            upstream: "https://localhost:\(up.port)", extra: ", tls: { ca: \(pair.cert) }",
            listen: "[{ address: 127.0.0.1:0, tls: { certificates: [{ cert: \(pair.cert), key: \(pair.key) }] } }]")
        let h = try ProxyHarness(yaml, holding: [up])
        defer { h.stop() }
        let out = try client(["\(h.proxy.ports[0])", "/echo", "echo", "10000000", pair.cert])
        #expect(out.last == "echo True close True eof True")
    }

    @Test func drainClosesOpenTunnelsAtItsTimeout() throws {
        let up = try Upstream()
        let h = try ProxyHarness(Self.yaml(upstream: "http://127.0.0.1:\(up.port)"), holding: [up])
        defer { h.stop() }
        // A tunnel stays open (its client idles) while the proxy drains.
        let idle = Process()
        idle.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        idle.arguments = ["-c", WebSocketPeers.client, "\(h.port)", "/echo", "many", "1", "\(h.adminPort)"]
        let output = Pipe()
        idle.standardOutput = output
        try idle.run()
        defer {
            kill(idle.processIdentifier, SIGKILL)
            idle.waitUntilExit()
        }
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("the tunnel is open") { try admin.metric("happypath_tunnels_open") == 1 }
        let started = ContinuousClock.now
        h.proxy.drain(timeout: .milliseconds(300))
        #expect(seconds(since: started) >= 0.25, "the drain waited for the tunnel until its timeout")
        idle.waitUntilExit()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(printed.contains("idle-closed 1"), "the client saw its tunnel closed: \(printed)")
    }
}
