import HappyPathCore
import HappyPathPolicies
import Testing

/// `cors:`'s decisions: preflights and the fields on answers, for listed
/// origins, any origin, credentials and a gRPC route's defaults.
@Suite struct CORSPolicyTests {
    static func policy(_ origins: [String], credentials: Bool = false, grpc: Bool = false, allowHeaders: [String]? = nil)
        -> CORSPolicy
    {
        var c = CORSConfiguration(allowOrigins: origins)
        c.allowCredentials = credentials
        c.allowHeaders = allowHeaders
        c.maxAge = .seconds(600)
        return CORSPolicy(c, methods: ["GET", "POST"], grpc: grpc)
    }

    static func value(_ fields: [HTTPField], _ name: String) -> String? { fields.first { $0.name == name }?.value }

    @Test func aListedOriginsPreflightIsAllowed() {
        let p = Self.policy(["https://app.example.com"], allowHeaders: ["x-api-key"])
        guard case let .allowed(fields) = p.preflight(origin: "https://APP.example.com", method: "POST", requestHeaders: "X-Api-Key, content-type")
        else {
            Issue.record("refused")
            return
        }
        #expect(Self.value(fields, "Access-Control-Allow-Origin") == "https://APP.example.com")
        #expect(Self.value(fields, "Access-Control-Allow-Methods") == "GET, POST")
        #expect(Self.value(fields, "Access-Control-Allow-Headers") == "x-api-key")
        #expect(Self.value(fields, "Access-Control-Max-Age") == "600")
        #expect(Self.value(fields, "Vary") == "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
        #expect(Self.value(fields, "Access-Control-Allow-Credentials") == nil)
    }

    @Test(arguments: [
        ("https://evil.example", "POST", nil as String?), ("https://app.example.com", "DELETE", nil),
        ("https://app.example.com", "POST", "x-secret"), ("https://app.example.com.evil.example", "GET", nil),
        ("null", "GET", nil),
    ])
    func refusedPreflights(_ origin: String, _ method: String, _ headers: String?) {
        let p = Self.policy(["https://app.example.com"])
        guard case .refused = p.preflight(origin: origin, method: method, requestHeaders: headers) else {
            Issue.record("allowed: \(origin) \(method) \(headers ?? "")")
            return
        }
        #expect(p.answerFields(origin: origin) == nil || origin == "https://app.example.com")
    }

    @Test func anyOriginWithoutCredentialsIsAStar() {
        let p = Self.policy(["*"])
        #expect(Self.value(p.answerFields(origin: "https://x.example") ?? [], "Access-Control-Allow-Origin") == "*")
        #expect(Self.value(p.answerFields(origin: "https://x.example") ?? [], "Vary") == nil)
    }

    @Test func credentialsNameTheOriginAndVaryOnIt() {
        let p = Self.policy(["https://app.example.com"], credentials: true)
        let fields = p.answerFields(origin: "https://app.example.com") ?? []
        #expect(Self.value(fields, "Access-Control-Allow-Origin") == "https://app.example.com")
        #expect(Self.value(fields, "Access-Control-Allow-Credentials") == "true")
        #expect(Self.value(fields, "Vary") == "Origin")
        #expect(p.answerFields(origin: "https://other.example") == nil)
    }

    @Test func aGRPCRouteExposesTheStatusAndTakesGRPCWebsFields() {
        let p = Self.policy(["https://app.example.com"], grpc: true)
        let fields = p.answerFields(origin: "https://app.example.com") ?? []
        #expect(Self.value(fields, "Access-Control-Expose-Headers") == "grpc-status, grpc-message, grpc-status-details-bin")
        guard case let .allowed(pre) = p.preflight(origin: "https://app.example.com", method: "POST", requestHeaders: "x-grpc-web,x-user-agent,grpc-timeout")
        else {
            Issue.record("refused")
            return
        }
        #expect(Self.value(pre, "Access-Control-Allow-Headers")?.contains("x-grpc-web") == true)
    }
}
