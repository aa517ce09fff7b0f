import HappyPathCore
import Testing

// MARK: - NominatedFields

/// Runs `NominatedFields.mark` over field names and a Connection value given
/// as strings; the names live in one contiguous buffer, as in a real head.
private func nominated(names: [String], connection: String, start: [Bool] = []) -> [Bool] {
    var storage: [UInt8] = []
    var ranges: [Range<Int>] = []
    for n in names {
        let s = storage.count
        storage += Array(n.utf8)
        ranges.append(s..<storage.count)
    }
    let value = Array(connection.utf8)
    var result = start
    storage.withUnsafeBytes { buf in
        value.withUnsafeBytes { v in
            NominatedFields.mark(
                count: names.count, name: { UnsafeRawBufferPointer(rebasing: buf[ranges[$0]]) }, connectionValue: v,
                nominated: &result)
        }
    }
    return result
}

@Suite struct NominatedFieldsTests {
    @Test func marksExactlyTheNamedFieldsIgnoringCase() {
        let names = ["Host", "x-a", "X-B", "Connection", "X-C", "x-ab", "x-", "Keep-Alive", "Close"]
        let marks = nominated(names: names, connection: "x-a, X-B, close")
        #expect(marks == [false, true, true, false, false, false, false, false, false])
    }

    @Test func marksEveryFieldWithANominatedName() {
        let marks = nominated(names: ["X-A", "Host", "x-a", "X-a"], connection: "X-A")
        #expect(marks == [true, false, true, true])
    }

    @Test func closeAndKeepAliveNameNoField() {
        let marks = nominated(names: ["close", "Keep-Alive", "X-A"], connection: "Close, KEEP-ALIVE")
        #expect(marks == [false, false, false])
    }

    @Test(arguments: ["", ",", " , ,\t", "x-z", "x-a-b", "x"])
    func marksNothingWhenNoTokenNamesAField(connection: String) {
        #expect(nominated(names: ["X-A", "Host"], connection: connection) == [false, false])
    }

    @Test func toleratesEmptyListElementsAndWhitespace() {
        let marks = nominated(names: ["X-A", "X-B", "X-C"], connection: " ,\tx-b\t, ,X-C ,")
        #expect(marks == [false, true, true])
    }

    @Test func growsTheResultArrayAndKeepsEarlierMarks() {
        let marks = nominated(names: ["X-A", "X-B", "X-C"], connection: "x-c", start: [true])
        #expect(marks == [true, false, true])
    }

    @Test func markingNoFieldsLeavesResultUntouched() {
        #expect(nominated(names: [], connection: "x-a").isEmpty)
    }

    @Test func manyTokensAgainstManyFieldsMarksExactlyTheNamedOnes() {
        // 20,000 tokens against 100 fields: every 200th token names field
        // (token / 200) in a different case; the rest name nothing. Only
        // correctness is asserted (the hash table keeps this linear).
        let names = (0..<100).map { "X-Field-\($0)" }
        var tokens: [String] = []
        tokens.reserveCapacity(20_000)
        var expected = [Bool](repeating: false, count: 100)
        for t in 0..<20_000 {
            if t % 200 == 0, (t / 200) % 2 == 0 {
                tokens.append("x-field-\(t / 200)".uppercased())
                expected[t / 200] = true
            } else {
                tokens.append("x-other-\(t)")
            }
        }
        let marks = nominated(names: names, connection: tokens.joined(separator: ", "))
        #expect(marks == expected)
        #expect(marks.filter { $0 }.count == 50)
    }

    @Test func manyFieldsWithTheSameNameAreAllMarked() {
        let names = Array(repeating: "X-Dup", count: 100) + ["X-Other"]
        let marks = nominated(names: names, connection: Array(repeating: "x-dup", count: 20_000).joined(separator: ","))
        #expect(marks == Array(repeating: true, count: 100) + [false])
    }
}

// MARK: - ResponseFraming

private func status(_ line: String) -> Int? {
    Array(line.utf8).withUnsafeBytes { ResponseFraming.status(ofLine: $0) }
}

private func verdict(_ fields: [(String, String)]) -> (Result<Int?, ResponseFramingError>, [Bool]) {
    var framing = ResponseFraming()
    var forwarded: [Bool] = []
    for (name, value) in fields {
        let n = Array(name.utf8)
        let v = Array(value.utf8)
        let keep = n.withUnsafeBytes { nb in v.withUnsafeBytes { vb in framing.add(name: nb, value: vb) } }
        forwarded.append(keep)
    }
    return (framing.verdict(), forwarded)
}

private func isFailure(_ r: Result<Int?, ResponseFramingError>) -> Bool {
    if case .failure = r { return true }
    return false
}

@Suite struct ResponseFramingTests {
    @Test(arguments: [
        ("HTTP/1.1 200 OK", 200), ("HTTP/1.0 404", 404), ("HTTP/1.1 100 Continue", 100), ("HTTP/1.1 599 ", 599),
        ("HTTP/1.1 204 No Content", 204), ("HTTP/1.9 301 Moved", 301), ("HTTP/1.1 200 \u{00E9}t\u{00E9}", 200),
    ])
    func acceptsValidStatusLine(line: String, expected: Int) {
        #expect(status(line) == expected)
    }

    @Test(arguments: [
        "HTTP/1.1 99 X", "HTTP/1.1 600 X", "HTTP/1.1 2000 X", "HTTP/1.1 abc", "HTTP/1.1 099 X", "HTTP/1.1 000",
        "HTTP/2.0 200 OK", "HTTP/1.x 200 OK", "http/1.1 200 OK", "HTTP/1.1  200 OK", "HTTP/1.1 20", "HTTP/1.1",
        "", "HTTP/1.1 200OK", "HTTP/1.1\t200 OK", "HTTP/1.1 +20 X", "HTTP/1.1 -20 X", "HTTP/11 200 OK",
    ])
    func refusesInvalidStatusLine(line: String) {
        #expect(status(line) == nil)
    }

    /// libcurl writes an HTTP/2 answer's status as `HTTP/2 NNN ` (http2.c).
    @Test(arguments: [
        ("HTTP/2 200 ", 200), ("HTTP/2 200", 200), ("HTTP/2 100 ", 100), ("HTTP/2 599 ", 599), ("HTTP/2 404 ", 404),
        ("HTTP/2 103", 103),
    ])
    func acceptsLibcurlHTTP2StatusLine(line: String, expected: Int) {
        #expect(status(line) == expected)
    }

    @Test(arguments: [
        "HTTP/2 200 OK", "HTTP/2 200  ", "HTTP/2 99 ", "HTTP/2 600 ", "HTTP/2 2000", "HTTP/2  200", "HTTP/2 20",
        "HTTP/2 abc", "HTTP/2", "HTTP/2 ", "HTTP/2.0 200", "HTTP/20 200", "HTTP/2\t200", "HTTP/3 200 ", "http/2 200",
        "HTTP/2 +20", "HTTP/2 -20",
    ])
    func refusesInvalidHTTP2StatusLine(line: String) {
        #expect(status(line) == nil)
    }

    @Test(arguments: [
        ("HTTP/1.1 200 OK", 13), ("HTTP/1.1 200", 12), ("HTTP/1.1 200 ", 13), ("HTTP/2 200 ", 11), ("HTTP/2 200", 10),
    ])
    func reasonStartsAfterTheStatus(line: String, expected: Int) {
        #expect(Array(line.utf8).withUnsafeBytes { ResponseFraming.reasonStart(ofLine: $0) } == expected)
    }

    @Test func refusesContentLengthWithTransferEncoding() {
        let (r, _) = verdict([("Content-Length", "5"), ("Transfer-Encoding", "chunked")])
        #expect(isFailure(r))
        let (r2, _) = verdict([("transfer-encoding", "chunked"), ("content-length", "5")])
        #expect(isFailure(r2))
    }

    @Test(arguments: [
        [("Content-Length", "5"), ("Content-Length", "6")],
        [("Content-Length", "5, 6")],
        [("Content-Length", "5"), ("content-length", "5, 6")],
    ])
    func refusesDifferingContentLengths(fields: [(String, String)]) {
        #expect(isFailure(verdict(fields).0))
    }

    @Test(arguments: ["+5", "-1", "0x5", "", "5 5", "5,", "1234567890123456789", "five"])
    func refusesContentLengthThatIsNotANumber(value: String) {
        #expect(isFailure(verdict([("Content-Length", value)]).0))
    }

    @Test func failureCarriesAMessage() throws {
        guard case let .failure(e) = verdict([("Content-Length", "+5")]).0 else {
            Issue.record("expected a failure")
            return
        }
        #expect(!e.message.isEmpty)
    }

    @Test(arguments: [
        ([("Content-Length", "5")], 5), ([("Content-Length", "0")], 0), ([("content-length", "5, 5")], 5),
        ([("Content-Length", "5"), ("Content-Length", "5")], 5), ([("CONTENT-LENGTH", "000000000000000042")], 42),
    ])
    func announcesASingleContentLength(fields: [(String, String)], length: Int) throws {
        let (r, _) = verdict(fields)
        #expect(try r.get() == length)
    }

    @Test(arguments: ["chunked", "Chunked", " chunked "])
    func transferEncodingAloneLeavesTheLengthUnknown(value: String) throws {
        let (r, _) = verdict([("Transfer-Encoding", value)])
        let length = try r.get()
        #expect(length == nil)
    }

    /// libcurl takes off the chunked coding only: a gzip-coded body would
    /// reach the client with nothing saying it is coded.
    @Test(arguments: ["gzip, chunked", "gzip", "chunked, identity", "chunked, chunked"])
    func aCodingOtherThanChunkedIsRefused(value: String) {
        let (r, _) = verdict([("Transfer-Encoding", value)])
        #expect(throws: ResponseFramingError.self) { try r.get() }
    }

    @Test func noFramingFieldsLeavesTheLengthUnknown() throws {
        let (r, _) = verdict([("Content-Type", "text/plain")])
        let length = try r.get()
        #expect(length == nil)
    }

    @Test func neverForwardsFramingFields() {
        let (_, forwarded) = verdict([
            ("Content-Length", "5"), ("content-length", "5"), ("Transfer-Encoding", "chunked"),
            ("TRANSFER-ENCODING", "chunked"), ("Content-Type", "text/plain"), ("Content-Length-X", "1"),
            ("X-Transfer-Encoding", "x"), ("Connection", "close"),
        ])
        #expect(forwarded == [false, false, false, false, true, true, true, true])
    }

    @Test func doesNotForwardAMalformedContentLengthEither() {
        let (r, forwarded) = verdict([("Content-Length", "+5")])
        #expect(forwarded == [false])
        #expect(isFailure(r))
    }
}
