import HappyPathConfig
import HappyPathCore

/// The configuration in the shape the hot path wants: routes resolved
/// (route → upstream → defaults), upstreams by index, endpoints pre-split.
/// Immutable and shared by every worker.
public final class RuntimeConfiguration: Sendable {
    public let configuration: Configuration
    let router: Router
    let routes: [RuntimeRoute]
    let upstreams: [RuntimeUpstream]

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        router = configuration.router
        let upstreams = configuration.upstreams.map(RuntimeUpstream.init)
        self.upstreams = upstreams
        routes = configuration.routes.indices.map { i in
            let route = configuration.routes[i]
            let policies = configuration.resolvedPolicies(forRoute: i)
            return RuntimeRoute(
                index: i, name: "routes[\(i)]", upstreamIndex: upstreams.firstIndex { $0.name == route.upstream }!,
                stripPrefix: route.stripPrefix, timeout: policies.timeout)
        }
    }
}

struct RuntimeRoute: Sendable {
    let index: Int
    let name: String
    let upstreamIndex: Int
    let stripPrefix: String?
    /// Overall deadline for a request on this route, all tries included.
    let timeout: Duration
}

struct RuntimeUpstream: Sendable {
    let name: String
    let endpoints: [Endpoint]
    let connectTimeout: Duration
    let maxConnections: Int

    init(_ upstream: Upstream) {
        name = upstream.name
        endpoints = upstream.endpoints.map(Endpoint.init)
        connectTimeout = upstream.connectTimeout
        maxConnections = upstream.maxConnections
    }
}

/// `http://host:port/base` split into what libcurl connects to and the path
/// prefix put in front of every request target.
struct Endpoint: Sendable {
    let url: String
    let origin: String
    let basePath: String

    init(_ url: String) {
        self.url = url
        let schemeEnd = url.range(of: "://")!.upperBound
        if let slash = url[schemeEnd...].firstIndex(of: "/") {
            origin = String(url[..<slash]) + "/"
            basePath = String(url[slash...])
        } else {
            origin = url + "/"
            basePath = ""
        }
    }
}
