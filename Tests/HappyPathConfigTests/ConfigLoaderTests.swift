import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Testing

func errors(_ yaml: String, env: [String: String] = [:]) -> [ConfigError] {
    do {
        _ = try ConfigLoader.parse(yaml, file: "f.yaml", environment: env)
        return []
    } catch {
        return error.errors
    }
}

let minimal = """
    upstreams:
      api:
        endpoints: [http://127.0.0.1:9000]
    routes:
      - match: { path_prefix: / }
        upstream: api
    """

@Suite struct ConfigLoaderTests {
    /// config/happypath.yaml, which `make run` and the README's walk-through
    /// use, stays valid, and its failure examples stay on an upstream of
    /// their own whose breaker their failures cannot open.
    @Test func theShippedExampleKeepsTheWalkThroughTrue() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let c = try ConfigLoader.load(path: root.appendingPathComponent("config/happypath.yaml").path, environment: [:])
        func upstream(_ path: String) -> String? { c.router.route(path: path, method: "GET").map { c.routes[$0].upstream } }
        #expect(upstream("/api/ok") == "demo")
        #expect(upstream("/api/status/404") == "demo")
        for path in ["/unstable/slow", "/unstable/flaky", "/unstable/status/503"] { #expect(upstream(path) == "unstable") }
        // slow (2 timeouts), flaky (at worst 4 failed tries) and 503 (4 tries): 10 failures in a row at most.
        let threshold = c.upstream(named: "unstable")?.policies.circuitBreaker.consecutiveFailures ?? 5
        #expect(threshold > 10)
        #expect(c.resolvedPolicies(forRoute: 1).retry.attempts == 4)
    }

    /// Every credential key is read as a `Secret`: printing the whole
    /// configuration shows none of them, yet each is there to reveal.
    @Test func credentialsArePrintedAsStars() throws {
        let env = ["CS": "cs-value-1f", "RT": "rt-value-2e", "PW": "pw-value-3d", "KEY": "key-value-4c"]
        let c = try ConfigLoader.parse(
            """
            upstreams:
              cc: { endpoints: [http://a], auth: { kind: oauth2_client_credentials, token_url: http://a/t, client_id: id, client_secret: "${CS}" } }
              rt: { endpoints: [http://b], auth: { kind: oauth2_refresh_token, token_url: http://b/t, refresh_token: "${RT}" } }
              lg: { endpoints: [http://c], auth: { kind: login, login_url: http://c/l, login_body: '{"pw":"${PW}"}', token_pointer: /t } }
              st: { endpoints: [http://d], auth: { kind: static, value: "${KEY}" } }
            routes: [ { match: { path_prefix: / }, upstream: cc } ]
            """, file: "f.yaml", environment: env)
        var dumped = ""
        dump(c, to: &dumped)
        for text in ["\(c)", String(reflecting: c), dumped, "\(c.upstreams)"] {
            for secret in env.values { #expect(!text.contains(secret)) }
        }
        #expect(c.upstreams[0].auth.clientSecret?.reveal == "cs-value-1f")
        #expect(c.upstreams[1].auth.refreshToken?.reveal == "rt-value-2e")
        #expect(c.upstreams[2].auth.loginBody?.reveal == #"{"pw":"pw-value-3d"}"#)
        #expect(c.upstreams[3].auth.value?.reveal == "key-value-4c")
    }

    @Test func minimalConfigGetsTheDocumentedDefaults() throws {
        let c = try ConfigLoader.parse(minimal, file: "f.yaml")
        #expect(c.listen == ListenAddress(host: "0.0.0.0", port: 8080))
        #expect(c.workers == nil)
        #expect(c.admin.listen == ListenAddress(host: "127.0.0.1", port: 9901))
        #expect(c.limits.maxRequestBody == 10 * 1024 * 1024)
        #expect(c.limits.maxHeaderBytes == 64 * 1024)
        #expect(c.limits.clientTimeout == .seconds(30))
        #expect(c.limits.maxParked == 10_000)
        #expect(c.limits.maxClientConnections == 10_000)
        let p = c.resolvedPolicies(forRoute: 0)
        #expect(p.timeout == .seconds(10))
        #expect(p.retry.attempts == 3)
        #expect(p.retry.methods == ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"])
        #expect(p.circuitBreaker.whileOpen == .park)
        #expect(p.reachability.parkFor == .seconds(10))
        #expect(c.upstreams[0].connectTimeout == .seconds(1))
        #expect(c.upstreams[0].maxConnectionsPerEndpoint == 256)
    }

    @Test func maxConnectionsIsReadAndMustBePositive() throws {
        let c = try ConfigLoader.parse("limits: { max_connections: 5 }\n" + minimal, file: "f.yaml")
        #expect(c.limits.maxClientConnections == 5)
        let e = errors("limits: { max_connections: 0 }\n" + minimal)
        #expect(e.count == 1)
        #expect(e.first?.message.contains("limits.max_connections") == true)
    }

    @Test func routeOverUpstreamOverDefaults() throws {
        let c = try ConfigLoader.parse(
            """
            defaults:
              timeout: 7s
              retry: { attempts: 5, per_try_timeout: 1s }
            upstreams:
              api:
                endpoints: [http://127.0.0.1:9000]
                retry: { attempts: 2 }
                timeout: 6s
            routes:
              - match: { path_prefix: /a }
                upstream: api
                timeout: 2s
              - match: { path_prefix: /b }
                upstream: api
                retry: { per_try_timeout: 250ms }
            """, file: "f.yaml")
        let a = c.resolvedPolicies(forRoute: 0)
        #expect(a.timeout == .seconds(2))
        #expect(a.retry.attempts == 2)
        #expect(a.retry.perTryTimeout == .seconds(1))
        let b = c.resolvedPolicies(forRoute: 1)
        #expect(b.timeout == .seconds(6))
        #expect(b.retry.perTryTimeout == .milliseconds(250))
        #expect(b.retry.backoffMax == .seconds(2))
    }

    @Test func badDurationIsReportedWithLineAndColumn() {
        let e = errors(
            """
            defaults:
              timeout: 10 seconds
            \(minimal)
            """)
        #expect(e.count == 1)
        #expect(e.first?.description == "f.yaml:2:12: defaults.timeout: '10 seconds' is not a duration; write e.g. 250ms, 2s, 1m")
    }

    @Test func unknownKeyIsReportedWithLineColumnAndSuggestion() {
        let e = errors(
            """
            limits:
              max_requst_body: 1MiB
            \(minimal)
            """)
        #expect(e.count == 1)
        #expect(e.first?.line == 2)
        #expect(e.first?.column == 3)
        #expect(e.first?.message.contains("unknown key 'limits.max_requst_body'") == true)
        #expect(e.first?.message.contains("did you mean 'max_request_body'") == true)
    }

    @Test func routeToMissingUpstream() {
        let e = errors(
            """
            upstreams:
              api: { endpoints: [http://127.0.0.1:9000] }
            routes:
              - match: { path_prefix: / }
                upstream: apj
            """)
        #expect(e.count == 1)
        #expect(e.first?.line == 5)
        #expect(e.first?.column == 15)
        #expect(e.first?.message == "routes[0].upstream: no upstream named 'apj' (defined: api)")
    }

    @Test func everyProblemIsReportedAtOnce() {
        let e = errors(
            """
            listen: nowhere
            workers: 0
            limits: { max_request_body: lots, client_timeout: 5 }
            upstreams:
              api: { endpoints: [ftp://x], max_connections: -1 }
            routes:
              - match: { path_prefix: api }
                upstream: nope
            """)
        #expect(e.map { "\($0.line):\($0.column)" } == ["1:9", "2:10", "3:29", "3:51", "5:22", "5:49", "7:27", "8:15"])
        #expect(e[5].message == "upstreams.api.max_connections must be at least 1, got -1")
        #expect(e.allSatisfy { $0.file == "f.yaml" && $0.line > 0 && $0.column > 0 })
    }

    @Test func shadowedRouteIsAnError() {
        let e = errors(
            """
            upstreams: { api: { endpoints: [http://127.0.0.1:9000] } }
            routes:
              - { match: { path_prefix: / }, upstream: api }
              - { match: { path_prefix: /api/ }, upstream: api }
            """)
        #expect(e.count == 1)
        #expect(e.first?.line == 4)
        #expect(e.first?.message.contains("can never match") == true)
    }

    @Test func environmentSubstitution() throws {
        let c = try ConfigLoader.parse(
            """
            listen: ${LISTEN:-127.0.0.1:8181}
            upstreams: { api: { endpoints: ["${API_URL}"] } }
            routes: [ { match: { path_prefix: / }, upstream: api } ]
            """, file: "f.yaml", environment: ["API_URL": "http://10.0.0.1:9000/base/"])
        #expect(c.listen == ListenAddress(host: "127.0.0.1", port: 8181))
        #expect(c.upstreams[0].endpoints == ["http://10.0.0.1:9000/base"])
    }

    @Test func unsetSecretVariableIsNamed() {
        let e = errors(
            """
            upstreams:
              api:
                endpoints: [http://127.0.0.1:9000]
                auth:
                  kind: oauth2_client_credentials
                  token_url: http://127.0.0.1:9000/token
                  client_id: ${API_CLIENT_ID}
                  client_secret: ${API_CLIENT_SECRET}
            routes: [ { match: { path_prefix: / }, upstream: api } ]
            """, env: ["API_CLIENT_ID": "s3cr3t-id"])
        #expect(e.count == 1)
        #expect(e.first?.line == 8)
        #expect(e.first?.message.contains("environment variable API_CLIENT_SECRET is not set") == true)
        #expect(e.first?.description.contains("s3cr3t") == false)  // names, never values
    }

    @Test func yamlSyntaxErrorHasAPosition() {
        let e = errors("upstreams:\n  api: [unclosed\n")
        #expect(e.count == 1)
        #expect(e.first?.message.hasPrefix("YAML syntax:") == true)
        #expect((e.first?.line ?? 0) >= 2)
    }

    @Test func breakerOnARouteIsAnError() {
        let e = errors(
            """
            upstreams: { api: { endpoints: [http://127.0.0.1:9000] } }
            routes:
              - { match: { path_prefix: / }, upstream: api, circuit_breaker: { open_for: 1s } }
            """)
        #expect(e.count == 1)
        #expect(e.first?.message == "routes[0].circuit_breaker belongs to the upstream (or defaults), not to a route")
    }

    /// A route's own budget would be silently ignored: the budget counts the upstream's requests.
    @Test func retryBudgetOnARouteIsAnError() {
        let e = errors(
            """
            upstreams: { api: { endpoints: [http://127.0.0.1:9000] } }
            routes:
              - { match: { path_prefix: / }, upstream: api, retry: { attempts: 2, budget: { ratio: 0.5 } } }
            """)
        #expect(e.count == 1)
        #expect(e.first?.message == "routes[0].retry.budget belongs to the upstream (or defaults), not to a route")
        #expect(e.first?.line == 3)
    }

    @Test func duplicateKeyIsAnError() {
        let e = errors("workers: 2\nworkers: 3\n" + minimal)
        #expect(e.count == 1)
        #expect(e.first?.line == 2)
        #expect(e.first?.message == "duplicate key 'workers'")
    }
}

@Suite struct UnitsTests {
    @Test(arguments: [
        ("250ms", Duration.milliseconds(250)), ("2s", .seconds(2)), ("1m", .seconds(60)), ("1m30s", .seconds(90)),
        ("1.5s", .milliseconds(1500)), ("0", .zero), ("1h", .seconds(3600)),
    ])
    func durations(text: String, expected: Duration) { #expect(Units.duration(text) == expected) }

    @Test(arguments: ["", "10", "ten s", "5 parsecs", "-1s", "s", "99999999999999999999h", "87601h"])
    func badDurations(text: String) { #expect(Units.duration(text) == nil) }

    @Test(arguments: [("512KiB", 524_288), ("10MiB", 10_485_760), ("1GiB", 1_073_741_824), ("100", 100), ("2KB", 2000)])
    func sizes(text: String, expected: Int) { #expect(Units.size(text) == expected) }

    @Test(arguments: ["", "big", "1.5B", "10 parsecs"])
    func badSizes(text: String) { #expect(Units.size(text) == nil) }

    @Test func addresses() {
        #expect(ListenAddress.parse("127.0.0.1:80") == ListenAddress(host: "127.0.0.1", port: 80))
        #expect(ListenAddress.parse(":8080") == ListenAddress(host: "0.0.0.0", port: 8080))
        #expect(ListenAddress.parse("[::1]:9") == ListenAddress(host: "::1", port: 9))
        #expect(ListenAddress.parse("host") == nil)
        #expect(ListenAddress.parse("h:99999") == nil)
    }

    @Test func substitution() {
        #expect(EnvironmentSubstitution.apply("a${X}b", environment: ["X": "1"]) == .success("a1b"))
        #expect(EnvironmentSubstitution.apply("${Y:-d}", environment: [:]) == .success("d"))
        #expect(EnvironmentSubstitution.apply("${Y:-d}", environment: ["Y": ""]) == .success("d"))
        #expect(EnvironmentSubstitution.apply("${Y}", environment: [:]) == .failure(.unset("Y")))
        #expect(EnvironmentSubstitution.apply("${Y", environment: [:]) == .failure(.malformed))
    }
}

@Suite("Deliver-later configuration")
struct DeliverLaterConfigTests {
    static let base = """
        upstreams:
          hooks: { endpoints: [http://127.0.0.1:9000] }
        routes:

        """

    func parse(_ yaml: String) throws -> Configuration { try ConfigLoader.parse(yaml, file: "t.yaml") }

    func errors(_ yaml: String) -> [String] {
        do {
            _ = try parse(yaml)
            return []
        } catch {
            return (error as? ConfigErrors)?.errors.map(\.description) ?? ["\(error)"]
        }
    }

    @Test func defaultsWhenOnlyTheModeIsSet() throws {
        let c = try parse(Self.base + "  - { match: { path_prefix: /hooks }, upstream: hooks, delivery: { mode: later } }")
        #expect(c.usesStore)
        let d = c.routes[0].delivery
        #expect(d.mode == .later && d.maxAge == .seconds(86400) && d.maxAttempts == 50)
        #expect(d.backoffBase == .seconds(1) && d.backoffMax == .seconds(600))
        #expect(c.storage.path == "/var/lib/happypath/deliveries.db" && c.storage.sync == .full)
        #expect(c.storage.maxBytes == 1 << 30 && c.storage.retention == .seconds(86400))
        #expect(c.storage.statusPath == "/_happypath/deliveries")
    }

    @Test func everyKeyIsRead() throws {
        let c = try parse(
            """
            storage: { path: /tmp/x/d.db, sync: normal, max_bytes: 64MiB, retention: 2h, status_path: /status }
            """ + "\n" + Self.base
                + "  - { match: { path_prefix: /h }, upstream: hooks, delivery: { mode: later, max_age: 1h, max_attempts: 7, backoff: { base: 2s, max: 30s }, idempotency: { client_header: X-Api-Key } } }"
        )
        #expect(c.storage.path == "/tmp/x/d.db" && c.storage.sync == .normal && c.storage.maxBytes == 64 << 20)
        #expect(c.storage.retention == .seconds(7200) && c.storage.statusPath == "/status")
        #expect(c.storage.pathLine == 1 && c.storage.pathColumn == 18)
        let d = c.routes[0].delivery
        #expect(d.maxAge == .seconds(3600) && d.maxAttempts == 7 && d.backoffBase == .seconds(2) && d.backoffMax == .seconds(30))
        #expect(d.idempotencyClientHeader == "X-Api-Key")
    }

    @Test func idempotencyClientHeaderDefaultsToNoneAndMustBeAHeaderName() throws {
        let c = try parse(Self.base + "  - { match: { path_prefix: /h }, upstream: hooks, delivery: { mode: later } }")
        #expect(c.routes[0].delivery.idempotencyClientHeader == nil)
        let e = errors(
            Self.base
                + "  - { match: { path_prefix: /h }, upstream: hooks, delivery: { mode: later, idempotency: { client_header: 'X Api' } } }\n"
                + "  - { match: { path_prefix: /i }, upstream: hooks, delivery: { mode: later, idempotency: { client_header: authorization } } }\n"
                + "  - { match: { path_prefix: /j }, upstream: hooks, delivery: { mode: later, idempotency: { header: X-Api-Key } } }"
        )
        #expect(e.contains { $0.contains("routes[0].delivery.idempotency.client_header must be a header name such as X-Api-Key, got 'X Api'") })
        #expect(e.contains { $0.contains("routes[1].delivery.idempotency.client_header cannot be authorization") })
        #expect(e.contains { $0.contains("routes[2].delivery.idempotency") && $0.contains("header") })
        #expect(e.allSatisfy { $0.hasPrefix("t.yaml:") && $0.split(separator: ":").count >= 4 }, "FILE:LINE:COL: message")
    }

    @Test func aSharedStoreIsReadAndNamedWithoutItsPassword() throws {
        let later = "  - { match: { path_prefix: /h }, upstream: hooks, delivery: { mode: later } }"
        let c = try parse(
            "storage: { url: 'postgres://hp:s3cret@db:5432/hp?sslmode=require', pool: 6, lease: 45s, required: true }\n"
                + Self.base + later)
        #expect(c.storage.url == "postgres://hp:s3cret@db:5432/hp?sslmode=require")
        #expect(c.storage.pool == 6 && c.storage.lease == .seconds(45) && c.storage.required)
        #expect(c.storage.name == "postgres://hp:***@db:5432/hp?sslmode=require")
        #expect(ConfigLoader.storageProblems(c).isEmpty, "no file to check")
        #expect(StorageConfiguration.redact("host=db user=hp password=s3cret dbname=hp") == "host=db user=hp password=*** dbname=hp")
        let defaults = try parse("storage: { url: 'postgres://db/hp' }\n" + Self.base + later)
        #expect(defaults.storage.pool == 4 && defaults.storage.lease == .seconds(30) && !defaults.storage.required)
        #expect(try parse(Self.base + later).storage.url == nil)
    }

    @Test func tracingIsReadAndItsMistakesAreNamed() throws {
        let route = "  - { match: { path_prefix: / }, upstream: hooks }"
        let c = try parse(
            "tracing: { otlp_endpoint: 'http://otel:4318/v1/traces', sample_ratio: 0.1, service_name: edge }\n" + Self.base + route)
        #expect(c.tracing?.endpoint == "http://otel:4318/v1/traces" && c.tracing?.sampleRatio == 0.1)
        #expect(c.tracing?.serviceName == "edge")
        let d = try parse("tracing: { otlp_endpoint: 'https://otel/v1/traces' }\n" + Self.base + route)
        #expect(d.tracing?.sampleRatio == 1 && d.tracing?.serviceName == "happypath")
        #expect(try parse(Self.base + route).tracing == nil)
        for (tracing, message) in [
            ("tracing: { sample_ratio: 0.5 }", "tracing needs otlp_endpoint"),
            ("tracing: { otlp_endpoint: 'otel:4318' }", "tracing.otlp_endpoint must be an http:// or https:// URL"),
            ("tracing: { otlp_endpoint: 'http://otel:4318/v1/traces', sample_ratio: 2 }", "tracing.sample_ratio"),
            ("tracing: { otlp_endpoint: 'http://otel:4318/v1/traces', service_name: '' }", "tracing.service_name must not be empty"),
            ("tracing: { otlp_endpoint: 'http://otel:4318/v1/traces', sampler: always }", "unknown key"),
        ] {
            let e = errors(tracing + "\n" + Self.base + route)
            #expect(e.contains { $0.contains(message) }, "\(tracing): \(e)")
        }
    }

    @Test func aSharedStoreKeyOutOfPlaceIsNamed() {
        let cases: [(String, String)] = [
            ("storage: { url: 'mysql://db/x' }", "storage.url must be a PostgreSQL URL"),
            ("storage: { url: 'postgres://db/x', path: /tmp/d.db }", "storage.url and storage.path both set"),
            ("storage: { url: 'postgres://db/x', sync: normal }", "storage.sync is SQLite's"),
            ("storage: { url: 'postgres://db/x', pool: 1 }", "storage.pool"),
            ("storage: { url: 'postgres://db/x', lease: 500ms }", "storage.lease must be at least 1s"),
            ("storage: { pool: 4 }", "storage.pool applies to a PostgreSQL store only"),
            ("storage: { required: true }", "storage.required applies to a PostgreSQL store only"),
        ]
        for (storage, message) in cases {
            let e = errors(storage + "\n" + Self.base + "  - { match: { path_prefix: / }, upstream: hooks }")
            #expect(e.contains { $0.contains(message) }, "\(storage): \(e)")
        }
    }

    @Test func modeNowNeedsNoStore() throws {
        let c = try parse(Self.base + "  - { match: { path_prefix: / }, upstream: hooks }")
        #expect(!c.usesStore)
        #expect(ConfigLoader.storageProblems(c).isEmpty)
    }

    @Test func badValuesAreNamed() {
        let e = errors(
            """
            storage: { sync: sometimes, max_bytes: 1KiB, status_path: nope/ }
            """ + "\n" + Self.base
                + "  - { match: { path_prefix: /h }, upstream: hooks, delivery: { mode: soon, max_attempts: 0, backoff: { base: 10s, max: 1s } } }"
        )
        let text = e.joined(separator: "\n")
        #expect(text.contains("storage.sync must be one of full, normal"))
        #expect(text.contains("storage.max_bytes must be at least 1MiB"))
        #expect(text.contains("storage.status_path must be a path"))
        #expect(text.contains("routes[0].delivery.mode must be one of now, later"))
        #expect(text.contains("routes[0].delivery.max_attempts"))
        #expect(text.contains("backoff.max (1s) is below backoff.base (10s)"))
        #expect(e.allSatisfy { $0.hasPrefix("t.yaml:") })
    }

    @Test func aRouteInsideTheStatusPathIsRefused() {
        let e = errors(Self.base + "  - { match: { path_prefix: /_happypath/deliveries/x }, upstream: hooks }")
        #expect(e.contains { $0.contains("inside storage.status_path") })
    }

    @Test func aStoreDirectoryThatCannotBeMadeIsReported() throws {
        let c = try parse(
            "storage: { path: /etc/hostname/sub/d.db }\n" + Self.base
                + "  - { match: { path_prefix: /h }, upstream: hooks, delivery: { mode: later } }")
        let problems = ConfigLoader.storageProblems(c)
        #expect(problems.count == 1)
        #expect(problems.first?.description.hasPrefix("t.yaml:1:18: storage.path: /etc/hostname is a file") == true)
    }
}

// MARK: - Paths and TRACE (issue 18)

@Suite struct EdgeHardeningConfigTests {
    static let base = """
        upstreams:
          u: { endpoints: [http://127.0.0.1:9000] }
        """

    @Test func pathNormalizationDefaultsKeepSlashesAndDoNotMerge() throws {
        let c = try ConfigLoader.parse(Self.base + "\nroutes:\n  - { match: { path_prefix: / }, upstream: u }", file: "t.yaml")
        #expect(c.pathNormalization == PathNormalization(mergeSlashes: false, encodedSlashes: .keep))
        #expect(c.routes[0].allowTrace == false)
    }

    @Test func normalizeAndEncodedSlashesAreRead() throws {
        let c = try ConfigLoader.parse(
            "normalize: { merge_slashes: true }\nlimits: { encoded_slashes: reject }\n" + Self.base
                + "\nroutes:\n  - { match: { path_prefix: / }, upstream: u, allow_trace: true }", file: "t.yaml")
        #expect(c.pathNormalization == PathNormalization(mergeSlashes: true, encodedSlashes: .reject))
        #expect(c.routes[0].allowTrace)
    }

    @Test func aBadEncodedSlashesValueNamesTheChoices() {
        let e = errors("limits: { encoded_slashes: decode }\n" + Self.base + "\nroutes:\n  - { match: { path_prefix: / }, upstream: u }")
        #expect(e.map(\.description).contains { $0.contains("limits.encoded_slashes must be one of keep, reject, got 'decode'") })
    }

    /// Routes match normalized paths: a prefix with a dot-segment or an
    /// encoded unreserved character would never match, so it is an error
    /// that says how to write it.
    @Test(arguments: [("/a/../b/", "/b/"), ("/%61pi/", "/api/"), ("/v1/./x", "/v1/x")])
    func aPrefixThatIsNotNormalizedIsAnError(prefix: String, normal: String) {
        let e = errors(Self.base + "\nroutes:\n  - { match: { path_prefix: \"\(prefix)\" }, upstream: u }")
        #expect(e.map(\.description).contains { $0.contains("write it as '\(normal)'") }, "\(e)")
    }
}

@Suite struct AdminAllowedHostsConfigTests {
    @Test func namesAreReadLowercased() throws {
        let c = try ConfigLoader.parse(
            minimal + "\nadmin: { allowed_hosts: [Admin.Example.com, 10.0.0.5, \"[fd00::5]\"] }", file: "f.yaml")
        #expect(c.admin.allowedHosts == ["admin.example.com", "10.0.0.5", "[fd00::5]"])
        #expect(try ConfigLoader.parse(minimal, file: "f.yaml").admin.allowedHosts == [])
    }

    @Test func anEntryWithAPortOrAPathIsRefusedWithItsPosition() {
        let found = errors(minimal + "\nadmin:\n  allowed_hosts: [ok.example, \"admin.example.com:9901\", http://x/]")
        #expect(
            found.map(\.description) == [
                "f.yaml:8:31: admin.allowed_hosts[1]: 'admin.example.com:9901' is not a host name (write it as a Host header carries it, without scheme, port or path: admin.example.com, 10.0.0.5, [fd00::5])",
                "f.yaml:8:57: admin.allowed_hosts[2]: 'http://x/' is not a host name (write it as a Host header carries it, without scheme, port or path: admin.example.com, 10.0.0.5, [fd00::5])",
            ])
    }
}

@Suite struct RetryStatusesConfigTests {
    /// `statuses` (looked up on every answer) follows `retry.on` when the
    /// policy is built from a file: a 429 or 408 listed there is retried.
    @Test func retryOnStatusesBelow500AreLookedUp() throws {
        let c = try ConfigLoader.parse(
            """
            defaults: { retry: { on: [429, 408, 503] } }
            upstreams:
              u: { endpoints: [http://127.0.0.1:9000] }
            routes:
              - { match: { path_prefix: / }, upstream: u }
            """, file: "t.yaml")
        let retry = c.resolvedPolicies(forRoute: 0).retry
        #expect(retry.statuses == [429, 408, 503])
    }
}

@Suite struct EndpointBasePathConfigTests {
    @Test(arguments: [
        ("http://h/base/../admin", "write it as '/admin'"), ("http://h/base?q=1", "has a query or fragment"),
        ("http://h/a%2e%2e", "write it as"),
    ])
    func aBasePathMustBeANormalizedPathWithoutQuery(url: String, message: String) {
        let e = errors("upstreams:\n  u: { endpoints: [\"\(url)\"] }\nroutes:\n  - { match: { path_prefix: / }, upstream: u }")
        #expect(e.map(\.description).contains { $0.contains(message) }, "\(e)")
    }
}

/// Issue 20: `hedge` and `fallback` on a route, and the two `limits` for kept answers.
@Suite struct TailAndFallbackConfigTests {
    static func route(_ extra: String) -> String {
        """
        limits: { stale_max_bytes: 8MiB, stale_max_entry: 64KiB }
        upstreams:
          api: { endpoints: [http://127.0.0.1:9000] }
        routes:
          - match: { path_prefix: / }
            upstream: api
            \(extra)
        """
    }

    @Test func everyKeyIsRead() throws {
        let fixed = "response: { status: 203, content_type: text/plain, body: 'degraded' }"
        let c = try ConfigLoader.parse(
            Self.route(
                "hedge: { after: p95, min: 5ms, max: 2s, max_extra: 2 }\n    fallback: { serve_stale: 10m, on: [timeout, 5xx], \(fixed) }"
            ), file: "t.yaml")
        let r = c.routes[0]
        #expect(r.hedge?.after == .p95)
        #expect(r.hedge?.min == .milliseconds(5) && r.hedge?.max == .seconds(2) && r.hedge?.maxExtra == 2)
        #expect(r.fallback?.serveStale == .seconds(600))
        #expect(r.fallback?.on == [.timeout, .serverError])
        #expect(r.fallback?.response == .init(status: 203, contentType: "text/plain", body: "degraded"))
        #expect(c.limits.staleMaxBytes == 8 << 20 && c.limits.staleMaxEntry == 64 << 10)
        let plain = try ConfigLoader.parse(Self.route("hedge: { after: 50ms }\n    fallback: { serve_stale: 1m }"), file: "t.yaml")
        #expect(plain.routes[0].hedge?.after == .fixed(.milliseconds(50)) && plain.routes[0].hedge?.maxExtra == 1)
        #expect(plain.routes[0].fallback?.on.count == 6)
        #expect(plain.routes[0].fallback?.response == nil)
        #expect(plain.routes[0].fallback?.privateHeaders == ["X-Api-Key"])
    }

    /// `fallback.private_headers` replaces the default list (issue 31).
    @Test func privateHeadersAreRead() throws {
        let c = try ConfigLoader.parse(
            Self.route("fallback: { serve_stale: 1m, private_headers: [X-Api-Key, X-Tenant-Token] }"), file: "t.yaml")
        #expect(c.routes[0].fallback?.privateHeaders == ["X-Api-Key", "X-Tenant-Token"])
        let none = try ConfigLoader.parse(Self.route("fallback: { serve_stale: 1m, private_headers: [] }"), file: "t.yaml")
        #expect(none.routes[0].fallback?.privateHeaders == [])
    }

    @Test(arguments: [
        ("hedge: { max_extra: 1 }", "routes[0].hedge needs 'after'"),
        ("hedge: { after: soon }", "routes[0].hedge.after must be a duration above zero (such as 50ms) or p95, got 'soon'"),
        ("hedge: { after: 50ms, min: 1ms }", "routes[0].hedge.min applies only to after: p95"),
        ("hedge: { after: p95, min: 2s, max: 1s }", "routes[0].hedge.min must not be above max"),
        ("hedge: { after: 50ms, max_extra: 9 }", "routes[0].hedge.max_extra must be between 1 and 8, got 9"),
        ("fallback: { on: [5xx] }", "routes[0].fallback needs serve_stale"),
        ("fallback: { serve_stale: 1m, on: [teapot] }", "routes[0].fallback.on lists ways of failing (timeout, unreachable, 5xx, circuit-open, overloaded, paused), got 'teapot'"),
        ("fallback: { response: { status: 99 } }", "routes[0].fallback.response.status must be between 200 and 599, got 99"),
        ("fallback: { serve_stale: 1m }\n    delivery: { mode: later }", "routes[0].fallback applies to routes that deliver now"),
        ("fallback: { serve_stale: 1m, private_headers: ['X Key'] }", "routes[0].fallback.private_headers lists header names (such as X-Api-Key), got 'X Key'"),
        ("fallback: { serve_stale: 1m, private_headers: [X-Key, x-key] }", "routes[0].fallback.private_headers lists 'x-key' twice"),
        ("fallback: { response: { body: x }, private_headers: [X-Key] }", "routes[0].fallback.private_headers applies only with serve_stale"),
    ])
    func mistakesAreNamed(extra: String, message: String) {
        let found = errors(Self.route(extra)).map(\.description)
        #expect(found.contains { $0.contains(message) }, "\(found)")
    }
}

/// `outlier_detection` on an upstream or in `defaults` (docs/configuration.md).
@Suite struct OutlierDetectionConfigTests {
    /// An upstream's settings over `defaults` over the built-in values, as the proxy resolves them.
    static func resolved(_ c: Configuration, _ upstream: Int = 0) -> OutlierDetector.Configuration {
        c.resolvedPolicies(forUpstream: c.upstreams[upstream]).outlierDetection
    }

    @Test func notConfiguredItKeepsTheFormerFixedValues() throws {
        let c = try ConfigLoader.parse(minimal, file: "f.yaml")
        #expect(c.upstreams[0].policies.outlierDetection == Partial())
        let builtIn = PolicySettings().resolved().outlierDetection
        #expect(builtIn.consecutiveFailures == 5)
        #expect(builtIn.baseEjection == .seconds(10))
        #expect(builtIn.maxEjectedPercent == 50)
        let r = Self.resolved(c)
        #expect(r == OutlierDetector.Configuration())
        #expect(r.baseEjectionNanoseconds == 10_000_000_000)
    }

    @Test func anUpstreamsSettingsOverDefaults() throws {
        let c = try ConfigLoader.parse(
            """
            defaults:
              outlier_detection: { consecutive_failures: 3, base_ejection: 30s }
            upstreams:
              api:
                endpoints: [http://127.0.0.1:9000, http://127.0.0.1:9001]
                outlier_detection: { consecutive_failures: 2, max_ejected_percent: 100 }
              other:
                endpoints: [http://127.0.0.1:9002]
            routes:
              - match: { path_prefix: / }
                upstream: api
            """, file: "f.yaml")
        let api = Self.resolved(c, 0)
        #expect(api.consecutiveFailures == 2)
        #expect(api.baseEjection == .seconds(30))
        #expect(api.baseEjectionNanoseconds == 30_000_000_000)
        #expect(api.maxEjectedPercent == 100)
        let other = Self.resolved(c, 1)
        #expect(other.consecutiveFailures == 3)
        #expect(other.baseEjection == .seconds(30))
        #expect(other.maxEjectedPercent == 50)
    }

    static let upstream = """
        upstreams:
          api:
            endpoints: [http://127.0.0.1:9000]
            outlier_detection: %@
        routes: [ { match: { path_prefix: / }, upstream: api } ]
        """

    @Test(arguments: [
        ("{ consecutive_failures: 0 }", "upstreams.api.outlier_detection.consecutive_failures must be at least 1, got 0"),
        (
            "{ consecutive_failures: many }",
            "upstreams.api.outlier_detection.consecutive_failures must be a whole number, got 'many'"
        ),
        ("{ base_ejection: 0s }", "upstreams.api.outlier_detection.base_ejection must be longer than zero"),
        (
            "{ base_ejection: soon }",
            "upstreams.api.outlier_detection.base_ejection: 'soon' is not a duration; write e.g. 250ms, 2s, 1m"
        ),
        (
            "{ max_ejected_percent: 101 }",
            "upstreams.api.outlier_detection.max_ejected_percent must be between 0 and 100, got 101"
        ),
        ("{ max_ejected_percent: -5 }", "upstreams.api.outlier_detection.max_ejected_percent must be between 0 and 100, got -5"),
        (
            "{ consecutive_5xx: 3 }",
            "unknown key 'upstreams.api.outlier_detection.consecutive_5xx'; expected one of: consecutive_failures, base_ejection, max_ejected_percent"
        ),
        (
            "{ base_ejections: 30s }",
            "unknown key 'upstreams.api.outlier_detection.base_ejections' (did you mean 'base_ejection'?)"
        ),
        ("on", "upstreams.api.outlier_detection must be a mapping of keys to values"),
    ])
    func mistakesOnAnUpstreamAreNamed(value: String, message: String) {
        let found = errors(Self.upstream.replacingOccurrences(of: "%@", with: value)).map(\.message)
        #expect(found == [message])
    }

    @Test func mistakesInDefaultsAreNamed() {
        let found = errors("defaults: { outlier_detection: { consecutive_failures: 0, max_ejected_percent: 200 } }\n" + minimal)
            .map(\.message)
        #expect(
            found == [
                "defaults.outlier_detection.consecutive_failures must be at least 1, got 0",
                "defaults.outlier_detection.max_ejected_percent must be between 0 and 100, got 200",
            ])
    }

    @Test func theBoundsAreAccepted() throws {
        for value in ["{ consecutive_failures: 1, max_ejected_percent: 0 }", "{ max_ejected_percent: 100, base_ejection: 1ms }"] {
            #expect(errors(Self.upstream.replacingOccurrences(of: "%@", with: value)).isEmpty)
        }
    }

    @Test func aRouteCannotSetIt() {
        let e = errors(
            """
            upstreams: { api: { endpoints: [http://127.0.0.1:9000] } }
            routes:
              - { match: { path_prefix: / }, upstream: api, outlier_detection: { consecutive_failures: 2 } }
            """)
        #expect(e.map(\.message) == ["routes[0].outlier_detection belongs to the upstream (or defaults), not to a route"])
    }
}

// MARK: - Upgrades (issue 22, docs/websocket.md)

@Suite struct UpgradeConfigTests {
    static let base = """
        upstreams:
          u: { endpoints: [http://127.0.0.1:9000] }
        routes:

        """

    @Test func upgradesAreLowercasedAndTheIdleTimeoutDefaultsToFiveMinutes() throws {
        let c = try ConfigLoader.parse(
            Self.base + "  - { match: { path_prefix: /ws/ }, upstream: u, upgrades: [WebSocket] }\n"
                + "  - { match: { path_prefix: / }, upstream: u, upgrades: [websocket], upgrades_idle_timeout: 30s }",
            file: "t.yaml")
        #expect(c.routes[0].upgrades == ["websocket"])
        #expect(c.routes[0].upgradesIdleTimeout == .seconds(300))
        #expect(c.routes[1].upgradesIdleTimeout == .seconds(30))
    }

    @Test func aRouteWithoutUpgradesHasNone() throws {
        let c = try ConfigLoader.parse(Self.base + "  - { match: { path_prefix: / }, upstream: u }", file: "t.yaml")
        #expect(c.routes[0].upgrades.isEmpty)
    }

    @Test(arguments: [
        ("upgrades: [\"web socket\"]", "routes[0].upgrades: 'web socket' is not a protocol name"),
        ("upgrades: [websocket], delivery: { mode: later }", "routes[0].upgrades applies to routes that deliver now"),
        ("upgrades: [websocket], match: { path_prefix: /, methods: [POST] }", "routes[0].upgrades needs GET among match.methods"),
        ("upgrades_idle_timeout: 1m", "routes[0].upgrades_idle_timeout is set but the route has no upgrades"),
        ("upgrades: [websocket], upgrades_idle_timeout: 0s", "routes[0].upgrades_idle_timeout must be longer than zero"),
    ])
    func mistakesAreNamed(_ keys: String, _ message: String) {
        let match = keys.contains("match:") ? "" : "match: { path_prefix: / }, "
        let e = errors(Self.base + "  - { \(match)upstream: u, \(keys) }")
        #expect(e.map(\.description).contains { $0.contains(message) }, "\(e)")
    }
}

/// `pacing` on an upstream (docs/shaping.md), issue 31: whom a 429 pauses.
@Suite struct PacingConfigTests {
    static func upstream(_ pacing: String) -> String {
        minimal.replacingOccurrences(
            of: "endpoints: [http://127.0.0.1:9000]", with: "endpoints: [http://127.0.0.1:9000]\n    pacing: \(pacing)")
    }

    @Test func aFourTwentyNinePausesOneClientByDefault() throws {
        let c = try ConfigLoader.parse(Self.upstream("{ on: [429, 503] }"), file: "t.yaml")
        #expect(c.upstreams[0].pacing?.scope429 == .client)
        #expect(c.upstreams[0].pacing?.maxClients == 10_000)
        #expect(PacingConfiguration().scope(of: 429) == .client)
        #expect(PacingConfiguration().scope(of: 503) == .upstream)
    }

    @Test func everyKeyIsRead() throws {
        let c = try ConfigLoader.parse(
            Self.upstream("{ on: [429], max_pause: 5s, while_paused: fail, scope_429: upstream, max_clients: 50 }"),
            file: "t.yaml")
        let p = try #require(c.upstreams[0].pacing)
        #expect(p.on == [429] && p.maxPause == .seconds(5) && p.whilePaused == .fail)
        #expect(p.scope429 == .upstream && p.maxClients == 50)
    }

    @Test func resourceExhaustedIsTheGRPCStatusPacingTakes() throws {
        let c = try ConfigLoader.parse(Self.upstream("{ on: [503, resource-exhausted] }"), file: "t.yaml")
        let p = try #require(c.upstreams[0].pacing)
        #expect(p.on == [503] && p.onResourceExhausted)
        #expect(PacingConfiguration().onResourceExhausted == false)
        let plain = try ConfigLoader.parse(Self.upstream("{ on: [429] }"), file: "t.yaml")
        #expect(plain.upstreams[0].pacing?.onResourceExhausted == false)
    }

    @Test(arguments: [
        ("{ scope_429: everyone }", "upstreams.api.pacing.scope_429 must be one of client, upstream, got 'everyone'"),
        ("{ max_clients: 0 }", "upstreams.api.pacing.max_clients"),
        // Only RESOURCE_EXHAUSTED carries a wait that means "slow down"; the exact spelling only.
        ("{ on: [unavailable] }", "pacing.on lists statuses from 400 to 599 (such as 429, 503) and the gRPC status resource-exhausted, got 'unavailable'"),
        ("{ on: [RESOURCE_EXHAUSTED] }", "got 'RESOURCE_EXHAUSTED'"),
        ("{ on: [200] }", "got '200'"),
    ])
    func mistakesAreNamed(pacing: String, message: String) {
        let found = errors(Self.upstream(pacing)).map(\.description)
        #expect(found.contains { $0.contains(message) }, "\(found)")
    }
}
