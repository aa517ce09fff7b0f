/// Request ids and W3C trace context ids from a fast non-cryptographic
/// generator (they label requests; they protect nothing). One per event loop.
public struct IdentifierGenerator {
    private var state: UInt64

    public init(seed: UInt64 = UInt64.random(in: 1...UInt64.max)) { state = seed }

    /// splitmix64: tiny, fast, and well distributed.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// 16 lower-case hex digits.
    public mutating func requestID() -> String { Self.hex(next()) }

    /// A `traceparent` value (version 00, sampled) for a request that came without one.
    public mutating func traceparent() -> String {
        "00-" + Self.hex(next()) + Self.hex(next()) + "-" + Self.hex(next()) + "-01"
    }

    static func hex(_ value: UInt64) -> String {
        let digits: StaticString = "0123456789abcdef"
        return String(unsafeUninitializedCapacity: 16) { buffer in
            digits.withUTF8Buffer { d in
                for i in 0..<16 { buffer[i] = d[Int((value >> UInt64(60 - 4 * i)) & 0xF)] }
            }
            return 16
        }
    }
}
