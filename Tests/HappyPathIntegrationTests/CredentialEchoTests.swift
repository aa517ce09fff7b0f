import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// An upstream that echoes what it got (a debugging 500 that dumps its
/// request headers, a token endpoint that repeats the form it was sent)
/// hands the proxy's own credentials back; none of them reaches a client
/// (docs/auth.md, "Where they never appear"). Each credential kind the
/// configuration has is sent to such an upstream, and every byte each
/// client receives is searched for every form of every secret.
@Suite("credential echo") struct CredentialEchoTests {
    // `/` and `+` on purpose: the echo writes `/` as `\/` (Foundation's JSON)
    // and a form writes `%2F` and `%2B`.
    static let clientSecret = "cs/4a1e+echo-never-shown"
    static let refreshToken = "rt/8c2f+echo-never-shown"
    static let rotatedPrefix = "rt-rotated/echo-never-shown-"
    static let password = "pw/e3f8+echo-never-shown"
    static let tokenPrefix = "at/echo-never-shown-"
    static let apiKey = "sk/static+echo-never-shown"
    static let basicPassword = "bp/basic+echo-never-shown"
    static let basic = Data("basic-user:\(basicPassword)".utf8).base64EncodedString()

    /// Every form in which a secret could show: as is, JSON-escaped the
    /// way Foundation writes it, form-encoded.
    static func forms(_ secret: String) -> [String] {
        [
            secret, secret.replacingOccurrences(of: "/", with: "\\/"),
            secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~")))!,
        ]
    }

    static var needles: [String] {
        [clientSecret, refreshToken, rotatedPrefix, password, tokenPrefix, apiKey, basicPassword].flatMap(forms) + [
            basic, "basic-user:",
        ]
    }

    func yaml(_ s: [String: AuthTestServer]) -> String {
        func url(_ name: String, _ path: String = "") -> String { "http://127.0.0.1:\(s[name]!.port)\(path)" }
        return """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { timeout: 5s, reachability: { park_for: 4s } }
            upstreams:
              cc:
                endpoints: [\(url("cc"))]
                auth: { kind: oauth2_client_credentials, token_url: "\(url("cc", "/token"))", client_id: proxy, client_secret: "${CLIENT_SECRET}" }
              rt:
                endpoints: [\(url("rt"))]
                auth: { kind: oauth2_refresh_token, token_url: "\(url("rt", "/token"))", refresh_token: "${REFRESH_TOKEN}" }
              login:
                endpoints: [\(url("login"))]
                auth:
                  kind: login
                  login_url: \(url("login", "/token"))
                  login_body: '{"user":"proxy","password":"${PASSWORD}"}'
                  token_pointer: /access_token
              key:
                endpoints: [\(url("key"))]
                auth: { kind: static, header: X-Api-Key, value: "${API_KEY}" }
              basic:
                endpoints: [\(url("basic"))]
                auth: { kind: static, scheme: Basic, value: "${BASIC}" }
            routes:
              - { match: { path_prefix: /cc/ }, upstream: cc }
              - { match: { path_prefix: /rt/ }, upstream: rt }
              - { match: { path_prefix: /login/ }, upstream: login }
              - { match: { path_prefix: /key/ }, upstream: key }
              - { match: { path_prefix: /basic/ }, upstream: basic }
            """
    }

    /// One request on its own connection, `Connection: close`; every byte
    /// the proxy sent back, head included.
    func raw(_ port: Int, _ path: String) throws -> [UInt8] {
        let c = try TestConnection(port: port)
        try c.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(c.fd, &chunk, chunk.count, 0)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        return bytes
    }

    func body(_ bytes: [UInt8]) -> [String: Any] {
        guard let end = bytes.firstRange(of: Array("\r\n\r\n".utf8))?.upperBound else { return [:] }
        return (try? JSONSerialization.jsonObject(with: Data(bytes[end...]))) as? [String: Any] ?? [:]
    }

    func status(_ bytes: [UInt8]) -> Int {
        Int(String(decoding: bytes.prefix(12), as: UTF8.self).split(separator: " ").dropFirst().first ?? "") ?? 0
    }

    @Test func noCredentialOfAnyKindReachesAClientThroughAnEchoingUpstream() throws {
        let names = ["cc", "rt", "login", "key", "basic"]
        var servers: [String: AuthTestServer] = [:]
        for name in names { servers[name] = try AuthTestServer() }
        defer { servers.values.forEach { $0.stop() } }
        for server in servers.values {
            server.state.withLock {
                $0.tokenPrefix = Self.tokenPrefix
                $0.echoStatus = 500
                $0.echoTokenErrors = true
            }
        }
        servers["rt"]!.state.withLock { $0.refreshPrefix = Self.rotatedPrefix }
        let h = try ProxyHarness(
            yaml(servers),
            environment: [
                "CLIENT_SECRET": Self.clientSecret, "REFRESH_TOKEN": Self.refreshToken, "PASSWORD": Self.password,
                "API_KEY": Self.apiKey, "BASIC": Self.basic,
            ])
        var received: [(String, [UInt8])] = []

        // 1. Each upstream answers 500 with its request dumped: the problem
        //    keeps the dump as upstream_body, with the credential as ***.
        for name in names {
            let bytes = try raw(h.port, "/\(name)/data")
            received.append(("500 echo from \(name)", bytes))
            #expect(status(bytes) == 503, "\(name)")
            let upstreamBody = try #require(body(bytes)["upstream_body"] as? [String: Any], "\(name) keeps upstream_body")
            let headers = upstreamBody["headers"] as? [String: String] ?? [:]
            let header = name == "key" ? "x-api-key" : "authorization"
            let echoed = headers.first { $0.key.lowercased() == header }?.value
            #expect(echoed == "***", "\(name): the echoed \(header) is \(echoed ?? "missing")")
            if name == "basic" { #expect(upstreamBody["basic"] as? String == "***") }
        }
        // The credentials did reach the upstreams (so the echoes carried them).
        #expect(servers["cc"]!.state.withLock { $0.tokenBodies.first ?? "" }.contains("client_secret=cs%2F4a1e%2Becho"))
        #expect(servers["rt"]!.state.withLock { $0.tokenBodies.first ?? "" }.contains("refresh_token=rt%2F8c2f%2Becho"))
        #expect(servers["login"]!.state.withLock { $0.tokenBodies.first ?? "" }.contains(Self.password))

        // 2. The upstreams refuse the credential (401, echoed); the token
        //    endpoints refuse the refresh with 400, echoing the form: the
        //    client secret, the rotated refresh token, the login body.
        for server in servers.values {
            server.state.withLock {
                $0.echoStatus = 401
                $0.tokenStatus = 400
            }
        }
        for name in names {
            let bytes = try raw(h.port, "/\(name)/data")
            received.append(("refused refresh for \(name)", bytes))
            #expect(body(bytes)["code"] as? String == "AUTH_FAILED", "\(name)")
        }
        #expect(servers["rt"]!.state.withLock { $0.tokenBodies.last ?? "" }.contains("rt-rotated%2Fecho"))
        #expect(servers["cc"]!.tokenCalls == 2)

        for (what, bytes) in received {
            let text = String(decoding: bytes, as: UTF8.self)
            for needle in Self.needles {
                #expect(!text.contains(needle), "\(what) shows \(needle)")
            }
        }

        // 3. A response that is not an error passes through byte for byte,
        //    whatever it holds (documented): the scrubbing is for problems.
        servers["key"]!.state.withLock { $0.echoStatus = 200 }
        let passed = try raw(h.port, "/key/data")
        #expect(status(passed) == 200)
        #expect(String(decoding: passed, as: UTF8.self).contains("sk\\/static+echo-never-shown"))
    }
}
