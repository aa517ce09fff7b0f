import Foundation
import HappyPathCore
import Testing

/// Issue 31, part 2: a kept answer goes only to requests it is the answer
/// to. Two clients and an outage each time: the upstream answers the
/// first, then fails; the second must not get the first's kept answer
/// when the authority, the scheme, a forwarding field or a credential
/// differs, and still gets it when nothing of that differs.
@Suite("fallback key") struct FallbackKeyTests {
    /// An upstream whose good answer names what the proxy passed on of the
    /// client (its forwarding fields and credentials), as an upstream that
    /// builds links or picks a tenant from them would; "503" is the outage.
    final class Reflecting: @unchecked Sendable {
        let mode = Locked("ok")
        var upstream: ScriptedUpstream!

        static let reflected: Set<String> = [
            "x-forwarded-host", "x-forwarded-proto", "forwarded", "authorization", "cookie", "proxy-authorization",
            "x-api-key", "x-tenant", "x-session",
        ]

        init(headers: [String] = []) {
            let mode = self.mode
            upstream = ScriptedUpstream(answering: { head in
                if mode.withLock({ $0 }) == "503" { return http(503, "{\"down\":true}") }
                let lines = head.split(separator: "\r\n").dropFirst().filter { line in
                    Self.reflected.contains(line.split(separator: ":").first.map { $0.lowercased() } ?? "")
                }
                return http(200, "answer for " + lines.joined(separator: "; "), headers: headers)
            }).started()
        }

        func set(_ m: String) { mode.withLock { $0 = m } }
    }

    /// One GET on a fresh connection with this `Host` and these fields.
    static func get(
        _ port: Int, _ target: String, host: String = "shop.example", _ headers: [(String, String)] = []
    ) throws -> TestResponse {
        let connection = try TestConnection(port: port, timeout: 10)
        var head = "GET \(target) HTTP/1.1\r\nHost: \(host)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        try connection.send(head + "\r\n")
        return try connection.readResponse()
    }

    static func expectStale(_ r: TestResponse, _ body: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(r.status == 200, "\(r.text)", sourceLocation: sourceLocation)
        #expect(r.text == body, sourceLocation: sourceLocation)
        #expect(r.header("X-Happypath-Fallback") == "stale; reason=5xx", sourceLocation: sourceLocation)
    }

    static func expectNotStale(_ r: TestResponse, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(r.status == 503, "got another client's kept answer: \(r.text)", sourceLocation: sourceLocation)
        #expect(r.header("X-Happypath-Fallback") == nil, sourceLocation: sourceLocation)
        #expect(!r.text.contains("answer for"), sourceLocation: sourceLocation)
    }

    /// An attacker's `Host: evil.example` answer (the upstream saw
    /// `X-Forwarded-Host: evil.example`) is never a shop.example user's,
    /// nor tenant A's page tenant B's; the same authority still shares.
    @Test func anotherAuthorityNeverGetsTheKeptAnswer() throws {
        let up = Reflecting()
        let h = try ProxyHarness(FallbackTests.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        let evil = try Self.get(h.port, "/catalog/home", host: "evil.example")
        #expect(evil.status == 200 && evil.text.contains("X-Forwarded-Host: evil.example"), "\(evil.text)")
        let tenantA = try Self.get(h.port, "/catalog/page", host: "a.tenants.example")
        #expect(tenantA.status == 200 && tenantA.text.contains("X-Forwarded-Host: a.tenants.example"), "\(tenantA.text)")
        FallbackTests.settled(h)
        up.set("503")
        Self.expectNotStale(try Self.get(h.port, "/catalog/home", host: "shop.example"))
        Self.expectNotStale(try Self.get(h.port, "/catalog/page", host: "b.tenants.example"))
        Self.expectNotStale(try Self.get(h.port, "/catalog/page", host: "a.tenants.example:8080"))
        // Another client of the same authority, without credentials: shared.
        Self.expectStale(try Self.get(h.port, "/catalog/page", host: "a.tenants.example"), tenantA.text)
        Self.expectStale(try Self.get(h.port, "/catalog/home", host: "evil.example"), evil.text)
    }

    /// Forwarding fields a client sends go upstream as they came: an answer
    /// made for `X-Forwarded-Host: evil.example` is not the answer to a
    /// request without it, on the same `Host`.
    @Test(arguments: [
        ("X-Forwarded-Host", "evil.example"), ("X-Forwarded-Proto", "https"), ("Forwarded", "host=evil.example"),
    ])
    func forwardingFieldsTheClientSentAreInTheKey(name: String, value: String) throws {
        let up = Reflecting()
        let h = try ProxyHarness(FallbackTests.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        let first = try Self.get(h.port, "/catalog/f", [(name, value)])
        #expect(first.status == 200 && first.text.contains(value), "\(first.text)")
        FallbackTests.settled(h)
        up.set("503")
        Self.expectNotStale(try Self.get(h.port, "/catalog/f"))
        Self.expectStale(try Self.get(h.port, "/catalog/f", [(name, value)]), first.text)
    }

    /// The same `Host` over TLS and over plain HTTP: two authorities (the
    /// upstream saw `X-Forwarded-Proto: https` or `http`).
    @Test func theSchemeIsInTheKey() throws {
        let certs = try TestCertificates()
        let pair = try certs.make("shop", names: ["localhost"])
        let up = Reflecting()
        defer { up.upstream.stop() }
        let yaml = FallbackTests.config(up.upstream.port).replacingOccurrences(
            of: "listen: 127.0.0.1:0\nadmin",
            with: """
                listen:
                  - 127.0.0.1:0
                  - address: 127.0.0.1:0
                    tls: { certificates: [ { cert: \(pair.cert), key: \(pair.key) } ] }
                admin
                """)
        let h = try ProxyHarness(yaml)
        defer { h.stop() }
        let (plainPort, tlsPort) = (h.proxy.ports[0], h.proxy.ports[1])
        func overTLS() throws -> (status: String, body: String) {
            let r = try runProcess(
                "/usr/bin/curl",
                [
                    "-sS", "--max-time", "10", "--cacert", pair.cert, "-H", "Host: shop.example", "-w", "\n%{http_code}",
                    "https://localhost:\(tlsPort)/catalog/s",
                ])
            let lines = r.out.split(separator: "\n", omittingEmptySubsequences: false)
            return (String(lines.last ?? ""), lines.dropLast().joined(separator: "\n"))
        }
        let plain = try Self.get(plainPort, "/catalog/s")
        #expect(plain.text == "answer for X-Forwarded-Proto: http; X-Forwarded-Host: shop.example")
        FallbackTests.settled(h)
        up.set("503")
        let secure = try overTLS()
        #expect(secure.status == "503", "the https request got the http one's kept answer: \(secure.body)")
        #expect(!secure.body.contains("answer for"))
        Self.expectStale(try Self.get(plainPort, "/catalog/s"), plain.text)
    }

    /// A credential in any header: alice's answer is hers alone. Bob (other
    /// value) and a request without it get the problem; alice gets her own
    /// answer back. `X-Api-Key` by default, `private_headers`, and the
    /// route's `rate_limit` header count as well as the standard three.
    @Test(arguments: [
        ("X-Api-Key", ""), ("Authorization", ""), ("Cookie", ""), ("Proxy-Authorization", ""),
        ("X-Tenant", "\n    rate_limit: { rate: 1000/s, key: 'header:X-Tenant' }"),
        ("X-Session", "\n    fallback: { serve_stale: 10m, private_headers: [X-Api-Key, X-Session] }"),
    ])
    func aCredentialedAnswerIsNeverAnotherCredentials(name: String, routeExtra: String) throws {
        let up = Reflecting()
        var yaml = FallbackTests.config(up.upstream.port)
        if routeExtra.contains("fallback:") {
            yaml = yaml.replacingOccurrences(of: "\n    fallback: { serve_stale: 10m }", with: routeExtra)
        } else {
            yaml = yaml.replacingOccurrences(
                of: "fallback: { serve_stale: 10m }", with: "fallback: { serve_stale: 10m }" + routeExtra)
        }
        let h = try ProxyHarness(yaml)
        defer { h.stop(); up.upstream.stop() }
        let alice = try Self.get(h.port, "/catalog/me", [(name, "alice-secret")])
        #expect(alice.status == 200, "\(alice.text)")
        // Proxy-Authorization is the proxy's, not passed on (hop-by-hop); the others reach the upstream.
        if name != "Proxy-Authorization" { #expect(alice.text.contains("alice-secret"), "\(alice.text)") }
        FallbackTests.settled(h)
        up.set("503")
        Self.expectNotStale(try Self.get(h.port, "/catalog/me", [(name, "bob-secret")]))
        Self.expectNotStale(try Self.get(h.port, "/catalog/me"))
        Self.expectStale(try Self.get(h.port, "/catalog/me", [(name, "alice-secret")]), alice.text)
        // Alice's credential on another authority: not hers there.
        Self.expectNotStale(try Self.get(h.port, "/catalog/me", host: "evil.example", [(name, "alice-secret")]))
    }

    /// An answer the upstream declared `public` is shared across
    /// credentials (RFC 9111 section 3.5), never across authorities.
    @Test func aPublicAnswerIsSharedAcrossCredentialsNotAuthorities() throws {
        let up = Reflecting(headers: ["Cache-Control: public, max-age=5"])
        let h = try ProxyHarness(FallbackTests.config(up.upstream.port))
        defer { h.stop(); up.upstream.stop() }
        let alice = try Self.get(h.port, "/catalog/pub", [("X-Api-Key", "alice-secret")])
        #expect(alice.status == 200)
        FallbackTests.settled(h)
        up.set("503")
        Self.expectStale(try Self.get(h.port, "/catalog/pub", [("X-Api-Key", "bob-secret")]), alice.text)
        Self.expectStale(try Self.get(h.port, "/catalog/pub"), alice.text)
        Self.expectNotStale(try Self.get(h.port, "/catalog/pub", host: "evil.example", [("X-Api-Key", "alice-secret")]))
        Self.expectNotStale(try Self.get(h.port, "/catalog/pub", host: "evil.example"))
    }
}
