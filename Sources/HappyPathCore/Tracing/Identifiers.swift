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

    /// 15 lower-case hex digits (60 bits): short enough to live inside a
    /// Swift string without a heap allocation.
    public mutating func requestID() -> String {
        let value = next() >> 4
        return String(unsafeUninitializedCapacity: 15) { buffer in
            let digits: StaticString = "0123456789abcdef"
            for i in 0..<15 { buffer[i] = digits.utf8Start[Int((value >> UInt64(56 - 4 * i)) & 0xF)] }
            return 15
        }
    }

    /// Length of a `traceparent` value.
    public static let traceparentLength = 55

    /// A `traceparent` value (version 00, sampled) for a request that came
    /// without one, written into `out` (55 bytes).
    public mutating func writeTraceparent(into out: UnsafeMutableBufferPointer<UInt8>) {
        let (a, b, c) = (next(), next(), next())
        var i = 0
        func put(_ s: StaticString) {
            for k in 0..<s.utf8CodeUnitCount {
                out[i] = s.utf8Start[k]
                i += 1
            }
        }
        func put(_ v: UInt64) {
            Self.writeHex(v, into: UnsafeMutableBufferPointer(rebasing: out[i..<(i + 16)]))
            i += 16
        }
        put("00-"); put(a); put(b); put("-"); put(c); put("-01")
    }

    /// The same as a string.
    public mutating func traceparent() -> String {
        String(unsafeUninitializedCapacity: Self.traceparentLength) { out in
            writeTraceparent(into: out)
            return Self.traceparentLength
        }
    }

    /// 16 lower-case hex digits.
    public static func hex(_ value: UInt64) -> String {
        String(unsafeUninitializedCapacity: 16) { buffer in
            writeHex(value, into: buffer)
            return 16
        }
    }

    static func writeHex(_ value: UInt64, into buffer: UnsafeMutableBufferPointer<UInt8>) {
        let digits: StaticString = "0123456789abcdef"
        digits.withUTF8Buffer { d in
            for i in 0..<16 { buffer[i] = d[Int((value >> UInt64(60 - 4 * i)) & 0xF)] }
        }
    }
}
