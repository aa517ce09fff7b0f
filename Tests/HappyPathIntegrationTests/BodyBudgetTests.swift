import Foundation
import HappyPathCore
import Testing

/// `limits.max_buffered_bytes`: request bodies held in memory by the whole
/// process. A body that does not fit is answered 503 OVERLOADED before it is
/// read; held bytes are given back when the request is done or its client
/// leaves. (Every client here is 127.0.0.1: its share is set to the whole
/// budget, so these test the process's; `ClientShareTests` the shares.
/// Bodies stay in memory here, `body_in_memory` at `max_request_body`:
/// `BodySpoolTests` has the spool.)
@Suite struct BodyBudgetTests {
    static let yaml = """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { max_buffered_bytes: 1MiB, max_buffered_per_client: 1MiB, body_in_memory: 10MiB }
        upstreams:
          demo: { endpoints: ["{{DEMO}}"] }
        routes:
          - match: { path_prefix: / }
            upstream: demo
        """

    func state(_ h: ProxyHarness) throws -> [String: Any] {
        try HTTP.request(port: h.adminPort, "/admin/state").json
    }

    @Test func aBodyOverTheBudgetIsRefusedAndTheHeldOneGoesThrough() throws {
        let h = try ProxyHarness(Self.yaml, workers: 2)
        defer { h.stop() }
        // Client A: a 600 KiB body, half of it sent, then a pause. Its
        // whole body is reserved from the budget when its head arrives.
        let body = [UInt8](repeating: 0x61, count: 600 * 1024)
        let a = try TestConnection(port: h.port)
        try a.send(Array("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body.prefix(300 * 1024))
        #expect(try eventually { try state(h)["buffered_bytes"] as? Int == body.count })
        #expect(try state(h)["max_buffered_bytes"] as? Int == 1024 * 1024)

        // Client B's 600 KiB do not fit beside A's: refused before being read.
        let b = try HTTP.request(port: h.port, "POST", "/echo", body: body)
        #expect(b.status == 503)
        #expect(b.json["code"] as? String == "OVERLOADED")
        #expect(b.header("Retry-After") == "1")
        #expect((b.json["detail"] as? String)?.contains("limits.max_buffered_bytes") == true)
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)

        // A's body arrives in full and is proxied; its bytes go back.
        try a.send(Array(body.suffix(300 * 1024)))
        let answer = try a.readResponse()
        #expect(answer.status == 200)
        #expect(answer.json["body_bytes"] as? Int == body.count)
        #expect(try eventually { try state(h)["buffered_bytes"] as? Int == 0 })
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(metrics.contains("happypath_buffered_body_bytes_limit 1048576"))
        #expect(metrics.contains("reason=\"body_over_budget\""))

        // With A's bytes back, B's body fits.
        #expect(try HTTP.request(port: h.port, "POST", "/echo", body: body).status == 200)
    }

    @Test func aClientThatLeavesGivesItsBytesBack() throws {
        let h = try ProxyHarness(Self.yaml, workers: 1)
        defer { h.stop() }
        var a: TestConnection? = try TestConnection(port: h.port)
        try a!.send(Array("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\nabc".utf8))
        #expect(try eventually { try state(h)["buffered_bytes"] as? Int == 900_000 })
        a = nil  // closes the socket mid-body
        #expect(try eventually { try state(h)["buffered_bytes"] as? Int == 0 })
    }

    @Test func aChunkedBodyIsCountedAsItGrows() throws {
        let h = try ProxyHarness(Self.yaml, workers: 1)
        defer { h.stop() }
        let c = try TestConnection(port: h.port)
        var bytes = Array("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
        let chunk = [UInt8](repeating: 0x62, count: 256 * 1024)
        for _ in 0..<5 { bytes += Array("40000\r\n".utf8) + chunk + Array("\r\n".utf8) }
        bytes += Array("0\r\n\r\n".utf8)
        try? c.send(bytes)  // the proxy may close before it has read everything
        let r = try c.readResponse()
        #expect(r.status == 503)
        #expect(r.json["code"] as? String == "OVERLOADED")
        #expect(try eventually { try state(h)["buffered_bytes"] as? Int == 0 })
        // A chunked body within the budget goes through.
        var small = Array("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".utf8)
        small += Array("40000\r\n".utf8) + chunk + Array("\r\n0\r\n\r\n".utf8)
        let d = try TestConnection(port: h.port)
        try d.send(small)
        let ok = try d.readResponse()
        #expect(ok.status == 200)
        #expect(ok.json["body_bytes"] as? Int == chunk.count)
    }
}

@Suite struct BodyBudgetUnitTests {
    @Test func reservationsAreBoundedAndGivenBack() {
        let budget = BodyBudget(limit: 100)
        #expect(budget.reserve(60))
        #expect(!budget.reserve(41))
        #expect(budget.current == 60)
        var body = RequestBody(count: 40, budget: budget)
        #expect(body != nil && budget.current == 100)
        #expect(RequestBody(count: 1, budget: budget) == nil)
        body = nil
        #expect(budget.current == 60)
        budget.release(60)
        budget.limit = 10
        #expect(!budget.reserve(11) && budget.reserve(10))
    }

    @Test func aBodyTakesOverWhatWasReservedForIt() {
        let budget = BodyBudget(limit: 100)
        #expect(budget.reserve(30))
        var body = RequestBody(count: 30, budget: budget, reserved: 30)
        #expect(body != nil && budget.current == 30)
        body = nil
        #expect(budget.current == 0)
    }
}
