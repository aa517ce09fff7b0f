import HappyPathCore

/// `cors:` on a route: which other origins a browser may call it from, and
/// what it may send and read (the Fetch standard's CORS protocol). Pure:
/// the worker asks it about a preflight (answered by the proxy, never sent
/// upstream) and about an actual request's answer.
public struct CORSConfiguration: Sendable, Equatable {
    /// Origins as a browser writes them (`https://app.example.com`,
    /// `http://localhost:3000`), compared without case; `*` allows any
    /// (and cannot go with `allowCredentials`).
    public var allowOrigins: [String]
    /// Request fields a page may send besides the CORS-safelisted ones
    /// (names, lowercased). Default: none, or gRPC-Web's on a gRPC route.
    public var allowHeaders: [String]?
    /// Response fields a page may read besides the safelisted ones
    /// (lowercased). Default: none, or gRPC's status fields on a gRPC route.
    public var exposeHeaders: [String]?
    /// How long a browser may keep a preflight's answer (nil: its own default, 5 s in Chromium).
    public var maxAge: Duration?
    /// Cookies and `Authorization` may go along (`Access-Control-Allow-Credentials: true`).
    public var allowCredentials = false

    public init(allowOrigins: [String]) { self.allowOrigins = allowOrigins }

    /// What a gRPC-Web client sends and must read.
    public static let grpcWebAllowHeaders = ["content-type", "x-grpc-web", "x-user-agent", "grpc-timeout", "authorization"]
    public static let grpcExposeHeaders = ["grpc-status", "grpc-message", "grpc-status-details-bin"]
}

/// A route's CORS decisions, made once per configuration.
public struct CORSPolicy: Sendable {
    public let configuration: CORSConfiguration
    private let anyOrigin: Bool
    private let origins: Set<String>
    private let allowHeadersValue: String?
    private let exposeHeadersValue: String?
    private let allowMethodsValue: String
    private let maxAgeValue: String?

    /// - Parameters:
    ///   - methods: the route's methods (`Access-Control-Allow-Methods`).
    ///   - grpc: a gRPC route: gRPC-Web's fields are the defaults.
    public init(_ configuration: CORSConfiguration, methods: [String], grpc: Bool) {
        self.configuration = configuration
        anyOrigin = configuration.allowOrigins.contains("*")
        origins = Set(configuration.allowOrigins.map { $0.lowercased() })
        let allow = configuration.allowHeaders ?? (grpc ? CORSConfiguration.grpcWebAllowHeaders : [])
        allowHeadersValue = allow.isEmpty ? nil : allow.joined(separator: ", ")
        let expose = configuration.exposeHeaders ?? (grpc ? CORSConfiguration.grpcExposeHeaders : [])
        exposeHeadersValue = expose.isEmpty ? nil : expose.joined(separator: ", ")
        allowMethodsValue = methods.joined(separator: ", ")
        maxAgeValue = configuration.maxAge.map { String(max(0, $0.nanoseconds / 1_000_000_000)) }
        allowedHeaders = Set(allow)
        allowedMethods = Set(methods)
    }

    private let allowedHeaders: Set<String>
    private let allowedMethods: Set<String>

    /// Whether `origin` (the request's `Origin`) may call the route.
    public func allows(origin: String) -> Bool {
        anyOrigin || origins.contains(origin.lowercased())
    }

    /// `Access-Control-Allow-Origin`: the origin itself (so credentials may
    /// go along, and a cache keys on it: `Vary: Origin`), or `*` when any is
    /// allowed without credentials.
    private func originFields(_ origin: String) -> [HTTPField] {
        if anyOrigin, !configuration.allowCredentials {
            return [HTTPField(name: "Access-Control-Allow-Origin", value: "*")]
        }
        var fields = [HTTPField(name: "Access-Control-Allow-Origin", value: origin), HTTPField(name: "Vary", value: "Origin")]
        if configuration.allowCredentials { fields.append(HTTPField(name: "Access-Control-Allow-Credentials", value: "true")) }
        return fields
    }

    public enum Preflight: Sendable, Equatable {
        /// Allowed: 204 with these fields.
        case allowed([HTTPField])
        /// Not allowed (origin, method or a header): 204 without CORS fields,
        /// so the browser refuses the call; `why` for the log.
        case refused(why: String)
    }

    /// A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`).
    /// - Parameter requestHeaders: `Access-Control-Request-Headers`, as sent.
    public func preflight(origin: String, method: String, requestHeaders: String?) -> Preflight {
        guard allows(origin: origin) else { return .refused(why: "origin \(origin.prefix(100)) is not in cors.allow_origins") }
        guard allowedMethods.contains(method) else { return .refused(why: "method \(method.prefix(20)) is not the route's") }
        var requested: [String] = []
        if let requestHeaders {
            for name in requestHeaders.split(separator: ",") {
                let n = name.trimmingSpaces.lowercased()
                guard !n.isEmpty else { continue }
                guard allowedHeaders.contains(n) || Self.safelisted.contains(n) else {
                    return .refused(why: "header \(n.prefix(40)) is not in cors.allow_headers")
                }
                requested.append(n)
            }
        }
        var fields = originFields(origin)
        fields.append(HTTPField(name: "Access-Control-Allow-Methods", value: allowMethodsValue))
        if let allowHeadersValue { fields.append(HTTPField(name: "Access-Control-Allow-Headers", value: allowHeadersValue)) }
        if let maxAgeValue { fields.append(HTTPField(name: "Access-Control-Max-Age", value: maxAgeValue)) }
        if fields.contains(where: { $0.name == "Vary" }) {
            fields.removeAll { $0.name == "Vary" }
        }
        fields.append(HTTPField(name: "Vary", value: "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"))
        return .allowed(fields)
    }

    /// The fields every answer to an actual request from `origin` carries
    /// (nil: not an allowed origin, no CORS fields).
    public func answerFields(origin: String) -> [HTTPField]? {
        guard allows(origin: origin) else { return nil }
        var fields = originFields(origin)
        if let exposeHeadersValue { fields.append(HTTPField(name: "Access-Control-Expose-Headers", value: exposeHeadersValue)) }
        return fields
    }

    /// Request fields a page may always send (the Fetch standard's safelist).
    static let safelisted: Set<String> = ["accept", "accept-language", "content-language", "content-type", "range"]
}

extension Substring {
    fileprivate var trimmingSpaces: Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return s
    }
}
