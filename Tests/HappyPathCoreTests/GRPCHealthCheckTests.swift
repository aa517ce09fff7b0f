import Testing

@testable import HappyPathCore

/// `health_check.grpc`: the `grpc.health.v1.Health/Check` request the proxy
/// sends, and how it reads the answer — up only for HTTP 200, grpc-status 0
/// and a `HealthCheckResponse` saying SERVING; a server that answers
/// otherwise is alive (reachable), unless it says it cannot serve.
@Suite struct GRPCHealthCheckTests {
    @Test(
        arguments: [
            ("", [0, 0, 0, 0, 0]),
            // HealthCheckRequest(service="a.B") as Python's protobuf serializes it, framed.
            ("a.B", [0, 0, 0, 0, 5, 0x0A, 0x03, 0x61, 0x2E, 0x42]),
        ] as [(String, [UInt8])])
    func theRequestIsOneFramedHealthCheckRequest(service: String, expected: [UInt8]) {
        #expect(GRPCHealthCheck.request(service: service) == expected)
    }

    @Test func aLongServiceNameHasAMultiByteLength() {
        let service = String(repeating: "s", count: 200)
        let request = GRPCHealthCheck.request(service: service)
        #expect(request[0..<5] == [0, 0, 0, 0, 203])
        #expect(request[5..<8] == [0x0A, 0xC8, 0x01])
        #expect(request.count == 208)
    }

    /// An answer as the probe sees it arrive.
    struct Arrival: CustomStringConvertible {
        var status = 200
        var head: [(String, String)] = [("content-type", "application/grpc")]
        var body: [[UInt8]] = [GRPCFrame.encode([0x08, 0x01])]
        var trailers: [(String, String)] = [("grpc-status", "0")]
        var note: String
        var description: String { note }

        var verdict: GRPCHealthCheck.Verdict {
            var answer = GRPCHealthCheck.Answer()
            answer.received(status: status)
            for (name, value) in head {
                Array(name.utf8).withUnsafeBytes { n in Array(value.utf8).withUnsafeBytes { answer.received(header: n, value: $0) } }
            }
            for chunk in body { answer.received(body: chunk) }
            for (name, value) in trailers {
                Array(name.utf8).withUnsafeBytes { n in Array(value.utf8).withUnsafeBytes { answer.received(trailer: n, value: $0) } }
            }
            return answer.verdict
        }
    }

    static let serving = GRPCFrame.encode([0x08, 0x01])

    @Test(arguments: [
        Arrival(note: "SERVING"),
        Arrival(body: [[0, 0, 0], [0, 2, 0x08], [0x01]], note: "the message in pieces"),
        Arrival(body: [GRPCFrame.encode([0x08, 0x02, 0x08, 0x01])], note: "the last status wins"),
        Arrival(
            body: [GRPCFrame.encode([0x12, 0x02, 0x61, 0x62, 0x08, 0x01, 0x1D, 1, 2, 3, 4])], note: "unknown fields skipped"),
        Arrival(trailers: [("Grpc-Status", "0")], note: "the field name in any case"),
        Arrival(head: [("grpc-status", "14")], note: "the trailers' status over the head's"),
    ])
    func servingAnswers(arrival: Arrival) {
        #expect(arrival.verdict == .serving)
    }

    /// Down: only what says the server cannot serve (a 5xx, UNAVAILABLE, NOT_SERVING), or no answer.
    @Test(
        arguments: [
            (Arrival(status: 503, note: "HTTP 503"), "HTTP status 503"),
            (Arrival(status: 500, note: "HTTP 500"), "HTTP status 500"),
            (Arrival(trailers: [("grpc-status", "14")], note: "UNAVAILABLE"), "grpc-status 14 (UNAVAILABLE)"),
            (
                Arrival(head: [("grpc-status", "14")], body: [], trailers: [], note: "Trailers-Only UNAVAILABLE"),
                "grpc-status 14 (UNAVAILABLE)"
            ),
            (Arrival(body: [GRPCFrame.encode([0x08, 0x02])], note: "NOT_SERVING"), "status NOT_SERVING"),
        ] as [(Arrival, String)])
    func downAnswersSayWhy(arrival: Arrival, reason: String) {
        #expect(arrival.verdict == .down(reason))
        #expect(!arrival.verdict.isUp)
    }

    /// A server that answers at all is reachable: any other answer is
    /// alive, with what it said (a server without the health service
    /// answers UNIMPLEMENTED; a malformed answer still came from a server).
    @Test(
        arguments: [
            (Arrival(status: 204, note: "HTTP 204"), "HTTP status 204"),
            (Arrival(status: 404, note: "HTTP 404"), "HTTP status 404"),
            (Arrival(trailers: [], note: "no grpc-status"), "no grpc-status"),
            (Arrival(trailers: [("grpc-status", "12")], note: "UNIMPLEMENTED"), "grpc-status 12"),
            (Arrival(head: [("grpc-status", "12")], body: [], trailers: [], note: "Trailers-Only UNIMPLEMENTED"), "grpc-status 12"),
            (Arrival(trailers: [("grpc-status", "00")], note: "not exactly 0"), "grpc-status 00"),
            (Arrival(trailers: [("grpc-status", "140")], note: "not exactly 14"), "grpc-status 140"),
            (
                Arrival(trailers: [("grpc-status", String(repeating: "9", count: 100))], note: "a long status"),
                "grpc-status (too long)"
            ),
            (Arrival(head: [("grpc-status", "5")], body: [], trailers: [], note: "Trailers-Only NOT_FOUND"), "grpc-status 5"),
            (Arrival(head: [("grpc-status", "0")], body: [], trailers: [], note: "Trailers-Only OK, no message"), "no message"),
            (Arrival(body: [GRPCFrame.encode([0x08, 0x03])], note: "SERVICE_UNKNOWN"), "status SERVICE_UNKNOWN"),
            (Arrival(body: [GRPCFrame.encode([])], note: "an empty message is UNKNOWN"), "status UNKNOWN"),
            (
                Arrival(
                    body: [GRPCFrame.encode([0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01])],
                    note: "a huge enum value"), "status 9223372036854775809"
            ),
            (Arrival(body: [[0, 0, 0]], note: "a cut prefix"), "a cut message"),
            (Arrival(body: [[0, 0, 0, 0, 3, 0x08, 0x01]], note: "a cut message"), "a cut message"),
            (Arrival(body: [[1, 0, 0, 0, 2, 0x08, 0x01]], note: "compressed"), "a compressed message"),
            (Arrival(body: [[0, 0xFF, 0xFF, 0xFF, 0xFF]], note: "a length of 4 GiB"), "a message of 4294967295 bytes"),
            (Arrival(body: [Self.serving + Self.serving], note: "two messages"), "more than one message"),
            (
                Arrival(body: [[UInt8](repeating: 0, count: 2000)], note: "a long body"),
                "an answer longer than one 1024-byte message"
            ),
            (
                Arrival(
                    body: [[UInt8](repeating: 0, count: 1000), [UInt8](repeating: 0, count: 1000)], note: "a long body in pieces"),
                "an answer longer than one 1024-byte message"
            ),
            (Arrival(body: [GRPCFrame.encode([0x0A, 0x01, 0x01])], note: "status as bytes"), "a malformed HealthCheckResponse"),
            (Arrival(body: [GRPCFrame.encode([0x08, 0xFF])], note: "a cut varint"), "a malformed HealthCheckResponse"),
            (
                Arrival(body: [GRPCFrame.encode([0x08] + [UInt8](repeating: 0xFF, count: 11))], note: "an endless varint"),
                "a malformed HealthCheckResponse"
            ),
            (Arrival(body: [GRPCFrame.encode([0x0B])], note: "a group"), "a malformed HealthCheckResponse"),
        ] as [(Arrival, String)])
    func otherAnswersAreAliveAndSayWhat(arrival: Arrival, reason: String) {
        #expect(arrival.verdict == .alive(reason))
        #expect(arrival.verdict.isUp)
    }

    @Test func nothingReceivedIsDown() {
        #expect(GRPCHealthCheck.Answer().verdict == .down("no answer"))
    }

    @Test(arguments: [
        ([0, 0, 0, 0, 0] as [UInt8], 0, Result<[UInt8], GRPCFrame.Failure>.success([])),
        ([0, 0, 0, 0, 1, 7], 1, .success([7])),
        ([0, 0, 0, 0, 2, 7, 8], 1, .failure(.tooLong(2))),
        ([0, 0, 0, 0, 2, 7], 10, .failure(.truncated)),
        ([0, 0, 0, 0], 10, .failure(.truncated)),
        ([0, 0, 0, 0, 1, 7, 8], 10, .failure(.trailingBytes)),
        ([2, 0, 0, 0, 0], 10, .failure(.compressed)),
        ([0, 0x80, 0, 0, 0], -1, .failure(.tooLong(0x8000_0000))),
    ])
    func aFrameHoldsExactlyOneMessage(bytes: [UInt8], limit: Int, expected: Result<[UInt8], GRPCFrame.Failure>) {
        #expect(GRPCFrame.single(bytes[...], limit: limit).map(Array.init) == expected)
    }

    @Test func aFrameIsEncodedBigEndian() {
        let message = [UInt8](repeating: 1, count: 0x0102_03)
        #expect(GRPCFrame.encode(message)[0..<5] == [0, 0, 1, 2, 3])
    }
}
