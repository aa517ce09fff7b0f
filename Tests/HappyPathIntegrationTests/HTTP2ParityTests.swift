import Foundation
import HappyPathCore
import Testing

/// The exchange over HTTP/2 behaves as over HTTP/1.1 (docs/http2.md):
/// retries, errors in one JSON shape, answers without a body, 1xx, a body
/// cut short. Real clients (curl, nghttp) over h2c to the real proxy, in
/// front of scripted HTTP/1.1 upstreams and the demo upstream.
@Suite(.serialized) struct HTTP2ParityTests {
    func h2(_ url: String, _ flags: [String] = []) throws -> (status: Int32, out: String, err: String) {
        try runProcess(
            "/usr/bin/curl", ["-sS", "--max-time", "15", "--http2-prior-knowledge"] + flags + [url], timeout: 20)
    }

    @Test func retriesAndTheProblemShapeAreTheSameOverHTTP2() throws {
        let (h, up) = try ProxyHarness.scripted([http(503, "a"), http(503, "b"), http(200, "finally")])
        defer { h.stop() }
        let r = try h2("http://127.0.0.1:\(h.port)/x", ["-i"])
        #expect(r.out.hasPrefix("HTTP/2 200"), "\(r.out)")
        #expect(r.out.hasSuffix("finally"), "\(r.out)")
        #expect(r.out.lowercased().contains("x-happypath-attempts: 3"), "\(r.out)")
        #expect(up.appRequests.count == 3)
        // Exhausted: the problem+json shape, as on HTTP/1.1.
        let (g, _) = try ProxyHarness.scripted([http(503, "{}", headers: ["Retry-After: 0"])])
        defer { g.stop() }
        let p = try h2("http://127.0.0.1:\(g.port)/x", ["-i"])
        #expect(p.out.hasPrefix("HTTP/2 503"), "\(p.out)")
        #expect(p.out.contains("content-type: application/problem+json"), "\(p.out)")
        #expect(p.out.contains(#""code":"UPSTREAM_UNAVAILABLE""#), "\(p.out)")
    }

    @Test func answersWithoutABodyEndOnTheirHeaders() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let base = "http://127.0.0.1:\(h.port)"
        let head = try h2(base + "/api/ok", ["-I"])
        #expect(head.out.hasPrefix("HTTP/2 200"), "\(head.out)")
        #expect(head.out.contains("content-length: 12"), "\(head.out)")  // {"ok":true}\n
        for status in [204, 304] {
            let n = try runProcess("/usr/bin/nghttp", ["-nv", "\(base)/status/\(status)"], timeout: 20)
            #expect(n.out.contains(":status: \(status)"), "\(n.out)")
            // END_STREAM on the HEADERS frame (flags 0x05: END_STREAM | END_HEADERS), no DATA.
            #expect(n.out.contains("recv HEADERS frame <length="), "\(n.out)")
            #expect(n.out.contains("flags=0x05, stream_id=13>"), "\(n.out)")
            #expect(!n.out.contains("recv DATA frame"), "\(n.out)")
        }
    }

    @Test func anInformationalAnswerIsAHeadersFrameOfItsOwn() throws {
        let early = "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        let (h, _) = try ProxyHarness.scripted([early + http(200, "done")])
        defer { h.stop() }
        let n = try runProcess("/usr/bin/nghttp", ["-v", "http://127.0.0.1:\(h.port)/x"], timeout: 20)
        #expect(n.out.contains(":status: 103"), "\(n.out)")
        #expect(n.out.contains("link: </style.css>; rel=preload"), "\(n.out)")
        #expect(n.out.contains(":status: 200"), "\(n.out)")
        let first103 = n.out.range(of: ":status: 103")!.lowerBound
        let final200 = n.out.range(of: ":status: 200")!.lowerBound
        #expect(first103 < final200)
    }

    @Test func aBodyCutShortResetsTheStreamInsteadOfEndingIt() throws {
        // 100 bytes announced, 10 sent, then the upstream closes.
        let cut = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\n0123456789"
        let (h, _) = try ProxyHarness.scripted([cut], defaults: "{ retry: { attempts: 1 }, reachability: { park_for: 0s } }")
        defer { h.stop() }
        let n = try runProcess("/usr/bin/nghttp", ["-nv", "http://127.0.0.1:\(h.port)/x"], timeout: 20)
        #expect(n.out.contains(":status: 200"), "\(n.out)")
        #expect(n.out.contains("recv RST_STREAM frame"), "\(n.out)")
        #expect(n.out.contains("error_code=INTERNAL_ERROR"), "\(n.out)")
        // No END_STREAM from the proxy: the client never sees the answer as complete.
        let received = n.out.components(separatedBy: "\n[").filter { $0.contains("recv ") }
        #expect(!received.contains { $0.contains("END_STREAM") }, "\(n.out)")
    }
}
