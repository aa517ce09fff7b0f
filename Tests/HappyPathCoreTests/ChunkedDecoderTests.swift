import HappyPathCore
import Testing

// Tests of ChunkedDecoder against RFC 9112 section 7.1. Every input goes
// through `decode(_:)`, which decodes it whole and one byte at a time
// (re-offering unconsumed bytes first) and expects the same result.

private let chunkLimits = RequestLimits(maxHeadBytes: 256, maxFields: 4, maxBodyBytes: 1 << 16)

private func decode(
    _ input: [UInt8], limits: RequestLimits = chunkLimits, sourceLocation: SourceLocation = #_sourceLocation
) -> ChunkedOutcome {
    let whole = decodeWhole(input, limits: limits)
    let trickled = decodeByteByByte(input, limits: limits)
    #expect(whole == trickled, "whole and byte-by-byte decoding disagree", sourceLocation: sourceLocation)
    return whole
}

private func decode(
    _ text: String, limits: RequestLimits = chunkLimits, sourceLocation: SourceLocation = #_sourceLocation
) -> ChunkedOutcome {
    decode(Array(text.utf8), limits: limits, sourceLocation: sourceLocation)
}

private func refusal(_ o: ChunkedOutcome) -> HTTP1Refusal? {
    if case let .refused(r) = o.end { return r }
    return nil
}

@Suite struct ChunkedDecoderTests {
    // MARK: Well-formed bodies

    @Test func decodesChunksIntoTheExactBody() {
        let text = "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        let o = decode(text)
        #expect(o.end == .done(consumed: text.utf8.count))
        #expect(o.body == Array("hello world".utf8))
    }

    @Test func decodesEmptyBody() {
        let o = decode("0\r\n\r\n")
        #expect(o.end == .done(consumed: 5))
        #expect(o.body.isEmpty)
    }

    @Test(arguments: [
        ("a", 10), ("A", 10), ("f", 15), ("F", 15), ("10", 16), ("1F", 31), ("0000000000000000000000005", 5), ("00a", 10),
    ])
    func readsChunkSizeAsHex(size: String, length: Int) {
        let data = (0..<length).map { UInt8(0x41 + $0 % 26) }
        let input = Array("\(size)\r\n".utf8) + data + Array("\r\n0\r\n\r\n".utf8)
        let o = decode(input)
        #expect(o.end == .done(consumed: input.count))
        #expect(o.body == data)
    }

    @Test func deliversChunkDataVerbatimIncludingCRLFAndBinaryBytes() {
        let data: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0xFF, 0x30, 0x0D, 0x0A, 0x0A, 0x0D]
        let input = Array("b\r\n".utf8) + data + Array("\r\n0\r\n\r\n".utf8)
        let o = decode(input)
        #expect(o.end == .done(consumed: input.count))
        #expect(o.body == data)
    }

    @Test func deliversAllBytesOfALargeBody() {
        var input: [UInt8] = []
        var expected: [UInt8] = []
        for n in [1, 100, 4000, 17, 255] {
            let data = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ n) }
            input += Array("\(String(n, radix: 16))\r\n".utf8) + data + [0x0D, 0x0A]
            expected += data
        }
        input += Array("0\r\n\r\n".utf8)
        let o = decode(input)
        #expect(o.end == .done(consumed: input.count))
        #expect(o.body == expected)
    }

    @Test func leavesPipelinedBytesAfterTheFinalCRLFUnconsumed() {
        let body = "3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
        let next = "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
        let o = decode(body + next)
        #expect(o.end == .done(consumed: body.utf8.count))
        #expect(o.body == Array("abc".utf8))
    }

    @Test func leavesPipelinedBytesThatLookLikeChunksUnconsumed() {
        let body = "1\r\nx\r\n0\r\n\r\n"
        let o = decode(body + "5\r\nhello\r\n0\r\n\r\n")
        #expect(o.end == .done(consumed: body.utf8.count))
        #expect(o.body == [0x78])
    }

    @Test func staysDoneAfterTheBodyEnds() {
        var decoder = ChunkedDecoder(limits: chunkLimits)
        let first = Array("0\r\n\r\n".utf8)
        let more = Array("5\r\nhello\r\n".utf8)
        var delivered = 0
        #expect(first.withUnsafeBytes { decoder.decode($0) { delivered += $0.count } } == .done(consumed: 5))
        #expect(more.withUnsafeBytes { decoder.decode($0) { delivered += $0.count } } == .done(consumed: 0))
        #expect(delivered == 0)
    }

    @Test(arguments: [
        ("5", 0, ""), ("5\r", 0, ""), ("5\r\n", 3, ""), ("5\r\nhel", 6, "hel"), ("5\r\nhello", 8, "hello"),
        ("5\r\nhello\r", 9, "hello"), ("5\r\nhello\r\n", 10, "hello"), ("5\r\nhello\r\n0\r\n", 13, "hello"),
        ("5\r\nhello\r\n0\r\nX-T: 1", 13, "hello"), ("5\r\nhello\r\n0\r\nX-T: 1\r\n", 21, "hello"),
    ])
    func asksForMoreAndConsumesOnlyWholeLines(text: String, consumed: Int, body: String) {
        let o = decode(text)
        #expect(o.end == .needMore(consumed: consumed))
        #expect(o.body == Array(body.utf8))
    }

    @Test func countsDecodedBodyBytes() {
        var decoder = ChunkedDecoder(limits: chunkLimits)
        let input = Array("5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n".utf8)
        _ = input.withUnsafeBytes { decoder.decode($0) { _ in } }
        #expect(decoder.bodyBytes == 8)
    }

    // MARK: Chunk size

    @Test(arguments: [
        "10000000000000000",  // 17 significant digits
        "1000000000000000",  // 16
        "FFFFFFFFFFFFFFFF",  // 16, would be -1 as Int64
        "7FFFFFFFFFFFFFFF",  // 16, Int.max
        "ffffffffffffffffffffffffffffffff",  // 32
        "0001000000000000000",  // 16 significant after leading zeros
    ])
    func refusesChunkSizeThatWouldOverflow(size: String) {
        #expect(refusal(decode("\(size)\r\nhello\r\n0\r\n\r\n")) == .badChunkSize)
    }

    @Test func refusesChunkSizeBeyondTheBodyLimitWithoutOverflowing() {
        // 14 significant hex digits: representable, but far above any body limit.
        #expect(refusal(decode("FFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n")) == .bodyTooLarge)
    }

    @Test(arguments: ["g", "-5", "+5", " 5", "0x5", "5g", "x", "", ";a", "\t5", "5.0", "\u{00E9}", "5,a"])
    func refusesChunkSizeThatIsNotHex(size: String) {
        #expect(refusal(decode("\(size)\r\nhello\r\n0\r\n\r\n")) == .badChunkSize)
    }

    @Test(arguments: ["5 ", "5\t"])
    func refusesTrailingWhitespaceAfterChunkSize(size: String) {
        let r = refusal(decode("\(size)\r\nhello\r\n0\r\n\r\n"))
        #expect(r == .badChunkExtension || r == .badChunkSize, "got \(String(describing: r))")
    }

    @Test func refusesBareLineFeedAfterChunkSize() {
        #expect(refusal(decode("5\nhello\r\n0\r\n\r\n")) == .bareLineFeed)
    }

    @Test func refusesBareCarriageReturnInChunkSizeLine() {
        let r = refusal(decode("5\r;a\r\nhello\r\n0\r\n\r\n"))
        #expect(r != nil)
        #expect([.badChunkSize, .badChunkExtension, .bareCarriageReturn].contains(r), "got \(String(describing: r))")
    }

    // MARK: Chunk extensions

    @Test(arguments: [
        "5;name", "5;name=value", "5;name=\"quoted \\\" value\"", "5;a;b=c", "5;a=\"\"", "5;a=b;c=\"d\"",
        "5;a=\"x;y=z\"", "5;A-B_c.d=!#$%", "5;a=\"tab\tand\\\\backslash\"",
    ])
    func acceptsValidChunkExtensions(line: String) {
        let text = "\(line)\r\nhello\r\n0;last=1\r\n\r\n"
        let o = decode(text)
        #expect(o.end == .done(consumed: text.utf8.count))
        #expect(o.body == Array("hello".utf8))
    }

    @Test(arguments: [
        "5;", "5;=x", "5;a=", "5;a=\"unterminated", "5;a=b c", "5;a b", "5;a=@", "5;a=\"x\\", "5;;a", "5;a;",
        "5;a=\"\"x", "5;a= ", "5;a ", "5;a=b,c", "5;a=\"x\"y", "5;(a)",
        // Whitespace around ';' and '=' (the RFC's BWS) is refused, as llhttp does.
        "5 ;a", "5; a", "5\t;\ta", "5 ; name = \"v\"", "5;a =b", "5;a= b", "5 ",
    ])
    func refusesMalformedChunkExtensions(line: String) {
        #expect(refusal(decode("\(line)\r\nhello\r\n0\r\n\r\n")) == .badChunkExtension)
    }

    @Test(arguments: [UInt8(0x00), 0x01, 0x1F, 0x7F])
    func refusesControlByteInQuotedChunkExtension(byte: UInt8) {
        let input = Array("5;a=\"x".utf8) + [byte] + Array("\"\r\nhello\r\n0\r\n\r\n".utf8)
        #expect(refusal(decode(input)) == .badChunkExtension)
    }

    @Test func refusesMalformedExtensionOnTheLastChunk() {
        #expect(refusal(decode("5\r\nhello\r\n0;\r\n\r\n")) == .badChunkExtension)
    }

    @Test func refusesChunkLineOverTheLimit() {
        let line = "5;a=" + String(repeating: "b", count: ChunkedDecoder.maxChunkLine)
        #expect(refusal(decode("\(line)\r\nhello\r\n0\r\n\r\n")) == .chunkLineTooLong)
        // Also before the line ends.
        #expect(refusal(decode(line)) == .chunkLineTooLong)
    }

    @Test func acceptsChunkLineExactlyAtTheLimit() {
        let line = "5;a=" + String(repeating: "b", count: ChunkedDecoder.maxChunkLine - 4)
        #expect(line.utf8.count == ChunkedDecoder.maxChunkLine)
        let text = "\(line)\r\nhello\r\n0\r\n\r\n"
        let o = decode(text)
        #expect(o.end == .done(consumed: text.utf8.count))
    }

    @Test func refusesChunkLineOneOverTheLimit() {
        let line = "5;a=" + String(repeating: "b", count: ChunkedDecoder.maxChunkLine - 3)
        #expect(refusal(decode("\(line)\r\nhello\r\n0\r\n\r\n")) == .chunkLineTooLong)
    }

    // MARK: Chunk data terminator

    @Test(arguments: [
        "5\r\nhelloX\r\n0\r\n\r\n", "5\r\nhello\rX0\r\n\r\n", "5\r\nhello\n0\r\n\r\n", "5\r\nhello world\r\n0\r\n\r\n",
        "5\r\nhello0\r\n\r\n", "3\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\r\n0\r\n\r\n",
    ])
    func refusesChunkDataNotFollowedByCRLF(text: String) {
        let o = decode(text)
        #expect(refusal(o) == .missingChunkTerminator)
    }

    @Test func deliversDataBeforeRefusingAMissingTerminator() {
        let o = decode("5\r\nhelloX")
        #expect(o.end == .refused(.missingChunkTerminator))
        #expect(o.body == Array("hello".utf8))
    }

    // MARK: Trailers

    @Test(arguments: [
        ["X-T: 1"], ["X-T: 1", "X-U: two words"], ["Checksum:"], ["X-T:\tv\t"], ["Expires: Wed, 21 Oct 2015 07:28:00 GMT"],
    ])
    func acceptsValidTrailersAndDropsThem(trailers: [String]) {
        let text = "5\r\nhello\r\n0\r\n" + trailers.map { $0 + "\r\n" }.joined() + "\r\n"
        let o = decode(text)
        #expect(o.end == .done(consumed: text.utf8.count))
        #expect(o.body == Array("hello".utf8))
    }

    @Test func refusesTrailersLargerThanTheHeadLimit() {
        // chunkLimits.maxHeadBytes is 256.
        let text = "5\r\nhello\r\n0\r\nX-Big: " + String(repeating: "v", count: 300) + "\r\n\r\n"
        let o = decode(text)
        #expect(o.end == .refused(.trailersTooLarge))
        #expect(HTTP1Refusal.trailersTooLarge.status == 431)
    }

    @Test func refusesTrailersThatAddUpPastTheHeadLimit() {
        let line = "X-T: " + String(repeating: "v", count: 50) + "\r\n"  // 57 bytes
        let limits = RequestLimits(maxHeadBytes: 256, maxFields: 100, maxBodyBytes: 1 << 16)
        let fits = "0\r\n" + String(repeating: line, count: 4) + "\r\n"  // 4 * 57 + 2 = 230
        #expect(decode(fits, limits: limits).end == .done(consumed: fits.utf8.count))
        let over = "0\r\n" + String(repeating: line, count: 5) + "\r\n"  // 5 * 57 + 2 = 287
        #expect(decode(over, limits: limits).end == .refused(.trailersTooLarge))
    }

    @Test func refusesOverlongTrailerBeforeItEnds() {
        let text = "0\r\nX-Big: " + String(repeating: "v", count: 300)
        #expect(decode(text).end == .refused(.trailersTooLarge))
    }

    @Test func refusesMoreTrailerFieldsThanTheFieldLimit() {
        // chunkLimits.maxFields is 4.
        let four = "0\r\n" + (1...4).map { "X-\($0): 1\r\n" }.joined() + "\r\n"
        #expect(decode(four).end == .done(consumed: four.utf8.count))
        let five = "0\r\n" + (1...5).map { "X-\($0): 1\r\n" }.joined() + "\r\n"
        #expect(decode(five).end == .refused(.trailersTooLarge))
    }

    @Test(arguments: ["NoColon", "X-T : 1", " X-T: 1", "\tX-T: 1", ": 1", "X(T): 1", "X-T: 1\rX-U: 2"])
    func refusesMalformedTrailerLine(line: String) {
        #expect(refusal(decode("0\r\n\(line)\r\n\r\n")) == .badTrailer)
    }

    @Test(arguments: [UInt8(0x00), 0x01, 0x7F])
    func refusesControlByteInTrailerValue(byte: UInt8) {
        let input = Array("0\r\nX-T: a".utf8) + [byte] + Array("\r\n\r\n".utf8)
        #expect(refusal(decode(input)) == .badTrailer)
    }

    @Test func refusesObsFoldedTrailer() {
        #expect(refusal(decode("0\r\nX-T: 1\r\n continued\r\n\r\n")) == .badTrailer)
    }

    @Test func refusesBareLineFeedInTrailers() {
        #expect(refusal(decode("0\r\nX-T: 1\n\r\n")) == .bareLineFeed)
        #expect(refusal(decode("0\r\n\n")) == .bareLineFeed)
    }

    // MARK: Body limit

    @Test func refusesBodyOverTheLimit() {
        let limits = RequestLimits(maxHeadBytes: 256, maxBodyBytes: 10)
        let o = decode("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", limits: limits)
        #expect(o.end == .refused(.bodyTooLarge))
        #expect(o.body == Array("hello".utf8))
        #expect(HTTP1Refusal.bodyTooLarge.status == 413)
    }

    @Test func refusesSingleChunkOverTheLimitBeforeItsData() {
        let limits = RequestLimits(maxHeadBytes: 256, maxBodyBytes: 10)
        let o = decode("b\r\nhello world\r\n0\r\n\r\n", limits: limits)
        #expect(o.end == .refused(.bodyTooLarge))
        #expect(o.body.isEmpty)
    }

    @Test func acceptsBodyExactlyAtTheLimit() {
        let limits = RequestLimits(maxHeadBytes: 256, maxBodyBytes: 10)
        let text = "5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"
        let o = decode(text, limits: limits)
        #expect(o.end == .done(consumed: text.utf8.count))
        #expect(o.body == Array("helloworld".utf8))
    }

    // MARK: Whole versus trickled

    static let bodies: [String] = [
        "5\r\nhello\r\n0\r\n\r\n",
        "5;name=\"v\\\"x\"\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n",
        "5\r\nhello\r\n0\r\nX-T: 1",
        "5\r\nhelloXX",
        "5;\r\nhello\r\n0\r\n\r\n",
        "FFFFFFFFFFFFFFFFF\r\n",
        "0\r\n" + String(repeating: "X-T: 1\r\n", count: 50) + "\r\n",
        "1\r\na\r\n2\r\nbc\r\n3\r\ndef\r\n0\r\n\r\n",
    ]

    @Test(arguments: bodies)
    func decodingByteByByteMatchesDecodingWhole(text: String) {
        let input = Array(text.utf8)
        #expect(decodeWhole(input, limits: chunkLimits) == decodeByteByByte(input, limits: chunkLimits))
    }

    @Test func decodingInIrregularPiecesMatchesDecodingWhole() {
        let text = "5;a=b\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\nNEXT"
        let input = Array(text.utf8)
        let whole = decodeWhole(input, limits: chunkLimits)
        for pieceSize in [2, 3, 5, 7, 11] {
            var decoder = ChunkedDecoder(limits: chunkLimits)
            var body: [UInt8] = []
            var pending: [UInt8] = []
            var offset = 0
            var consumed = 0
            var end: ChunkedOutcome.End = .needMore(consumed: 0)
            feeding: while offset < input.count {
                let next = min(offset + pieceSize, input.count)
                pending += input[offset..<next]
                offset = next
                let step = pending.withUnsafeBytes { buf in decoder.decode(buf) { body.append(contentsOf: $0) } }
                switch step {
                case let .needMore(c):
                    consumed += c
                    pending.removeFirst(c)
                case let .done(c):
                    end = .done(consumed: consumed + c)
                    break feeding
                case let .refused(r):
                    end = .refused(r)
                    break feeding
                }
            }
            #expect(ChunkedOutcome(end: end, body: body) == whole, "piece size \(pieceSize)")
        }
        #expect(whole.end == .done(consumed: input.count - 4))
    }
}

@Suite struct ChunkedTrailerFramingTests {
    /// Found by the differential fuzzer: llhttp refuses these, and a reader
    /// that merged trailers into the head would frame the message anew.
    @Test(arguments: ["Transfer-Encoding: chunked", "Content-Length: 5", "Host: other", "content-length: 0"])
    func refusesFramingAndRoutingFieldsInTrailers(trailer: String) {
        #expect(refusal(decode("5\r\nhello\r\n0\r\n\(trailer)\r\n\r\n")) == .badTrailer)
    }
}
