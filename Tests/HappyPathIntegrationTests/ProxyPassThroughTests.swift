import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Transparent proxying: methods, statuses, bodies, headers, streaming.
@Suite("pass-through") struct ProxyPassThroughTests {
    @Test(arguments: ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
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

    /// A client that reads slowly gets every byte, in order, and the proxy
    /// holds no more than its back-pressure mark for it (Exchange.highWater,
    /// 1 MiB): above it, the proxy stops reading from the upstream, whose
    /// writes then block once the socket buffers between them are full.
    ///
    /// The client reads nothing until the upstream has stalled, then 2 MiB,
    /// waits for the next stall, and so on; at each stall the test measures
    /// what the proxy holds. The upstream counts the body bytes the kernel
    /// took from it, the client counts what it read, and /proc/net/tcp
    /// gives what sits in the kernel queues of the four sockets in between
    /// (upstream → proxy → client). With the upstream blocked and nothing
    /// moving, written − read − queued is exactly what the proxy keeps in its
    /// own memory; without back-pressure it would be most of the body. The
    /// proxy's RSS would be a blurred measure: tests run in parallel in this
    /// process, and freed memory is not always given back.
    @Test func slowReaderGetsTheWholeResponse() throws {
        let highWater = 1 << 20  // Exchange.highWater
        // Above the mark: the chunk libcurl hands over as the mark is
        // crossed, the one it keeps while paused, its receive buffer (64 KiB
        // each), and room to spare.
        let slack = 256 << 10
        let step = 2 << 20
        let rounds = 4
        // The test pins its own two sockets' buffers; the kernel grows the
        // proxy's two up to the tcp_rmem and tcp_wmem maximums. The body must
        // be larger than all of that, or the upstream would never block.
        let kernelMax = Self.sysctlMax("tcp_rmem") + Self.sysctlMax("tcp_wmem")
        let length = max(64 << 20, kernelMax + highWater + rounds * step + (8 << 20))
        let up = BulkUpstream(length: length).started()
        defer { up.stop() }
        // Back-pressure itself: nothing read ahead (ReadAheadTests has the spool).
        let h = try ProxyHarness(ProxyHarness.single(upstream: up.url) + "\nlimits: { read_ahead: 0 }\n", workers: 1)
        let c = try TestConnection(port: h.port, receiveBuffer: 64 * 1024)
        try c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try Edge.readRawHead(c)
        #expect(head.hasPrefix("HTTP/1.1 200 "))
        #expect(Edge.values(head, "Content-Length") == [String(length)])

        var received = 0
        var intact = true
        var buffer = [UInt8](repeating: 0, count: 65536)
        func read(_ count: Int) throws {
            var left = count
            while left > 0 {
                let n = buffer.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, min($0.count, left), 0) }
                guard n > 0 else { throw TestError("the body ended after \(received) of \(length) bytes (errno \(errno))") }
                if intact {
                    intact = buffer.withUnsafeBytes { BulkUpstream.matches(UnsafeRawBufferPointer(rebasing: $0[0..<n]), at: received) }
                }
                received += n
                left -= n
            }
        }

        let clientPort = localPort(c.fd)
        for round in 0..<rounds {
            // Stalled: the upstream waits for room, and its count and the
            // kernel queues stay the same over three polls in a row.
            var last: (written: Int, queued: Int)?
            var same = 0
            let stalled = waitUntil("the upstream to stall behind the client (round \(round))") {
                let proxyPort = up.proxyPort.load(ordering: .relaxed)
                let written = up.written.load(ordering: .acquiring)
                guard up.blocked.load(ordering: .acquiring), proxyPort > 0,
                    let queued = KernelTCPQueues.queued([(clientPort, h.port), (proxyPort, up.port)]),
                    up.blocked.load(ordering: .acquiring), up.written.load(ordering: .acquiring) == written
                else {
                    same = 0
                    return false
                }
                if let last, last == (written, queued) { same += 1 } else { same = 0 }
                last = (written, queued)
                return same >= 2
            }
            guard stalled, let (written, queued) = last else { return }
            let held = written - received - queued
            #expect(written < length, "round \(round): the upstream wrote the whole body to a client that read \(received)")
            #expect(
                held <= highWater + slack,
                "round \(round): the upstream wrote \(written), the client read \(received), the kernel holds \(queued): the proxy holds \(held)"
            )
            try read(step)
        }
        try read(length - received)
        #expect(received == length)
        #expect(intact, "the body arrived altered")
    }

    /// The maximum (third) value of /proc/sys/net/ipv4/NAME.
    static func sysctlMax(_ name: String) -> Int {
        let text = readSmallFile("/proc/sys/net/ipv4/\(name)") ?? ""
        return Int(text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).last ?? "") ?? (32 << 20)
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
