import HappyPathCore
import Testing

// Tests of RequestHeadScanner + RequestHeadParser against RFC 9112. Every
// head goes through `outcome(_:)`, which also feeds it one byte at a time
// and expects the same answer.

// MARK: - Framing: Content-Length and Transfer-Encoding (RFC 9112 section 6)

@Suite struct ContentLengthTests {
    @Test func acceptsSingleContentLength() throws {
        let p = try #require(outcome(request(["Content-Length: 5"])).request)
        #expect(p.head.framing == .contentLength(5))
    }

    @Test(arguments: [
        ["Content-Length: 5", "Content-Length: 5"],
        ["Content-Length: 5, 5"],
        ["Content-Length: 5,5"],
        ["Content-Length:5 ,\t5"],
        ["Content-Length: 5", "content-length: 5, 5"],
        ["Content-Length: 000000000000000005"],
    ])
    func acceptsIdenticalDuplicateContentLengths(lines: [String]) throws {
        let p = try #require(outcome(request(lines)).request)
        #expect(p.head.framing == .contentLength(5))
    }

    @Test(arguments: [
        ["Content-Length: 5", "Content-Length: 6"],
        ["Content-Length: 5, 6"],
        ["Content-Length: 5", "Content-Length: 5, 6"],
        ["Content-Length: 0", "Content-Length: 5"],
        ["Content-Length: 5", "Content-Length: 50"],
        ["Content-Length: 5", "CONTENT-LENGTH: 6"],
    ])
    func refusesDifferingContentLengths(lines: [String]) {
        #expect(outcome(request(lines)).refusal == .conflictingContentLength)
    }

    @Test(arguments: [
        "+5", "-1", " 5 5", "5 5", "0x5", "", "5,", ",5", "5, ,5", "5.0", "1e3", "five",
        "1234567890123456789",  // 19 digits
        "99999999999999999999999999",
    ])
    func refusesContentLengthThatIsNotPlainDigits(value: String) {
        #expect(outcome(request(["Content-Length: \(value)"])).refusal == .badContentLength)
    }

    /// A tab around the number: whitespace to RFC 9110, an error to llhttp,
    /// so two servers would frame the request two ways (a fuzzer found it).
    @Test(arguments: ["Content-Length: 5\t", "Content-Length:\t5", "Content-Length: 5\t\t\t\t\t\t", "Content-Length: \t5 "])
    func refusesContentLengthWithATabAroundIt(line: String) {
        #expect(outcome(request([line])).refusal == .badContentLength)
    }

    @Test func acceptsSpacesAroundContentLength() throws {
        let p = try #require(outcome(request(["Content-Length:   5   "])).request)
        #expect(p.head.framing == .contentLength(5))
    }

    @Test func refusesContentLengthWithNonASCIIDigits() {
        // U+0665 ARABIC-INDIC DIGIT FIVE
        #expect(outcome(request(["Content-Length: \u{0665}"])).refusal == .badContentLength)
    }

    @Test func zeroContentLengthMeansNoBody() throws {
        let p = try #require(outcome(request(["Content-Length: 0"])).request)
        #expect(p.head.framing == .none)
    }

    @Test func noFramingFieldsMeansNoBody() throws {
        let p = try #require(outcome(request([])).request)
        #expect(p.head.framing == .none)
    }

    @Test(arguments: [
        ["Content-Length: 5", "Transfer-Encoding: chunked"],
        ["Transfer-Encoding: chunked", "Content-Length: 5"],
        ["Transfer-Encoding: chunked", "Content-Length: 0"],
        ["Content-Length: 5", "Transfer-Encoding: gzip, chunked"],
    ])
    func refusesContentLengthWithTransferEncoding(lines: [String]) {
        let o = outcome(request(lines))
        #expect(o.refusal == .contentLengthWithTransferEncoding)
        #expect(o.refusal?.status == 400)
    }

    @Test func refusesContentLengthAboveBodyLimit() {
        let limits = RequestLimits(maxHeadBytes: 8192, maxBodyBytes: 1000)
        let o = outcome(request(["Content-Length: 1001"]), limits: limits)
        #expect(o.refusal == .bodyTooLarge)
        #expect(o.refusal?.status == 413)
    }

    @Test func acceptsContentLengthAtBodyLimit() throws {
        let limits = RequestLimits(maxHeadBytes: 8192, maxBodyBytes: 1000)
        let p = try #require(outcome(request(["Content-Length: 1000"]), limits: limits).request)
        #expect(p.head.framing == .contentLength(1000))
    }
}

@Suite struct TransferEncodingTests {
    @Test(arguments: ["chunked", "Chunked", "CHUNKED", "  chunked\t", ", chunked", "chunked ,"])
    func acceptsChunkedInAnyCase(value: String) throws {
        let p = try #require(outcome(request(["Transfer-Encoding: \(value)"])).request)
        #expect(p.head.framing == .chunked)
    }

    @Test(arguments: [
        "xchunked", "chunkedx", "gzip", "chunked, gzip", "chunked, chunked", "chunked;x=1", "chunked ; x=1",
        "gzip, chunked, chunked", "", ",", "\"chunked\"",
    ])
    func refusesTransferEncodingWhoseFinalCodingIsNotChunkedOnce(value: String) {
        let o = outcome(request(["Transfer-Encoding: \(value)"]))
        #expect(o.refusal == .chunkedNotFinal)
        #expect(o.refusal?.status == 400)
    }

    @Test(arguments: ["gzip, chunked", "deflate, chunked", "GZIP,chunked", "x-custom;q=1, chunked"])
    func refusesUnsupportedCodingsBeforeChunkedWith501(value: String) {
        let o = outcome(request(["Transfer-Encoding: \(value)"]))
        #expect(o.refusal == .unsupportedTransferCoding)
        #expect(o.refusal?.status == 501)
    }

    @Test(arguments: [
        (["Transfer-Encoding: gzip", "Transfer-Encoding: chunked"], HTTP1Refusal?.some(.unsupportedTransferCoding)),
        (["Transfer-Encoding: chunked", "Transfer-Encoding: gzip"], .chunkedNotFinal),
        (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], .chunkedNotFinal),
        (["Transfer-Encoding: chunked", "Transfer-Encoding: xchunked"], .chunkedNotFinal),
        (["Transfer-Encoding: chunked", "Transfer-Encoding:"], .chunkedNotFinal),
        (["Transfer-Encoding: ", "Transfer-Encoding: chunked"], .chunkedNotFinal),
    ])
    func combinesSeveralTransferEncodingLinesAsOneList(lines: [String], expected: HTTP1Refusal?) {
        #expect(outcome(request(lines)).refusal == expected)
    }

    @Test(arguments: ["chunked", "gzip", "gzip, chunked"])
    func refusesTransferEncodingOnHTTP10(value: String) {
        let text = request(["Transfer-Encoding: \(value)"], requestLine: "POST / HTTP/1.0", host: nil)
        #expect(outcome(text).refusal == .transferEncodingOnHTTP10)
    }

    @Test func refusesTransferEncodingWithContentLengthOnHTTP10() {
        let text = request(["Transfer-Encoding: chunked", "Content-Length: 3"], requestLine: "POST / HTTP/1.0")
        let r = outcome(text).refusal
        #expect(r == .transferEncodingOnHTTP10 || r == .contentLengthWithTransferEncoding)
    }
}

// MARK: - Field lines (RFC 9112 section 5)

@Suite struct FieldLineTests {
    @Test(arguments: [
        "Transfer-Encoding : chunked", "Content-Length : 5", "Host2 : x", "X-A\t: 1", "X-A  :1",
    ])
    func refusesWhitespaceBetweenNameAndColon(line: String) {
        #expect(outcome(request([line])).refusal == .whitespaceBeforeColon)
    }

    @Test func refusesWhitespaceBeforeColonOnHost() {
        let text = "GET / HTTP/1.1\r\nHost : example.com\r\n\r\n"
        #expect(outcome(text).refusal == .whitespaceBeforeColon)
    }

    @Test(arguments: [
        "X(a): 1", "X)a: 1", "X/Y: 1", "X@Y: 1", "X,Y: 1", "X;Y: 1", "X=Y: 1", "X[Y]: 1", "X{Y}: 1", "\"X\": 1",
        "X?: 1", "X\\Y: 1", ": no name", "Na\u{00EF}ve: 1",
    ])
    func refusesFieldNameWithNonTokenByte(line: String) {
        #expect(outcome(request([line])).refusal == .badFieldName)
    }

    @Test(arguments: [UInt8(0x00), 0x01, 0x08, 0x0B, 0x0C, 0x1B, 0x1F, 0x7F, 0x80, 0xFF])
    func refusesControlOrNonASCIIByteInFieldName(byte: UInt8) {
        let head = bytes("GET / HTTP/1.1\r\nHost: x\r\nX-", [byte], "A: 1\r\n\r\n")
        #expect(outcome(head).refusal == .badFieldName)
    }

    @Test(arguments: [UInt8(0x00), 0x01, 0x07, 0x08, 0x0B, 0x0C, 0x0E, 0x1B, 0x1F, 0x7F])
    func refusesControlByteInFieldValue(byte: UInt8) {
        let head = bytes("GET / HTTP/1.1\r\nHost: x\r\nX-A: a", [byte], "b\r\n\r\n")
        let o = outcome(head)
        #expect(o.refusal == .badFieldValue)
        #expect(o.refusal?.status == 400)
    }

    @Test func refusesNulAtStartOfFieldValue() {
        let head = bytes("GET / HTTP/1.1\r\nHost: x\r\nX-A: ", [0x00], "\r\n\r\n")
        #expect(outcome(head).refusal == .badFieldValue)
    }

    @Test func refusesControlByteInHostValue() {
        let head = bytes("GET / HTTP/1.1\r\nHost: exa", [0x00], "mple.com\r\n\r\n")
        #expect(outcome(head).refusal == .badFieldValue)
    }

    @Test func refusesBareCarriageReturnInFieldValue() {
        let head = bytes("GET / HTTP/1.1\r\nHost: x\r\nX-A: a", [0x0D], "X-Injected: 1\r\n\r\n")
        #expect(outcome(head).refusal == .bareCarriageReturn)
    }

    @Test func refusesBareLineFeedInFieldValue() {
        let head = bytes("GET / HTTP/1.1\r\nHost: x\r\nX-A: a", [0x0A], "X-Injected: 1\r\n\r\n")
        #expect(outcome(head).refusal == .bareLineFeed)
    }

    @Test(arguments: [
        "GET / HTTP/1.1\nHost: x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\n\n",
        "GET / HTTP/1.1\nHost: x\n\n",
        "\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ])
    func refusesBareLineFeedAsLineEnding(text: String) {
        #expect(outcome(text).refusal == .bareLineFeed)
    }

    @Test(arguments: [
        "GET / HTTP/1.1\rHost: x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\n\r\r\n",
        "\r\rGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ])
    func refusesBareCarriageReturnAsLineEnding(text: String) {
        #expect(outcome(text).refusal == .bareCarriageReturn)
    }

    @Test(arguments: [" continued", "\tcontinued", "  ", " X-B: 2"])
    func refusesObsFold(continuation: String) {
        let text = "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\(continuation)\r\n\r\n"
        #expect(outcome(text).refusal == .obsFold)
    }

    @Test(arguments: [" Host: x", "\tHost: x", " "])
    func refusesWhitespaceBeforeFirstField(line: String) {
        let text = "GET / HTTP/1.1\r\n\(line)\r\nHost: y\r\n\r\n"
        #expect(outcome(text).refusal == .whitespaceBeforeFirstField)
    }

    @Test(arguments: ["NoColon", "X-A", "-"])
    func refusesFieldLineWithoutColon(line: String) {
        #expect(outcome(request([line])).refusal == .missingColon)
    }

    @Test func trimsWhitespaceAroundFieldValueButKeepsInnerWhitespace() throws {
        let p = try #require(outcome(request(["X-A: \t v  v \t ", "X-B:", "X-C:x"])).request)
        #expect(p.fieldNames == ["Host", "X-A", "X-B", "X-C"])
        #expect(p.fieldValues == ["example.com", "v  v", "", "x"])
    }

    @Test func acceptsObsTextAndTabInFieldValue() throws {
        let head = bytes("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\t", [0x80, 0xC3, 0xA9, 0xFF], "b\r\n\r\n")
        let p = try #require(outcome(head).request)
        #expect(p.fields.count == 2)
        #expect(Array(p.bytes[p.fields[1].valueStart..<p.fields[1].valueEnd]) == [0x61, 0x09, 0x80, 0xC3, 0xA9, 0xFF, 0x62])
    }

    @Test func acceptsEveryTokenCharacterInFieldName() throws {
        let name = "!#$%&'*+-.^_`|~09azAZ"
        let p = try #require(outcome(request(["\(name): v"])).request)
        #expect(p.fieldNames.last == name)
    }

    @Test func refillsTheFieldsArrayFromScratchOnEveryParse() throws {
        let first = Array(request(["X-A: 1", "X-B: 2"]).utf8)
        let second = Array(request(["X-C: 3"]).utf8)
        var fields: [HTTP1Field] = []
        for (input, expected) in [(first, 3), (second, 2)] {
            let count: Int? = input.withUnsafeBytes { buf in
                var scanner = RequestHeadScanner()
                guard case let .complete(start, end) = scanner.scan(buf, limits: defaultLimits) else { return nil }
                guard
                    case .success = RequestHeadParser.parse(
                        buf, requestStart: start, end: end, limits: defaultLimits, fields: &fields)
                else { return nil }
                return fields.count
            }
            #expect(count == expected)
        }
    }
}

// MARK: - Request line and target (RFC 9112 section 3)

@Suite struct RequestTargetTests {
    @Test(arguments: [
        "/a\tb", "/a#frag", "/#", "#", "/caf\u{00E9}", "/\u{00A0}", "/a\u{7F}", "http://user@host/",
        "http://user:pw@host/p", "ftp://example.com/", "http://", "http:///p",
    ])
    func refusesBadTarget(target: String) {
        let o = outcome(request([], requestLine: "GET \(target) HTTP/1.1"))
        #expect(o.refusal == .badTarget)
        #expect(o.refusal?.status == 400)
    }

    @Test(arguments: [UInt8(0x00), 0x01, 0x09, 0x0B, 0x1F, 0x7F, 0x80, 0xC3, 0xFF])
    func refusesControlOrNonASCIIByteInTarget(byte: UInt8) {
        let head = bytes("GET /a", [byte], "b HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(outcome(head).refusal == .badTarget)
    }

    @Test(arguments: ["GET /a b HTTP/1.1", "GET  / HTTP/1.1", "GET / HTTP/1.1 ", "GET /  HTTP/1.1", "GET / HTTP/1.1 x"])
    func refusesExtraSpaceInRequestLine(line: String) {
        #expect(outcome(request([], requestLine: line)).refusal == .badRequestLine)
    }

    @Test func refusesCarriageReturnInjectedIntoTarget() {
        let o = outcome("GET /a\rX-Injected: 1 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(o.request == nil)
        #expect(o.refusal == .bareCarriageReturn)
    }

    @Test func refusesLineFeedInjectedIntoTarget() {
        let o = outcome("GET /a\nX-Injected: 1 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(o.refusal == .bareLineFeed)
    }

    @Test func refusesCRLFInjectedIntoTarget() {
        // The request line becomes "GET /a": no version.
        let o = outcome("GET /a\r\nX-Injected: 1 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(o.refusal == .badRequestLine)
    }

    @Test(arguments: [
        ("/", "/"), ("/p?q=1&r", "/p?q=1&r"), ("/a%20b", "/a%20b"), ("/?", "/?"), ("//x", "//x"),
    ])
    func acceptsOriginForm(target: String, path: String) throws {
        let p = try #require(outcome(request([], requestLine: "GET \(target) HTTP/1.1")).request)
        #expect(p.head.form == .origin)
        #expect(p.target == target)
        #expect(p.pathAndQuery == path)
    }

    @Test(arguments: [
        ("http://example.com/p?q", "/p?q"),
        ("http://example.com", ""),
        ("http://example.com?q", "?q"),
        ("https://example.com:8443/x/y", "/x/y"),
        ("HTTP://Example.COM/", "/"),
        ("http://[::1]:8080/x", "/x"),
        ("http://127.0.0.1:80/", "/"),
    ])
    func acceptsAbsoluteForm(target: String, path: String) throws {
        let p = try #require(outcome(request([], requestLine: "GET \(target) HTTP/1.1")).request)
        #expect(p.head.form == .absolute)
        #expect(p.target == target)
        #expect(p.pathAndQuery == path)
    }

    @Test(arguments: ["example.com:443", "localhost", "1.2.3.4:80", "[::1]:443", "example.com:443/x", "a:b"])
    func refusesAuthorityForm(target: String) {
        #expect(outcome(request([], requestLine: "GET \(target) HTTP/1.1")).refusal == .authorityForm)
    }

    @Test(arguments: ["CONNECT example.com:443 HTTP/1.1", "CONNECT / HTTP/1.1", "CONNECT * HTTP/1.1"])
    func refusesConnectMethod(line: String) {
        #expect(outcome(request([], requestLine: line)).refusal == .connectMethod)
    }

    @Test func acceptsAsteriskFormWithOptions() throws {
        let p = try #require(outcome(request([], requestLine: "OPTIONS * HTTP/1.1")).request)
        #expect(p.head.form == .asterisk)
        #expect(p.method == "OPTIONS")
        #expect(p.target == "*")
    }

    @Test(arguments: ["GET", "HEAD", "POST", "options"])
    func refusesAsteriskFormWithOtherMethods(method: String) {
        #expect(outcome(request([], requestLine: "\(method) * HTTP/1.1")).refusal == .asteriskFormNotOptions)
    }

    @Test(arguments: ["GE(T / HTTP/1.1", "G\"T / HTTP/1.1", "GE@T / HTTP/1.1", " GET / HTTP/1.1", "/ HTTP/1.1"])
    func refusesMethodThatIsNotAToken(line: String) {
        #expect(outcome(request([], requestLine: line)).refusal == .badMethod)
    }

    @Test(arguments: ["GET", "GET /", "GET / ", "GET\t/ HTTP/1.1"])
    func refusesIncompleteRequestLine(line: String) {
        let r = outcome(request([], requestLine: line)).refusal
        #expect([.badRequestLine, .badMethod, .badVersion].contains(r), "got \(String(describing: r))")
    }

    @Test(arguments: ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "X-Custom!"])
    func acceptsTokenMethods(method: String) throws {
        let p = try #require(outcome(request([], requestLine: "\(method) / HTTP/1.1")).request)
        #expect(p.method == method)
        #expect(p.head.isHead == (method == "HEAD"))
    }
}

// MARK: - Host (RFC 9112 section 3.2)

@Suite struct HostTests {
    @Test func refusesHTTP11RequestWithoutHost() {
        let o = outcome("GET / HTTP/1.1\r\nX-A: 1\r\n\r\n")
        #expect(o.refusal == .missingHost)
        #expect(o.refusal?.status == 400)
    }

    @Test func acceptsHTTP10RequestWithoutHost() throws {
        let p = try #require(outcome("GET / HTTP/1.0\r\n\r\n").request)
        #expect(p.head.host == nil)
        #expect(p.head.version == .http10)
    }

    @Test(arguments: [
        ["Host: a", "Host: b"], ["Host: a", "Host: a"], ["Host: a", "host: a"], ["HOST: a", "Host:"],
    ])
    func refusesRepeatedHost(lines: [String]) {
        let text = "GET / HTTP/1.1\r\n" + lines.joined(separator: "\r\n") + "\r\n\r\n"
        #expect(outcome(text).refusal == .repeatedHost)
    }

    @Test func refusesRepeatedHostOnHTTP10() {
        #expect(outcome("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n").refusal == .repeatedHost)
    }

    @Test(arguments: [
        "a b", "a/b", "x@y", "[::1", "host:port", "h:123456", "[]", "[::1]x", "[::1]:x", "a:b:c", "[::g]",
        "a?b", "a#b", "\"a\"", "a\\b",
    ])
    func refusesInvalidHost(value: String) {
        #expect(outcome(request([], host: value)).refusal == .invalidHost)
    }

    @Test func refusesInvalidHostOnHTTP10() {
        #expect(outcome("GET / HTTP/1.0\r\nHost: a b\r\n\r\n").refusal == .invalidHost)
    }

    @Test(arguments: [
        "example.com", "example.com:8080", "127.0.0.1:80", "[::1]:8080", "", "[::1]", "EXAMPLE.com",
        "xn--bcher-kva.example", "a-b_c~d", "example.com:", "h:65535", "[v1.fe80::a]", "%41bc",
    ])
    func acceptsValidHost(value: String) throws {
        let p = try #require(outcome(request([], host: value)).request)
        #expect(p.host == value)
    }

    @Test func hostValueIsTrimmed() throws {
        let p = try #require(outcome("GET / HTTP/1.1\r\nHost: \t example.com:80 \t\r\n\r\n").request)
        #expect(p.host == "example.com:80")
    }
}

// MARK: - HTTP version (RFC 9112 section 2.3)

@Suite struct VersionTests {
    @Test(arguments: [
        ("HTTP/1.0", HTTPVersion.http10), ("HTTP/1.1", .http11), ("HTTP/1.2", .http11), ("HTTP/1.9", .http11),
    ])
    func acceptsHTTP1Versions(version: String, expected: HTTPVersion) throws {
        let p = try #require(outcome(request([], requestLine: "GET / \(version)")).request)
        #expect(p.head.version == expected)
    }

    @Test(arguments: ["HTTP/2.0", "HTTP/3.0", "HTTP/0.9", "HTTP/9.9"])
    func refusesOtherMajorVersionsWith505(version: String) {
        let o = outcome(request([], requestLine: "GET / \(version)"))
        #expect(o.refusal == .unsupportedVersion)
        #expect(o.refusal?.status == 505)
    }

    @Test(arguments: [
        "HTTP/1.1x", "http/1.1", "Http/1.1", "HTTP/11", "HTTP/1", "HTTP/1.", "HTTP/1.x", "HTTP/a.1", "HTTP/1,1",
        "HTTPS/1.1", "HTTP/1.10", "HTTP 1.1", "HTTP/1.1/", "XTTP/1.1",
    ])
    func refusesMalformedVersion(version: String) {
        let r = outcome(request([], requestLine: "GET / \(version)")).refusal
        #expect(r == .badVersion || r == .badRequestLine, "got \(String(describing: r))")
    }
}

// MARK: - Limits

@Suite struct HeadLimitTests {
    @Test func refusesRequestLineOverLimitWith414() {
        let limits = RequestLimits(maxHeadBytes: 8192, maxRequestLineBytes: 64, maxBodyBytes: 1000)
        let line = "GET /" + String(repeating: "a", count: 64 - 14 + 1) + " HTTP/1.1"  // 65 bytes
        #expect(line.utf8.count == 65)
        let o = outcome(request([], requestLine: line), limits: limits)
        #expect(o.refusal == .requestLineTooLong)
        #expect(o.refusal?.status == 414)
    }

    @Test func acceptsRequestLineAtLimit() throws {
        let limits = RequestLimits(maxHeadBytes: 8192, maxRequestLineBytes: 64, maxBodyBytes: 1000)
        let line = "GET /" + String(repeating: "a", count: 64 - 14) + " HTTP/1.1"
        #expect(line.utf8.count == 64)
        let p = try #require(outcome(request([], requestLine: line), limits: limits).request)
        #expect(p.target.utf8.count == 51)
    }

    @Test func refusesOverlongRequestLineBeforeItEnds() {
        let limits = RequestLimits(maxHeadBytes: 8192, maxRequestLineBytes: 64, maxBodyBytes: 1000)
        let partial = "GET /" + String(repeating: "a", count: 100)
        #expect(scanWhole(Array(partial.utf8), limits: limits).refusal == .requestLineTooLong)
        #expect(scanByteByByte(Array(partial.utf8), limits: limits).refusal == .requestLineTooLong)
    }

    @Test func requestLineLimitDefaultsToHeadLimitWhenSmaller() {
        #expect(RequestLimits(maxHeadBytes: 100, maxBodyBytes: 1).maxRequestLineBytes == 100)
        #expect(RequestLimits(maxHeadBytes: 65536, maxBodyBytes: 1).maxRequestLineBytes == 8192)
    }

    @Test func refusesHeadOverLimitWith431() {
        let limits = RequestLimits(maxHeadBytes: 200, maxBodyBytes: 1000)
        let text = request(["X-Pad: " + String(repeating: "p", count: 200)])
        let o = outcome(text, limits: limits)
        #expect(o.refusal == .headTooLarge)
        #expect(o.refusal?.status == 431)
    }

    @Test func refusesOverlongHeadBeforeItIsComplete() {
        let limits = RequestLimits(maxHeadBytes: 200, maxBodyBytes: 1000)
        // Many short field lines and no empty line: the head never ends.
        let text = "GET / HTTP/1.1\r\nHost: x\r\n" + String(repeating: "X-A: 1\r\n", count: 40)
        #expect(text.utf8.count > 200)
        #expect(scanWhole(Array(text.utf8), limits: limits).refusal == .headTooLarge)
        #expect(scanByteByByte(Array(text.utf8), limits: limits).refusal == .headTooLarge)
        // ... and a prefix within the limit is merely incomplete.
        #expect(scanWhole(Array(text.utf8.prefix(200)), limits: limits) == .incomplete)
    }

    @Test func acceptsHeadExactlyAtLimit() throws {
        let base = request(["X-Pad: "])
        let limits = RequestLimits(maxHeadBytes: base.utf8.count + 10, maxBodyBytes: 1000)
        let text = request(["X-Pad: " + String(repeating: "p", count: 10)])
        #expect(text.utf8.count == limits.maxHeadBytes)
        _ = try #require(outcome(text, limits: limits).request)
        let over = request(["X-Pad: " + String(repeating: "p", count: 11)])
        #expect(outcome(over, limits: limits).refusal == .headTooLarge)
    }

    @Test func completeHeadFollowedByMoreBytesThanTheLimitIsAccepted() throws {
        // A head within the limit followed by a large pipelined body: the
        // body bytes do not count against the head.
        let limits = RequestLimits(maxHeadBytes: 100, maxBodyBytes: 1000)
        let head = request(["Content-Length: 500"])
        let text = head + String(repeating: "b", count: 500)
        let p = try #require(outcome(text, limits: limits).request)
        #expect(p.head.headLength == head.utf8.count)
    }

    @Test func requestLineLongerThanTheHeadLimitGivesTheSameAnswerWholeOrTrickled() {
        // With the request-line limit equal to the head limit, a request line
        // past both is refused as soon as the head limit is passed (431),
        // however the bytes arrived.
        let text = "GET /" + String(repeating: "a", count: 9000) + " HTTP/1.1\r\nHost: a\r\n\r\n"
        #expect(outcome(text).refusal == .headTooLarge)
        let partial = Array(text.utf8.prefix(8193))
        #expect(scanWhole(partial) == .refused(.headTooLarge))
    }

    @Test func refusesMoreFieldsThanTheLimit() {
        let limits = RequestLimits(maxHeadBytes: 8192, maxFields: 3, maxBodyBytes: 1000)
        let o = outcome(request(["X-A: 1", "X-B: 2", "X-C: 3"]), limits: limits)
        #expect(o.refusal == .tooManyFields)
        #expect(o.refusal?.status == 431)
    }

    @Test func acceptsExactlyTheFieldLimit() throws {
        let limits = RequestLimits(maxHeadBytes: 8192, maxFields: 3, maxBodyBytes: 1000)
        let p = try #require(outcome(request(["X-A: 1", "X-B: 2"]), limits: limits).request)
        #expect(p.fields.count == 3)
    }

    /// A bare LF (or another error) that lies beyond the head limit: fed
    /// whole or byte by byte, the answer must be the same (431).
    @Test(arguments: ["\n", "\rx", "\r\n\r\n"])
    func errorBeyondHeadLimitGivesTheSameAnswerWholeOrTrickled(tail: String) {
        let limits = RequestLimits(maxHeadBytes: 100, maxBodyBytes: 1000)
        let text = "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + String(repeating: "p", count: 120) + tail
        let whole = scanWhole(Array(text.utf8), limits: limits)
        let trickled = scanByteByByte(Array(text.utf8), limits: limits)
        #expect(whole == trickled)
        #expect(whole.refusal == .headTooLarge)
    }
}

// MARK: - Connection semantics

@Suite struct ConnectionSemanticsTests {
    @Test(arguments: [
        ("HTTP/1.1", String?.none, true),
        ("HTTP/1.1", "close", false),
        ("HTTP/1.1", "Close", false),
        ("HTTP/1.1", "keep-alive", true),
        ("HTTP/1.1", "x-a, close", false),
        ("HTTP/1.1", "x-a", true),
        ("HTTP/1.0", nil, false),
        ("HTTP/1.0", "keep-alive", true),
        ("HTTP/1.0", "Keep-Alive", true),
        ("HTTP/1.0", "x-a, keep-alive", true),
        ("HTTP/1.0", "keep-alive, close", false),
        ("HTTP/1.0", "close", false),
        ("HTTP/1.0", "x-a", false),
    ])
    func keepAliveFollowsVersionAndConnection(version: String, connection: String?, keepAlive: Bool) throws {
        let lines = connection.map { ["Connection: \($0)"] } ?? []
        let p = try #require(outcome(request(lines, requestLine: "GET / \(version)")).request)
        #expect(p.head.keepAlive == keepAlive)
    }

    @Test func keepAliveCombinesSeveralConnectionLines() throws {
        let p = try #require(outcome(request(["Connection: x-a", "Connection: close"])).request)
        #expect(!p.head.keepAlive)
        #expect(p.head.connectionNominatesFields)
    }

    @Test(arguments: [
        ("x-a", true), ("close", false), ("keep-alive, close", false), ("Keep-Alive", false), ("close, X-B", true),
        ("", false), (" , ", false),
    ])
    func connectionNominatesFieldsOnlyForOtherTokens(value: String, nominates: Bool) throws {
        let p = try #require(outcome(request(["Connection: \(value)"])).request)
        #expect(p.head.connectionNominatesFields == nominates)
    }

    @Test(arguments: [
        ("HTTP/1.1", ["Expect: 100-continue", "Content-Length: 5"], true),
        ("HTTP/1.1", ["Expect: 100-Continue", "Content-Length: 5"], true),
        ("HTTP/1.1", ["Expect: 100-continue", "Transfer-Encoding: chunked"], true),
        ("HTTP/1.1", ["Expect: 100-continue"], false),
        ("HTTP/1.1", ["Expect: 100-continue", "Content-Length: 0"], false),
        ("HTTP/1.1", ["Content-Length: 5"], false),
        ("HTTP/1.1", ["Expect: 200-ok", "Content-Length: 5"], false),
        ("HTTP/1.0", ["Expect: 100-continue", "Content-Length: 5"], false),
    ])
    func expectsContinueOnlyOnHTTP11WithABody(version: String, lines: [String], expected: Bool) throws {
        let p = try #require(outcome(request(lines, requestLine: "POST / \(version)")).request)
        #expect(p.head.expectsContinue == expected)
    }

    @Test func ignoresEmptyLinesBeforeTheRequestLine() throws {
        let text = "\r\n\r\n\r\nGET /x HTTP/1.1\r\nHost: a\r\n\r\n"
        let p = try #require(outcome(text).request)
        #expect(p.method == "GET")
        #expect(p.target == "/x")
        #expect(p.head.method.lowerBound == 6)
        #expect(p.head.headLength == text.utf8.count)
    }

    @Test func scannerIsNotStartedByEmptyLinesAlone() {
        var scanner = RequestHeadScanner()
        let empty = Array("\r\n\r\n".utf8)
        let r = empty.withUnsafeBytes { scanner.scan($0, limits: defaultLimits) }
        #expect(r == .incomplete)
        #expect(!scanner.started)
        #expect(scanner.requestStart == nil)
    }

    @Test func headLengthStopsAtTheEmptyLineAndLeavesPipelinedBytes() throws {
        let first = "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n"
        let text = first + "GET /2 HTTP/1.1\r\nHost: a\r\n\r\n"
        let p = try #require(scanWhole(Array(text.utf8)).request)
        #expect(p.head.headLength == first.utf8.count)
        #expect(p.target == "/1")
    }

    @Test func scannerResetStartsOverForTheNextRequest() {
        var scanner = RequestHeadScanner()
        let a = Array("GET /1 HTTP/1.1\r\nHost: a\r\n\r\n".utf8)
        let b = Array("POST /2 HTTP/1.1\r\nHost: b\r\n\r\n".utf8)
        #expect(a.withUnsafeBytes { scanner.scan($0, limits: defaultLimits) } == .complete(requestStart: 0, end: a.count))
        scanner.reset()
        #expect(b.withUnsafeBytes { scanner.scan($0, limits: defaultLimits) } == .complete(requestStart: 0, end: b.count))
    }
}

// MARK: - Scanner linearity

@Suite struct ScannerLinearityTests {
    static let heads: [String] = [
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "\r\n\r\nPOST /p?q HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
        "GET / HTTP/1.1\r\nHost: a\r\nX-A: \r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\rX\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n",
        "GET /" + String(repeating: "a", count: 9000) + " HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\n" + String(repeating: "X-Long: 0123456789\r\n", count: 500) + "\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n\r",
    ]

    // Indices rather than the heads themselves, to keep the test log short.
    @Test(arguments: heads.indices)
    func scanningByteByByteMatchesScanningWhole(index: Int) {
        let input = Array(Self.heads[index].utf8)
        #expect(scanWhole(input) == scanByteByByte(input))
    }

    @Test(arguments: heads.indices.filter { heads[$0].utf8.count < 2000 })
    func scannerAnswersIdenticallyForEveryPrefixLength(index: Int) {
        // The raw scanner results, not just the parse: for each prefix, a
        // fresh scanner given the prefix at once must agree with the one
        // that has been fed the bytes one at a time.
        let input = Array(Self.heads[index].utf8)
        var trickled = RequestHeadScanner()
        var stopped = false
        for n in 1...input.count where !stopped {
            let prefix = Array(input[0..<n])
            let a = prefix.withUnsafeBytes { trickled.scan($0, limits: defaultLimits) }
            var fresh = RequestHeadScanner()
            let b = prefix.withUnsafeBytes { fresh.scan($0, limits: defaultLimits) }
            #expect(a == b, "prefix length \(n)")
            if a != .incomplete { stopped = true }
        }
    }

    @Test func largeHeadTrickledByteByByteCompletes() throws {
        // 32 KB of head, one byte per call: linear scanning keeps this cheap.
        let limits = RequestLimits(maxHeadBytes: 64 * 1024, maxFields: 2000, maxBodyBytes: 1000)
        let text = "GET / HTTP/1.1\r\nHost: a\r\n" + String(repeating: "X-Field: 0123456789abcdef\r\n", count: 1300) + "\r\n"
        #expect(text.utf8.count > 32 * 1024)
        let p = try #require(scanByteByByte(Array(text.utf8), limits: limits).request)
        #expect(p.fields.count == 1301)
    }
}

// MARK: - Refusal metadata

@Suite struct RefusalStatusTests {
    @Test(arguments: [
        (HTTP1Refusal.requestLineTooLong, 414), (.headTooLarge, 431), (.tooManyFields, 431), (.trailersTooLarge, 431),
        (.bodyTooLarge, 413), (.unsupportedTransferCoding, 501), (.unsupportedVersion, 505), (.headTimeout, 408),
        (.bodyTimeout, 408), (.badContentLength, 400), (.chunkedNotFinal, 400), (.bareLineFeed, 400),
        (.missingHost, 400), (.badChunkSize, 400),
    ])
    func refusalMapsToStatus(refusal: HTTP1Refusal, status: Int) {
        #expect(refusal.status == status)
    }

    @Test func everyRefusalHasADistinctReasonAndADetail() {
        let reasons = HTTP1Refusal.allCases.map(\.rawValue)
        #expect(Set(reasons).count == reasons.count)
        for r in HTTP1Refusal.allCases {
            #expect(!r.detail.isEmpty)
            #expect((400...599).contains(r.status))
        }
    }
}

@Suite struct ByteClassTests {
    /// The constant masks of HTTPBytes, byte by byte, against the grammar.
    @Test func masksMatchTheGrammar() {
        for b in 0...255 {
            let c = UInt8(b)
            let alnum = (0x30...0x39).contains(b) || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b)
            #expect(HTTPBytes.isToken(c) == (alnum || "!#$%&'*+-.^_`|~".utf8.contains(c)), "token \(b)")
            #expect(HTTPBytes.isFieldValue(c) == (b == 0x09 || (b >= 0x20 && b != 0x7F)), "field value \(b)")
            #expect(HTTPBytes.isTarget(c) == (b > 0x20 && b < 0x7F && b != 0x23), "target \(b)")
            #expect(HTTPBytes.isRegName(c) == (alnum || "-._~%!$&'()*+,;=".utf8.contains(c)), "reg-name \(b)")
        }
    }
}
