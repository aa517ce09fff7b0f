import HappyPathConfig
import Testing

/// Issue 45: an endpoint URL that carries credentials (`user:password@`,
/// `user@`) is refused, by `happypath check` and at start, since the
/// admin listener and the logs show endpoints as they are written. The
/// message points at `auth` and never repeats the secret.
@Suite struct EndpointCredentialsConfigTests {
    static func yaml(_ endpoint: String) -> String {
        """
        upstreams:
          api: { endpoints: [http://127.0.0.1:9001, "\(endpoint)"] }
        routes:
          - { match: { path_prefix: / }, upstream: api }
        """
    }

    /// Every way the loader's refusal can be printed: each message, and
    /// the whole error as `happypath check` writes it.
    static func printed(_ yaml: String, env: [String: String] = [:]) -> (messages: [String], text: String) {
        do {
            _ = try ConfigLoader.parse(yaml, file: "f.yaml", environment: env)
            return ([], "")
        } catch {
            return (error.errors.map(\.message), "\(error)")
        }
    }

    @Test(arguments: [
        // (endpoint, as the message shows it, the secret and its pieces)
        ("http://alice:s3cret-pw@127.0.0.1:9000", "http://alice:***@127.0.0.1:9000", ["s3cret-pw"]),
        ("https://alice:s3cret-pw@api.example.com/base", "https://alice:***@api.example.com/base", ["s3cret-pw"]),
        // A user alone is often a token (https://TOKEN@host): hidden too.
        ("https://ghp-t0ken-9f2e@api.example.com", "https://***@api.example.com", ["ghp-t0ken-9f2e"]),
        ("http://alice:@127.0.0.1:9000", "http://alice:***@127.0.0.1:9000", []),
        // A raw @ in the password: the userinfo ends at the last one.
        ("http://alice:p@ss-w0rd@127.0.0.1:9000", "http://alice:***@127.0.0.1:9000", ["p@ss", "ss-w0rd"]),
        ("http://alice:p%40ss%2Fw0rd@127.0.0.1:9000", "http://alice:***@127.0.0.1:9000", ["p%40ss", "w0rd"]),
        ("HTTP://alice:s3cret-pw@127.0.0.1:9000", "HTTP://alice:***@127.0.0.1:9000", ["s3cret-pw"]),
    ])
    func credentialsInAnEndpointAreRefusedAndNotRepeated(endpoint: String, shown: String, secrets: [String]) {
        let (messages, text) = Self.printed(Self.yaml(endpoint))
        #expect(messages.count == 1, "\(messages)")
        let message = messages.first ?? ""
        #expect(message.hasPrefix("upstreams.api.endpoints[1]: '\(shown)' carries credentials before the host"), "\(message)")
        // It says what to do instead: the upstream's auth, with a secret from the environment.
        #expect(message.contains("set them in upstreams.api.auth instead"), "\(message)")
        #expect(message.contains(#"auth: { kind: static, scheme: Basic, value: "${BASIC_CREDENTIALS}" }"#), "\(message)")
        #expect(message.contains("docs/auth.md"), "\(message)")
        for secret in secrets { #expect(!text.contains(secret), "\(text)") }
    }

    @Test func aPasswordFromTheEnvironmentIsRefusedWithoutBeingShown() {
        let (messages, text) = Self.printed(
            Self.yaml("http://alice:${API_PASSWORD}@127.0.0.1:9000"), env: ["API_PASSWORD": "env-pw-71c3"])
        #expect(messages.count == 1 && messages[0].contains("'http://alice:***@127.0.0.1:9000' carries credentials"))
        #expect(!text.contains("env-pw-71c3"))
    }

    /// A raw `/` in the password ends the authority early: the URL has no
    /// host then, and that refusal hides the password as well.
    @Test func aPasswordWithASlashIsRefusedAsNoHostAndHidden() {
        let (messages, text) = Self.printed(Self.yaml("http://alice:pa/ss-w0rd@127.0.0.1:9000"))
        #expect(
            messages == [
                "upstreams.api.endpoints[1]: 'http://alice:***@127.0.0.1:9000' is not an http:// or https:// URL with a host"
            ])
        #expect(!text.contains("pa/ss") && !text.contains("ss-w0rd"))
    }

    /// Only the authority counts: an `@` in a base path is a path character.
    @Test func anAtSignInTheBasePathIsNotCredentials() throws {
        let c = try ConfigLoader.parse(Self.yaml("http://127.0.0.1:9000/users/@me"), file: "f.yaml", environment: [:])
        #expect(c.upstreams[0].endpoints == ["http://127.0.0.1:9001", "http://127.0.0.1:9000/users/@me"])
    }

    /// The auth URLs' refusals quote them redacted too.
    @Test func aBadTokenURLIsQuotedWithoutItsPassword() {
        let (messages, text) = Self.printed(
            """
            upstreams:
              api:
                endpoints: [http://127.0.0.1:9000]
                auth: { kind: oauth2_client_credentials, token_url: "ftp://alice:tk-pw-55@idp/token", client_id: x, client_secret: y }
            routes:
              - { match: { path_prefix: / }, upstream: api }
            """)
        #expect(messages == ["upstreams.api.auth.token_url: 'ftp://alice:***@idp/token' is not an http:// or https:// URL"])
        #expect(!text.contains("tk-pw-55"))
    }

    /// `storage.url` names the store in logs and on `/admin/state`: a
    /// password with an `@` of its own is hidden whole, the role name kept.
    @Test(arguments: [
        ("postgres://hp:p@ss@db:5432/hp", "postgres://hp:***@db:5432/hp"),
        ("postgres://hp:s3cret@db/hp?sslmode=require&x=a@b", "postgres://hp:***@db/hp?sslmode=require&x=a@b"),
        ("postgres://hp@db/hp", "postgres://hp@db/hp"),
    ])
    func storageURLsAreRedactedWhole(url: String, shown: String) {
        #expect(StorageConfiguration.redact(url) == shown)
    }
}
