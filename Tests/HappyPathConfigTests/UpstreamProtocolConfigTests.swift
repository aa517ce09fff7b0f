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

    /// `h2_client` (which chose libcurl or the proxy's own client during
    /// issue 46) is read and ignored, with a warning; no h2c warning remains.
    @Test(arguments: [
        ("http://127.0.0.1:9000", ", protocol: h2", nil), ("https://127.0.0.1:9443", ", protocol: h2", nil),
        ("http://127.0.0.1:9000", "", nil), ("http://127.0.0.1:9000", ", protocol: http1", nil),
        ("http://127.0.0.1:9000", ", protocol: h2, h2_client: nghttp2", "nghttp2"),
        ("https://127.0.0.1:9443", ", protocol: h2, h2_client: libcurl", "libcurl"),
        ("http://127.0.0.1:9000", ", protocol: h2, h2_client: curl", "curl"),
    ] as [(String, String, String?)])
    func theH2ClientKeyIsIgnoredWithAWarning(endpoint: String, setting: String, given: String?) throws {
        let c = try ConfigLoader.parse(Self.yaml(endpoint, setting), file: "f.yaml", environment: [:])
        #expect(c.ignoredH2Clients["api"] == given)
        let warnings = ConfigLoader.upstreamWarnings(c)
        #expect(warnings == (given.map {
            ["upstreams.api.h2_client: \($0) is ignored: protocol: h2 always uses the proxy's own HTTP/2 client now (libcurl carries HTTP/1.1 only); delete the key"]
        } ?? []))
    }

    /// A reload tells a changed upstream by equality, as for its other keys.
    @Test func aChangedProtocolMakesAChangedUpstream() throws {
        let a = try ConfigLoader.parse(Self.yaml("https://127.0.0.1:9443", ""), file: "f.yaml", environment: [:])
        let b = try ConfigLoader.parse(Self.yaml("https://127.0.0.1:9443", ", protocol: h2"), file: "f.yaml", environment: [:])
        #expect(a.upstreams[0] != b.upstreams[0])
    }

    /// Deleting the ignored `h2_client`, as its warning asks, changes nothing
    /// on a reload: the upstream keeps its breaker, budget and pools.
    @Test func deletingTheIgnoredH2ClientIsNoChange() throws {
        let a = try ConfigLoader.parse(
            Self.yaml("http://127.0.0.1:9000", ", protocol: h2, h2_client: nghttp2"), file: "f.yaml", environment: [:])
        let b = try ConfigLoader.parse(Self.yaml("http://127.0.0.1:9000", ", protocol: h2"), file: "f.yaml", environment: [:])
        #expect(a.upstreams[0] == b.upstreams[0])
    }
}
