import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 25: where a standard HTTP client relies on the proxy changing
/// nothing. Real proxy, scripted upstreams, raw bytes on both sides.
@Suite("transparency") struct TransparencyTests {
    static func config(upstream: Int, routeExtra: String = "") -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: { reachability: { park_for: 0s } }
        upstreams:
          u:
            endpoints: [http://127.0.0.1:\(upstream)/base]
        routes:
          - match: { path_prefix: /public/ }
            upstream: u
            strip_prefix: /public
            \(routeExtra)
        """
    }

    /// Everything the proxy writes on a connection until it closes it.
    static func exchange(_ port: Int, _ request: String) throws -> String {
        let c = try TestConnection(port: port)
        try c.send(request)
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            out += chunk[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }

    // MARK: - 3. Empty fields

    @Test func emptyFieldsReachTheUpstreamAndComeBack() throws {
        let upstream = ScriptedUpstream(response: http(200, "ok", headers: ["X-Empty-Back:", "X-Full: 1"])).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let r = try HTTP.request(
            port: h.port, "/public/x", headers: [("X-Empty", ""), ("X-Dup", "a"), ("X-Empty", ""), ("X-Dup", "b")])
        #expect(r.status == 200)
        let lines = try #require(upstream.appRequests.first).head.components(separatedBy: "\r\n")
        let sent = lines.filter { $0.hasPrefix("X-Empty") || $0.hasPrefix("X-Dup") }
        #expect(sent == ["X-Empty:", "X-Dup: a", "X-Empty:", "X-Dup: b"], "\(lines)")
        #expect(r.headers.contains { $0.name == "X-Empty-Back" && $0.value.isEmpty })
        #expect(r.header("X-Full") == "1")
    }

    // MARK: - 4. 1xx answers

    static let earlyHints =
        "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: x-drop\r\n\r\n"
        + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

    @Test func earlyHintsReachAnHTTP11Client() throws {
        let upstream = ScriptedUpstream(response: Self.earlyHints).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"), "\(wire)")
        #expect(!wire.contains("x-drop"))
        #expect(wire.hasSuffix("\r\n\r\nok"))
    }

    @Test func noInformationalAnswerForAnHTTP10Client() throws {
        let upstream = ScriptedUpstream(response: Self.earlyHints).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.0\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(wire)")
        #expect(!wire.contains("103"))
    }

    /// A flood of 1xx answers: at most 8 reach the client, and the final answer still does.
    @Test func aFloodOfInformationalAnswersIsBounded() throws {
        let flood = String(repeating: "HTTP/1.1 102 Processing\r\n\r\n", count: 50)
        let upstream = ScriptedUpstream(response: flood + http(200, "ok")).started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.components(separatedBy: "HTTP/1.1 102 Processing").count - 1 == 8)
        #expect(wire.hasSuffix("\r\n\r\nok"))
    }

    // MARK: - 5. Redirects

    @Test func aRedirectToTheEndpointPointsAtTheProxy() throws {
        // The Location names the upstream's own port, known only once it listens.
        let target = ScriptedUpstream(comingUpOnFreshPort: { port in
            http(302, "", headers: ["Location: http://127.0.0.1:\(port)/base/next?x=1", "Content-Location: http://127.0.0.1:\(port)/elsewhere"])
        }).started()
        let h = try ProxyHarness(Self.config(upstream: target.port))
        defer { h.stop(); target.stop() }
        let r = try HTTP.request(port: h.port, "/public/start", headers: [])
        #expect(r.status == 302)
        #expect(r.header("Location") == "http://127.0.0.1:\(h.port)/public/next?x=1")
        // Outside the endpoint's base path: left alone.
        #expect(r.header("Content-Location") == "http://127.0.0.1:\(target.port)/elsewhere")
    }

    @Test func redirectsKeepLeavesThemAlone() throws {
        let target = ScriptedUpstream(comingUpOnFreshPort: { port in
            http(302, "", headers: ["Location: http://127.0.0.1:\(port)/base/next"])
        }).started()
        let h = try ProxyHarness(Self.config(upstream: target.port, routeExtra: "redirects: keep"))
        defer { h.stop(); target.stop() }
        let r = try HTTP.request(port: h.port, "/public/start")
        #expect(r.header("Location") == "http://127.0.0.1:\(target.port)/base/next")
    }

    // MARK: - 6. Reason phrases

    @Test func theUpstreamsReasonPhraseIsKept() throws {
        let upstream = ScriptedUpstream(response: "HTTP/1.1 200 Fine By Me\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .started()
        let h = try ProxyHarness(Self.config(upstream: upstream.port))
        defer { h.stop(); upstream.stop() }
        let wire = try Self.exchange(h.port, "GET /public/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(wire.hasPrefix("HTTP/1.1 200 Fine By Me\r\n"), "\(wire)")
    }
}
