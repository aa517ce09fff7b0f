import HappyPathConfig
import HappyPathCore
import Testing

/// Issue 34: `grpc:` on a route, and the two config errors it brings.
@Suite struct GRPCRouteConfigTests {
    static func yaml(protocol: String = "h2", route: String) -> String {
        """
        upstreams:
          svc: { endpoints: [https://127.0.0.1:9443], protocol: \(`protocol`) }
        routes:
          - { match: { path_prefix: / }, upstream: svc\(route) }
        """
    }

    @Test(arguments: [
        ("", nil), (", grpc: {}", GRPCRouteConfiguration(idempotent: false)),
        (", grpc: { idempotent: false }", GRPCRouteConfiguration(idempotent: false)),
        (", grpc: { idempotent: true }", GRPCRouteConfiguration(idempotent: true)),
    ])
    func grpcIsReadWithIdempotentFalseByDefault(route: String, expected: GRPCRouteConfiguration?) throws {
        let c = try ConfigLoader.parse(Self.yaml(route: route), file: "f.yaml", environment: [:])
        #expect(c.routes[0].grpc == expected)
    }

    @Test func aGRPCRouteToAnUpstreamWithoutH2IsAnErrorNamingRouteAndUpstream() {
        let e = errors(Self.yaml(protocol: "http1", route: ", grpc: {}"))
        #expect(
            e.map(\.message) == [
                "routes[0].grpc: the route carries gRPC, which needs HTTP/2 to the upstream, but upstreams.svc has protocol: http1; set protocol: h2 on it"
            ])
    }

    @Test func theDefaultProtocolIsNotEnoughEither() {
        let yaml = """
            upstreams:
              svc: { endpoints: [https://127.0.0.1:9443] }
            routes:
              - { match: { path_prefix: / }, upstream: svc, grpc: { idempotent: true } }
            """
        let e = errors(yaml)
        #expect(e.count == 1 && e[0].message.hasPrefix("routes[0].grpc: the route carries gRPC"), "\(e)")
    }

    @Test func aGRPCRouteThatDeliversLaterIsRefusedByName() {
        let e = errors(Self.yaml(route: ", grpc: {}, delivery: { mode: later }"))
        #expect(
            e.map(\.message) == [
                "routes[0].grpc: a gRPC route cannot deliver later (delivery.mode: later): a gRPC client waits for the call's status, and a 202 is not one"
            ])
    }

    @Test(arguments: [
        (", grpc: true", "routes[0].grpc must be a mapping of keys to values"),
        (", grpc: { idempotent: yes please }", "routes[0].grpc.idempotent"),
        (", grpc: { retry: true }", "unknown key 'routes[0].grpc.retry'"),
    ])
    func aMalformedGRPCIsRefusedByName(route: String, prefix: String) {
        let e = errors(Self.yaml(route: route))
        #expect(e.count == 1 && e[0].message.hasPrefix(prefix), "\(e)")
    }

    @Test func aGRPCRouteDoesNotChangeOtherRoutes() throws {
        let yaml = """
            upstreams:
              svc: { endpoints: [https://127.0.0.1:9443], protocol: h2 }
              web: { endpoints: [http://127.0.0.1:9000] }
            routes:
              - { match: { path_prefix: /pkg.Service/ }, upstream: svc, grpc: {} }
              - { match: { path_prefix: / }, upstream: web, delivery: { mode: later } }
            """
        let c = try ConfigLoader.parse(yaml, file: "f.yaml", environment: [:])
        #expect(c.routes[0].grpc != nil && c.routes[1].grpc == nil)
    }

    @Test func retryOnTakesTheRetryableGRPCStatusNamesBesideTheOthers() throws {
        let c = try ConfigLoader.parse(
            Self.yaml(route: ", grpc: {}, retry: { on: [unavailable, resource-exhausted, aborted, reset, 503] }"),
            file: "f.yaml", environment: [:])
        let retry = c.resolvedPolicies(forRoute: 0).retry
        #expect(retry.grpcStatuses == [.unavailable, .resourceExhausted, .aborted])
        #expect(retry.statuses == [503])
        #expect(retry.on.contains("reset"))
    }

    @Test(arguments: [
        ("not-found", "routes[0].retry.on: 'not-found' is a gRPC status no retry can mend; the gRPC names it takes are cancelled, unknown, deadline-exceeded, resource-exhausted, aborted, internal, unavailable"),
        ("UNAVAILABLE", "routes[0].retry.on: 'UNAVAILABLE' is not connect-failure, reset, timeout, a 5xx/408/429 status or a gRPC status name (cancelled, unknown, deadline-exceeded, resource-exhausted, aborted, internal, unavailable)"),
        ("ok", "routes[0].retry.on: 'ok' is a gRPC status no retry can mend"),
    ])
    func retryOnRefusesOtherGRPCNamesByName(name: String, prefix: String) {
        let e = errors(Self.yaml(route: ", grpc: {}, retry: { on: [\(name)] }"))
        #expect(e.count == 1 && e[0].message.hasPrefix(prefix), "\(e)")
    }
}
