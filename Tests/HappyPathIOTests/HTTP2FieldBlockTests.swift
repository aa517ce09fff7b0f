import CNghttp2
import HappyPathCore
import Testing

@testable import HappyPathIO

/// The answer fields handed to nghttp2: names lower-cased, values byte for byte.
@Suite struct HTTP2FieldBlockTests {
    /// Each (name, value) the nv array points at, as bytes.
    static func nv(_ block: HTTP2FieldBlock, status: Int? = nil) -> [[UInt8]] {
        block.withNV(status: status) { nv in
            nv.flatMap {
                [
                    Array(UnsafeBufferPointer(start: $0.name, count: $0.namelen)),
                    Array(UnsafeBufferPointer(start: $0.value, count: $0.valuelen)),
                ]
            }
        }
    }

    static func block(_ pairs: [([UInt8], [UInt8])]) -> HTTP2FieldBlock {
        var block = HTTP2FieldBlock()
        for (name, value) in pairs {
            name.withUnsafeBytes { n in value.withUnsafeBytes { block.append(name: n, value: $0) } }
        }
        return block
    }

    @Test func namesAreLowerCasedAndValuesKeptByteForByte() {
        // 0xE9 alone is not UTF-8 (an upstream's obs-text): through a String it would become U+FFFD.
        let block = Self.block([(Array("X-Name".utf8), [0x63, 0x61, 0x66, 0xE9]), (Array("EMPTY".utf8), [])])
        #expect(Self.nv(block) == [Array("x-name".utf8), [0x63, 0x61, 0x66, 0xE9], Array("empty".utf8), []])
        #expect(block.count == 2)
    }

    @Test(arguments: [
        ("x-a", ["x-b", "x-c"]), ("X-A, x-c", ["x-b"]), ("close, keep-alive", ["x-a", "x-b", "x-c"]),
        ("", ["x-a", "x-b", "x-c"]),
    ])
    func fieldsAConnectionValueNamesAreDropped(connection: String, kept: [String]) {
        var block = HTTP2FieldBlock([
            HTTPField(name: "x-a", value: "1"), HTTPField(name: "X-B", value: "2"), HTTPField(name: "x-c", value: "3"),
        ])
        Array(connection.utf8).withUnsafeBytes { block.removeNominated(by: $0) }
        #expect(block.fields.map(\.name) == kept)
    }

    @Test(arguments: [200, 103, 503])
    func statusComesFirstThenTheFieldsAsStaged(status: Int) {
        let block = Self.block([(Array("Content-Type".utf8), Array("text/plain".utf8)), (Array("x-a".utf8), [])])
        #expect(
            Self.nv(block, status: status) == [
                Array(":status".utf8), Array(String(status).utf8), Array("content-type".utf8), Array("text/plain".utf8),
                Array("x-a".utf8), [],
            ])
        #expect(Self.nv(HTTP2FieldBlock(), status: status) == [Array(":status".utf8), Array(String(status).utf8)])
        #expect(Self.nv(block) == Array(Self.nv(block, status: status).dropFirst(2)))
    }

    @Test func emptyBlocksAndEmptyFieldsStillGiveAnArray() {
        #expect(Self.nv(HTTP2FieldBlock()).isEmpty)
        #expect(Self.nv(Self.block([([], [])])) == [[], []])
        var block = HTTP2FieldBlock([HTTPField(name: "a", value: "b")])
        block.removeAll()
        #expect(block.isEmpty)
        block.append(contentsOf: HTTP2FieldBlock([HTTPField(name: "C", value: "d")]))
        #expect(block.fields == [HTTPField(name: "c", value: "d")])
    }
}
