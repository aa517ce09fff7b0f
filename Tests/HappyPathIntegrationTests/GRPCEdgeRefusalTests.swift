import Foundation
import HappyPathCore
import HappyPathIO
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Every answer the proxy itself gives a gRPC call is a Trailers-Only gRPC
/// status with `google.rpc.Status` details, edge refusals included (issue
/// 45): a head refused before routing keeps no fields, but its content type
/// is read even then, so a gRPC client never gets problem+json.
@Suite(.serialized) struct GRPCEdgeRefusalTests {
    static let limits = HTTPServerLimits(maxHeaderBytes: 8192, maxBodyBytes: 4 << 20, timeout: .seconds(5))

    /// gRPC's HTTP-to-gRPC table, and the codes the design names beside it
    /// (docs/grpc.md): 413 PAYLOAD_TOO_LARGE is RESOURCE_EXHAUSTED, 503
    /// OVERLOADED UNAVAILABLE.
    static let byStatus: [Int: GRPCStatus] = [
        400: .internal, 408: .unknown, 413: .resourceExhausted, 414: .unknown, 431: .internal, 501: .unknown,
        503: .unavailable, 505: .unknown,
    ]

    @Test func everyEdgeRefusalIsAGRPCStatusByTheTable() throws {
        let refusals =
            HTTP1Refusal.allCases.map(HTTP2RequestRefusal.http1) + HTTP2Malformation.allCases.map(HTTP2RequestRefusal.malformed)
        var statuses = Set<Int>()
        for refusal in refusals {
            let problem = ProblemResponder.problem(for: refusal, requestID: "r1", limits: Self.limits)
            let answer = GRPCErrorResponse(problem)
            statuses.insert(refusal.status)
            let expected = try #require(Self.byStatus[refusal.status], "\(refusal): no row for \(refusal.status)")
            #expect(answer.status == expected, "\(refusal)")
            #expect(answer.httpStatus == 200)
            // What to do is in the message and the details, and the code names the rule's problem.
            #expect(answer.message.contains(problem.detail ?? "?"), "\(refusal)")
            #expect(answer.details.errorInfo?.reason == problem.code, "\(refusal)")
            #expect(answer.fields.first { $0.name == "grpc-status" }?.value == String(expected.rawValue))
        }
        #expect(statuses == Set(Self.byStatus.keys), "every row is used: \(statuses.sorted())")
    }

    /// After `PythonH2.rawFrames` (hpack does not check what it encodes):
    /// one call per connection, `PORT CASES` (JSON: name, path, extra
    /// fields, method, body size); per call, every field of its HEADERS
    /// frames, DATA bytes, a reset if any, and whether the stream ended.
    static let client = #"""
        import sys, json
        port, cases = int(sys.argv[1]), json.loads(sys.argv[2])
        out = {}
        for name, path, extra, method, size in cases:
            c = H2(port)
            fields = [(":method", method), (":scheme", "http"), (":authority", "t"), (":path", path),
                      ("content-type", "application/grpc"), ("te", "trailers")] + [tuple(f) for f in extra]
            # A size below 0: the head alone, the body still to come (an early answer).
            c.send(c.headers(fields), c.data(b"\0" * size, end=True) if size >= 0 else b"")
            r = {"fields": {}, "data": 0, "reset": None, "ended": False}
            for f in c.frames:
                if f.stream_id != 1: continue
                if isinstance(f, HeadersFrame): r["fields"].update(c.fields(f))
                elif isinstance(f, DataFrame): r["data"] += len(f.data)
                elif isinstance(f, RstStreamFrame): r["reset"] = f.error_code
                if "END_STREAM" in f.flags: r["ended"] = True
                if r["ended"] or r["reset"] is not None: break
            out[name] = r
            c.s.close()
        print(json.dumps(out))
        """#

    @Test(.disabled(if: OverloadAttackTests.plainOnce, "raw frames at the edge: run once, by the address sanitizer's pass"))
    func aGRPCCallRefusedAtTheEdgeGetsATrailersOnlyStatus() throws {
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { max_header_bytes: 8KiB, max_request_body: 1MiB }
            upstreams:
              demo: { endpoints: ["{{DEMO}}"], protocol: h2 }
            routes:
              - { match: { path_prefix: /t.S/, }, upstream: demo, grpc: {} }
            """)
        defer { h.stop() }
        let cases: [[Any]] = [
            ["crlf", "/t.S/M", [["x-meta", "a\r\nb"]], "POST", 5],
            ["timeout", "/t.S/M", [["grpc-timeout", " 1S"]], "POST", 5],
            ["uppercase", "/t.S/M", [["X-Meta", "a"]], "POST", 5],
            ["connection", "/t.S/M", [["connection", "close"]], "POST", 5],
            ["toolarge", "/t.S/M", [["content-length", "104857600"]], "POST", -1],
            ["headers", "/t.S/M", [["x-big", String(repeating: "a", count: 9000)]], "POST", 5],
            ["noroute", "/nowhere.S/M", [], "POST", 5],
            ["method", "/t.S/M", [], "TRACE", 5],
        ]
        let arguments = String(decoding: try JSONSerialization.data(withJSONObject: cases), as: UTF8.self)
        let r = try runProcess(try PythonH2.python(), ["-c", PythonH2.rawFrames + Self.client, "\(h.port)", arguments], timeout: 60)
        #expect(r.status == 0, "\(r.err)")
        let all = try #require(try JSONSerialization.jsonObject(with: Data(r.out.utf8)) as? [String: [String: Any]], "\(r.out)")
        let expected = [
            "crlf": 13, "timeout": 13, "toolarge": 8, "headers": 13, "noroute": 12, "method": 2,
        ]
        for (name, code) in expected {
            let call = try #require(all[name], "\(name)")
            let fields = call["fields"] as? [String: String] ?? [:]
            // Trailers-Only: HTTP 200, one block that ends the stream, no body, no problem+json.
            #expect(fields[":status"] == "200", "\(name): \(call)")
            #expect(fields["content-type"] == "application/grpc", "\(name): \(call)")
            #expect(fields["grpc-status"] == String(code), "\(name): \(call)")
            #expect(fields["grpc-message"]?.isEmpty == false, "\(name): \(call)")
            #expect(fields["grpc-status-details-bin"]?.isEmpty == false, "\(name): \(call)")
            #expect(call["data"] as? Int == 0 && call["ended"] as? Bool == true, "\(name): \(call)")
        }
        // A connection-specific field or an upper-case name is refused by
        // nghttp2 itself before the head is read: the stream is reset
        // PROTOCOL_ERROR (a gRPC client reads INTERNAL), with no answer.
        for name in ["connection", "uppercase"] {
            #expect(all[name]?["reset"] as? Int == 1, "\(name): \(all[name] ?? [:])")
        }
        // The refusal says what was wrong, in words.
        let crlf = (all["crlf"]?["fields"] as? [String: String])?["grpc-message"] ?? ""
        #expect(crlf.contains("value"), "\(crlf)")
    }
}
