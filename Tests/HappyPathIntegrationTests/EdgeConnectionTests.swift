import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The edge's connection handling: pipelining, `Expect: 100-continue`,
/// client timeouts, and a head built to be expensive.
@Suite("edge connections") struct EdgeConnectionTests {
    // MARK: - Pipelining

    /// One pipelined request and what the demo's /echo must report for it.
    struct Piped: Sendable, CustomTestStringConvertible {
        let raw: String
        let target: String
        let bodyBytes: Int
        var testDescription: String { target }
    }

    static let pipelines: [[Piped]] = [
        [
            Piped(raw: "GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n", target: "/echo?n=1", bodyBytes: 0),
            Piped(raw: "GET /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n", target: "/echo?n=2", bodyBytes: 0),
        ],
        [
            Piped(raw: "GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n", target: "/echo?n=1", bodyBytes: 0),
            Piped(raw: "POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", target: "/echo?n=2", bodyBytes: 5),
            Piped(raw: "GET /echo?n=3 HTTP/1.1\r\nHost: x\r\n\r\n", target: "/echo?n=3", bodyBytes: 0),
        ],
        [
            Piped(
                raw:
                    "POST /echo?n=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\n\r\n",
                target: "/echo?n=1", bodyBytes: 7),
            Piped(raw: "DELETE /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n", target: "/echo?n=2", bodyBytes: 0),
            Piped(raw: "PUT /echo?n=3 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", target: "/echo?n=3", bodyBytes: 2),
        ],
    ]

    @Test(arguments: pipelines)
    func pipelinedRequestsAreAnsweredInOrder(_ requests: [Piped]) throws {
        let h = try ProxyHarness(workers: 1)
        let c = try TestConnection(port: h.port)
        try c.send(requests.map(\.raw).joined())
        for expected in requests {
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.json["target"] as? String == expected.target)
            #expect(r.json["body_bytes"] as? Int == expected.bodyBytes)
        }
        // Still the same, usable connection.
        try c.send("GET /echo?n=last HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().json["target"] as? String == "/echo?n=last")
        #expect(h.demo.hits.load(ordering: .relaxed) == requests.count + 1)
    }

    @Test(arguments: [
        ("GET /echo?n=2 HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (
            "POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
            "BAD_REQUEST"
        ),
        ("POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501, "NOT_IMPLEMENTED"),
    ])
    func refusedRequestAfterAGoodOneInTheSameWrite(_ bad: String, _ status: Int, _ code: String) throws {
        let h = try ProxyHarness(workers: 1)
        let c = try TestConnection(port: h.port)
        try c.send("GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n" + bad + "GET /echo?n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        let first = try c.readResponse()
        #expect(first.status == 200)
        #expect(first.json["target"] as? String == "/echo?n=1")
        let refused = try c.readResponse()
        #expect(refused.status == status)
        #expect(refused.json["code"] as? String == code)
        #expect(refused.header("Content-Type") == "application/problem+json")
        #expect(Edge.readToEnd(c) == [])  // closed, and nothing for the third request
        #expect(h.demo.hits.load(ordering: .relaxed) == 1)
    }

    // MARK: - Expect: 100-continue

    static let expectYAML = """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { max_request_body: 1KiB, client_timeout: 5s }
        upstreams:
          demo:
            endpoints: [{{DEMO}}]
        routes:
          - match: { path_prefix: /api/ }
            upstream: demo
            strip_prefix: /api
        """

    @Test(arguments: [
        ("Content-Length: 5", "hello", 5),
        ("Transfer-Encoding: chunked", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 11),
    ])
    func continueIsSentBeforeTheBody(_ framing: String, _ body: String, _ length: Int) throws {
        let h = try ProxyHarness(Self.expectYAML, workers: 1)
        let c = try TestConnection(port: h.port)
        try c.send("POST /api/echo HTTP/1.1\r\nHost: x\r\n\(framing)\r\nExpect: 100-continue\r\n\r\n")
        #expect(try Edge.readRawHead(c) == "HTTP/1.1 100 Continue\r\n\r\n")
        try c.send(body)
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.json["body_bytes"] as? Int == length)
        let headers = (r.json["headers"] as? [[String]]) ?? []
        #expect(!headers.isEmpty)
        #expect(!headers.contains { $0.first?.lowercased() == "expect" })  // the proxy answered it; it does not travel
        // Keep-alive: the next request (no Expect) on the same connection.
        try c.send("GET /api/echo?again HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().json["target"] as? String == "/echo?again")
    }

    @Test(arguments: [
        ("POST /api/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n", 413, "PAYLOAD_TOO_LARGE"),
        ("POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", 404, "NO_ROUTE"),
        ("POST /nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", 404, "NO_ROUTE"),
    ])
    func noContinueForARequestThatWillNotBeServed(_ head: String, _ status: Int, _ code: String) throws {
        let h = try ProxyHarness(Self.expectYAML, workers: 1)
        let c = try TestConnection(port: h.port)
        try c.send(head)
        // The first thing back is the final answer, not an invitation.
        let answer = try Edge.readRawHead(c)
        #expect(answer.hasPrefix("HTTP/1.1 \(status) "))
        #expect(!answer.contains("100 Continue"))
        #expect(answer.lowercased().contains("content-type: application/problem+json"))
        let length = try #require(Edge.values(answer, "Content-Length").first.flatMap { Int($0) })
        let body = try Edge.readRaw(c, length)
        let json = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
        #expect(json["code"] as? String == code)
        #expect(Edge.readToEnd(c) == [])
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)
    }

    // MARK: - Client timeout

    static let timeoutYAML = """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { client_timeout: 1s }
        upstreams:
          demo:
            endpoints: [{{DEMO}}]
        routes:
          - match: { path_prefix: / }
            upstream: demo
        """

    @Test func headTrickledByteByByteTimesOutFromItsFirstByte() throws {
        let h = try ProxyHarness(Self.timeoutYAML, workers: 1)
        let c = try TestConnection(port: h.port)
        let head = Array(("GET /ok HTTP/1.1\r\nHost: x\r\nX-Pad: " + String(repeating: "a", count: 20) + "\r\n\r\n").utf8)
        // One byte every 300 ms (never idle for the timeout), until the proxy
        // answers: the pacing is what the test is about, not an ordering wait.
        var sent = 0
        while sent < head.count {
            try c.send([head[sent]])
            sent += 1
            if Edge.readable(c, ms: 300) { break }
        }
        // Not exact, it depends on timers and scheduling: about 4 bytes
        // (1 s at one byte per 300 ms). What is certain is that the answer
        // came before the head was whole (that would take 15 s).
        #expect(sent < head.count)
        let r = try c.readResponse()
        #expect(r.status == 408)
        #expect(r.json["code"] as? String == "REQUEST_TIMEOUT")
        #expect(r.header("Content-Type") == "application/problem+json")
        #expect(c.closedByPeer())
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "head_timeout", status: 408) == 1)
    }

    @Test(arguments: [
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello",
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
    ])
    func stalledBodyTimesOut(_ partial: String) throws {
        let h = try ProxyHarness(Self.timeoutYAML, workers: 1)
        let c = try TestConnection(port: h.port)
        try c.send(partial)
        let r = try c.readResponse()
        #expect(r.status == 408)
        #expect(r.json["code"] as? String == "REQUEST_TIMEOUT")
        #expect(c.closedByPeer())
        #expect(h.demo.hits.load(ordering: .relaxed) == 0)
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "body_timeout", status: 408) == 1)
    }

    @Test(arguments: ["", "\r\n\r\n", "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"])
    func idleConnectionIsClosedSilently(_ before: String) throws {
        let h = try ProxyHarness(Self.timeoutYAML, workers: 1)
        let c = try TestConnection(port: h.port)
        if !before.isEmpty { try c.send(before) }
        if before.hasPrefix("GET") {
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.header("Connection") == nil)  // kept alive
        }
        // Closed after the timeout, without a single byte of answer.
        #expect(Edge.readToEnd(c) == [])
        #expect(try Edge.refusedCount(adminPort: h.adminPort, reason: "head_timeout", status: 408) == 0)
    }

    // MARK: - Linear cost

    @Test func hugeConnectionHeaderIsServed() throws {
        let yaml = ProxyHarness.defaultYAML.replacingOccurrences(of: "max_header_bytes: 8KiB", with: "max_header_bytes: 64KiB")
        #expect(yaml.contains("64KiB"))
        let h = try ProxyHarness(yaml, workers: 1)
        let letters = Array("abcdefghijklmnopqrstuvwxyz")
        var tokens = (0..<20_000).map { i in String([letters[(i / 26) % 26], letters[i % 26]]) }
        var head = "GET /echo HTTP/1.1\r\nHost: x\r\n"
        for k in 0..<50 {
            head += "X-F\(k): v\r\n"
            tokens.insert("x-f\(k)", at: k * 400)
        }
        head += "X-Keep: yes\r\nConnection: " + tokens.joined(separator: ",") + "\r\n\r\n"
        // The test's own input, not the proxy's behaviour: a range states the
        // requirement (large enough to be expensive, under the 64 KiB limit).
        #expect(head.utf8.count > 60_000)
        #expect(head.utf8.count < 64 * 1024)
        let c = try TestConnection(port: h.port)
        try c.send(head)
        let r = try c.readResponse()
        #expect(r.status == 200)
        let names = ((r.json["headers"] as? [[String]]) ?? []).compactMap { $0.first?.lowercased() }
        #expect(names.contains("x-keep"))
        #expect(!names.contains { $0.hasPrefix("x-f") && !$0.hasPrefix("x-forwarded-") })
        #expect(!names.contains("connection"))
        // And the next client, right after, is served.
        #expect(try HTTP.request(port: h.port, "/ok").status == 200)
    }
}
