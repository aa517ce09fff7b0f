import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `limits.max_connections`: at the cap the listener stops accepting, the
/// next client waits in the kernel's backlog (never refused, never reset),
/// and it is served as soon as a place frees.
@Suite("connection cap") struct ConnectionCapTests {
    static let yaml = ProxyHarness.defaultYAML.replacingOccurrences(
        of: "client_timeout: 5s }", with: "client_timeout: 5s, max_connections: 2 }")

    @Test func aClientOverTheCapWaitsForAPlace() throws {
        let h = try ProxyHarness(Self.yaml, workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        var first: TestConnection? = try TestConnection(port: h.port)
        let second = try TestConnection(port: h.port)
        for c in [first!, second] {
            try c.send("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try c.readResponse().status == 200)
        }
        #expect(try admin.metric("happypath_client_connections") == 2)
        #expect(try admin.metric("happypath_client_connections_limit") == 2)

        // The third connects (the kernel's backlog takes it) but is not read.
        let third = try TestConnection(port: h.port)
        try third.send("GET /echo?n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(waitUntil("the listener paused at the cap", { try admin.metric("happypath_accept_capped_total") >= 1 }))
        #expect(!Edge.readable(third, ms: 200), "no answer while two connections are open")

        // A place frees: the waiting client is accepted and answered.
        first = nil
        let r = try third.readResponse()
        #expect(r.status == 200)
        #expect(r.json["target"] as? String == "/echo?n=3")
        #expect(waitUntil("two connections counted again", { try admin.metric("happypath_client_connections") == 2 }))
        _ = first
    }

    /// At the cap, connections that never sent a byte make room: the oldest
    /// such is closed and the new client is served at once, not after
    /// `client_timeout`; a connection mid-request is never the one closed.
    @Test func aSilentConnectionMakesRoomForANewClient() throws {
        let yaml = ProxyHarness.defaultYAML.replacingOccurrences(
            of: "client_timeout: 5s }", with: "client_timeout: 60s, max_connections: 3 }")
        let h = try ProxyHarness(yaml, workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        func open() throws -> Double { try admin.metric("happypath_client_connections") }
        // The oldest connection is mid-request (half a head), then two say nothing.
        let busy = try TestConnection(port: h.port, timeout: 10)
        try busy.send("GET /echo?n=busy HTTP/1.1\r\n")
        waitUntil("the busy connection accepted") { try open() == 1 }
        let oldestSilent = try TestConnection(port: h.port, timeout: 10)
        waitUntil("the first silent connection accepted") { try open() == 2 }
        let silent = try TestConnection(port: h.port, timeout: 10)
        waitUntil("the cap reached") { try open() == 3 }

        // A new client is served well before client_timeout (60 s).
        let started = ContinuousClock.now
        let fresh = try TestConnection(port: h.port, timeout: 10)
        try fresh.send("GET /echo?n=fresh HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try fresh.readResponse().status == 200)
        #expect(seconds(since: started) < 5)
        #expect(oldestSilent.closedByPeer(), "the oldest silent connection made room")
        #expect(try admin.metric("happypath_silent_connections_closed_total") == 1)

        // The one mid-request finishes its request; the younger silent one is still open.
        try busy.send("Host: x\r\n\r\n")
        let r = try busy.readResponse()
        #expect(r.status == 200)
        #expect(r.json["target"] as? String == "/echo?n=busy")
        try silent.send("GET /echo?n=silent HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try silent.readResponse().status == 200)
        #expect(try open() == 3)
    }
}
