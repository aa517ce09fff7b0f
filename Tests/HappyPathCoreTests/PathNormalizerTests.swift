import HappyPathCore
import Testing

// PathNormalizer: RFC 3986 section 5.2.4 remove_dot_segments (with a climb
// above the root refused), unreserved characters decoded, encoded slashes
// never decoded; and the parser applying it before anything routes.

@Suite struct PathNormalizerTests {
    @Test(arguments: [
        ("/", "/"),
        ("/a/b/c", "/a/b/c"),
        ("/a/./b", "/a/b"),
        ("/a/b/../c", "/a/c"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("/a/..", "/"),
        ("/.", "/"),
        ("/a/b/c/./../../g", "/a/g"),
        ("/public/%2e%2e/secret", "/secret"),
        ("/public/%2E%2e/secret", "/secret"),
        ("/public/.%2e/secret", "/secret"),
        ("/%41%62c", "/Abc"),
        ("/a%7Eb%5f%2D", "/a~b_-"),
        ("/a//b", "/a//b"),
        ("/a//../b", "/a/b"),
        ("//../x", "/x"),
        ("/a/...", "/a/..."),
        ("/a/..b/.c", "/a/..b/.c"),
        ("/a%2Fb", "/a%2Fb"),
        ("/a%2f..%2fb", "/a%2f..%2fb"),
        ("/a/%2e%2e%2f", "/a/..%2f"),
        ("/%252e%252e/x", "/%252e%252e/x"),
        ("/caf%C3%A9", "/caf%C3%A9"),
        ("/a\\..\\b", "/a\\..\\b"),
    ])
    func normalizesLikeRFC3986(input: String, expected: String) {
        #expect(PathNormalizer.normalize(input) == .success(expected))
    }

    @Test(arguments: ["/..", "/../x", "/a/../../x", "/%2e%2e/x", "/a/b/../../..", "/public/../../secret"])
    func refusesAClimbAboveTheRoot(input: String) {
        #expect(PathNormalizer.normalize(input) == .failure(.pathAboveRoot))
    }

    @Test(arguments: ["/..;/x", "/a/..;jsessionid=1/x", "/.;/x", "/a/%2e%2e;/x", "/a/.%2e;x", "/a/..;"])
    func refusesDotSegmentsWithParameters(input: String) {
        #expect(PathNormalizer.normalize(input) == .failure(.dotSegmentParameters))
    }

    @Test(arguments: ["/a;b/c", "/a/b;v=1", "/...;x", "/.x;y"])
    func keepsOtherSegmentsWithParameters(input: String) {
        #expect(PathNormalizer.normalize(input) == .success(input))
    }

    @Test(arguments: ["/%", "/a%2", "/a%zz", "/%G0/x", "/a%2/b"])
    func refusesBadPercentEncoding(input: String) {
        #expect(PathNormalizer.normalize(input) == .failure(.badPercentEncoding))
    }

    @Test(arguments: [
        ("/a//b", "/a/b"), ("//a///b//", "/a/b/"), ("//", "/"), ("/a/.//b", "/a/b"), ("/a//..", "/"),
    ])
    func mergesSlashesWhenAsked(input: String, expected: String) {
        let merge = PathNormalization(mergeSlashes: true)
        #expect(PathNormalizer.normalize(input, merge) == .success(expected))
    }

    @Test(arguments: ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb", "/a\\b"])
    func refusesEncodedSlashesWhenAsked(input: String) {
        #expect(PathNormalizer.normalize(input) == .success(input))
        let reject = PathNormalization(encodedSlashes: .reject)
        #expect(PathNormalizer.normalize(input, reject) == .failure(.encodedSlash))
    }

    /// No output ever holds a dot-segment, encoded or not: whatever the
    /// input, the upstream cannot be sent `.` or `..`.
    @Test func outputNeverHoldsADotSegment() {
        let alphabet = ["/", ".", "%2e", "%2E", "a", "%41", "//", "%2f"]
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<20_000 {
            var path = "/"
            for _ in 0..<Int(state % 9) {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                path += alphabet[Int(state >> 33) % alphabet.count]
            }
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            for options in [PathNormalization(), PathNormalization(mergeSlashes: true)] {
                guard case let .success(out) = PathNormalizer.normalize(path, options) else { continue }
                let segments = out.split(separator: "/", omittingEmptySubsequences: false)
                #expect(!segments.contains { PathNormalizer.isDotSegment($0) }, "\(path) → \(out)")
                #expect(!out.lowercased().contains("%2e"), "\(path) → \(out)")
                #expect(out.hasPrefix("/"))
                // Normalizing is idempotent.
                #expect(PathNormalizer.normalize(out, options) == .success(out), "\(path) → \(out)")
                if options.mergeSlashes { #expect(!out.contains("//"), "\(path) → \(out)") }
            }
        }
    }
}

@Suite struct ParserPathTests {
    @Test func normalizesThePathAndKeepsTheQuery() throws {
        let p = try #require(outcome("GET /a/./b/../c?x=/../y HTTP/1.1\r\nHost: h\r\n\r\n").request)
        #expect(p.normalizedPath == "/a/c")
        #expect(p.pathAndQuery == "/a/./b/../c?x=/../y")
    }

    @Test func leavesANormalPathAloneWithoutACopy() throws {
        let p = try #require(outcome("GET /a/b?q=.. HTTP/1.1\r\nHost: h\r\n\r\n").request)
        #expect(p.normalizedPath == nil)
    }

    @Test func normalizesAnAbsoluteFormPath() throws {
        let p = try #require(outcome("GET http://h/x/%2e%2e/y HTTP/1.1\r\nHost: h\r\n\r\n").request)
        #expect(p.normalizedPath == "/y")
    }

    @Test(arguments: [
        ("GET /../x HTTP/1.1", HTTP1Refusal.pathAboveRoot),
        ("GET /a/%2e%2e/%2e%2e/x HTTP/1.1", .pathAboveRoot),
        ("GET http://h/../x HTTP/1.1", .pathAboveRoot),
        ("GET /a%zz HTTP/1.1", .badPercentEncoding),
    ])
    func refusesPathsBeforeRouting(line: String, refusal: HTTP1Refusal) {
        #expect(outcome(request([], requestLine: line)).refusal == refusal)
        #expect(refusal.status == 400)
    }

    @Test func encodedSlashesFollowTheLimit() {
        let text = request([], requestLine: "GET /a%2Fb HTTP/1.1")
        #expect(outcome(text).request != nil)
        var limits = defaultLimits
        limits.path = PathNormalization(encodedSlashes: .reject)
        #expect(outcome(text, limits: limits).refusal == .encodedSlash)
    }
}

// MARK: - The request line is judged when it ends (HTTP/0.9)

@Suite struct RequestLineAtOnceTests {
    /// An HTTP/0.9 request is one line with no version and no head after
    /// it: the scanner refuses it as soon as the line ends, without
    /// waiting for the empty line that will never come.
    @Test(arguments: [
        ("GET /p\r\n", HTTP1Refusal.badRequestLine),
        ("GET\r\n", .badRequestLine),
        ("GET /p HTTP/2.0\r\n", .unsupportedVersion),
        ("GET /p HTTX/1.1\r\n", .badVersion),
        ("GET /p  HTTP/1.1\r\n", .badRequestLine),
        ("G(T /p HTTP/1.1\r\n", .badMethod),
    ])
    func refusesABadRequestLineBeforeTheHeadEnds(line: String, refusal: HTTP1Refusal) {
        #expect(outcome(line).refusal == refusal)
    }

    @Test func aGoodRequestLineStillWaitsForTheHead() {
        #expect(outcome("GET /p HTTP/1.1\r\nHost: h\r\n") == .incomplete)
    }
}
