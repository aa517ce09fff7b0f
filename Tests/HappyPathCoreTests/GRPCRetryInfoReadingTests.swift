import Testing

@testable import HappyPathCore

/// Reading an upstream's `grpc-status-details-bin` for the wait its
/// `google.rpc.RetryInfo` asks for (pacing on gRPC): well-formed values
/// give their delay, capped; anything else gives none, never a trap.
@Suite struct GRPCRetryInfoReadingTests {
    static func delay(_ text: String, max: Duration = .seconds(3600)) -> Duration? {
        var text = text
        return text.withUTF8 { GRPCStatusDetails.retryDelay(fieldValue: UnsafeRawBufferPointer($0), max: max) }
    }

    static func delay(status bytes: [UInt8], max: Duration = .seconds(3600)) -> Duration? {
        delay(Base64.unpadded(bytes), max: max)
    }

    /// A `google.rpc.Status` with one `Any` detail of `typeURL` packing `value`.
    static func status(typeURL: String = GRPCStatusDetails.retryInfoTypeURL, value: [UInt8]) -> [UInt8] {
        var w = ProtoWriter()
        w.varint(1, 8)
        w.message(3) { any in
            any.string(1, typeURL)
            any.bytes(2, value)
        }
        return w.bytes
    }

    /// A `RetryInfo` whose `Duration` has these raw varints.
    static func retryInfo(seconds: UInt64?, nanos: UInt64? = nil) -> [UInt8] {
        var w = ProtoWriter()
        w.message(1) { d in
            if let seconds { d.varint(1, seconds) }
            if let nanos { d.varint(2, nanos) }
        }
        return w.bytes
    }

    @Test func theProxysOwnDetailsReadBack() {
        let details = GRPCStatusDetails(
            code: .resourceExhausted, message: "slow down", errorInfo: .init(reason: "QUOTA"), retryDelay: .milliseconds(1500))
        #expect(Self.delay(details.fieldValue) == .milliseconds(1500))
    }

    // The bytes grpcio's server sends for Status(code=8, message="quota",
    // details=[Any(RetryInfo(retry_delay=Duration(seconds=2)))]): padded and not.
    @Test(arguments: [
        "CAgSBXF1b3RhGjAKKHR5cGUuZ29vZ2xlYXBpcy5jb20vZ29vZ2xlLnJwYy5SZXRyeUluZm8SBAoCCAI",
        "CAgSBXF1b3RhGjAKKHR5cGUuZ29vZ2xlYXBpcy5jb20vZ29vZ2xlLnJwYy5SZXRyeUluZm8SBAoCCAI=",
    ])
    func paddedOrNot(_ value: String) {
        #expect(Self.delay(value) == .seconds(2))
    }

    @Test(
        arguments: [
            // (seconds, nanos, max, expected) — Duration's int64 seconds are bounded by `max` first.
            (UInt64(2), UInt64?.none, Duration.seconds(3600), Duration?.some(.seconds(2))),
            (0, 250_000_000, .seconds(3600), .milliseconds(250)),
            (1, 999_999_999, .seconds(3600), .seconds(1) + .nanoseconds(999_999_999)),
            (7200, nil, .seconds(3600), .seconds(3600)),
            (UInt64(Int64.max), 999_999_999, .seconds(60), .seconds(60)),
            (59, 999_999_999, .seconds(59) + .milliseconds(500), .seconds(59) + .milliseconds(500)),
            (0, nil, .seconds(3600), nil),  // no wait
            (UInt64(bitPattern: -5), nil, .seconds(3600), nil),  // negative seconds
            (0, UInt64(bitPattern: -5), .seconds(3600), nil),  // negative nanos (int32, sign-extended)
            (0, 1_000_000_000, .seconds(3600), nil),  // nanos out of range
            (1, UInt64.max, .seconds(3600), nil),  // nanos past 32 bits: int32 -1
        ] as [(UInt64, UInt64?, Duration, Duration?)])
    func theDelayIsBounded(_ seconds: UInt64, _ nanos: UInt64?, _ max: Duration, _ expected: Duration?) {
        #expect(Self.delay(status: Self.status(value: Self.retryInfo(seconds: seconds, nanos: nanos)), max: max) == expected)
    }

    @Test func anotherDetailFirstIsSkipped() {
        var w = ProtoWriter()
        w.varint(1, 8)
        w.message(3) { any in
            any.string(1, GRPCStatusDetails.errorInfoTypeURL)
            any.message(2) { $0.string(1, "QUOTA") }
        }
        w.message(3) { any in
            any.string(1, "example.com/google.rpc.RetryInfo")  // any host: only the type's name is read
            any.bytes(2, Self.retryInfo(seconds: 3))
        }
        #expect(Self.delay(status: w.bytes) == .seconds(3))
    }

    @Test(arguments: [
        "",  // no field value
        "CAg",  // Status(code=8), no details
        "!!!!",  // not base64
        "CAgS BXF1",  // a space
        "CA=A",  // `=` before the end
        "CAgSB",  // one character past a group of four
        "CA=",  // padded but not a multiple of four
        "Cg==",  // one byte, 0x0a: a field that ends at once
        "//////////////8B",  // a varint key too long
    ])
    func malformedValuesGiveNoSignal(_ value: String) {
        #expect(Self.delay(value) == nil)
    }

    @Test func malformedMessagesGiveNoSignal() {
        // a RetryInfo with the wrong type name, or none
        #expect(
            Self.delay(
                status: Self.status(typeURL: "type.googleapis.com/google.rpc.ErrorInfo", value: Self.retryInfo(seconds: 2)))
                == nil)
        #expect(Self.delay(status: Self.status(typeURL: "google.rpc.RetryInfo", value: Self.retryInfo(seconds: 2))) == nil)
        // an Any without a value, a RetryInfo without a delay
        #expect(Self.delay(status: Self.status(value: [])) == nil)
        // a RetryInfo whose bytes are cut off, or a Duration cut inside its varint
        let cut = Self.retryInfo(seconds: 300)
        #expect(Self.delay(status: Self.status(value: Array(cut.dropLast()))) == nil)
        #expect(Self.delay(status: Array(Self.status(value: cut).dropLast())) == nil)
        // a group wire type inside the Duration
        #expect(Self.delay(status: Self.status(value: [0x0A, 0x02, 0x0B, 0x00])) == nil)
        // retry_delay as a varint, not a message: no delay
        #expect(Self.delay(status: Self.status(value: [0x08, 0x02])) == nil)
    }

    @Test func aValuePastTheBoundIsNotRead() {
        // The same status with a long message: read within the bound, not past it.
        func status(message: Int) -> String {
            var w = ProtoWriter()
            w.varint(1, 8)
            w.string(2, String(repeating: "q", count: message))
            w.message(3) { any in
                any.string(1, GRPCStatusDetails.retryInfoTypeURL)
                any.bytes(2, Self.retryInfo(seconds: 2))
            }
            return Base64.unpadded(w.bytes)
        }
        #expect(status(message: 6000).utf8.count <= GRPCStatusDetails.maxFieldBytes)
        #expect(Self.delay(status(message: 6000)) == .seconds(2))
        #expect(status(message: 6200).utf8.count > GRPCStatusDetails.maxFieldBytes)
        #expect(Self.delay(status(message: 6200)) == nil)
    }

    @Test func everyByteStringEndsInADelayOrNil() {
        // Every value of up to two bytes, and prefixes of a good one: none traps.
        for a in 0...255 {
            for b in stride(from: 0, through: 255, by: 5) {
                var bytes: [UInt8] = [UInt8(a), UInt8(b)]
                _ = bytes.withUnsafeBytes { GRPCStatusDetails.retryDelay(fieldValue: $0, max: .seconds(60)) }
                _ = Self.delay(status: bytes)
                bytes.removeLast()
                _ = Self.delay(status: bytes)
            }
        }
        let good = Self.status(value: Self.retryInfo(seconds: 2, nanos: 5))
        for n in 0..<good.count { _ = Self.delay(status: Array(good.prefix(n))) }
    }
}
