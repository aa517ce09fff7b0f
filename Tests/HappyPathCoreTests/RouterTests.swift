import HappyPathCore
import Testing

@Suite struct RouterTests {
    let router = Router([
        RouteMatch(pathPrefix: "/api/", methods: ["GET", "POST"]),
        RouteMatch(pathPrefix: "/api/"),
        RouteMatch(pathPrefix: "/"),
    ])

    @Test(arguments: [
        ("/api/items", "GET", 0), ("/api/items", "DELETE", 1), ("/apix", "GET", 2), ("/", "PUT", 2),
    ])
    func firstMatchWins(path: String, method: String, expected: Int) {
        #expect(router.route(path: path, method: method) == expected)
    }

    @Test func noMatchIsNil() {
        let r = Router([RouteMatch(pathPrefix: "/api/", methods: ["GET"])])
        #expect(r.route(path: "/other", method: "GET") == nil)
        #expect(r.route(path: "/api/x", method: "POST") == nil)
    }

    @Test(
        arguments: [
            ("/api/items", "a=1", "/api", "/items?a=1"),
            ("/api", nil, "/api", "/"),
            ("/apiv2/x", nil, "/api", "/v2/x"),
            ("/x", nil, nil, "/x"),
            ("/x/y", "q", "/zzz", "/x/y?q"),
        ] as [(String, String?, String?, String)])
    func upstreamTargetStripsPrefixAndKeepsQuery(path: String, query: String?, strip: String?, expected: String) {
        #expect(Router.upstreamTarget(path: path, query: query, stripPrefix: strip) == expected)
    }

    @Test func splitTarget() {
        #expect(Router.split(target: "/a?b=c?d").path == "/a")
        #expect(Router.split(target: "/a?b=c?d").query == "b=c?d")
        #expect(Router.split(target: "/a").query == nil)
    }

    /// Read from the bytes, the same as the string's own slicing: an empty
    /// path or query, a long target, and a `?` that a combining mark joins
    /// (the mark goes with it, as the string's characters say).
    @Test(
        arguments: [
            ("?", "", ""), ("/a?", "/a", ""), ("?q", "", "q"), ("", "", nil), ("/caf\u{E9}?x=\u{E9}", "/caf\u{E9}", "x=\u{E9}"),
            ("/a?\u{301}b", "/a", "b"),
            (
                "/" + String(repeating: "p", count: 300) + "?" + String(repeating: "q", count: 300),
                "/" + String(repeating: "p", count: 300), String(repeating: "q", count: 300)
            ),
        ] as [(String, String, String?)])
    func splitTargetReadsBytes(target: String, path: String, query: String?) {
        let split = Router.split(target: target)
        #expect(split.path == path)
        #expect(split.query == query)
    }

    @Test func shadowing() {
        #expect(RouteMatch(pathPrefix: "/api/v1").isShadowed(by: RouteMatch(pathPrefix: "/api")))
        #expect(!RouteMatch(pathPrefix: "/api").isShadowed(by: RouteMatch(pathPrefix: "/api/v1")))
        #expect(!RouteMatch(pathPrefix: "/a", methods: ["POST"]).isShadowed(by: RouteMatch(pathPrefix: "/", methods: ["GET"])))
        #expect(
            RouteMatch(pathPrefix: "/a", methods: ["GET"]).isShadowed(by: RouteMatch(pathPrefix: "/", methods: ["GET", "PUT"])))
        #expect(!RouteMatch(pathPrefix: "/a").isShadowed(by: RouteMatch(pathPrefix: "/", methods: ["GET"])))
    }
}

@Suite struct HeaderTests {
    @Test(arguments: [
        "Connection", "keep-alive", "TE", "Trailer", "transfer-encoding", "Upgrade", "Proxy-Authorization", "proxy-connection",
    ])
    func hopByHop(name: String) { #expect(HopByHop.isHopByHop(name)) }

    @Test(arguments: ["Content-Type", "X-Request-Id", "Authorization", "Proxy", "Tee", "Host"])
    func endToEnd(name: String) { #expect(!HopByHop.isHopByHop(name)) }

    /// The tokens of a `Connection` value name fields; `close` and `keep-alive` name none.
    @Test func connectionTokens() {
        let names = ["X-Foo", "X-Bar", "close", "keep-alive", "Other"]
        let bytes = Array(names.joined().utf8)
        var ranges: [Range<Int>] = []
        for name in names { ranges.append((ranges.last?.upperBound ?? 0)..<((ranges.last?.upperBound ?? 0) + name.utf8.count)) }
        func marked(_ value: String) -> [Bool] {
            var marks: [Bool] = []
            bytes.withUnsafeBytes { b in
                Array(value.utf8).withUnsafeBytes { v in
                    NominatedFields.mark(
                        count: names.count, name: { UnsafeRawBufferPointer(rebasing: b[ranges[$0]]) }, connectionValue: v,
                        nominated: &marks)
                }
            }
            return marks
        }
        #expect(marked("keep-alive, X-Foo ,close,X-Bar") == [true, true, false, false, false])
        #expect(marked("") == [false, false, false, false, false])
    }

    @Test func caseInsensitiveCompare() {
        #expect("Content-Length".equalsIgnoringASCIICase("content-length"))
        #expect(!"Content-Length".equalsIgnoringASCIICase("content-lengt"))
        #expect(!"a-b".equalsIgnoringASCIICase("a\rb"))
        #expect([HTTPField(name: "X-A", value: "1")].value(for: "x-a") == "1")
    }
}

@Suite struct ProblemTests {
    @Test(arguments: ProblemCode.allCases)
    func everyCodeHasTextAndAType(code: ProblemCode) {
        let p = Problem(code, requestID: "r1")
        #expect(!p.title.isEmpty)
        #expect(!(p.recoverySuggestion ?? "").isEmpty)
        #expect(p.type.hasPrefix("urn:happypath:error:"))
        #expect(!p.type.contains("_"))
        #expect(p.recoveryOptions.contains("cancel"))
        #expect(p.recoveryOptions.contains("retry") == code.retryable)
    }

    @Test func statusesMatchTheContract() {
        let expected: [ProblemCode: Int] = [
            .noRoute: 404, .badRequest: 400, .payloadTooLarge: 413, .headersTooLarge: 431,
            .upstreamUnreachable: 503, .upstreamTimeout: 504, .upstreamUnavailable: 503, .circuitOpen: 503,
            .overloaded: 503, .rateLimited: 429, .authFailed: 401, .forbidden: 403, .notFound: 404, .badGateway: 502,
            .storeUnavailable: 503, .idempotencyKeyReused: 422,
        ]
        for (code, status) in expected { #expect(code.status == status, "\(code)") }
    }

    @Test func jsonHasTheDocumentedFieldsInOrder() {
        let p = Problem(
            .upstreamUnavailable, requestID: "4f7c", detail: "3 attempts failed: \"503\"\n", attempts: 3, upstream: "api",
            retryAfterSeconds: 5)
        let json = p.json()
        #expect(json.hasPrefix("{\"type\":\"urn:happypath:error:upstream-unavailable\",\"title\":"))
        #expect(json.contains("\"detail\":\"3 attempts failed: \\\"503\\\"\\n\""))
        #expect(json.contains("\"retryable\":true,\"retry_after_s\":5"))
        #expect(json.contains("\"attempts\":3,\"upstream\":\"api\",\"request_id\":\"4f7c\"}"))
    }

    @Test func optionalFieldsAreLeftOut() {
        let json = Problem(.noRoute, requestID: "x").json()
        #expect(!json.contains("attempts"))
        #expect(!json.contains("retry_after_s"))
        #expect(!json.contains("upstream"))
        #expect(!json.contains("detail"))
    }

    @Test func jsonQuotesControlCharacters() {
        #expect(JSON.quote("a\u{01}b\\") == "\"a\\u0001b\\\\\"")
    }
}

@Suite struct CommandAndClockTests {
    @Test func remainingTimeFollowsTheManualClock() {
        let clock = ManualClock()
        let command = Command(
            requestID: "r", method: "GET", target: "/", headers: HeaderBlock(), body: .empty, routeIndex: 0, upstream: "u",
            deadline: clock.now() + .seconds(2))
        #expect(command.remaining(at: clock.now()) == .seconds(2))
        clock.advance(by: .milliseconds(1500))
        #expect(command.remaining(at: clock.now()) == .milliseconds(500))
        clock.advance(by: .seconds(1))
        #expect(command.remaining(at: clock.now()) == .zero)
    }

    @Test func replayIsACopyWithTheNextAttemptAndTheSameBody() {
        let body = RequestBody([1, 2, 3])
        let first = Command(
            requestID: "r", method: "POST", target: "/x", headers: HeaderBlock([HTTPField(name: "A", value: "b")]), body: body,
            routeIndex: 2, upstream: "u", deadline: Instant(nanoseconds: 99))
        let second = first.nextAttempt()
        #expect(second.attempt == 2)
        #expect(second.body === first.body)
        #expect(second.body.bytes == [1, 2, 3])
        #expect(second.headers === first.headers)
        #expect(second.headers.fields == [HTTPField(name: "A", value: "b")])
        #expect(second.deadline == first.deadline)
        #expect(first.attempt == 1)
    }

    @Test func identifiersHaveTheirFormats() {
        var ids = IdentifierGenerator(seed: 42)
        let id = ids.requestID()
        #expect(id.count == 15)
        #expect(id.allSatisfy { $0.isHexDigit })
        #expect(ids.requestID() != id)
        let tp = ids.traceparent().split(separator: "-")
        #expect(tp.map(\.count) == [2, 32, 16, 2])
    }

    @Test(arguments: [
        (Duration.milliseconds(250), "250ms"), (.seconds(2), "2s"), (.seconds(120), "2m"), (.milliseconds(1500), "1.5s"),
    ])
    func durationText(duration: Duration, text: String) { #expect(duration.configText == text) }
}
