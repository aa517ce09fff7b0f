import Foundation
import HappyPathCore
import HappyPathConfig
import HappyPathServer
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Credentials never leave the proxy except to where they belong: after a
/// token refresh storm, failed refreshes and reloads (one refused, one that
/// rotates the client secret), no configured secret and no obtained token
/// appears in the logs, the access log, the event stream, the admin state,
/// the metrics or any answer a client got.
@Suite("secrets") struct SecretRedactionTests {
    static let clientSecret = "cs-7d41-never-shown"
    static let rotatedSecret = "cs-0b9e-rotated-never-shown"
    static let refreshToken = "rt-52ac-never-shown"
    static let password = "pw-e3f8-never-shown"
    static let tokenPrefix = "at-91c6-never-shown-"

    func yaml(cc: AuthTestServer, rt: AuthTestServer, login: AuthTestServer, listen: String = "127.0.0.1:0") -> String {
        """
        listen: \(listen)
        admin: { listen: 127.0.0.1:0 }
        defaults: { timeout: 5s, reachability: { park_for: 4s } }
        upstreams:
          cc:
            endpoints: [http://127.0.0.1:\(cc.port)]
            auth: { kind: oauth2_client_credentials, token_url: "http://127.0.0.1:\(cc.port)/token", client_id: proxy, client_secret: "${CLIENT_SECRET}" }
          rt:
            endpoints: [http://127.0.0.1:\(rt.port)]
            auth: { kind: oauth2_refresh_token, token_url: "http://127.0.0.1:\(rt.port)/token", refresh_token: "${REFRESH_TOKEN}" }
          login:
            endpoints: [http://127.0.0.1:\(login.port)]
            auth:
              kind: login
              login_url: http://127.0.0.1:\(login.port)/token
              login_body: '{"user":"proxy","password":"${PASSWORD}"}'
              token_pointer: /access_token
        routes:
          - { match: { path_prefix: /cc/ }, upstream: cc }
          - { match: { path_prefix: /rt/ }, upstream: rt }
          - { match: { path_prefix: /login/ }, upstream: login }
        """
    }

    /// Reads an SSE stream into `text` on its own thread until stopped.
    final class EventRecorder: @unchecked Sendable {
        let connection: TestConnection
        let text = Locked("")
        let stopped = Atomic(false)
        let done = DispatchSemaphore(value: 0)

        init(adminPort: Int) throws {
            connection = try TestConnection(port: adminPort, timeout: 0.2)
            try connection.send("GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1:\(adminPort)\r\n\r\n")
            Thread { [self] in
                var chunk = [UInt8](repeating: 0, count: 4096)
                while !stopped.load(ordering: .relaxed) {
                    let n = recv(connection.fd, &chunk, chunk.count, 0)
                    if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { break }
                    if n > 0 { text.withLock { $0 += String(decoding: chunk[0..<n], as: UTF8.self) } }
                }
                done.signal()
            }.start()
        }

        var current: String { text.withLock { $0 } }

        func stop() {
            stopped.store(true, ordering: .relaxed)
            done.wait()
        }
    }

    @Test func noSecretAppearsAnywhereAfterAStormAndReloads() throws {
        let cc = try AuthTestServer()
        let rt = try AuthTestServer()
        let login = try AuthTestServer()
        defer { [cc, rt, login].forEach { $0.stop() } }
        for server in [cc, rt, login] { server.state.withLock { $0.tokenPrefix = Self.tokenPrefix } }
        let env = [
            "CLIENT_SECRET": Self.clientSecret, "REFRESH_TOKEN": Self.refreshToken, "PASSWORD": Self.password,
        ]
        let log = CapturedLog()
        let accessLog = Locked("")
        let h = try ProxyHarness(
            yaml(cc: cc, rt: rt, login: login), workers: 2, logger: log.logger, environment: env,
            accessLog: AccessLogSettings(
                level: .info, format: .json,
                sink: { bytes in
                    accessLog.withLock { $0 += String(decoding: bytes, as: UTF8.self) }
                }))
        let events = try EventRecorder(adminPort: h.adminPort)
        var answers: [String] = []
        func get(_ path: String) throws -> TestResponse {
            let r = try HTTP.request(port: h.port, path)
            answers.append(r.headers.map { "\($0.name): \($0.value)" }.joined(separator: "\n") + "\n" + r.text)
            return r
        }

        // Every kind fetches its first token.
        for prefix in ["/cc/", "/rt/", "/login/"] { #expect(try get(prefix + "data").status == 200) }

        // A storm: the token is refused under 40 concurrent requests; one refresh serves them all.
        cc.invalidate()
        let clients = try (0..<40).map { i -> TestConnection in
            let c = try TestConnection(port: h.port)
            try c.send("GET /cc/data?i=\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            return c
        }
        for c in clients {
            let r = try c.readResponse()
            answers.append(r.text)
            #expect(r.status == 200)
        }
        #expect(cc.tokenCalls == 2)

        // Refreshes that fail: a refused credential, and a token endpoint that is down.
        rt.invalidate()
        rt.state.withLock { $0.tokenStatus = 400 }
        #expect(try get("/rt/data").json["code"] as? String == "AUTH_FAILED")
        login.invalidate()
        login.state.withLock { $0.failNext = 10 }
        #expect(try get("/login/data").json["code"] as? String == "AUTH_FAILED")

        // A reload refused (a restart-only key), then one that rotates the client secret.
        var refused = try ConfigLoader.parse(
            yaml(cc: cc, rt: rt, login: login, listen: "127.0.0.1:1"), file: "test.yaml", environment: env)
        refused.source = "refused.yaml"
        #expect(!h.proxy.reload(refused).isEmpty)
        var rotatedEnv = env
        rotatedEnv["CLIENT_SECRET"] = Self.rotatedSecret
        #expect(
            h.proxy.reload(try ConfigLoader.parse(yaml(cc: cc, rt: rt, login: login), file: "test.yaml", environment: rotatedEnv))
                .isEmpty)
        // The changed secret is in force: a fresh token was fetched with it.
        #expect(eventually { (try? get("/cc/data").status) == 200 && cc.tokenCalls == 3 })
        #expect(cc.state.withLock { $0.tokenBodies.last?.contains("client_secret=\(Self.rotatedSecret)") } == true)

        #expect(eventually { events.current.contains("event: config_reloaded") })
        #expect(eventually { events.current.contains("event: token_refresh_failed") })
        events.stop()
        let state = try HTTP.request(port: h.adminPort, "/admin/state").text
        let metrics = try HTTP.request(port: h.adminPort, "/metrics").text
        #expect(eventually { accessLog.withLock { $0.contains("/login/") } })

        let everything: [(String, String)] = [
            ("log", log.text), ("access log", accessLog.withLock { $0 }), ("events", events.current),
            ("admin state", state), ("metrics", metrics), ("answers", answers.joined(separator: "\n")),
            ("configuration", "\(h.proxy.runtime.configuration)"),
        ]
        for (place, text) in everything {
            #expect(!text.isEmpty, "\(place) captured nothing")
            for secret in [Self.clientSecret, Self.rotatedSecret, Self.refreshToken, Self.password, Self.tokenPrefix] {
                #expect(!text.contains(secret), "\(place) shows \(secret)")
            }
        }
        // And the secrets did reach where they belong.
        #expect(cc.state.withLock { $0.tokenBodies.first?.contains("client_secret=\(Self.clientSecret)") } == true)
        #expect(rt.state.withLock { $0.tokenBodies.first?.contains("refresh_token=\(Self.refreshToken)") } == true)
        #expect(login.state.withLock { $0.tokenBodies.first?.contains(Self.password) } == true)
    }
}
