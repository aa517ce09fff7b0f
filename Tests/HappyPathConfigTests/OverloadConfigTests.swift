import HappyPathConfig
import HappyPathCore
import HappyPathPolicies
import Testing

/// Issue 35: `adaptive_concurrency` on an upstream, `priority` and
/// `priority_header` on a route (docs/overload.md).
@Suite struct OverloadConfigTests {
    static func yaml(upstream: String = "", route: String = "") -> String {
        """
        upstreams:
          api: { endpoints: [http://127.0.0.1:9000], max_connections: 100\(upstream) }
        routes:
          - { match: { path_prefix: / }, upstream: api\(route) }
        """
    }

    @Test func withoutThemTheLimitIsFixedAndEveryRouteNormal() throws {
        let c = try ConfigLoader.parse(Self.yaml(), file: "f.yaml", environment: [:])
        #expect(c.upstreams[0].adaptiveConcurrency == nil)
        #expect(c.routes[0].priority == .normal && c.routes[0].priorityHeader == nil)
    }

    /// It starts at 20 (issue 44: a limit that starts at its minimum is
    /// held by the first slow requests), within its bounds.
    @Test func anEmptyBlockTakesTheDefaultsAndStartsAtTwenty() throws {
        let c = try ConfigLoader.parse(Self.yaml(upstream: ", adaptive_concurrency: {}"), file: "f.yaml", environment: [:])
        let a = try #require(c.upstreams[0].adaptiveConcurrency)
        #expect(a.limit.minLimit == 2 && a.limit.maxLimit == 200 && a.limit.initialLimit == 20)
        #expect(a.limit.latencyFloor == 0.005 && a.maxStreams == nil && !a.minLimitGiven)
        let low = try ConfigLoader.parse(
            Self.yaml(upstream: ", adaptive_concurrency: { max_limit: 8 }"), file: "f.yaml", environment: [:])
        #expect(low.upstreams[0].adaptiveConcurrency?.limit.initialLimit == 8)
        #expect(a.limit.tolerance == 1.5 && a.limit.smoothing == 0.2)
        #expect(a.queue.interval == .milliseconds(100) && a.queue.target == .milliseconds(5))
    }

    @Test func everyKeyIsRead() throws {
        let c = try ConfigLoader.parse(
            Self.yaml(
                upstream:
                    ", adaptive_concurrency: { min_limit: 4, max_limit: 40, initial_limit: 10, tolerance: 2, smoothing: 0.5, latency_floor: 1ms, max_streams: 30, queue: { interval: 50ms, target: 2ms } }",
                route: ", priority: sheddable, priority_header: X-Priority"),
            file: "f.yaml", environment: [:])
        let a = try #require(c.upstreams[0].adaptiveConcurrency)
        #expect(a.limit.minLimit == 4 && a.limit.maxLimit == 40 && a.limit.initialLimit == 10)
        #expect(a.limit.tolerance == 2 && a.limit.smoothing == 0.5)
        #expect(a.limit.latencyFloor == 0.001 && a.maxStreams == 30 && a.minLimitGiven)
        #expect(a.queue.interval == .milliseconds(50) && a.queue.target == .milliseconds(2))
        #expect(c.routes[0].priority == .sheddable && c.routes[0].priorityHeader == "x-priority")
    }

    @Test(arguments: [
        (", adaptive_concurrency: { min_limit: 0 }", "", "upstreams.api.adaptive_concurrency.min_limit must be between 1 and 100000, got 0"),
        (", adaptive_concurrency: { min_limit: 10, max_limit: 5, initial_limit: 5 }", "", "upstreams.api.adaptive_concurrency: max_limit (5) must not be below min_limit (10)"),
        (", adaptive_concurrency: { min_limit: 200 }", "", "upstreams.api.adaptive_concurrency.min_limit (200) is above max_connections × endpoints (100)"),
        (", adaptive_concurrency: { tolerance: 0.5 }", "", "upstreams.api.adaptive_concurrency.tolerance must be a number from 1.0 to 10.0"),
        (", adaptive_concurrency: { probe: 1s }", "", "unknown key 'upstreams.api.adaptive_concurrency.probe'"),
        (", adaptive_concurrency: { latency_floor: 11s }", "", "upstreams.api.adaptive_concurrency: latency_floor must be between 0s and 10s"),
        (", adaptive_concurrency: { max_streams: -1 }", "", "upstreams.api.adaptive_concurrency.max_streams must be between 0 and 100000"),
        ("", ", priority: urgent", "routes[0].priority must be one of critical, normal, sheddable, got 'urgent'"),
        ("", ", priority_header: 'X Priority'", "routes[0].priority_header: 'X Priority' is not a header name"),
    ])
    func aBadValueIsNamed(upstream: String, route: String, prefix: String) {
        let e = errors(Self.yaml(upstream: upstream, route: route))
        #expect(e.first.map { $0.message.hasPrefix(prefix) } == true, "\(e.map(\.message))")
    }
}
