import Testing

@testable import HappyPathCore

/// `grpc-message`: UTF-8, then percent-encoding of every byte outside
/// 0x20–0x7E and of `%`; decoded leniently and within a bound.
@Suite struct GRPCMessageTests {
    @Test(arguments: [
        ("", ""),
        ("The service cannot be reached", "The service cannot be reached"),
        ("100% sure", "100%25 sure"),
        ("a\tb\nc\r", "a%09b%0Ac%0D"),
        ("~ and \u{7F}", "~ and %7F"),
        ("café", "caf%C3%A9"),
        ("日本", "%E6%97%A5%E6%9C%AC"),
        ("👍", "%F0%9F%91%8D"),
        ("\u{0}", "%00"),
        ("e\u{301}", "e%CC%81"),
    ])
    func textIsPercentEncodedAsGRPCSays(_ text: String, _ field: String) {
        #expect(GRPCMessage.encode(text) == field)
        #expect(GRPCMessage.decode(field) == text)
    }

    @Test func everyEncodedByteIsPrintableASCII() {
        let all = String(decoding: (0...0x7F).map { UInt8($0) }, as: UTF8.self) + "é中😀"
        let field = GRPCMessage.encode(all)
        #expect(field.utf8.allSatisfy { $0 >= 0x20 && $0 <= 0x7E })
        #expect(GRPCMessage.decode(field) == all)
    }

    @Test func aLongTextIsCutAtACharacterBoundary() {
        let text = String(repeating: "é", count: 100)  // each is %C3%A9: 6 bytes encoded
        let field = GRPCMessage.encode(text, limit: 40)
        #expect(field.utf8.count == 36)
        #expect(GRPCMessage.decode(field) == String(repeating: "é", count: 6))
        #expect(GRPCMessage.encode("abc%", limit: 5) == "abc")
        #expect(GRPCMessage.encode("abc", limit: 0) == "")
    }

    @Test(arguments: [
        ("%", "%"),
        ("%4", "%4"),
        ("%zz", "%zz"),
        ("%4g", "%4g"),
        ("100%", "100%"),
        ("%%41", "%A"),
        ("%4%41", "%4A"),
        ("a%2", "a%2"),
        ("%c3%a9", "é"),  // lower-case hex digits are read too
        ("%C3", "\u{FFFD}"),  // a lone UTF-8 lead byte
        ("%FF%FE", "\u{FFFD}\u{FFFD}"),
        ("caf\u{E9}", "caf\u{E9}"),  // a raw non-ASCII character, outside the grammar, is kept
    ])
    func brokenEncodingsStayAsWrittenAndNothingIsThrownAway(_ field: String, _ text: String) {
        #expect(GRPCMessage.decode(field) == text)
    }

    @Test func decodingReadsAtMostTheLimit() {
        let field = String(repeating: "%41", count: 10_000)
        #expect(GRPCMessage.decode(field, limit: 9) == "AAA")
        #expect(GRPCMessage.decode(field, limit: 10) == "AAA%")
        #expect(GRPCMessage.decode(field, limit: 0) == "")
        #expect(GRPCMessage.decode(field, limit: -5) == "")
        #expect(GRPCMessage.decode(field).utf8.count == 8192 / 3 + 2)
    }

    @Test func anyBytesDecodeWithoutTrapping() {
        // A deterministic sweep of byte strings: every pair, and pseudo-random longer ones.
        for a in 0...255 {
            for b in stride(from: 0, through: 255, by: 5) {
                _ = GRPCMessage.decode([UInt8(ascii: "%"), UInt8(a), UInt8(b)])
                _ = GRPCMessage.decode([UInt8(a), UInt8(ascii: "%"), UInt8(b)])
            }
        }
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<2000 {
            var bytes: [UInt8] = []
            for _ in 0..<Int(state % 64) {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                bytes.append(state >> 60 == 0 ? UInt8(ascii: "%") : UInt8(truncatingIfNeeded: state >> 33))
            }
            let text = GRPCMessage.decode(bytes)
            // Whatever came in, what goes back out is valid and decodes to the same text.
            #expect(GRPCMessage.decode(GRPCMessage.encode(text, limit: .max)) == text)
        }
    }
}
