import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Testing

/// Issue 50: `coalesce:` on a route, its two forms, its bounds and its errors.
@Suite struct CoalesceConfigTests {
    static func yaml(route: String, methods: String = "") -> String {
        """
        upstreams:
          svc: { endpoints: [http://127.0.0.1:9000] }
        routes:
          - { match: { path_prefix: /\(methods) }, upstream: svc\(route) }
        """
    }

    static var defaults: CoalesceConfiguration { CoalesceConfiguration() }

    static func with(_ change: (inout CoalesceConfiguration) -> Void) -> CoalesceConfiguration {
        var c = CoalesceConfiguration()
        change(&c)
        return c
    }

    @Test(arguments: [
        ("", nil), (", coalesce: false", nil), (", coalesce: true", defaults), (", coalesce: {}", defaults),
        (", coalesce: { max_followers: 1 }", with { $0.maxFollowers = 1 }),
        (", coalesce: { max_followers: 100000 }", with { $0.maxFollowers = 100_000 }),
        (", coalesce: { private_headers: [X-Token, X-Tenant] }", with { $0.privateHeaders = ["X-Token", "X-Tenant"] }),
        (", coalesce: { private_headers: [] }", with { $0.privateHeaders = [] }),
    ])
    func coalesceIsReadInBothForms(route: String, expected: CoalesceConfiguration?) throws {
        let c = try ConfigLoader.parse(Self.yaml(route: route), file: "f.yaml", environment: [:])
        #expect(c.routes[0].coalesce == expected)
    }

    @Test func theDefaultsAreAThousandFollowersAndXApiKey() {
        #expect(Self.defaults.maxFollowers == 1000)
        #expect(Self.defaults.privateHeaders == ["X-Api-Key"])
    }

    @Test(arguments: [
        (", coalesce: { max_followers: 0 }", "routes[0].coalesce.max_followers must be between 1 and 100000, got 0"),
        (
            ", coalesce: { max_followers: 100001 }",
            "routes[0].coalesce.max_followers must be between 1 and 100000, got 100001"
        ),
        (", coalesce: maybe", "routes[0].coalesce must be true or false, got 'maybe'"),
        (", coalesce: { max: 3 }", "unknown key 'routes[0].coalesce.max'"),
        (
            ", coalesce: { private_headers: [X-A, x-a] }",
            "routes[0].coalesce.private_headers lists 'x-a' twice"
        ),
        (
            ", coalesce: { private_headers: ['a b'] }",
            "routes[0].coalesce.private_headers lists header names (such as X-Api-Key), got 'a b'"
        ),
        (
            ", coalesce: true, delivery: { mode: later }",
            "routes[0].coalesce applies only to routes that deliver now (delivery.mode: now), not later"
        ),
    ])
    func aMalformedCoalesceIsRefusedByName(route: String, prefix: String) {
        let e = errors(Self.yaml(route: route))
        #expect(e.count == 1 && e[0].message.hasPrefix(prefix), "\(e)")
    }

    @Test func aRouteOfOtherMethodsCannotCoalesce() {
        let e = errors(Self.yaml(route: ", coalesce: true", methods: ", methods: [POST]"))
        #expect(e.map(\.message) == ["routes[0].coalesce shares GET and HEAD answers, but match.methods lists neither"])
    }

    @Test func thirtyThreePrivateHeadersAreTooMany() {
        let names = (0..<33).map { "X-H\($0)" }.joined(separator: ", ")
        let e = errors(Self.yaml(route: ", coalesce: { private_headers: [\(names)] }"))
        #expect(e.map(\.message) == ["routes[0].coalesce.private_headers lists at most 32 names, got 33"])
    }
}
