import HappyPathCore
import HappyPathPolicies
import Testing

/// What a kept answer is filed under (`StaleKey`): the client-facing
/// authority, scheme and forwarding fields, and a hash of the credentials;
/// nothing else of the request, and no credential in clear.
@Suite struct StaleKeyTests {
    static let salt = Array("salt for the tests".utf8)
    static let key = StaleKey(privateHeaders: FallbackConfiguration.defaultPrivateHeaders)

    static func keys(
        _ fields: [(String, String)], key: StaleKey = key, scheme: String = "http", target: String = "/catalog/a",
        upstream: String = "api", salt: [UInt8] = salt
    ) -> StaleKey.Keys {
        var reader = key.reader(salt: salt)
        for (name, value) in fields { reader.field(name: name, value: value) }
        return reader.keys(upstream: upstream, target: target, scheme: scheme)
    }

    static let plain = keys([("Host", "shop.example")])

    @Test func theAuthorityAndTheSchemeAreInTheKey() {
        #expect(Self.plain.credentials == nil)
        #expect(Self.plain.lookup == [Self.plain.shared])
        #expect(Self.keys([("host", "shop.example")]) == Self.plain)
        #expect(Self.keys([("Host", "evil.example")]).shared != Self.plain.shared)
        #expect(Self.keys([("Host", "shop.example:8443")]).shared != Self.plain.shared)
        #expect(Self.keys([]).shared != Self.plain.shared)
        #expect(Self.keys([("Host", "shop.example")], scheme: "https").shared != Self.plain.shared)
        #expect(Self.keys([("Host", "shop.example")], target: "/catalog/b").shared != Self.plain.shared)
        #expect(Self.keys([("Host", "shop.example")], upstream: "other").shared != Self.plain.shared)
    }

    /// Forwarding fields a client sent go upstream as they came: an
    /// answer built from them is filed under them.
    @Test(arguments: [
        ("X-Forwarded-Host", "evil.example"), ("x-forwarded-host", "shop.example"), ("X-Forwarded-Proto", "https"),
        ("Forwarded", "host=evil.example;proto=https"),
    ])
    func forwardingFieldsTheClientSentAreInTheKey(name: String, value: String) {
        let with = Self.keys([("Host", "shop.example"), (name, value)])
        #expect(with.shared != Self.plain.shared)
        #expect(with.credentials == nil)
        #expect(Self.keys([("Host", "shop.example"), (name, value + "x")]).shared != with.shared)
        // Two lines are not the one line they would join to.
        let twoLines = Self.keys([("Host", "shop.example"), (name, "a"), (name, "b")]).shared
        #expect(twoLines != Self.keys([("Host", "shop.example"), (name, "a,b")]).shared)
        #expect(twoLines != Self.keys([("Host", "shop.example"), (name, "a")]).shared)
    }

    /// Fields the proxy does not pass on by design, or that say nothing of
    /// the answer, do not split what is shared (`Vary` does that).
    @Test(arguments: ["User-Agent", "Accept", "Accept-Language", "X-Forwarded-For", "X-Request-Id", "traceparent"])
    func otherFieldsAreNotInTheKey(name: String) {
        #expect(Self.keys([("Host", "shop.example"), (name, "anything")]) == Self.plain)
    }

    /// Each credential field splits the key by its value's hash; the same
    /// values make the same key, in any order; no value is kept in clear.
    @Test(arguments: ["Authorization", "Cookie", "Proxy-Authorization", "X-Api-Key", "x-tenant", "X-Session"])
    func credentialsPartitionTheKey(name: String) throws {
        let key = StaleKey(privateHeaders: ["X-Api-Key", "X-Session"], rateLimitHeader: "X-Tenant")
        let alice = Self.keys([("Host", "shop.example"), (name, "alice-secret")], key: key)
        let bob = Self.keys([("Host", "shop.example"), (name, "bob-secret")], key: key)
        let aliceCredentials = try #require(alice.credentials)
        #expect(alice.shared == Self.keys([("Host", "shop.example")], key: key).shared)
        #expect(aliceCredentials != alice.shared && bob.credentials != aliceCredentials)
        #expect(alice.lookup == [aliceCredentials, alice.shared])
        #expect(alice.keep(shared: false) == aliceCredentials && alice.keep(shared: true) == alice.shared)
        #expect(Self.keys([("Host", "shop.example"), (name.uppercased(), "alice-secret")], key: key) == alice)
        #expect(!aliceCredentials.contains("alice"))
        // Another salt, another hash.
        #expect(Self.keys([("Host", "shop.example"), (name, "alice-secret")], key: key, salt: [1]) != alice)
        // Another authority: other keys, credentials or not.
        let elsewhere = Self.keys([("Host", "evil.example"), (name, "alice-secret")], key: key)
        #expect(elsewhere.shared != alice.shared && elsewhere.credentials != alice.credentials)
    }

    @Test func severalCredentialsHashTheSameInAnyOrder() {
        let one = Self.keys([("Host", "h"), ("Cookie", "a=1"), ("Authorization", "Bearer t")])
        let other = Self.keys([("Authorization", "Bearer t"), ("Host", "h"), ("Cookie", "a=1")])
        #expect(one == other)
        #expect(one.credentials != Self.keys([("Host", "h"), ("Cookie", "a=1")]).credentials)
        #expect(
            one.credentials
                != Self.keys([("Host", "h"), ("Cookie", "a=1"), ("Cookie", "b=2"), ("Authorization", "Bearer t")]).credentials)
    }

    /// `private_headers` replaces the default; the standard three and the
    /// rate limit's header always count.
    @Test func privateHeadersReplaceTheDefault() {
        #expect(
            StaleKey(privateHeaders: FallbackConfiguration.defaultPrivateHeaders).credentialNames
                == ["authorization", "cookie", "proxy-authorization", "x-api-key"])
        let none = StaleKey(privateHeaders: [])
        #expect(Self.keys([("Host", "h"), ("X-Api-Key", "k")], key: none).credentials == nil)
        #expect(Self.keys([("Host", "h"), ("Authorization", "k")], key: none).credentials != nil)
        #expect(
            StaleKey(privateHeaders: ["Cookie", "X-Key", "x-key"], rateLimitHeader: "X-Key").credentialNames
                == ["authorization", "cookie", "proxy-authorization", "x-key"])
    }

    /// A `Vary` value of a credential field is kept as a salted hash.
    @Test func varyValuesOfCredentialsAreHashed() throws {
        let hashed = try #require(Self.key.varyValue(name: "authorization", value: "Bearer alice", salt: Self.salt))
        #expect(hashed.hasPrefix("sha256:") && !hashed.contains("alice"))
        #expect(Self.key.varyValue(name: "Authorization", value: " Bearer alice ", salt: Self.salt) == hashed)
        #expect(Self.key.varyValue(name: "authorization", value: "Bearer bob", salt: Self.salt) != hashed)
        #expect(Self.key.varyValue(name: "x-api-key", value: "k", salt: Self.salt)?.hasPrefix("sha256:") == true)
        #expect(Self.key.varyValue(name: "authorization", value: nil, salt: Self.salt) == nil)
        #expect(Self.key.varyValue(name: "accept-language", value: "de", salt: Self.salt) == "de")
    }

    /// With credentials on the request: shared only if the upstream
    /// declared it so (`public`, `s-maxage`); else kept for those very
    /// credentials. Without credentials: shared.
    @Test func credentialedAnswersAreKeptApartUnlessPublic() {
        func decide(_ fields: [String: String], credentials: Bool) -> StaleRules.Decision? {
            StaleRules.decide(
                method: "GET", status: 200, fields: fields.map { HTTPField(name: $0.key, value: $0.value) },
                requestHasCredentials: credentials, serveStale: .seconds(600))
        }
        #expect(decide([:], credentials: false)?.shared == true)
        #expect(decide([:], credentials: true)?.shared == false)
        #expect(decide(["Cache-Control": "max-age=60"], credentials: true)?.shared == false)
        #expect(decide(["Cache-Control": "public"], credentials: true)?.shared == true)
        #expect(decide(["Cache-Control": "s-maxage=30"], credentials: true)?.shared == true)
        #expect(decide(["Cache-Control": "public, private"], credentials: true) == nil)
        #expect(decide(["Set-Cookie": "a=b"], credentials: true) == nil)
    }

    /// The store: the newest of the answers under a request's own
    /// credentials and the shared ones.
    @Test func theNewestOfOwnAndSharedIsAnswered() {
        let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 16, salt: Self.salt)
        let t0 = Instant(nanoseconds: 1_000_000_000)
        func entry(_ body: String, at: Instant) -> StaleEntry {
            StaleEntry(
                status: 200, reason: nil, fields: [], body: Array(body.utf8), receivedAt: at, expiresAt: at + .seconds(60),
                varyNames: [], varyValues: [], path: "/a")
        }
        store.keep(entry("own", at: t0), key: "own")
        store.keep(entry("shared", at: t0 + .seconds(1)), key: "shared")
        func answer(_ keys: [String]) -> String? {
            store.lookup(keys: keys, at: t0 + .seconds(2), requestValue: { _ in nil }).map {
                String(decoding: $0.body, as: UTF8.self)
            }
        }
        #expect(answer(["own", "shared"]) == "shared")
        store.keep(entry("own, newer", at: t0 + .seconds(2)), key: "own")
        #expect(answer(["own", "shared"]) == "own, newer")
        #expect(answer(["shared"]) == "shared")
        #expect(answer(["other", "shared"]) == "shared")
        #expect(answer(["other"]) == nil)
    }
}
