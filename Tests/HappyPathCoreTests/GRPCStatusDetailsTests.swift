import Testing

@testable import HappyPathCore

/// `grpc-status-details-bin` (a `google.rpc.Status` with ErrorInfo and
/// RetryInfo, base64 without padding) and the Trailers-Only answer the proxy
/// gives a gRPC client for a problem.
@Suite struct GRPCStatusDetailsTests {
    static func hex(_ s: String) -> [UInt8] {
        var out: [UInt8] = []
        var i = s.startIndex
        while i < s.endIndex {
            let j = s.index(i, offsetBy: 2)
            out.append(UInt8(s[i..<j], radix: 16)!)
            i = j
        }
        return out
    }

    @Test func theStatusIsWrittenAsProtobufWritesIt() {
        // The bytes Python's protobuf serializes for the same message
        // (Status(code=14, message="hi", details=[Any(ErrorInfo(reason="X",
        // domain="d", metadata={"k": "v"})), Any(RetryInfo(retry_delay=2s 5ns))])).
        let details = GRPCStatusDetails(
            code: .unavailable, message: "hi", errorInfo: .init(reason: "X", domain: "d", metadata: [("k", "v")]),
            retryDelay: .seconds(2) + .nanoseconds(5))
        let expected = Self.hex(
            "080e120268691a3a0a28747970652e676f6f676c65617069732e636f6d2f676f6f676c652e7270632e4572726f72496e666f"
                + "120e0a01581201641a060a016b1201761a320a28747970652e676f6f676c65617069732e636f6d2f676f6f676c652e7270"
                + "632e5265747279496e666f12060a0408021005")
        #expect(details.encoded == expected)
        #expect(
            details.fieldValue
                == "CA4SAmhpGjoKKHR5cGUuZ29vZ2xlYXBpcy5jb20vZ29vZ2xlLnJwYy5FcnJvckluZm8SDgoBWBIBZBoGCgFrEgF2GjIKKHR5cGUu"
                + "Z29vZ2xlYXBpcy5jb20vZ29vZ2xlLnJwYy5SZXRyeUluZm8SBgoECAIQBQ")
    }

    @Test func defaultsAreLeftOutAsProto3DoesIt() {
        #expect(GRPCStatusDetails(code: .ok, message: "").encoded == [])
        #expect(GRPCStatusDetails(code: .internal, message: "").encoded == [0x08, 13])
        // A zero or negative delay is an empty Duration, not a wait in the past.
        let zero = GRPCStatusDetails(code: .unavailable, message: "", retryDelay: .zero).encoded
        #expect(zero.suffix(4) == [0x12, 0x02, 0x0A, 0x00])
        let negative = GRPCStatusDetails(code: .unavailable, message: "", retryDelay: .seconds(-3)).encoded
        #expect(negative == zero)
    }

    @Test(arguments: [
        ([UInt8](), ""), (Array("f".utf8), "Zg"), (Array("fo".utf8), "Zm8"), (Array("foo".utf8), "Zm9v"),
        (Array("foob".utf8), "Zm9vYg"), (Array("fooba".utf8), "Zm9vYmE"), (Array("foobar".utf8), "Zm9vYmFy"),
        ([0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF], "+vv8/f7/"),
    ])
    func base64IsUnpadded(_ bytes: [UInt8], _ text: String) {
        #expect(Base64.unpadded(bytes) == text)
    }

    // MARK: - The answer for a problem

    @Test func aRetryableProblemCarriesItsCodeMetadataAndWait() {
        let problem = Problem(
            .circuitOpen, requestID: "req-1", detail: "orders is paused", attempts: 3, upstream: "orders",
            retryAfterSeconds: 7)
        let answer = GRPCErrorResponse(problem)
        #expect(answer.httpStatus == 200)
        #expect(answer.status == .unavailable)
        #expect(answer.message == "The service is paused after repeated failures: orders is paused")
        #expect(answer.fields.map(\.name) == ["content-type", "grpc-status", "grpc-message", "grpc-status-details-bin"])
        #expect(answer.fields.value(for: "content-type") == "application/grpc")
        #expect(answer.fields.value(for: "grpc-status") == "14")
        #expect(answer.fields.value(for: "grpc-message") == answer.message)  // all printable ASCII
        #expect(answer.details.code == .unavailable && answer.details.message == answer.message)
        #expect(answer.details.retryDelay == .seconds(7))
        let info = answer.details.errorInfo
        #expect(info?.reason == "CIRCUIT_OPEN" && info?.domain == "happypath")
        #expect(info?.metadata.map(\.key) == ["request_id", "upstream", "attempts", "recovery_suggestion"])
        #expect(info?.metadata.map(\.value) == ["req-1", "orders", "3", ProblemCode.circuitOpen.recoverySuggestion])
        #expect(answer.fields.value(for: "grpc-status-details-bin") == answer.details.fieldValue)
    }

    @Test func aGivenWaitWinsOverRetryAfter() {
        let problem = Problem(.rateLimited, requestID: "r", retryAfterSeconds: 2)
        #expect(GRPCErrorResponse(problem, retryDelay: .milliseconds(1500)).details.retryDelay == .milliseconds(1500))
        #expect(GRPCErrorResponse(problem).status == .resourceExhausted)
    }

    @Test func withoutAKnownWaitOrRetryThereIsNoRetryInfo() {
        #expect(GRPCErrorResponse(Problem(.upstreamUnreachable, requestID: "r")).details.retryDelay == nil)
        // Not retryable: no RetryInfo, whatever wait is known.
        let forbidden = GRPCErrorResponse(Problem(.forbidden, requestID: "r", retryAfterSeconds: 5), retryDelay: .seconds(1))
        #expect(forbidden.details.retryDelay == nil)
        #expect(forbidden.status == .permissionDenied)
        #expect(forbidden.message == ProblemCode.forbidden.title)
        #expect(forbidden.details.errorInfo?.metadata.map(\.key) == ["request_id", "recovery_suggestion"])
    }

    @Test func aNonASCIIDetailIsPercentEncodedAndALongOneCut() {
        let problem = Problem(.badGateway, requestID: "r", detail: "réponse invalide: " + String(repeating: "ü", count: 2000))
        let answer = GRPCErrorResponse(problem)
        let field = answer.fields.value(for: "grpc-message") ?? ""
        #expect(field.hasPrefix("The service sent an invalid response: r%C3%A9ponse invalide: %C3%BC"))
        #expect(field.utf8.count <= GRPCErrorResponse.messageLimit)
        #expect(field.utf8.allSatisfy { $0 >= 0x20 && $0 <= 0x7E })
        // The details say what the client reads in grpc-message, cut the same way.
        #expect(answer.details.message == GRPCMessage.decode(field))
        #expect(answer.status == .unavailable)
    }
}
