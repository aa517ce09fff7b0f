import HappyPathConfig
import HappyPathPolicies
import Testing

/// Issue 34: `health_check.grpc` — gRPC's health service as the check.
@Suite struct GRPCHealthCheckConfigTests {
    static func yaml(defaults: String = "", upstream: String, protocol: String = ", protocol: h2") -> String {
        """
        \(defaults.isEmpty ? "" : "defaults: { health_check: \(defaults) }")
        upstreams:
          api: { endpoints: [https://127.0.0.1:9443]\(`protocol`)\(upstream.isEmpty ? "" : ", health_check: \(upstream)") }
        routes:
          - { match: { path_prefix: / }, upstream: api }
        """
    }

    static func healthCheck(_ yaml: String) throws -> HealthCheckConfiguration {
        let c = try ConfigLoader.parse(yaml, file: "f.yaml", environment: [:])
        return c.resolvedPolicies(forUpstream: c.upstreams[0]).healthCheck
    }

    @Test(
        arguments: [
            ("", "", nil),
            ("", "{ grpc: {} }", ""),
            ("", "{ grpc: { service: \"\" } }", ""),
            ("", "{ grpc: { service: shop.Cart } }", "shop.Cart"),
            ("{ grpc: { service: a } }", "", "a"),
            ("{ grpc: { service: a } }", "{ interval: 5s }", "a"),
            ("{ grpc: { service: a } }", "{ grpc: { service: b } }", "b"),
            ("{ grpc: { service: a } }", "{ grpc: {} }", ""),
        ] as [(String, String, String?)])
    func theServiceIsReadAndInheritedFromDefaults(defaults: String, upstream: String, service: String?) throws {
        let settings = try Self.healthCheck(Self.yaml(defaults: defaults, upstream: upstream))
        #expect(settings.grpc?.service == service)
    }

    @Test func theOtherKeysStillApplyAndThePathStaysItsOwn() throws {
        let settings = try Self.healthCheck(
            Self.yaml(upstream: "{ grpc: { service: s }, path: /ready, interval: 200ms, unhealthy_after: 1 }"))
        #expect(settings.grpc == HealthCheckConfiguration.GRPC(service: "s"))
        #expect(settings.path == "/ready")
        #expect(settings.interval == .milliseconds(200))
        #expect(settings.unhealthyAfter == 1)
    }

    @Test func theDefaultIsAnHTTPCheck() {
        #expect(HealthCheckConfiguration().grpc == nil)
        #expect(HealthCheckConfiguration.GRPC().service == "")
    }

    @Test func aGRPCCheckOnAnHTTP1UpstreamIsRefusedByName() {
        let e = errors(Self.yaml(upstream: "{ grpc: {} }", protocol: ""))
        #expect(
            e.map(\.message) == [
                "upstreams.api: a grpc health check (its health_check.grpc) needs protocol: h2, as gRPC runs over"
                    + " HTTP/2; set protocol: h2 on the upstream"
            ])
        #expect(e.first?.line == 3)  // the upstream's own line (line 1 is the empty defaults line)
    }

    @Test func anInheritedGRPCCheckOnAnHTTP1UpstreamSaysWhereItComesFrom() {
        let e = errors(Self.yaml(defaults: "{ grpc: {} }", upstream: "", protocol: ", protocol: http1"))
        #expect(
            e.map(\.message) == [
                "upstreams.api: a grpc health check (defaults' health_check.grpc) needs protocol: h2, as gRPC runs"
                    + " over HTTP/2; set protocol: h2 on the upstream"
            ])
    }

    @Test(arguments: [
        ("{ grpc: { service: a, port: 1 } }", "unknown key 'upstreams.api.health_check.grpc.port'"),
        ("{ grpc: { servise: a } }", "unknown key 'upstreams.api.health_check.grpc.servise'"),
        ("{ grpc: true }", "upstreams.api.health_check.grpc must be a mapping of keys to values"),
        ("{ grpc: { service: [a] } }", "upstreams.api.health_check.grpc.service must be a single value, not a list or mapping"),
    ])
    func malformedGRPCSettingsAreErrors(upstream: String, message: String) {
        let e = errors(Self.yaml(upstream: upstream))
        #expect(e.count == 1, "\(e)")
        #expect(e.first?.message.hasPrefix(message) == true, "\(e)")
    }

    @Test func aRouteMayNotSetIt() {
        let e = errors(
            """
            upstreams:
              api: { endpoints: [https://127.0.0.1:9443], protocol: h2 }
            routes:
              - { match: { path_prefix: / }, upstream: api, health_check: { grpc: {} } }
            """)
        #expect(e.count == 1, "\(e)")
    }

    /// Issue 45: an upstream serving gRPC routes is checked with gRPC's
    /// health service unless its own check names a `path`, or a `grpc` is
    /// named (its own or `defaults'`); a `path` in `defaults` is for the
    /// HTTP upstreams (the example config sets one), not a way out.
    @Test(
        arguments: [
            // (defaults' health_check, the upstream's, the route is gRPC's, the check is gRPC's by default, its service)
            ("", "", true, true, ""),
            ("{ path: /healthz }", "", true, true, ""),
            ("{ path: /healthz, interval: 5s }", "{ unhealthy_after: 2 }", true, true, ""),
            ("", "{ path: /ready }", true, false, nil),
            ("{ grpc: { service: a } }", "", true, false, "a"),
            ("", "{ grpc: { service: b } }", true, false, "b"),
            ("", "", false, false, nil),
        ] as [(String, String, Bool, Bool, String?)])
    func anUpstreamServingGRPCRoutesGetsAGRPCCheckByDefault(
        defaults: String, upstream: String, grpcRoute: Bool, byDefault: Bool, service: String?
    ) throws {
        let yaml = Self.yaml(defaults: defaults, upstream: upstream).replacingOccurrences(
            of: "upstream: api }", with: grpcRoute ? "upstream: api, grpc: {} }" : "upstream: api }")
        let c = try ConfigLoader.parse(yaml, file: "f.yaml", environment: [:])
        #expect(c.upstreams[0].grpcHealthCheckByDefault == byDefault)
        #expect(c.resolvedPolicies(forUpstream: c.upstreams[0]).healthCheck.grpc?.service == service)
        let summary = ConfigLoader.healthCheckSummary(c)
        #expect(summary.count == 1)
        #expect(summary.first?.contains("(the default for an upstream serving gRPC routes)") == byDefault, "\(summary)")
        #expect(summary.first?.hasPrefix(service == nil ? "upstreams.api: health check GET " : "upstreams.api: gRPC health check") == true)
    }
}
