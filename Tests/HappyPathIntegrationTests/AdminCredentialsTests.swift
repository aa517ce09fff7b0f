import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 45, credentials never on admin: the real binary, with a secret of
/// every static kind written where the configuration takes secrets
/// (`auth.value` as a header of its own and as `Basic`, a client secret),
/// serves requests that fetch, refresh and are refused tokens, an echoing
/// upstream's 500, admin actions and a reload; then `/admin/state`,
/// `/status`, `/metrics`, the event stream, every log line (debug, access
/// log included) and `happypath check` are searched for each secret in
/// each form it could take. And an endpoint URL with credentials in it is
/// refused by `happypath check` without repeating them.
@Suite("credentials never on admin") struct AdminCredentialsTests {
    static let apiKey = "ak-1d93-never-shown"
    static let basicUser = "svc-user"
    static let basicPassword = "bp-4a7e-never-shown"
    static let basic = Data("\(basicUser):\(basicPassword)".utf8).base64EncodedString()
    static let clientSecret = "cs-66b0-never-shown"
    static let tokenPrefix = "at-c2f7-never-shown-"

    /// What must show nowhere: each secret, the `Basic` one decoded too.
    static let secrets = [apiKey, basic, "\(basicUser):\(basicPassword)", basicPassword, clientSecret, tokenPrefix]

    func yaml(key: AuthTestServer, basic: AuthTestServer, cc: AuthTestServer) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        workers: 2
        defaults: { timeout: 5s, retry: { attempts: 1 }, reachability: { park_for: 2s } }
        upstreams:
          key:
            endpoints: [http://127.0.0.1:\(key.port)]
            auth: { kind: static, header: X-Api-Key, value: "\(Self.apiKey)" }
          basic:
            endpoints: [http://127.0.0.1:\(basic.port)]
            auth: { kind: static, scheme: Basic, value: "\(Self.basic)" }
          cc:
            endpoints: [http://127.0.0.1:\(cc.port)]
            auth: { kind: oauth2_client_credentials, token_url: "http://127.0.0.1:\(cc.port)/token", client_id: proxy, client_secret: "\(Self.clientSecret)" }
        routes:
          - { match: { path_prefix: /key/ }, upstream: key }
          - { match: { path_prefix: /basic/ }, upstream: basic }
          - { match: { path_prefix: /cc/ }, upstream: cc }
        """
    }

    func file(_ text: String) throws -> String {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        try text.write(to: file, atomically: true, encoding: .utf8)
        return file.path
    }

    @Test func noConfiguredSecretShowsOnTheAdminListenerOrInTheLogs() throws {
        let key = try AuthTestServer()
        let basic = try AuthTestServer()
        let cc = try AuthTestServer()
        defer { [key, basic, cc].forEach { $0.stop() } }
        cc.state.withLock { $0.tokenPrefix = Self.tokenPrefix }
        // An upstream that dumps the request it got (its X-Api-Key with it) in a 500.
        key.state.withLock { $0.echoStatus = 500 }
        let config = yaml(key: key, basic: basic, cc: cc)
        let serve = try ServeProcess(config: config, logLevel: "debug")
        let port = try #require(serve.listeningPort())
        let adminPort = try #require(serve.adminPort())
        serve.waitForSignalHandlers()
        let events = try SecretRedactionTests.EventRecorder(adminPort: adminPort)

        // A token fetched, used, refused and refreshed; a static key echoed
        // back in a 500; a Basic credential refused.
        #expect(try HTTP.request(port: port, "/cc/data").status == 200)
        cc.invalidate()
        #expect(try HTTP.request(port: port, "/cc/data").status == 200)
        #expect(cc.tokenCalls == 2)
        let echoed = try HTTP.request(port: port, "/key/data")
        #expect(echoed.status == 503 && echoed.text.contains(#""X-Api-Key":"***""#), "\(echoed.text)")
        #expect(try HTTP.request(port: port, "/basic/data").json["code"] as? String == "AUTH_FAILED")
        // Admin actions, and a reload, each logged and published.
        for action in ["open", "auto"] {
            #expect(try HTTP.request(port: adminPort, "POST", "/admin/upstreams/basic/breaker/\(action)").status == 200)
        }
        serve.signal(SIGHUP)
        #expect(eventually { events.current.contains("event: config_reloaded") })
        #expect(eventually { events.current.contains("event: breaker_released") })
        events.stop()

        let state = try HTTP.request(port: adminPort, "/admin/state")
        let page = try HTTP.request(port: adminPort, "/status")
        let metrics = try HTTP.request(port: adminPort, "/metrics")
        #expect(state.status == 200 && page.status == 200 && metrics.status == 200)
        #expect(state.text.contains("\"upstreams\"") && page.text.contains("cc"))
        let check = try runProcess(happypathBinary, ["check", "--config", try file(config)])
        #expect(check.status == 0, "\(check.err)")

        serve.signal(SIGTERM)
        #expect(serve.waitForExit())
        // The access log's lines are in the log: each request shows there.
        #expect(serve.errors.contains("\"msg\":\"request\""))
        #expect(serve.errors.contains("token refreshed"))

        let places: [(String, String)] = [
            ("/admin/state", state.text), ("/status", page.text), ("/metrics", metrics.text), ("/admin/events", events.current),
            ("the log (stderr)", serve.errors), ("stdout", serve.output), ("happypath check", check.out + check.err),
        ]
        for (place, text) in places {
            #expect(!text.isEmpty, "\(place) captured nothing")
            for secret in Self.secrets {
                #expect(!text.contains(secret), "\(place) shows \(secret)")
            }
        }
        // The secrets did go where they belong.
        #expect(cc.state.withLock { $0.tokenBodies.first?.contains("client_secret=\(Self.clientSecret)") } == true)
    }

    /// `happypath check` refuses an endpoint with credentials in its URL,
    /// says to use `auth`, and prints the password as `***`.
    @Test func checkRefusesAnEndpointWithCredentialsWithoutPrintingThem() throws {
        let path = try file(
            """
            listen: 127.0.0.1:0
            upstreams: { u: { endpoints: ["http://svc-user:\(Self.basicPassword)@127.0.0.1:9"] } }
            routes: [ { match: { path_prefix: / }, upstream: u } ]
            """)
        let check = try runProcess(happypathBinary, ["check", "--config", path])
        #expect(check.status == 1)
        let printed = check.out + check.err
        #expect(printed.contains("'http://svc-user:***@127.0.0.1:9' carries credentials before the host"), "\(printed)")
        #expect(printed.contains("upstreams.u.auth"), "\(printed)")
        #expect(!printed.contains(Self.basicPassword), "\(printed)")
    }
}
