import Foundation
import HappyPathConfig
import HappyPathCore
import Testing

@testable import HappyPathServer

/// The proxy's own HTTP/2 client over TLS (`https://` endpoints, ALPN
/// `h2` required): verification against the upstream's `tls.ca`, a client
/// certificate for mTLS, and the failures a user meets (an unknown
/// certificate, a server that does not agree to h2), each against the
/// Python h2 upstream's TLS port. In `UpstreamH2ClientTests`' serialized
/// suite, run once (the address sanitizer's pass).
extension UpstreamH2ClientTests {
    static func tlsProxy(_ up: H2Upstream, _ tls: String) throws -> ProxyHarness {
        try UpstreamHTTP2Tests.proxy("https://127.0.0.1:\(up.tlsPort)", extra: tls)
    }

    /// Requests one after another and at once are streams of one TLS
    /// connection, which ALPN made h2; `:scheme` is https.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func tlsTriesAreStreamsOfOneConnection() throws {
        let (up, tls, certificates) = try UpstreamHTTP2Tests.upstream()
        let h = try Self.tlsProxy(up, tls)
        defer { h.stop() }
        let first = try HTTP.request(port: h.port, "/tls/first", headers: [("X-Tenant", "green")])
        #expect(first.status == 200, "\(first.text)")
        #expect(first.json["path"] as? String == "/tls/first")
        #expect(
            UpstreamHTTP2Tests.statusesAtOnce(port: h.port, (0..<3).map { "/tls/at-once-\($0)?delay=300" })
                == [200, 200, 200])
        let post = try HTTP.request(port: h.port, "POST", "/tls/post", body: Array(repeating: 0x62, count: 100_000))
        #expect(post.json["body_bytes"] as? Int == 100_000)
        let big = try HTTP.request(port: h.port, "/tls/big?size=1000000")
        #expect(big.body.count == 1_000_000)
        let seen = up.requests(to: "/tls/", atLeast: 6)
        try #require(seen.count == 6)
        #expect(seen.allSatisfy { $0["reached"] as? String == "h2" })
        #expect(field(seen[0], ":scheme") == "https")
        #expect(field(seen[0], "x-tenant") == "green")
        #expect(Set(seen.compactMap { $0["conn"] as? Int }).count == 1, "\(seen.map { $0["conn"] ?? "-" })")
        #expect(try AdminProbe(port: h.adminPort).metric(#"happypath_upstream_h2_connections_opened_total{upstream="u"}"#) == 1)
        withExtendedLifetime(certificates) {}
    }

    /// mTLS: an upstream that requires a client certificate gets the one
    /// `tls.client_cert` and `tls.client_key` name; without it, no request
    /// reaches it and the answer says why.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func mutualTLSPresentsTheClientCertificate() throws {
        let certificates = try TestCertificates()
        let server = try certificates.make("h2-upstream", names: ["localhost"])
        let client = try certificates.make("proxy-client", names: ["happypath-client"], ip: false)
        let up = try H2Upstream(certificate: server, clientCA: client.cert)
        let with = try Self.tlsProxy(up, "tls: { ca: \(server.cert), client_cert: \(client.cert), client_key: \(client.key) }")
        defer { with.stop() }
        let r = try HTTP.request(port: with.port, "/mtls/with")
        #expect(r.status == 200, "\(r.text)")
        let seen = up.requests(to: "/mtls/with", atLeast: 1)
        #expect(seen.first?["client"] as? String == "happypath-client")

        let without = try Self.tlsProxy(up, "tls: { ca: \(server.cert) }")
        defer { without.stop() }
        let refused = try HTTP.request(port: without.port, "/mtls/without")
        // TLS 1.3 checks the client's certificate after the handshake: a server
        // that refuses it with an alert is a TLS failure (502); one that only
        // hangs up (as this one) is a closed connection that names the likely cause.
        #expect([502, 503].contains(refused.status), "\(refused.text)")
        #expect(
            (refused.json["detail"] as? String).map { $0.contains("client certificate") || $0.contains("alert") } == true,
            "\(refused.text)")
        #expect(up.requests(to: "/mtls/without").isEmpty)
    }

    /// A certificate the proxy does not trust, and a server that does not
    /// agree to h2: each a 502 that says why, and the upstream sees nothing.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func anUntrustedCertificateOrNoH2IsRefusedWithWhy() throws {
        let certificates = try TestCertificates()
        let server = try certificates.make("h2-upstream", names: ["localhost"])
        let stranger = try certificates.make("stranger", names: ["localhost"])
        let up = try H2Upstream(certificate: server)
        let untrusting = try Self.tlsProxy(up, "tls: { ca: \(stranger.cert) }")
        defer { untrusting.stop() }
        let r = try HTTP.request(port: untrusting.port, "/untrusted")
        #expect(r.status == 502)
        #expect((r.json["detail"] as? String)?.contains("certificate") == true, "\(r.text)")
        #expect(up.requests(to: "/untrusted").isEmpty)

        let http1Only = try H2Upstream(certificate: server, alpn: ["http/1.1"])
        let h = try Self.tlsProxy(http1Only, "tls: { ca: \(server.cert) }")
        defer { h.stop() }
        let noH2 = try HTTP.request(port: h.port, "/no-h2")
        #expect(noH2.status == 502)
        #expect((noH2.json["detail"] as? String)?.contains("ALPN h2") == true, "\(noH2.text)")
        #expect(http1Only.requests(to: "/no-h2").isEmpty)
    }

    /// `tls.server_name`: the name sent as SNI, checked against the
    /// certificate and sent as `:authority`, while the connection goes to
    /// the endpoint's address; without it, a certificate that does not
    /// name the address is refused.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func serverNameIsTheNameChecked() throws {
        let certificates = try TestCertificates()
        let server = try certificates.make("api-internal", names: ["api.internal"], ip: false)
        let up = try H2Upstream(certificate: server)
        let named = try Self.tlsProxy(up, "tls: { ca: \(server.cert), server_name: api.internal }")
        defer { named.stop() }
        #expect(try HTTP.request(port: named.port, "/named").status == 200)
        let seen = up.requests(to: "/named", atLeast: 1)
        #expect(field(seen[0], ":authority") == "api.internal:\(up.tlsPort)")
        let unnamed = try Self.tlsProxy(up, "tls: { ca: \(server.cert) }")
        defer { unnamed.stop() }
        let refused = try HTTP.request(port: unnamed.port, "/unnamed")
        #expect(refused.status == 502)
        #expect((refused.json["detail"] as? String)?.contains("certificate") == true, "\(refused.text)")
    }

    /// `verify: false` accepts any certificate (what libcurl's path does too).
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func verifyFalseAcceptsAnyCertificate() throws {
        let (up, _, certificates) = try UpstreamHTTP2Tests.upstream()
        let h = try Self.tlsProxy(up, "tls: { verify: false }")
        defer { h.stop() }
        #expect(try HTTP.request(port: h.port, "/unverified").status == 200)
        withExtendedLifetime(certificates) {}
    }
}

/// Endpoints named by host name: resolved by libevent's `evdns` on the
/// worker's loop each time a connection opens (`localhost` from
/// /etc/hosts), over h2c and TLS alike.
extension UpstreamH2ClientTests {
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func aNamedEndpointIsResolvedForEachConnection() throws {
        let (up, tls, certificates) = try UpstreamHTTP2Tests.upstream()
        let plain = try UpstreamHTTP2Tests.proxy("http://localhost:\(up.plainPort)", extra: "")
        defer { plain.stop() }
        #expect(try HTTP.request(port: plain.port, "/named/plain").status == 200)
        #expect(
            UpstreamHTTP2Tests.statusesAtOnce(port: plain.port, (0..<3).map { "/named/plain-\($0)?delay=200" })
                == [200, 200, 200])
        let seen = up.requests(to: "/named/plain", atLeast: 4)
        #expect(field(seen[0], ":authority") == "localhost:\(up.plainPort)")
        #expect(Set(seen.compactMap { $0["conn"] as? Int }).count == 1)
        // Over TLS: the certificate names localhost.
        let secured = try UpstreamHTTP2Tests.proxy(
            "https://localhost:\(up.tlsPort)", extra: tls)
        defer { secured.stop() }
        #expect(try HTTP.request(port: secured.port, "/named/tls").status == 200)
        #expect(up.requests(to: "/named/tls", atLeast: 1).first?["reached"] as? String == "h2")
        withExtendedLifetime(certificates) {}
    }

    /// A name that does not resolve fails the try as a connect failure
    /// that says so, within connect_timeout, and the proxy goes on.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "run by the address sanitizer's pass")) func aNameThatDoesNotResolveSaysSo() throws {
        let h = try UpstreamHTTP2Tests.proxy("http://no-such-host.invalid:80", extra: "")
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.status >= 502)
        #expect((r.json["detail"] as? String)?.contains("resolve no-such-host.invalid") == true, "\(r.text)")
    }
}
