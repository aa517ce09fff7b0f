import HappyPathConfig
import HappyPathPolicies
import Testing

/// Issue 49, first part: `cors:` on a route, read and refused.
@Suite struct CORSConfigTests {
    static func yaml(_ cors: String) -> String {
        """
        upstreams:
          api: { endpoints: [http://127.0.0.1:9000] }
        routes:
          - match: { path_prefix: / }
            upstream: api
            cors: \(cors)
        """
    }

    @Test func everyKeyIsRead() throws {
        let c = try ConfigLoader.parse(
            Self.yaml(
                "{ allow_origins: [https://app.example.com, 'http://localhost:3000'], allow_headers: [X-Api-Key], expose_headers: [X-Request-Id], max_age: 10m, allow_credentials: true }"
            ), file: "t.yaml")
        let cors = try #require(c.routes[0].cors)
        #expect(cors.allowOrigins == ["https://app.example.com", "http://localhost:3000"])
        #expect(cors.allowHeaders == ["x-api-key"])
        #expect(cors.exposeHeaders == ["x-request-id"])
        #expect(cors.maxAge == .seconds(600))
        #expect(cors.allowCredentials)
        let star = try ConfigLoader.parse(Self.yaml("{ allow_origins: ['*'] }"), file: "t.yaml")
        #expect(star.routes[0].cors?.allowOrigins == ["*"])
        #expect(star.routes[0].cors?.allowHeaders == nil)
    }

    @Test(arguments: [
        ("{}", "needs allow_origins"),
        ("{ allow_origins: [] }", "needs allow_origins"),
        ("{ allow_origins: [app.example.com] }", "is not an origin"),
        ("{ allow_origins: ['https://app.example.com/'] }", "is not an origin"),
        ("{ allow_origins: ['*'], allow_credentials: true }", "allow_credentials with allow_origins"),
        ("{ allow_origins: ['*'], allow_headers: ['bad header'] }", "is not a header name"),
        ("{ allow_origins: ['*'], max_age: 48h }", "max_age must be at most 24h"),
        ("{ allow_origins: ['*'], allow_methods: [GET] }", "allow_methods"),
    ])
    func refusals(_ cors: String, _ message: String) {
        let found = errors(Self.yaml(cors)).map(\.message)
        #expect(found.contains { $0.contains(message) }, "\(found)")
    }
}
