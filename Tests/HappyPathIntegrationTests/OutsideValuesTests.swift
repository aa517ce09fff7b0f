import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 30, part 1: no number an upstream, a token endpoint or a client
/// sends can trap the proxy, and every one reaches the proxy's arithmetic
/// only bounded. Each test runs the real proxy against a real upstream
/// that says the hostile thing in raw bytes.
@Suite("numbers from outside") struct OutsideValuesTests {
    /// What the issue's attack sent, and more of its kind.
    static let hostileRetryAfter = [
        "9223372036", "9223372036854775807", String(repeating: "9", count: 40), "-9223372036854775808", "+5", "1.5",
        "Sun, 06 Nov 999999999999 08:49:37 GMT", "Sun, 06 Nov -9223372036854775808 08:49:37 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT", "\u{663}\u{663}",
    ]

    /// The proxy as its own process (a trap ends it, not the test runner)
    /// with the default retry rules, in front of an upstream
    /// whose every answer is a 503 carrying `Retry-After: <value #n>` for
    /// `/n` (and a 200 with one for `/ok/n`).
    @Test func noRetryAfterStopsTheProxyAndEveryOneGoesOutAsBoundedWholeSeconds() throws {
        let values = Self.hostileRetryAfter
        let upstream = ScriptedUpstream(answering: { head in
            let target = head.split(separator: " ").dropFirst().first.map(String.init) ?? "/"
            let parts = target.split(separator: "/")
            let n = Int(parts.last ?? "") ?? 0
            let value = values[n % values.count]
            if parts.first == "ok" { return http(200, "fine", headers: ["Retry-After: \(value)"]) }
            return http(503, "{\"error\":\"busy\"}", headers: ["Retry-After: \(value)"])
        }).started()
        defer { upstream.stop() }
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                upstreams:
                  u:
                    endpoints: [http://127.0.0.1:\(upstream.port)]
                routes:
                  - match: { path_prefix: / }
                    upstream: u
                    timeout: 3s
                """)
        guard let port = serve.listeningPort() else { return }
        for n in 0..<values.count {
            for prefix in ["", "/ok"] {
                let r = try HTTP.request(port: port, "\(prefix)/\(n)")
                #expect(serve.process.isRunning, "the proxy died on Retry-After: \(values[n])")
                guard serve.process.isRunning else { return }
                #expect(r.status == (prefix.isEmpty ? 503 : 200))
                if let sent = r.header("Retry-After") {
                    // Whole seconds, at most retry.max_retry_after (1h), never as it came.
                    #expect(sent.allSatisfy(\.isASCII) && sent.allSatisfy(\.isNumber), "Retry-After: '\(sent)'")
                    #expect((Int(sent) ?? -1) >= 0 && (Int(sent) ?? .max) <= 3600, "Retry-After: '\(sent)'")
                }
            }
        }
        // A date in range and a plain number pass on as whole seconds, clamped.
        #expect(serve.process.isRunning)
        #expect(try HTTP.request(port: port, "/ok/0").header("Retry-After") == "3600")
    }

    /// retry.max_retry_after caps what is honoured and passed on; a date is
    /// written back as the seconds it stands for.
    @Test func maxRetryAfterCapsTheWaitAndADateBecomesSeconds() throws {
        let now = Int64(Date().timeIntervalSince1970)
        let inTwoMinutes = Self.imfFixdate(now + 120)
        let upstream = ScriptedUpstream(answering: { head in
            if head.contains("GET /date") { return http(200, "ok", headers: ["Retry-After: \(inTwoMinutes)"]) }
            return http(200, "ok", headers: ["Retry-After: 86400"])
        }).started()
        let h = try ProxyHarness(
            ProxyHarness.single(
                upstream: "http://127.0.0.1:\(upstream.port)",
                defaults: "{ reachability: { park_for: 0s }, retry: { max_retry_after: 30s } }"))
        h.scripted.append(upstream)
        defer { h.stop() }
        #expect(try HTTP.request(port: h.port, "/long").header("Retry-After") == "30")
        let date = try HTTP.request(port: h.port, "/date").header("Retry-After")
        #expect(date == "30")  // 120 s, capped at 30
        let h2 = try ProxyHarness(
            ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)", defaults: "{ reachability: { park_for: 0s } }"))
        defer { h2.stop() }
        let seconds = Int(try HTTP.request(port: h2.port, "/date").header("Retry-After") ?? "") ?? -1
        #expect((110...121).contains(seconds), "a date two minutes ahead read as \(seconds) s")
    }

    /// `Age: 9223372036854775807` on a kept answer, served stale later:
    /// the Age the client gets is bounded (it crashed the proxy before).
    @Test func aHugeAgeOnAKeptAnswerIsServedStaleBounded() throws {
        let up = Locked(true)
        let upstream = ScriptedUpstream(answering: { _ in
            up.withLock { $0 }
                ? http(200, "kept", headers: ["Age: 9223372036854775807", "Cache-Control: max-age=60"])
                : http(503, "down")
        }).started()
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { reachability: { park_for: 0s }, retry: { attempts: 1 } }
            upstreams:
              u:
                endpoints: [http://127.0.0.1:\(upstream.port)]
                circuit_breaker: { consecutive_failures: 100 }
            routes:
              - match: { path_prefix: / }
                upstream: u
                fallback: { serve_stale: 10m }
            """)
        h.scripted.append(upstream)
        defer { h.stop() }
        #expect(try HTTP.request(port: h.port, "/page").status == 200)
        up.withLock { $0 = false }
        let stale = try HTTP.request(port: h.port, "/page")
        #expect(stale.status == 200)
        #expect(stale.text == "kept")
        #expect(stale.header("X-Happypath-Fallback")?.hasPrefix("stale") == true)
        let age = Int64(stale.header("Age") ?? "") ?? -1
        #expect(age >= 0 && age <= OutsideValues.maxSeconds, "Age: \(stale.header("Age") ?? "none")")
    }

    /// A token endpoint's `expires_in` of 1e16, "Infinity", or 0.0001: the
    /// proxy stays up and answers; a lifetime below the 1 s floor does not
    /// turn every client request into a token request.
    @Test(arguments: ["1e16", "\"Infinity\"", "1e308", "-5", "\"NaN\"", "0.0001"])
    func noExpiresInStopsOrStormsTheProxy(_ expiresIn: String) throws {
        let auth = try AuthTestServer()
        defer { auth.stop() }
        auth.state.withLock { $0.expiresInJSON = expiresIn }
        // The auth suite's proxy: oauth2_client_credentials, refresh_ahead at its default of 30 s.
        let h = try AuthTests().harness(auth)
        defer { h.stop() }
        let start = ContinuousClock.now
        for i in 0..<40 {
            let r = try HTTP.request(port: h.port, "/data?i=\(i)")
            #expect(r.status == 200, "request \(i) with expires_in \(expiresIn): \(r.status) \(r.text)")
        }
        let elapsed = seconds(since: start)
        // At most four token requests a second per upstream, whatever the
        // endpoint says (and one, or one per second-long token, otherwise).
        #expect(Double(auth.tokenCalls) <= 2 + 4 * elapsed, "\(auth.tokenCalls) token requests in \(elapsed) s")
    }

    /// W3C Trace Context: an invalid `traceparent` (malformed, upper-case,
    /// all-zero, version ff, an extra field, or two of them) is not passed
    /// on, nor its `tracestate`; the upstream gets a fresh, valid one. With
    /// and without a tracer (sample_ratio 0: not sampled, the case that
    /// passed it on as it came).
    @Test(arguments: [false, true])
    func anInvalidTraceparentIsReplacedAndItsTracestateDropped(tracing: Bool) throws {
        let upstream = ScriptedUpstream(response: http(200, "ok")).started()
        let tracingBlock = tracing ? "tracing: { otlp_endpoint: http://127.0.0.1:9/v1/traces, sample_ratio: 0 }" : ""
        let h = try ProxyHarness(
            ProxyHarness.single(upstream: "http://127.0.0.1:\(upstream.port)") + "\n" + tracingBlock)
        h.scripted.append(upstream)
        defer { h.stop() }
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        let invalid: [[String]] = [
            ["00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"],
            ["00-00000000000000000000000000000000-00f067aa0ba902b7-01"],
            ["00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"],
            ["ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
            [valid + "-extra"],
            ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"],
            ["garbage"],
            [valid, valid],
        ]
        for (i, values) in invalid.enumerated() {
            let headers = values.map { ("traceparent", $0) } + [("tracestate", "vendor=secret\(i)")]
            #expect(try HTTP.request(port: h.port, "/t\(i)", headers: headers).status == 200)
            let head = upstream.requests.withLock { $0.last?.head } ?? ""
            let sent = Self.fields(head, "traceparent")
            #expect(sent.count == 1, "\(values): upstream got \(sent)")
            #expect(sent.first.flatMap(TraceContext.parse) != nil, "\(values): upstream got \(sent)")
            #expect(!values.contains(sent.first ?? ""), "\(values) passed on")
            #expect(Self.fields(head, "tracestate").isEmpty, "\(values): tracestate passed on")
        }
        // A valid one passes on (as it came, or with the proxy's span), with its tracestate.
        #expect(try HTTP.request(port: h.port, "/v", headers: [("traceparent", valid), ("tracestate", "a=b")]).status == 200)
        let head = upstream.requests.withLock { $0.last?.head } ?? ""
        #expect(Self.fields(head, "traceparent").first?.contains("4bf92f3577b34da6a3ce929d0e0e4736") == true)
        #expect(Self.fields(head, "tracestate") == ["a=b"])
    }

    static func fields(_ head: String, _ name: String) -> [String] {
        head.components(separatedBy: "\r\n").compactMap { line in
            guard let colon = line.firstIndex(of: ":"), line[..<colon].lowercased() == name else { return nil }
            return line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
    }

    static func imfFixdate(_ unix: Int64) -> String {
        var t = time_t(unix)
        var parts = tm()
        gmtime_r(&t, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let n = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
