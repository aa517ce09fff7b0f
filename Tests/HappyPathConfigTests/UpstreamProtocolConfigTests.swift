import HappyPathConfig
import HappyPathCore
import Testing

/// Issue 33, step 10: `upstreams.NAME.protocol`.
@Suite struct UpstreamProtocolConfigTests {
    static func yaml(_ endpoint: String, _ setting: String) -> String {
        """
        upstreams:
          api: { endpoints: [\(endpoint)]\(setting) }
        routes:
          - { match: { path_prefix: / }, upstream: api }
        """
    }

    @Test(arguments: [
        ("", UpstreamProtocol.http1), (", protocol: http1", .http1), (", protocol: h2", .h2),
    ])
    func theProtocolIsReadWithHTTP1AsDefault(setting: String, expected: UpstreamProtocol) throws {
        let c = try ConfigLoader.parse(Self.yaml("https://127.0.0.1:9443", setting), file: "f.yaml", environment: [:])
        #expect(c.upstreams[0].protocol == expected)
    }

    @Test(arguments: ["h2c", "HTTP/2", "http2", "H2", "1.1", "[h2]"])
    func anyOtherValueIsRefusedByName(value: String) {
        let e = errors(Self.yaml("http://127.0.0.1:9000", ", protocol: \"\(value)\""))
        #expect(e.count == 1, "\(e)")
        #expect(e.first?.message.hasPrefix("upstreams.api.protocol") == true, "\(e)")
    }

    @Test func aWrongValueNamesTheChoices() {
        let e = errors(Self.yaml("http://127.0.0.1:9000", ", protocol: h2c"))
        #expect(e.map(\.message) == ["upstreams.api.protocol must be one of http1, h2, got 'h2c'"])
    }

    @Test(arguments: [
        ("http://127.0.0.1:9000", ", protocol: h2", false), ("HTTP://127.0.0.1:9000", ", protocol: h2, h2_client: libcurl", true),
        ("https://127.0.0.1:9443", ", protocol: h2, h2_client: libcurl", false), ("http://127.0.0.1:9000", "", false),
        ("http://127.0.0.1:9000", ", protocol: http1", false),
        ("http://127.0.0.1:9000", ", protocol: h2, h2_client: nghttp2", false),
        ("http://127.0.0.1:9000", ", protocol: h2, h2_client: libcurl", true),
    ])
    func checkWarnsOnlyOfH2WithoutTLS(endpoint: String, setting: String, warns: Bool) throws {
        let c = try ConfigLoader.parse(Self.yaml(endpoint, setting), file: "f.yaml", environment: [:])
        let warnings = ConfigLoader.upstreamWarnings(c)
        #expect(warnings.count == (warns ? 1 : 0))
        if warns { #expect(warnings[0].hasPrefix("upstreams.api.protocol: h2 to \(endpoint) is HTTP/2 without TLS (h2c)")) }
    }

    /// `h2_client` (transitional, issue 46): the proxy's own (nghttp2) by default, libcurl asked by name.
    @Test(arguments: [
        ("", UpstreamH2Client.nghttp2), (", h2_client: libcurl", .libcurl), (", h2_client: nghttp2", .nghttp2),
    ])
    func theH2ClientIsReadWithNghttp2AsDefault(setting: String, expected: UpstreamH2Client) throws {
        let c = try ConfigLoader.parse(
            Self.yaml("http://127.0.0.1:9000", ", protocol: h2" + setting), file: "f.yaml", environment: [:])
        #expect(c.upstreams[0].h2Client == expected)
    }

    @Test func aWrongH2ClientNamesTheChoices() {
        let e = errors(Self.yaml("http://127.0.0.1:9000", ", protocol: h2, h2_client: curl"))
        #expect(e.map(\.message) == ["upstreams.api.h2_client must be one of libcurl, nghttp2, got 'curl'"])
    }

    /// A reload tells a changed upstream by equality, as for its other keys.
    @Test func aChangedProtocolMakesAChangedUpstream() throws {
        let a = try ConfigLoader.parse(Self.yaml("https://127.0.0.1:9443", ""), file: "f.yaml", environment: [:])
        let b = try ConfigLoader.parse(Self.yaml("https://127.0.0.1:9443", ", protocol: h2"), file: "f.yaml", environment: [:])
        #expect(a.upstreams[0] != b.upstreams[0])
    }
}
