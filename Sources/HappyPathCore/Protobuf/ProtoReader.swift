/// Reading the protobuf wire format, for the small messages the proxy reads
/// from a peer (a gRPC health answer, the `google.rpc.Status` an upstream sends): `ProtoWriter`'s counterpart. Every
/// number is bounded before use — a varint is at most ten bytes and fits 64
/// bits, a field number fits 29 bits, a length never reaches past the
/// bytes — so any input ends in a field or a `ProtoReadError`, never a trap.
public struct ProtoReader {
    /// A field's value by wire type; a length-delimited one is a slice of the input.
    public enum Value: Equatable, Sendable {
        case varint(UInt64)
        case fixed64(UInt64)
        case bytes(ArraySlice<UInt8>)
        case fixed32(UInt32)
    }

    private let bytes: ArraySlice<UInt8>
    private var position: Int

    public init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        position = bytes.startIndex
    }

    public init(_ bytes: [UInt8]) { self.init(bytes[...]) }

    /// The largest field number protobuf allows (2^29 - 1).
    public static let maxFieldNumber: UInt64 = (1 << 29) - 1

    /// The next field, or nil at the end of the input.
    public mutating func next() throws(ProtoReadError) -> (field: Int, value: Value)? {
        guard position < bytes.endIndex else { return nil }
        let key = try rawVarint()
        let number = key >> 3
        guard number >= 1, number <= Self.maxFieldNumber else { throw .badFieldNumber }
        let field = Int(number)
        switch key & 7 {
        case 0: return (field, .varint(try rawVarint()))
        case 1: return (field, .fixed64(try fixed(8)))
        case 2:
            let length = try rawVarint()
            guard length <= UInt64(bytes.endIndex - position) else { throw .truncated }
            let start = position
            position += Int(length)
            return (field, .bytes(bytes[start..<position]))
        case 5: return (field, .fixed32(UInt32(truncatingIfNeeded: try fixed(4))))
        default: throw .unsupportedWireType  // 3 and 4 (groups, long gone), 6 and 7 (none)
        }
    }

    /// A varint: seven bits a byte, least significant first; the tenth byte
    /// may carry only the 64th bit.
    mutating func rawVarint() throws(ProtoReadError) -> UInt64 {
        var value: UInt64 = 0
        for index in 0..<10 {
            guard position < bytes.endIndex else { throw .truncated }
            let byte = bytes[position]
            position += 1
            if index == 9, byte > 1 { throw .varintTooLong }
            value |= UInt64(byte & 0x7F) << UInt64(7 * index)
            if byte < 0x80 { return value }
        }
        throw .varintTooLong
    }

    /// A little-endian fixed-width value of `count` (4 or 8) bytes.
    private mutating func fixed(_ count: Int) throws(ProtoReadError) -> UInt64 {
        guard bytes.endIndex - position >= count else { throw .truncated }
        var value: UInt64 = 0
        for i in 0..<count { value |= UInt64(bytes[position + i]) << UInt64(8 * i) }
        position += count
        return value
    }
}

/// Why bytes are not a protobuf message.
public enum ProtoReadError: Error, Equatable, Sendable {
    /// The input ends inside a field.
    case truncated
    /// A varint longer than ten bytes, or past 64 bits.
    case varintTooLong
    /// Field number 0, or past 2^29 - 1.
    case badFieldNumber
    /// Wire type 3, 4 (groups), 6 or 7.
    case unsupportedWireType
}
