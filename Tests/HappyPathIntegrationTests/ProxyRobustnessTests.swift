import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Load and abuse: the proxy keeps answering.
@Suite("robustness") struct ProxyRobustnessTests {
    @Test func fourHundredConcurrentClients() throws {
        let h = try ProxyHarness()
        // Every client connects and sends before any answer is read, so all
        // 400 requests are in the proxy at once.
        let clients = try (0..<400).map { _ in try TestConnection(port: h.port, timeout: 20) }
        for (i, c) in clients.enumerated() {
            try c.send("GET /echo?client=\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
        }
        var ok = 0
        for (i, c) in clients.enumerated() {
            let r = try c.readResponse()
            if r.status == 200 && r.json["target"] as? String == "/echo?client=\(i)" { ok += 1 }
        }
        #expect(ok == 400)
    }

    @Test func abuseDoesNotStopTheNextClient() throws {
        let h = try ProxyHarness()
        // 200 half-sent requests (slowloris), raw garbage, malformed heads.
        let slow = try (0..<200).map { i -> TestConnection in
            let c = try TestConnection(port: h.port)
            try c.send("GET /ok?\(i) HTTP/1.1\r\nHost: x\r\nX-Partial: ")
            return c
        }
        for _ in 0..<20 {
            let c = try TestConnection(port: h.port)
            try c.send(randomBytes(512))
        }
        for bad in ["GET / HTTP/9.9\r\n\r\n", "GET\r\n\r\n", "GET / HTTP/1.1\r\nBad Header\r\n\r\n", "\r\n\r\n\r\n"] {
            let c = try TestConnection(port: h.port)
            try c.send(bad)
        }
        // The next well-formed client is answered within a second.
        let r = try HTTP.request(port: h.port, "/ok", timeout: 1)
        #expect(r.status == 200)
        withExtendedLifetime(slow) {}
    }

    @Test func clientHangingUpMidRequestDoesNotDisturbOthers() throws {
        let h = try ProxyHarness()
        for _ in 0..<20 {
            let c = try TestConnection(port: h.port)
            try c.send("GET /slow?ms=200 HTTP/1.1\r\nHost: x\r\n\r\n")
        }  // each connection is closed here, while its upstream call is in flight
        for _ in 0..<5 {
            let c = try TestConnection(port: h.port)
            try c.send("GET /bytes?n=4000000 HTTP/1.1\r\nHost: x\r\n\r\n")
            var chunk = [UInt8](repeating: 0, count: 1000)
            _ = recv(c.fd, &chunk, 1000, 0)
        }  // and these mid-response
        let r = try HTTP.request(port: h.port, "/ok", timeout: 2)
        #expect(r.status == 200)
    }

    @Test func adminHealthAndReadiness() throws {
        let h = try ProxyHarness()
        #expect(try HTTP.request(port: h.adminPort, "/healthz").status == 200)
        #expect(try HTTP.request(port: h.adminPort, "/readyz").status == 200)
        let other = try HTTP.request(port: h.adminPort, "/api/ok")
        #expect(other.status == 404)
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)
    }

    @Test func roundRobinAcrossEndpoints() throws {
        let a = ScriptedUpstream(response: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\na").started()
        let b = ScriptedUpstream(response: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nb").started()
        defer {
            a.stop()
            b.stop()
        }
        let h = try ProxyHarness(
            ProxyHarness.single(upstream: "http://127.0.0.1:\(a.port), http://127.0.0.1:\(b.port)"), workers: 1)
        let bodies = try (0..<6).map { _ in try HTTP.request(port: h.port, "/").text }
        #expect(bodies.filter { $0 == "a" }.count == 3)
        #expect(bodies.filter { $0 == "b" }.count == 3)
    }
}
