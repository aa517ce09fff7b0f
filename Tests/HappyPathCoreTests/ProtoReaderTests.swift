import Testing

@testable import HappyPathCore

/// `ProtoReader`: the protobuf wire format read back, bounded on every
/// number a peer sends.
@Suite struct ProtoReaderTests {
    static func fields(_ bytes: [UInt8]) throws(ProtoReadError) -> [ProtoField] {
        var reader = ProtoReader(bytes)
        var out: [ProtoField] = []
        while let (field, value) = try reader.next() { out.append(ProtoField(field: field, value: value)) }
        return out
    }

    struct ProtoField: Equatable, CustomStringConvertible {
        let field: Int
        let value: ProtoReader.Value
        var description: String { "\(field): \(value)" }
    }

    @Test func whatTheWriterWritesIsReadBack() throws {
        var w = ProtoWriter()
        w.varint(1, 0)
        w.varint(2, 300)
        w.varint(3, .max)
        w.fixed64(4, 0x0102_0304_0506_0708)
        w.string(5, "hi")
        w.message(536_870_911) { $0.varint(1, 1) }
        #expect(
            try Self.fields(w.bytes) == [
                ProtoField(field: 1, value: .varint(0)), ProtoField(field: 2, value: .varint(300)),
                ProtoField(field: 3, value: .varint(.max)), ProtoField(field: 4, value: .fixed64(0x0102_0304_0506_0708)),
                ProtoField(field: 5, value: .bytes(Array("hi".utf8)[...])),
                ProtoField(field: 536_870_911, value: .bytes([0x08, 0x01][...])),
            ])
    }

    @Test func aFixed32IsReadLittleEndian() throws {
        #expect(try Self.fields([0x0D, 0x01, 0x02, 0x03, 0x04]) == [ProtoField(field: 1, value: .fixed32(0x0403_0201))])
    }

    @Test func emptyInputHasNoFields() throws { #expect(try Self.fields([]).isEmpty) }

    @Test(
        arguments: [
            // A varint cut short, in the key and in the value.
            ([0x80], ProtoReadError.truncated), ([0x08], .truncated), ([0x08, 0xFF], .truncated),
            // Eleven bytes, and a tenth byte past the 64th bit.
            ([0x08] + [UInt8](repeating: 0xFF, count: 10) + [0x01], .varintTooLong),
            ([0x08] + [UInt8](repeating: 0xFF, count: 9) + [0x02], .varintTooLong),
            // A length past the end, and one near 2^64 (no overflow on the way).
            ([0x0A, 0x03, 0x61, 0x62], .truncated),
            ([0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], .truncated),
            // Fixed-width values cut short.
            ([0x09, 1, 2, 3, 4, 5, 6, 7], .truncated), ([0x0D, 1, 2, 3], .truncated),
            // Field number 0, and one past 2^29 - 1 (a key of 2^32 + type 0).
            ([0x00, 0x01], .badFieldNumber), ([0x80, 0x80, 0x80, 0x80, 0x20, 0x00], .badFieldNumber),
            // Groups and the wire types that do not exist.
            ([0x0B], .unsupportedWireType), ([0x0C], .unsupportedWireType), ([0x0E], .unsupportedWireType),
            ([0x0F], .unsupportedWireType),
        ] as [([UInt8], ProtoReadError)])
    func malformedInputIsAnErrorNeverATrap(bytes: [UInt8], expected: ProtoReadError) {
        #expect(throws: expected) { try Self.fields(bytes) }
    }

    @Test func theLargestTenByteVarintIsRead() throws {
        var reader = ProtoReader([UInt8](repeating: 0xFF, count: 9) + [0x01])
        #expect(try reader.rawVarint() == .max)
    }

    @Test func aSliceIsReadFromItsOwnStart() throws {
        let bytes: [UInt8] = [0xFF, 0xFF, 0x08, 0x07]
        var reader = ProtoReader(bytes[2...])
        let first = try reader.next()
        #expect(first?.field == 1)
        #expect(first?.value == .varint(7))
        #expect(try reader.next() == nil)
    }
}
