/// The protobuf wire format, as much of it as its writers need (OTLP spans,
/// gRPC's `google.rpc.Status` and health checks): varints, 64-bit fixed, and
/// length-delimited fields (bytes, strings, nested messages). `ProtoReader`
/// reads the same format back.
public struct ProtoWriter {
    public private(set) var bytes: [UInt8] = []

    public init() {}

    mutating func tag(_ field: Int, _ wireType: UInt64) { rawVarint(UInt64(field) << 3 | wireType) }

    mutating func rawVarint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    public mutating func varint(_ field: Int, _ value: UInt64) {
        tag(field, 0)
        rawVarint(value)
    }

    public mutating func fixed64(_ field: Int, _ value: UInt64) {
        tag(field, 1)
        for i in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(i)))) }
    }

    public mutating func bytes(_ field: Int, _ value: [UInt8]) {
        tag(field, 2)
        rawVarint(UInt64(value.count))
        bytes += value
    }

    public mutating func string(_ field: Int, _ value: String) { bytes(field, Array(value.utf8)) }

    public mutating func message(_ field: Int, _ body: (inout ProtoWriter) -> Void) {
        var inner = ProtoWriter()
        body(&inner)
        bytes(field, inner.bytes)
    }
}
