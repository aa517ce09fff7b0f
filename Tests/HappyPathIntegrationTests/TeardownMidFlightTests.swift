import Foundation
import HappyPathCore
import HappyPathDemo
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 47: each owner whose teardown frees what a C callback or an
/// unowned reference points to (the "Alive:" comments in Sources) is torn
/// down here while something is in flight, over real sockets. Under
/// `make sanitize-address` a callback that outlived its object stops the
/// run; each test also checks what the teardown must leave: connections
/// closed on both sides, nothing in flight, the proxy still serving.
@Suite("teardown mid-flight") struct TeardownMidFlightTests {
    /// The proxy stops with a transfer in flight (libcurl's `UpstreamClient`
    /// shut down with its try held by the upstream), a kept-alive idle
    /// client and a client halfway through its head (`HTTPServer.close`
    /// with connections open): the upstream sees its connection closed, and
    /// every client sees its own closed.
    @Test func stoppingTheProxyMidRequestClosesEveryConnection() throws {
        let (h, upstream) = try ProxyHarness.scripted(
            ["HOLD", http(200, "ok")],
            defaults: "{ reachability: { park_for: 0s }, retry: { attempts: 1, per_try_timeout: 60s } }",
            routeTimeout: "60s")
        defer { h.stop() }
        let busy = try TestConnection(port: h.port)
        try busy.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(waitUntil("the request held at the upstream") { upstream.appRequests.count == 1 })
        let idle = try TestConnection(port: h.port)
        try idle.send("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try idle.readResponse().status == 200)
        let half = try TestConnection(port: h.port)
        try half.send("GET /half HTTP/1.1\r\nHost: x\r\nX-Partial: ")
        h.stop()
        #expect(waitUntil("the held upstream connection closed") { upstream.held.withLock { $0 } == 1 })
        #expect(busy.closedByPeer(), "the client in flight was let go")
        #expect(idle.closedByPeer(), "the idle kept-alive client was let go")
        #expect(half.closedByPeer(), "the client halfway through its head was let go")
    }

    /// The proxy stops with a stream open on its own HTTP/2 client (an h2c
    /// upstream that never answers): `HTTP2UpstreamClient.shutdown` closes
    /// the pool and its connection with the stream on it, and the upstream
    /// sees the connection end.
    @Test func stoppingTheProxyWithAnHTTP2StreamOpenClosesItsConnection() throws {
        try UpstreamH2HostileTests.withServer("hold") { h, lines in
            let admin = AdminProbe(port: h.adminPort)
            let client = try TestConnection(port: h.port)
            try client.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(waitUntil("the stream open") { try admin.metric(#"happypath_upstream_h2_streams{upstream="u"}"#) >= 1 })
            h.stop()
            #expect(
                waitUntil("the upstream connection closed") { lines.withLock { $0.contains("closed 1") } },
                "\(lines.withLock { $0 })")
            #expect(client.closedByPeer(), "the client in flight was let go")
        }
    }

    /// The client hangs up while its upgrade waits for the upstream's `101`
    /// (an `UpstreamUpgrade` mid-handshake): the exchange closes the try,
    /// whose connection the upstream sees closed, and the proxy goes on.
    @Test func aClientLeavingMidUpgradeClosesTheUpgradesConnection() throws {
        let upstream = ScriptedUpstream(responses: ["HOLD", http(200, "after")]).started()
        let h = try ProxyHarness(WebSocketTests.yaml(upstream: "http://127.0.0.1:\(upstream.port)"), workers: 1)
        defer {
            h.stop()
            upstream.stop()
        }
        let admin = AdminProbe(port: h.adminPort)
        var client: TestConnection? = try TestConnection(port: h.port)
        try client!.send(
            "GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        #expect(waitUntil("the upgrade request at the upstream") { upstream.appRequests.count == 1 })
        client = nil  // hangs up before any answer
        #expect(waitUntil("the upgrade's connection closed") { upstream.held.withLock { $0 } == 1 })
        #expect(waitUntil("nothing in flight") { try admin.inFlight() == 0 })
        #expect(try HTTP.request(port: h.port, "/plain/after").status == 200)
    }

    /// The client hangs up while its try and a hedge are both out (the
    /// exchange ends with a `HedgeTry` in flight): both transfers are
    /// cancelled, both upstream connections closed, and the proxy goes on.
    @Test func aClientLeavingWithAHedgeInFlightEndsBothTries() throws {
        let a = ScriptedUpstream(answering: { head in head.hasPrefix("GET /held") ? "HOLD" : http(200, "ok") }).started()
        let b = ScriptedUpstream(answering: { head in head.hasPrefix("GET /held") ? "HOLD" : http(200, "ok") }).started()
        let h = try ProxyHarness(HedgingTests.config([a.port, b.port]), workers: 1)
        defer {
            h.stop()
            a.stop()
            b.stop()
        }
        let admin = AdminProbe(port: h.adminPort)
        var client: TestConnection? = try TestConnection(port: h.port)
        try client!.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(waitUntil("the try and its hedge at the upstreams") { a.appRequests.count + b.appRequests.count == 2 })
        client = nil  // hangs up with both in flight
        #expect(
            waitUntil("both upstream connections closed") { a.held.withLock { $0 } + b.held.withLock { $0 } == 2 })
        #expect(waitUntil("nothing in flight") { try admin.inFlight() == 0 })
        #expect(try HTTP.request(port: h.port, "/after").text == "ok")
    }

    /// The demo upstream stops with an answer waiting on a timer (its
    /// loop's `LoopTimer` armed) and a body streaming to a client that
    /// reads nothing (a `BodyStreamer` waiting for the client to drain):
    /// the timer is dropped unrun with the loop, the stream is cut, and
    /// both clients see their connections closed.
    @Test func stoppingTheDemoMidAnswerClosesItsClients() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let waiting = try TestConnection(port: demo.port)
        try waiting.send("GET /slow?ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n")
        let streaming = try TestConnection(port: demo.port)
        try streaming.send("GET /bytes?n=100000000 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(waitUntil("both requests at the demo") { demo.hits.load(ordering: .relaxed) == 2 })
        demo.stop()
        #expect(waiting.bytesUntilClosed() == 0, "the client waiting on the timer was let go, unanswered")
        let streamed = streaming.bytesUntilClosed()
        #expect(streamed != nil && streamed! < 100_000_000, "the streamed body was cut: \(String(describing: streamed))")
    }
}
