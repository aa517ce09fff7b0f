import HappyPathCore
import Testing

/// HTTP2Preface: h2c told from HTTP/1.1 by the connection preface
/// (RFC 9113 section 3.4), as early as one byte differs, however the bytes
/// are split into reads.
@Suite struct HTTP2PrefaceTests {
    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    @Test func theMagicIsRFC9113s() {
        #expect(HTTP2Preface.count == 24)
        #expect(HTTP2Preface.match(Self.preface) == .http2)
    }

    @Test(arguments: [
        ("", HTTP2Preface.Match.needMore),
        ("P", .needMore),
        ("PRI", .needMore),
        ("PRI * HTTP/2.0\r\n", .needMore),
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r", .needMore),
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", .http2),
        // Frames after the preface are nghttp2's to read.
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\u{4}\0\0\0\0\0", .http2),
        ("G", .http1),
        ("GET / HTTP/1.1\r\n", .http1),
        ("PO", .http1),
        ("POST / HTTP/1.1\r\n", .http1),
        ("PUT / HTTP/1.1\r\n", .http1),
        ("PATCH / HTTP/1.1\r\n", .http1),
        ("pri * HTTP/2.0\r\n\r\nSM\r\n\r\n", .http1),
        // HTTP/1.1's form of the same line: the HTTP/1 parser answers it (505).
        ("PRI * HTTP/2.0\r\nHost: a\r\n\r\n", .http1),
        ("PRI * HTTP/1.1\r\n", .http1),
        ("PRI * HTTP/2.0\n\nSM\n\n", .http1),
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r", .http1),
        ("\r\nGET / HTTP/1.1\r\n", .http1),
        (" PRI", .http1),
    ])
    func classifiesTheFirstBytes(bytes: String, expected: HTTP2Preface.Match) {
        #expect(HTTP2Preface.match(Array(bytes.utf8)) == expected)
    }

    @Test func decidesAtTheFirstByteThatDiffers() {
        // Every prefix of the preface with its last byte changed is HTTP/1.1
        // at once; the same prefix unchanged waits for more.
        for length in 1..<Self.preface.count {
            var bytes = Array(Self.preface.prefix(length))
            #expect(HTTP2Preface.match(bytes) == .needMore, "prefix of \(length)")
            bytes[length - 1] ^= 0x01
            #expect(HTTP2Preface.match(bytes) == .http1, "differs at byte \(length - 1)")
        }
    }

    /// The bytes arrive in reads of the given sizes; after each, the caller
    /// matches everything read so far.
    @Test(arguments: [
        ([24], [HTTP2Preface.Match.http2]),
        ([1, 23], [.needMore, .http2]),
        ([3, 3, 18], [.needMore, .needMore, .http2]),
        ([23, 1], [.needMore, .http2]),
        ([23, 10], [.needMore, .http2]),
        ([10, 14, 9], [.needMore, .http2, .http2]),
        (Array(repeating: 1, count: 24), Array(repeating: .needMore, count: 23) + [.http2]),
    ])
    func prefaceSplitAcrossReads(reads: [Int], expected: [HTTP2Preface.Match]) {
        let stream = Self.preface + [0, 0, 0, 4, 0, 0, 0, 0, 0]
        #expect(matches(stream, reads) == expected)
    }

    @Test(arguments: [
        ("POST /x HTTP/1.1\r\n", [1, 1, 16], [HTTP2Preface.Match.needMore, .http1, .http1]),
        ("PRI * HTTP/1.1\r\n", [6, 4, 6], [.needMore, .needMore, .http1]),
        ("PRI * HTTP/2.0\r\nHost: a\r\n\r\n", [16, 2, 9], [.needMore, .http1, .http1]),
        ("GET / HTTP/1.1\r\n", [1, 15], [.http1, .http1]),
    ])
    func http1SplitAcrossReads(text: String, reads: [Int], expected: [HTTP2Preface.Match]) {
        #expect(matches(Array(text.utf8), reads) == expected)
    }

    private func matches(_ stream: [UInt8], _ reads: [Int]) -> [HTTP2Preface.Match] {
        var buffered: [UInt8] = []
        var offset = 0
        return reads.map { size in
            let end = min(offset + size, stream.count)
            buffered += stream[offset..<end]
            offset = end
            return HTTP2Preface.match(buffered)
        }
    }
}
