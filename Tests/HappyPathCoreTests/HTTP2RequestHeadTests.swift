import Testing

@testable import HappyPathCore

/// HTTP2RequestHeadReader: RFC 9113 sections 8.2 and 8.3 on decoded fields,
/// the proxy's limits, and the head in HTTP/1.1's terms. Each rule has its
/// valid and invalid rows.
@Suite struct HTTP2RequestHeadTests {
    typealias Fields = [(String, String)]

    static let limits = RequestLimits(maxHeadBytes: 8192, maxFields: 100, maxBodyBytes: 1_000_000)

    /// A GET with every pseudo-header, then `rest`.
    static func get(_ path: String = "/", authority: String? = "example.com", scheme: String = "https", _ rest: Fields = [])
        -> Fields
    {
        [(":method", "GET"), (":scheme", scheme), (":path", path)] + (authority.map { [(":authority", $0)] } ?? []) + rest
    }

    func read(_ fields: Fields, _ limits: RequestLimits = limits) -> Result<HTTP2RequestHead, HTTP2RequestRefusal> {
        HTTP2RequestHeadReader.read(fields, limits: limits)
    }

    func fieldLines(_ head: HTTP2RequestHead) -> [String] { head.httpFields.map { "\($0.name): \($0.value)" } }

    // MARK: - Valid heads

    struct Valid: Sendable, CustomTestStringConvertible {
        var name: String
        var fields: Fields
        var method = "GET"
        var target: String
        var lines: [String]
        var testDescription: String { name }
    }

    static let valid: [Valid] = [
        Valid(
            name: ":authority becomes the first field, host", fields: get("/a?b=1", [("accept", "*/*")]),
            target: "/a?b=1", lines: ["host: example.com", "accept: */*"]),
        Valid(
            name: "a host field stands in for :authority, moved first",
            fields: get("/", authority: nil, scheme: "http", [("accept", "*/*"), ("host", "a.example")]),
            target: "/", lines: ["host: a.example", "accept: */*"]),
        Valid(
            name: ":authority and host agreeing: one host, :authority's",
            fields: get("/", [("host", "EXAMPLE.com:443"), ("x", "1")]),
            target: "/", lines: ["host: example.com", "x: 1"]),
        Valid(
            name: "the default port of http is the same as none",
            fields: get("/", authority: "a.example:80", scheme: "http", [("host", "a.example")]),
            target: "/", lines: ["host: a.example:80"]),
        Valid(
            name: "an empty port is the same as none",
            fields: get("/", authority: "a.example:", [("host", "a.example")]),
            target: "/", lines: ["host: a.example:"]),
        Valid(
            name: "an IP literal with a port", fields: get("/", authority: "[::1]:8443", [("host", "[::1]:8443")]),
            target: "/", lines: ["host: [::1]:8443"]),
        Valid(
            name: "cookie crumbs joined with '; ' where the first came (RFC 9113 section 8.2.3)",
            fields: get("/", [("cookie", "a=1"), ("x", "y"), ("cookie", "b=2"), ("cookie", "c=3")]),
            target: "/", lines: ["host: example.com", "cookie: a=1; b=2; c=3", "x: y"]),
        Valid(
            name: "one cookie stays as it is", fields: get("/", [("cookie", "a=1; b=2")]),
            target: "/", lines: ["host: example.com", "cookie: a=1; b=2"]),
        Valid(
            name: "the path normalized as HTTP/1.1's, the query untouched",
            fields: get("/a/../b/./c%7e?x=/../"), target: "/b/c~?x=/../", lines: ["host: example.com"]),
        Valid(
            name: "OPTIONS *", fields: [(":method", "OPTIONS"), (":scheme", "http"), (":path", "*"), (":authority", "a")],
            method: "OPTIONS", target: "*", lines: ["host: a"]),
        Valid(
            name: "OPTIONS with a path",
            fields: [(":method", "OPTIONS"), (":scheme", "http"), (":path", "/x"), (":authority", "a")],
            method: "OPTIONS", target: "/x", lines: ["host: a"]),
        Valid(
            name: "te: trailers is allowed and kept", fields: get("/", [("te", "trailers")]),
            target: "/", lines: ["host: example.com", "te: trailers"]),
        Valid(
            name: "pseudo-headers in any order",
            fields: [(":path", "/p"), (":authority", "a"), (":scheme", "http"), (":method", "POST")],
            method: "POST", target: "/p", lines: ["host: a"]),
        Valid(
            name: "an extension method",
            fields: [(":method", "PURGE"), (":scheme", "http"), (":path", "/"), (":authority", "a")],
            method: "PURGE", target: "/", lines: ["host: a"]),
        Valid(
            name: "an empty value and obs-text are field values",
            fields: get("/", [("x-empty", ""), ("x-text", "caf\u{e9} a\tb")]),
            target: "/", lines: ["host: example.com", "x-empty: ", "x-text: caf\u{e9} a\tb"]),
        Valid(
            name: "content-length is read and kept",
            fields: [
                (":method", "POST"), (":scheme", "http"), (":path", "/"),
                (":authority", "a"), ("content-length", "5"),
            ],
            method: "POST", target: "/", lines: ["host: a", "content-length: 5"]),
    ]

    @Test(arguments: valid)
    func readsAValidHead(row: Valid) throws {
        let head = try read(row.fields).get()
        #expect(head.method == row.method)
        #expect(head.target == row.target)
        #expect(fieldLines(head) == row.lines)
        #expect(head.isAsteriskForm == (row.target == "*"))
    }

    @Test func theHeadSaysWhatElseItKnows() throws {
        let head = try read([
            (":method", "HEAD"), (":scheme", "HTTPS"), (":path", "/"), (":authority", "a"), ("content-length", "0"),
        ]).get()
        #expect(head.isHead)
        #expect(head.scheme == "https")
        #expect(head.contentLength == 0)
        // name + value + 32 per field, pseudo-headers included (RFC 9113 section 6.5.2).
        #expect(head.size == (7 + 4 + 32) + (7 + 5 + 32) + (5 + 1 + 32) + (10 + 1 + 32) + (14 + 1 + 32))
        let get = try read(Self.get()).get()
        #expect(!get.isHead)
        #expect(get.contentLength == nil)
        #expect(get.connectProtocol == nil)
    }

    /// RFC 8441: an extended CONNECT is read as the GET it becomes upstream, its protocol kept.
    @Test func anExtendedConnectIsTheGETItBecomes() throws {
        let head = try read([(":method", "CONNECT"), (":protocol", "WebSocket")] + Array(Self.get("/chat?room=1").dropFirst())).get()
        #expect(head.method == "GET")
        #expect(head.connectProtocol == "websocket")
        #expect(head.target == "/chat?room=1")
        #expect(fieldLines(head) == ["host: example.com"])
    }

    // MARK: - Refused heads

    struct Invalid: Sendable, CustomTestStringConvertible {
        var name: String
        var fields: Fields
        var refusal: HTTP2RequestRefusal
        var limits = HTTP2RequestHeadTests.limits
        var testDescription: String { name }
    }

    static let post: Fields = [(":method", "POST"), (":scheme", "http"), (":path", "/"), (":authority", "a")]

    static let invalid: [Invalid] = [
        // Required pseudo-headers (RFC 9113 section 8.3.1)
        Invalid(
            name: "no :method", fields: [(":scheme", "http"), (":path", "/"), (":authority", "a")],
            refusal: .malformed(.missingPseudoHeader)),
        Invalid(
            name: "no :scheme", fields: [(":method", "GET"), (":path", "/"), (":authority", "a")],
            refusal: .malformed(.missingPseudoHeader)),
        Invalid(
            name: "no :path", fields: [(":method", "GET"), (":scheme", "http"), (":authority", "a")],
            refusal: .malformed(.missingPseudoHeader)),
        Invalid(name: "no pseudo-header at all", fields: [("host", "a")], refusal: .malformed(.missingPseudoHeader)),
        Invalid(name: "neither :authority nor host", fields: get("/", authority: nil), refusal: .http1(.missingHost)),
        // Unknown, repeated, late pseudo-headers (RFC 9113 section 8.3)
        Invalid(name: ":status in a request", fields: [(":status", "200")] + get(), refusal: .malformed(.unknownPseudoHeader)),
        Invalid(
            name: ":protocol (no extended CONNECT)", fields: get() + [(":protocol", "websocket")],
            refusal: .malformed(.badProtocol)),
        Invalid(
            name: "an extended CONNECT without :authority",
            fields: [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/ws")],
            refusal: .malformed(.missingPseudoHeader)),
        Invalid(
            name: "an extended CONNECT without :path",
            fields: [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":authority", "a")],
            refusal: .malformed(.missingPseudoHeader)),
        Invalid(
            name: ":protocol twice", fields: [(":method", "CONNECT"), (":protocol", "websocket"), (":protocol", "websocket")] + Array(get().dropFirst()),
            refusal: .malformed(.repeatedPseudoHeader)),
        Invalid(
            name: "a :protocol that is no token", fields: [(":method", "CONNECT"), (":protocol", "web socket")] + Array(get().dropFirst()),
            refusal: .malformed(.badProtocol)),
        Invalid(name: "an unknown pseudo-header", fields: [(":foo", "x")] + get(), refusal: .malformed(.unknownPseudoHeader)),
        Invalid(name: "a lone colon", fields: [(":", "x")] + get(), refusal: .malformed(.unknownPseudoHeader)),
        Invalid(name: ":path twice", fields: get() + [(":path", "/b")], refusal: .malformed(.repeatedPseudoHeader)),
        Invalid(name: ":method twice", fields: [(":method", "GET")] + get(), refusal: .malformed(.repeatedPseudoHeader)),
        Invalid(
            name: ":authority twice", fields: get() + [(":authority", "example.com")], refusal: .malformed(.repeatedPseudoHeader)),
        Invalid(
            name: "a pseudo-header after a regular field",
            fields: [(":method", "GET"), (":scheme", "http"), ("accept", "*/*"), (":path", "/"), (":authority", "a")],
            refusal: .malformed(.pseudoHeaderAfterField)),
        // :method
        Invalid(name: "an empty :method", fields: [(":method", "")] + Array(get().dropFirst()), refusal: .http1(.badMethod)),
        Invalid(
            name: "a :method that is no token", fields: [(":method", "G T")] + Array(get().dropFirst()),
            refusal: .http1(.badMethod)),
        Invalid(
            name: "CONNECT, as HTTP/1.1 refuses it", fields: [(":method", "CONNECT"), (":authority", "a:443")],
            refusal: .http1(.connectMethod)),
        Invalid(
            name: "CONNECT with a path", fields: [(":method", "CONNECT")] + Array(get().dropFirst()),
            refusal: .http1(.connectMethod)),
        // :scheme
        Invalid(name: "an ftp :scheme", fields: get(scheme: "ftp"), refusal: .malformed(.badScheme)),
        Invalid(name: "an empty :scheme", fields: get(scheme: ""), refusal: .malformed(.badScheme)),
        // :path
        Invalid(name: "an empty :path", fields: get(""), refusal: .malformed(.badPath)),
        Invalid(name: "a relative :path", fields: get("a/b"), refusal: .malformed(.badPath)),
        Invalid(name: "an absolute URI as :path", fields: get("http://a/b"), refusal: .malformed(.badPath)),
        Invalid(name: "a space in :path", fields: get("/a b"), refusal: .http1(.badTarget)),
        Invalid(name: "a fragment in :path", fields: get("/a#b"), refusal: .http1(.badTarget)),
        Invalid(name: "non-ASCII in :path", fields: get("/caf\u{e9}"), refusal: .http1(.badTarget)),
        Invalid(name: "* with GET", fields: get("*"), refusal: .http1(.asteriskFormNotOptions)),
        Invalid(name: "a path above the root", fields: get("/a/../../etc/passwd"), refusal: .http1(.pathAboveRoot)),
        Invalid(name: "a bad percent-encoding", fields: get("/%zz"), refusal: .http1(.badPercentEncoding)),
        Invalid(name: "a dot-segment with parameters", fields: get("/a/..;x/b"), refusal: .http1(.dotSegmentParameters)),
        Invalid(
            name: "an encoded slash when the listener refuses them", fields: get("/a%2Fb"), refusal: .http1(.encodedSlash),
            limits: RequestLimits(maxHeadBytes: 8192, maxBodyBytes: 100, path: PathNormalization(encodedSlashes: .reject))),
        // :authority and host
        Invalid(name: "an empty :authority", fields: get(authority: ""), refusal: .http1(.invalidHost)),
        Invalid(name: "userinfo in :authority", fields: get(authority: "user@a.example"), refusal: .http1(.invalidHost)),
        Invalid(name: "a space in :authority", fields: get(authority: "a b"), refusal: .http1(.invalidHost)),
        Invalid(name: "a port that is no number", fields: get(authority: "a:http"), refusal: .http1(.invalidHost)),
        Invalid(name: "an empty host", fields: get(authority: nil, [("host", "")]), refusal: .http1(.invalidHost)),
        Invalid(name: "two hosts", fields: get(authority: nil, [("host", "a"), ("host", "a")]), refusal: .http1(.repeatedHost)),
        Invalid(
            name: "host names another host", fields: get(authority: "a.example", [("host", "b.example")]),
            refusal: .malformed(.authorityMismatch)),
        Invalid(
            name: "host names another port", fields: get(authority: "a.example:8080", [("host", "a.example")]),
            refusal: .malformed(.authorityMismatch)),
        Invalid(
            name: "http's default port is not https's",
            fields: get(authority: "a.example:80", scheme: "https", [("host", "a.example")]),
            refusal: .malformed(.authorityMismatch)),
        Invalid(
            name: "host has a port :authority lacks", fields: get(authority: "a.example", [("host", "a.example:1")]),
            refusal: .malformed(.authorityMismatch)),
        // Connection-specific fields (RFC 9113 section 8.2.2)
        Invalid(
            name: "connection", fields: get("/", [("connection", "keep-alive")]), refusal: .malformed(.connectionSpecificField)),
        Invalid(
            name: "keep-alive", fields: get("/", [("keep-alive", "timeout=5")]), refusal: .malformed(.connectionSpecificField)),
        Invalid(
            name: "proxy-connection", fields: get("/", [("proxy-connection", "close")]),
            refusal: .malformed(.connectionSpecificField)),
        Invalid(
            name: "transfer-encoding", fields: get("/", [("transfer-encoding", "chunked")]),
            refusal: .malformed(.connectionSpecificField)),
        Invalid(name: "upgrade", fields: get("/", [("upgrade", "h2c")]), refusal: .malformed(.connectionSpecificField)),
        Invalid(
            name: "te other than trailers", fields: get("/", [("te", "gzip")]), refusal: .malformed(.connectionSpecificField)),
        Invalid(
            name: "te with trailers and more", fields: get("/", [("te", "trailers, gzip")]),
            refusal: .malformed(.connectionSpecificField)),
        // Names and values (RFC 9113 section 8.2.1)
        Invalid(name: "an upper-case name", fields: get("/", [("Accept", "*/*")]), refusal: .malformed(.uppercaseFieldName)),
        Invalid(
            name: "an upper-case pseudo-header", fields: [(":Method", "GET")] + get(), refusal: .malformed(.uppercaseFieldName)),
        Invalid(name: "an empty name", fields: get("/", [("", "x")]), refusal: .http1(.badFieldName)),
        Invalid(name: "a space in a name", fields: get("/", [("x y", "1")]), refusal: .http1(.badFieldName)),
        Invalid(name: "a colon inside a name", fields: get("/", [("x:y", "1")]), refusal: .http1(.badFieldName)),
        Invalid(name: "CRLF in a value", fields: get("/", [("x", "a\r\nevil: 1")]), refusal: .http1(.badFieldValue)),
        Invalid(name: "NUL in a value", fields: get("/", [("x", "a\u{0}b")]), refusal: .http1(.badFieldValue)),
        Invalid(name: "a control byte in a value", fields: get("/", [("x", "a\u{7f}")]), refusal: .http1(.badFieldValue)),
        Invalid(name: "leading whitespace", fields: get("/", [("x", " a")]), refusal: .http1(.badFieldValue)),
        Invalid(name: "trailing whitespace", fields: get("/", [("x", "a\t")]), refusal: .http1(.badFieldValue)),
        Invalid(name: "whitespace around :path", fields: get("/a "), refusal: .http1(.badFieldValue)),
        // content-length
        Invalid(
            name: "a content-length that is no number", fields: post + [("content-length", "5x")],
            refusal: .http1(.badContentLength)),
        Invalid(
            name: "content-lengths that differ", fields: post + [("content-length", "5"), ("content-length", "6")],
            refusal: .http1(.conflictingContentLength)),
        Invalid(
            name: "a content-length over the body limit", fields: post + [("content-length", "1000001")],
            refusal: .http1(.bodyTooLarge)),
        Invalid(
            name: "a content-length of 19 digits", fields: post + [("content-length", "9999999999999999999")],
            refusal: .http1(.badContentLength)),
    ]

    @Test(arguments: invalid)
    func refusesAnInvalidHead(row: Invalid) {
        #expect(read(row.fields, row.limits).failure == row.refusal)
    }

    @Test func theFirstReasonIsTheOneGiven() {
        // Each of these would be refused on its own; the earliest wins.
        let fields: Fields = [(":status", "200"), ("Connection", "x"), ("x", "\r")] + Self.get()
        #expect(read(fields).failure == .malformed(.unknownPseudoHeader))
    }

    // MARK: - Limits

    /// :method GET (42 bytes counted), :scheme https (44), :path / (38), :authority a (43): 167.
    static let smallHead: Fields = get("/", authority: "a")

    @Test(arguments: [(167, true), (166, false)])
    func theHeaderBytesLimitIsInclusive(limit: Int, accepted: Bool) {
        let limits = RequestLimits(maxHeadBytes: limit, maxFields: 100, maxBodyBytes: 100)
        let result = read(Self.smallHead, limits)
        #expect(result.failure == (accepted ? nil : .http1(.headTooLarge)))
        #expect(HTTP2RequestRefusal.http1(.headTooLarge).status == 431)
    }

    @Test func aLargeValueIsRefusedWith431() {
        let limits = RequestLimits(maxHeadBytes: 1024, maxFields: 100, maxBodyBytes: 100)
        #expect(read(Self.get("/", [("x", String(repeating: "a", count: 1000))]), limits).failure == .http1(.headTooLarge))
    }

    /// Regular fields against `maxFields`: `:authority` counts as the host
    /// field it becomes, a cookie's crumbs as the one cookie they become.
    @Test(arguments: [
        (get("/", [("a", "1"), ("b", "2")]), 3, nil),
        (get("/", [("a", "1"), ("b", "2"), ("c", "3")]), 3, HTTP2RequestRefusal.http1(.tooManyFields)),
        (get("/", authority: nil, [("a", "1"), ("b", "2"), ("host", "h")]), 3, nil),
        (get("/", authority: nil, [("a", "1"), ("b", "2"), ("c", "3"), ("host", "h")]), 3, .http1(.tooManyFields)),
        (get("/", [("host", "example.com"), ("b", "2")]), 2, nil),
        (get("/", [("cookie", "a"), ("cookie", "b"), ("cookie", "c"), ("cookie", "d")]), 2, nil),
        (get("/", [("cookie", "a"), ("x", "b"), ("cookie", "c")]), 2, .http1(.tooManyFields)),
        (get("/", []), 0, .http1(.tooManyFields)),
    ])
    func theFieldCountLimit(fields: Fields, maxFields: Int, refusal: HTTP2RequestRefusal?) {
        let limits = RequestLimits(maxHeadBytes: 8192, maxFields: maxFields, maxBodyBytes: 100)
        #expect(read(fields, limits).failure == refusal)
    }

    @Test func farPastTheLimitTheStreamIsReset() {
        // An HPACK bomb: the same 100-byte value again and again.
        let limits = RequestLimits(maxHeadBytes: 1000, maxFields: 1000, maxBodyBytes: 100)
        var reader = HTTP2RequestHeadReader(limits: limits)
        for (name, value) in Self.get() { #expect(reader.add(name, value) == .proceed) }
        var verdicts: [HTTP2RequestHeadReader.Verdict] = []
        for _ in 0..<40 { verdicts.append(reader.add("x", String(repeating: "v", count: 100))) }
        // Each costs 133 bytes; past 4 × 1000 (the 29th, on top of the pseudo-headers' 177) the reader gives up.
        let firstReset = verdicts.firstIndex(of: .resetStream)
        #expect(firstReset == 28)
        #expect(reader.refusal == .http1(.headTooLarge))
        #expect(reader.finish().failure == .http1(.headTooLarge))
    }

    @Test func oneFieldFarPastTheLimitIsRefusedAndReset() {
        // A single 16 KiB value against a 1,000-byte limit: reset at once, and refused if asked.
        var reader = HTTP2RequestHeadReader(limits: RequestLimits(maxHeadBytes: 1000, maxBodyBytes: 100))
        #expect(reader.add(":method", "GET") == .proceed)
        #expect(reader.add("x", String(repeating: "v", count: 16384)) == .resetStream)
        #expect(reader.refusal == .http1(.headTooLarge))
        #expect(reader.finish().failure == .http1(.headTooLarge))
    }

    @Test func theCountsSaturateInsteadOfTrapping() {
        let limits = RequestLimits(maxHeadBytes: Int.max, maxFields: Int.max, maxBodyBytes: Int.max)
        var reader = HTTP2RequestHeadReader(limits: limits)
        for (name, value) in Self.get() { #expect(reader.add(name, value) == .proceed) }
        #expect(HTTP2RequestHeadReader.saturatingAdd(Int.max - 1, 32) == Int.max)
        #expect(reader.add("x", "y") == .proceed)
        #expect((try? reader.finish().get())?.target == "/")
    }

    @Test func aRefusedHeadIsStillCounted() {
        var reader = HTTP2RequestHeadReader(limits: Self.limits)
        #expect(reader.add("connection", "close") == .proceed)
        let before = reader.size
        #expect(reader.add("x", "12345") == .proceed)
        #expect(reader.size == before + 1 + 5 + 32)
        #expect(reader.refusal == .malformed(.connectionSpecificField))
    }

    // MARK: - Authorities

    @Test(arguments: [
        ("a.example", "a.example", "443", true),
        ("A.Example", "a.EXAMPLE", "443", true),
        ("a.example:443", "a.example", "443", true),
        ("a.example", "a.example:443", "443", true),
        ("a.example:", "a.example:443", "443", true),
        ("a.example:80", "a.example", "80", true),
        ("[::1]", "[::1]:443", "443", true),
        ("[::1]:8443", "[::1]:8443", "443", true),
        ("a.example:80", "a.example", "443", false),
        ("a.example:8080", "a.example:8081", "443", false),
        ("a.example", "b.example", "443", false),
        ("[::1]", "[::2]", "443", false),
        ("a.example", "a.example.", "443", false),
    ])
    func authoritiesCompareUnderSchemeBasedNormalization(a: String, b: String, port: String, same: Bool) {
        var a = a
        var b = b
        let result = a.withUTF8 { x in
            b.withUTF8 { y in
                port == "443"
                    ? HTTP2RequestHeadReader.sameEntity(UnsafeRawBufferPointer(x), UnsafeRawBufferPointer(y), defaultPort: "443")
                    : HTTP2RequestHeadReader.sameEntity(UnsafeRawBufferPointer(x), UnsafeRawBufferPointer(y), defaultPort: "80")
            }
        }
        #expect(result == same)
    }

    // MARK: - Refusals

    @Test func refusalsShareHTTP1sLabelsAndStatuses() {
        #expect(HTTP2RequestRefusal.http1(.headTooLarge).label == "head_too_large")
        #expect(HTTP2RequestRefusal.http1(.tooManyFields).status == 431)
        #expect(HTTP2RequestRefusal.http1(.bodyTooLarge).status == 413)
        #expect(HTTP2RequestRefusal.http1(.connectMethod).detail == HTTP1Refusal.connectMethod.detail)
        let http1Labels = Set(HTTP1Refusal.allCases.map(\.rawValue))
        for rule in HTTP2Malformation.allCases {
            let refusal = HTTP2RequestRefusal.malformed(rule)
            #expect(!http1Labels.contains(refusal.label), "\(rule) has a label of its own")
            #expect(refusal.status == 400)
            #expect(!refusal.detail.isEmpty)
        }
        #expect(Set(HTTP2Malformation.allCases.map(\.rawValue)).count == HTTP2Malformation.allCases.count)
    }
}

extension Result {
    var failure: Failure? {
        if case let .failure(f) = self { return f }
        return nil
    }
}
