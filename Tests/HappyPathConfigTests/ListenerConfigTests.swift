import HappyPathConfig
import HappyPathCore
import Testing

/// `listen`: one address, or a list of plain and TLS listeners (docs/tls.md).
@Suite struct ListenerConfigTests {
    static let rest = """
        upstreams: { api: { endpoints: [http://127.0.0.1:9000] } }
        routes: [ { match: { path_prefix: / }, upstream: api } ]
        """

    func parse(_ listen: String) throws -> Configuration { try ConfigLoader.parse(listen + "\n" + Self.rest, file: "t.yaml") }

    func messages(_ listen: String) -> [String] { errors(listen + "\n" + Self.rest).map(\.message) }

    @Test func aSingleAddressIsOnePlainListener() throws {
        let c = try parse("listen: 127.0.0.1:8181")
        #expect(c.listeners == [Listener(address: ListenAddress(host: "127.0.0.1", port: 8181))])
        #expect(c.listen == ListenAddress(host: "127.0.0.1", port: 8181))
    }

    @Test func aListOfPlainAndTLSListeners() throws {
        let c = try parse(
            """
            listen:
              - address: 0.0.0.0:8443
                tls:
                  certificates:
                    - { cert: /etc/tls/api.crt, key: /etc/tls/api.key }
                    - { cert: /etc/tls/other.crt, key: /etc/tls/other.key }
                  min_version: "1.3"
                  alpn: [http/1.1]
              - 0.0.0.0:8080
              - address: 127.0.0.1:8081
            """)
        #expect(c.listeners.map(\.address.description) == ["0.0.0.0:8443", "0.0.0.0:8080", "127.0.0.1:8081"])
        #expect(c.listen.port == 8443, "the first listener is `listen`")
        let tls = try #require(c.listeners[0].tls)
        #expect(tls.certificates == [
            CertificatePair(cert: "/etc/tls/api.crt", key: "/etc/tls/api.key"),
            CertificatePair(cert: "/etc/tls/other.crt", key: "/etc/tls/other.key"),
        ])
        #expect(tls.minVersion == .tls13)
        #expect(c.listeners[1].tls == nil && c.listeners[2].tls == nil)
    }

    @Test func tlsDefaults() throws {
        let c = try parse(
            """
            listen:
              - address: 127.0.0.1:8443
                tls: { certificates: [ { cert: a.crt, key: a.key } ] }
            """)
        #expect(c.listeners[0].tls?.minVersion == .tls12)
        #expect(c.listeners[0].tls?.alpn == ["h2", "http/1.1"])
    }

    @Test(arguments: [
        ("listen: []", "listen must name at least one address"),
        ("listen: [ { tls: { certificates: [ { cert: a, key: b } ] } } ]", "listen[0] needs an address"),
        ("listen: [ { address: 127.0.0.1:8443, tls: {} } ]", "listen[0].tls.certificates must list at least one"),
        ("listen: [ { address: 127.0.0.1:8443, tls: { certificates: [ { cert: a } ] } } ]", "listen[0].tls.certificates[0] needs both cert and key"),
        ("listen: [ { address: 127.0.0.1:8443, tls: { certificates: [ { cert: a, key: b } ], min_version: \"1.1\" } } ]", "min_version must be \"1.2\" or \"1.3\""),
        ("listen: [ { address: 127.0.0.1:8443, tls: { certificates: [ { cert: a, key: b } ], alpn: [h2] } } ]", "alpn must include http/1.1"),
        ("listen: [ { address: 127.0.0.1:8443, tls: { certificates: [ { cert: a, key: b } ], alpn: [spdy/3, http/1.1] } } ]", "'spdy/3' is not a protocol the proxy speaks"),
        ("listen: [ \"0.0.0.0:8080\", { address: \"0.0.0.0:8080\" } ]", "is listed twice"),
        ("listen: [ \"0.0.0.0:8080\", \"0.0.0.0:8080\" ]", "listen[1]: 0.0.0.0:8080 is listed twice"),
        ("listen: [ { address: 127.0.0.1:8443, tls: { certificates: [ { cert: a, key: b } ], ciphers: x } } ]", "unknown key 'listen[0].tls.ciphers'"),
        ("listen: [ nonsense ]", "listen[0]: 'nonsense' is not HOST:PORT"),
    ])
    func mistakesAreNamed(_ listen: String, _ expected: String) {
        let found = messages(listen)
        #expect(found.contains { $0.contains(expected) }, "\(found)")
    }
}

/// `upstreams.NAME.tls`.
@Suite struct UpstreamTLSConfigTests {
    func config(_ tls: String, endpoint: String = "https://api.internal:443") -> String {
        """
        upstreams: { api: { endpoints: [\(endpoint)], tls: \(tls) } }
        routes: [ { match: { path_prefix: / }, upstream: api } ]
        """
    }

    @Test func everyKey() throws {
        let c = try ConfigLoader.parse(
            config("{ ca: /etc/ca.pem, verify: true, client_cert: /etc/c.crt, client_key: /etc/c.key, server_name: API.Internal }"),
            file: "t.yaml")
        let t = try #require(c.upstreams[0].tls)
        #expect(t.ca == "/etc/ca.pem" && t.verify && t.clientCert == "/etc/c.crt" && t.clientKey == "/etc/c.key")
        #expect(t.serverName == "api.internal")
        #expect(try ConfigLoader.parse(config("{}"), file: "t.yaml").upstreams[0].tls == UpstreamTLSSettings())
    }

    @Test(arguments: [
        ("{ client_cert: /etc/c.crt }", "https://a:443", "client_cert and client_key go together"),
        ("{ server_name: \"bad name\" }", "https://a:443", "'bad name' is not a host name"),
        ("{ verify: false }", "http://a:80", "tls applies to https:// endpoints"),
        ("{ pin: x }", "https://a:443", "unknown key 'upstreams.api.tls.pin'"),
    ])
    func mistakesAreNamed(_ tls: String, _ endpoint: String, _ expected: String) {
        let found = errors(config(tls, endpoint: endpoint)).map(\.message)
        #expect(found.contains { $0.contains(expected) }, "\(found)")
    }
}
