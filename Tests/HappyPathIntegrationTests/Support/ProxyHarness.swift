import Foundation
import HappyPathConfig
import HappyPathDemo
import HappyPathServer
import Logging

/// The real proxy and the real demo upstream on ephemeral loopback ports.
final class ProxyHarness {
    let demo: DemoUpstream
    let proxy: ProxyServer
    var port: Int { proxy.port }
    var adminPort: Int { proxy.adminPort }

    /// `yaml` may use `{{DEMO}}` for the demo upstream's base URL.
    /// - Parameter holding: kept until the proxy has stopped (a
    ///   `RefusingPort` the config names must not be freed before).
    init(
        _ yaml: String = ProxyHarness.defaultYAML, workers: Int = 2, logger: Logger = Logger.happypath(level: .critical),
        environment: [String: String] = [:], accessLog: AccessLogSettings? = nil, holding: [AnyObject] = []
    ) throws {
        held = holding
        demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        let text = yaml.replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(demo.port)")
        let configuration = try ConfigLoader.parse(text, file: "test.yaml", environment: environment)
        proxy = ProxyServer(configuration: configuration, workers: workers, logger: logger, accessLog: accessLog)
        try proxy.start()
    }

    /// Scripted upstreams this harness stops with itself.
    var scripted: [ScriptedUpstream] = []
    /// Released when the proxy has stopped.
    private var held: [AnyObject]

    func stop() {
        proxy.stop()
        demo.stop()
        for upstream in scripted { upstream.stop() }
        scripted.removeAll()
        held.removeAll()
    }

    /// The proxy (`single` config) in front of a scripted upstream serving
    /// `responses`; the upstream stops with the harness.
    static func scripted(
        _ responses: [String], defaults: String = "{ reachability: { park_for: 0s } }", routeTimeout: String = "2s"
    ) throws -> (ProxyHarness, ScriptedUpstream) {
        let upstream = ScriptedUpstream(responses: responses).started()
        do {
            let h = try ProxyHarness(
                single(upstream: "http://127.0.0.1:\(upstream.port)", defaults: defaults, routeTimeout: routeTimeout))
            h.scripted.append(upstream)
            return (h, upstream)
        } catch {
            upstream.stop()
            throw error
        }
    }

    deinit { stop() }

    static let defaultYAML = """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { max_request_body: 4MiB, max_header_bytes: 8KiB, client_timeout: 5s }
        upstreams:
          demo:
            endpoints: [{{DEMO}}]
        routes:
          - match: { path_prefix: /api/ }
            upstream: demo
            strip_prefix: /api
          - match: { path_prefix: /slow }
            upstream: demo
            timeout: 300ms
          - match: { path_prefix: / , methods: [GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE] }
            upstream: demo
        """

    /// A config whose single route goes to `url`; `defaults` is YAML for the defaults mapping.
    static func single(
        upstream url: String, defaults: String = "{ reachability: { park_for: 0s } }", upstreamExtra: String = "",
        routeTimeout: String = "2s"
    ) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        defaults: \(defaults)
        upstreams:
          u:
            endpoints: [\(url)]
            connect_timeout: 500ms
            \(upstreamExtra)
        routes:
          - match: { path_prefix: / }
            upstream: u
            timeout: \(routeTimeout)
        """
    }
}
