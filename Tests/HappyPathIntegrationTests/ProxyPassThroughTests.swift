import Foundation
import Testing

/// Transparent proxying: methods, statuses, bodies, headers, streaming.
@Suite("pass-through") struct ProxyPassThroughTests {
    @Test(arguments: ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"])
    func methodReachesUpstream(method: String) throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, method, "/echo?x=1&y=%20z", body: method == "GET" ? nil : Array("b".utf8))
        #expect(r.status == 200)
        #expect(r.json["method"] as? String == method)
        #expect(r.json["target"] as? String == "/echo?x=1&y=%20z")
        #expect(r.header("X-Happypath-Attempts") == "1")
    }

    @Test func headIsAnsweredWithoutBody() throws {
        let h = try ProxyHarness()
        let c = try TestConnection(port: h.port)
        try c.send("HEAD /bytes?n=1000 HTTP/1.1\r\nHost: x\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try c.readResponse(forHead: true)
        #expect(head.status == 200)
        #expect(head.header("Content-Length") == "1000")
        // The next response on the same connection parses cleanly: no stray body bytes.
        let next = try c.readResponse()
        #expect(next.status == 200)
        #expect(next.text == "{\"ok\":true}\n")
    }

    @Test(arguments: [200, 201, 202, 204, 206, 301, 302, 304, 307])
    func statusPassesThrough(status: Int) throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, "/status/\(status)")
        #expect(r.status == status)
        if status != 204 && status != 304 {
            #expect(r.text == "{\"status\":\(status)}\n")
            #expect(r.header("Content-Type") == "application/json")
        }
    }

    @Test(arguments: [0, 1, 64 * 1024, 3 * 1024 * 1024])
    func requestBodyArrivesByteForByte(size: Int) throws {
        let h = try ProxyHarness()
        let body = randomBytes(size)
        let echoed = try HTTP.request(
            port: h.port, "POST", "/echo/raw", headers: [("Content-Type", "application/x-test")], body: body)
        #expect(echoed.status == 200)
        #expect(echoed.body.count == size)
        #expect(echoed.body == body)
        #expect(echoed.header("Content-Type") == "application/x-test")
        let summary = try HTTP.request(port: h.port, "PUT", "/echo", body: body)
        #expect(summary.json["body_bytes"] as? Int == size)
        #expect(summary.json["body_fnv1a64"] as? String == fnv1a(body))
    }

    @Test func chunkedRequestBodyIsForwardedWithLength() throws {
        let h = try ProxyHarness()
        let c = try TestConnection(port: h.port)
        try c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.json["body_bytes"] as? Int == 11)
        #expect(r.json["body_fnv1a64"] as? String == fnv1a(Array("hello world".utf8)))
    }

    @Test func largeResponseStreams() throws {
        let h = try ProxyHarness()
        let n = 5 * 1024 * 1024
        let r = try HTTP.request(port: h.port, "/bytes?n=\(n)")
        #expect(r.status == 200)
        #expect(r.body.count == n)
        #expect(r.header("Content-Length") == String(n))
        let expected = (0..<n).map { UInt8(truncatingIfNeeded: $0 % 251) }
        #expect(r.body == expected)
    }

    @Test func slowReaderGetsTheWholeResponse() throws {
        // The client does not read for a while: far more than fits in socket
        // buffers waits upstream (the proxy pauses the transfer instead of
        // buffering it), and every byte still arrives, in order.
        let h = try ProxyHarness()
        let c = try TestConnection(port: h.port)
        let n = 32 * 1024 * 1024
        try c.send("GET /bytes?n=\(n) HTTP/1.1\r\nHost: x\r\n\r\n")
        Thread.sleep(forTimeInterval: 0.5)
        let r = try c.readResponse()
        #expect(r.body.count == n)
        #expect(r.body.prefix(502) == ArraySlice((0..<502).map { UInt8($0 % 251) }))
    }

    @Test func prefixIsStrippedAndQueryKept() throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(port: h.port, "/api/echo?a=b")
        #expect(r.json["target"] as? String == "/echo?a=b")
    }

    @Test func keepAliveClientSendsManyRequests() throws {
        let h = try ProxyHarness()
        let c = try TestConnection(port: h.port)
        for i in 0..<50 {
            try c.send("GET /echo?i=\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.json["target"] as? String == "/echo?i=\(i)")
        }
    }

    @Test func http10ClientIsAnswered() throws {
        let h = try ProxyHarness()
        let c = try TestConnection(port: h.port)
        try c.send("GET /ok HTTP/1.0\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.text == "{\"ok\":true}\n")
    }
}

@Suite("headers") struct ProxyHeaderTests {
    @Test func hopByHopRemovedAndForwardingAdded() throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(
            port: h.port, "/echo",
            headers: [
                ("Connection", "keep-alive, X-Drop-Me"), ("X-Drop-Me", "1"), ("Keep-Alive", "timeout=5"),
                ("Proxy-Authorization", "Basic eA=="), ("TE", "trailers"), ("Upgrade", "websocket"),
                ("X-Request-Id", "client-id-123"), ("X-Forwarded-For", "10.1.2.3"), ("X-Custom", "kept"),
            ])
        let pairs = (r.json["headers"] as? [[String]] ?? []).map { ($0[0].lowercased(), $0[1]) }
        func value(_ name: String) -> String? { pairs.first { $0.0 == name }?.1 }
        for gone in ["keep-alive", "proxy-authorization", "te", "upgrade", "x-drop-me"] {
            #expect(value(gone) == nil, "\(gone) must not be forwarded")
        }
        #expect(value("x-custom") == "kept")
        #expect(value("x-request-id") == "client-id-123")
        #expect(value("x-forwarded-for") == "10.1.2.3, 127.0.0.1")
        #expect(value("x-forwarded-proto") == "http")
        #expect(value("x-forwarded-host") == "127.0.0.1:\(h.port)")
        #expect(value("traceparent")?.hasPrefix("00-") == true)
        #expect(pairs.filter { $0.0 == "x-request-id" }.count == 1)
        #expect(r.header("X-Request-Id") == "client-id-123")
    }

    @Test func requestIdAndTraceparentAreMadeWhenMissing() throws {
        let h = try ProxyHarness()
        let r = try HTTP.request(
            port: h.port, "/echo", headers: [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")])
        let pairs = (r.json["headers"] as? [[String]] ?? []).map { ($0[0].lowercased(), $0[1]) }
        let id = pairs.first { $0.0 == "x-request-id" }?.1
        #expect(id?.count == 15)
        #expect(r.header("X-Request-Id") == id)
        #expect(pairs.first { $0.0 == "traceparent" }?.1 == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    }

    @Test func hopByHopResponseHeadersAreRemoved() throws {
        let upstream = ScriptedUpstream(
            response:
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\nProxy-Thing: x\r\nX-Kept: yes\r\nConnection: close\r\n\r\nok"
        ).started()
        defer { upstream.stop() }
        let h = try ProxyHarness(ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)"))
        let r = try HTTP.request(port: h.port, "/anything")
        #expect(r.status == 200)
        #expect(r.text == "ok")
        #expect(r.header("X-Kept") == "yes")
        #expect(r.header("Keep-Alive") == nil)
        #expect(r.header("Proxy-Thing") == nil)
        #expect(r.header("Connection") == nil)
    }
}
