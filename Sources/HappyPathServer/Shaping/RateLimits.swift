import CoreMetrics
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Prometheus
import Synchronization

/// One route's rate limit, shared by every worker: its buckets and their
/// queues behind one lock (taken once per request on the route), the
/// number of requests waiting in its queue, and the fields it adds to
/// answers. A reload that leaves the route and its `rate_limit` as they
/// were keeps this object (`RuntimeConfiguration.init(_:previous:)`), so
/// its buckets stay as drained as they are and its queue keeps its order.
final class RouteRateLimit: Sendable {
    let configuration: RateLimitConfiguration
    let label: String
    /// `Locked` (a pthread mutex), not `Synchronization.Mutex`: ThreadSanitizer
    /// cannot see a futex's critical sections and reported this one as a race.
    private let state: Locked<State>
    /// Requests waiting for their token, in the whole process (`max_queue`).
    let queued = Atomic<Int>(0)
    /// `RateLimit-Policy`: the sustained rate as quota per window
    /// (draft-ietf-httpapi-ratelimit-headers), made once.
    let policyField: HTTPField

    /// `max_wait`, or the route's timeout if that is shorter.
    let maxWait: Duration
    /// `scope: cluster`: counted in Redis (nil: in this process).
    let cluster: ClusterRouteLimit?

    private struct State {
        var limiter: RateLimiter
        /// The queued requests by ticket, each on its worker's loop: told
        /// when the one before them left and their turn moved up.
        var waiters: [UInt64: LoopBound<QueuedRequest>] = [:]
    }

    init(_ configuration: RateLimitConfiguration, label: String, timeout: Duration) {
        self.configuration = configuration
        self.label = label
        maxWait = min(configuration.maxWait, timeout)
        state = Locked(State(limiter: RateLimiter(configuration)))
        cluster =
            configuration.scope == .cluster
            ? ClusterRouteLimit(configuration, label: label, timeout: timeout, maxWait: min(configuration.maxWait, timeout)) : nil
        policyField = HTTPField(
            name: "RateLimit-Policy",
            value: "\"default\";q=\(configuration.count);w=\(Int(configuration.period.seconds))")
        policyValueBytes = Array(policyField.value.utf8)
    }

    /// Whether a reload may keep this limit for a route with these settings.
    func isSame(as configuration: RateLimitConfiguration, label: String, timeout: Duration) -> Bool {
        self.configuration == configuration && self.label == label && maxWait == min(configuration.maxWait, timeout)
    }

    enum Decision {
        case pass(fields: RateLimitFields)
        /// Queued: `ticket` is its place (`enqueue`, `served`, `leave`).
        case wait(Duration, ticket: UInt64)
        case refuse(retryAfterSeconds: Int, fields: RateLimitFields)
    }

    /// Takes or reserves a token for `key` (made, and a long key hashed,
    /// before the lock). A queued request beyond `max_queue` is refused
    /// (its reservation given back).
    func admit(key: RateLimitBucketKey, at now: Instant) -> Decision {
        let admitted = state.withLock { $0.limiter.admitWithState(key: key, at: now, maxWait: maxWait) }
        switch admitted.decision {
        case .pass:
            return .pass(fields: fields(remaining: admitted.remaining, untilFullNs: admitted.untilFullNs))
        case let .wait(delay):
            guard takeQueuePlace() else {
                leave(ticket: admitted.ticket, key: key, at: now)
                return .refuse(
                    retryAfterSeconds: Self.seconds(delay.nanoseconds),
                    fields: fields(remaining: 0, untilFullNs: admitted.untilFullNs))
            }
            return .wait(delay, ticket: admitted.ticket)
        case let .refuse(retryAfter):
            return .refuse(
                retryAfterSeconds: Self.seconds(retryAfter.nanoseconds),
                fields: fields(remaining: 0, untilFullNs: admitted.untilFullNs))
        }
    }

    /// Registers a queued request (on its worker's loop) to hear when it
    /// moves up. Returns when its token is due now: someone in front may
    /// have left between `admit` and this call.
    func enqueue(_ waiting: QueuedRequest, ticket: UInt64, on loop: EventLoop) -> Instant? {
        let bound = LoopBound(waiting, on: loop)
        return state.withLock { s in
            guard let due = s.limiter.waiting(key: waiting.key).first(where: { $0.ticket == ticket })?.due else { return nil }
            s.waiters[ticket] = bound
            return due
        }
    }

    /// A place in the process's queue (`max_queue`) for a request about to
    /// wait; false, and nothing taken, when it is full.
    func takeQueuePlace() -> Bool {
        guard queued.wrappingAdd(1, ordering: .relaxed).newValue > configuration.maxQueue else { return true }
        queued.wrappingSubtract(1, ordering: .relaxed)
        return false
    }

    /// A queued request left the queue (its turn came, or it went away).
    func dequeued() { queued.wrappingSubtract(1, ordering: .relaxed) }

    /// A queued request's turn came (it used its token), or the worker
    /// is shutting down: out of the queue, nobody else moves.
    func served(ticket: UInt64, key: RateLimitBucketKey) {
        state.withLock {
            $0.limiter.served(ticket: ticket, key: key)
            $0.waiters[ticket] = nil
        }
    }

    /// A queued request left before its turn: its token goes back and each
    /// request behind it on the same key moves up to the turn of the one
    /// before it (told on its own loop).
    func leave(ticket: UInt64, key: RateLimitBucketKey, at now: Instant) {
        let moved: [(LoopBound<QueuedRequest>, Instant)] = state.withLock { s in
            s.waiters[ticket] = nil
            return s.limiter.leave(ticket: ticket, key: key, at: now).compactMap { w in
                s.waiters[w.ticket].map { ($0, w.due) }
            }
        }
        for (waiting, due) in moved { waiting.loop.execute(with: waiting) { $0.moveUp(to: due) } }
    }

    /// The fields for `key` as its bucket is now.
    func fields(key: RateLimitBucketKey, at now: Instant) -> RateLimitFields {
        let state = state.withLock { $0.limiter.state(key: key, at: now) }
        return fields(remaining: state.remaining, untilFullNs: state.untilFull.nanoseconds)
    }

    /// Buckets kept now (`/admin/state`).
    var keys: Int { state.withLock { $0.limiter.keys } }

    /// The fields for an answer after a token was taken: the policy, and
    /// what is left with when the bucket is full again (in whole seconds).
    func fields(remaining: Int, untilFullNs: Int64) -> RateLimitFields {
        RateLimitFields(limit: self, remaining: remaining, untilFullSeconds: Self.seconds(untilFullNs, least: 0))
    }

    /// `RateLimit-Policy`'s name and value as bytes, made once (staged on
    /// every answer of the route without building a string).
    let policyValueBytes: [UInt8]

    /// Whole seconds, rounded up (at least `least`): for `Retry-After` and `t`.
    static func seconds(_ ns: Int64, least: Int = 1) -> Int {
        max(least, Int((ns + 999_999_999) / 1_000_000_000))
    }
}

/// A limited route's two fields for one answer: `RateLimit-Policy` (made
/// once per route) and `RateLimit` (what is left, and when the bucket is
/// full again), staged as bytes written on the stack: no string is built
/// and nothing is allocated for them on the way to the client.
struct RateLimitFields {
    let limit: RouteRateLimit
    let remaining: Int
    let untilFullSeconds: Int

    func stage<C: ExchangeClient>(on request: C) {
        Self.policyName.withUnsafeBytes { name in
            limit.policyValueBytes.withUnsafeBytes { request.addResponseHeader(name: name, value: $0) }
        }
        // `"default";r=<remaining>;t=<seconds>`, written into stack memory
        // (no nested functions: a captured `var` would be boxed on the heap).
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 64) { buffer in
            var n = 0
            let prefix: StaticString = "\"default\";r="
            for i in 0..<prefix.utf8CodeUnitCount {
                buffer[n] = prefix.utf8Start[i]
                n += 1
            }
            n = Self.writeDecimal(remaining, into: buffer, at: n)
            buffer[n] = UInt8(ascii: ";")
            buffer[n + 1] = UInt8(ascii: "t")
            buffer[n + 2] = UInt8(ascii: "=")
            n = Self.writeDecimal(untilFullSeconds, into: buffer, at: n + 3)
            Self.name.withUnsafeBytes { name in
                request.addResponseHeader(name: name, value: UnsafeRawBufferPointer(UnsafeMutableBufferPointer(rebasing: buffer[0..<n])))
            }
        }
    }

    /// Writes `value` (clamped to 0...) in decimal at `at`; returns the end.
    private static func writeDecimal(_ value: Int, into buffer: UnsafeMutableBufferPointer<UInt8>, at: Int) -> Int {
        var v = max(0, value)
        var digits = 1
        var probe = v
        while probe >= 10 {
            probe /= 10
            digits += 1
        }
        var i = at + digits - 1
        repeat {
            buffer[i] = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: v % 10)
            v /= 10
            i -= 1
        } while v > 0
        return at + digits
    }

    /// The same, as fields (for a problem answer).
    var fields: [HTTPField] {
        [
            limit.policyField,
            HTTPField(name: "RateLimit", value: "\"default\";r=\(remaining);t=\(untilFullSeconds)"),
        ]
    }

    private static let policyName = Array("RateLimit-Policy".utf8)
    private static let name = Array("RateLimit".utf8)
}

/// The key a request's bucket is found under.
enum RateLimitKey {
    static func of(_ request: HTTPRequest, _ key: RateLimitConfiguration.Key, trusted: [IPRange]) -> String {
        switch key {
        case .route:
            return ""
        case let .header(name):
            // Kept apart from addresses, so a header value cannot take an address's bucket.
            if let value = request.header(name), !value.isEmpty { return "h:" + value }
            return clientIP(request, trusted: trusted)
        case .clientIP:
            return clientIP(request, trusted: trusted)
        }
    }

    static func clientIP(_ request: HTTPRequest, trusted: [IPRange]) -> String {
        let peer = request.peerAddress
        guard !trusted.isEmpty else { return ClientAddress.canonicalPeer(peer) }
        var forwarded: [String] = []
        request.forEachHeader { name, value in
            if name.count == 15, name.lowercased() == "x-forwarded-for" { forwarded.append(value) }
        }
        return ClientAddress.resolve(peer: peer, forwardedFor: forwarded, trusted: trusted)
    }
}

/// A limited route's verdict on a request with a body, given at its head
/// (before the body was read): the token it took, as the fields for its
/// answer (`HTTPRequest.headDecision`).
final class HeadAdmission {
    let fields: RateLimitFields
    /// The request's rate-limit key, bounded (`RateLimitBucketKey.text`): pacing's client key.
    let key: String

    init(_ fields: RateLimitFields, key: RateLimitBucketKey) {
        self.fields = fields
        self.key = key.text
    }
}

/// `happypath_rate_limited_total{route,outcome}`, the queue's depth and
/// its waits, with HELP text. One per worker (its `RateLimitGate`), on its
/// loop: the counters are made once per route and outcome and kept.
final class RateLimitMetrics {
    private let registry: PrometheusCollectorRegistry
    private let routeSeries: RouteSeriesBook
    /// By route, then outcome (readable for the status page: `RouteSeriesBook`).
    private var counters: [String: [String: any CoreMetrics.CounterHandler]] = [:]

    init(_ metrics: ProxyMetrics) {
        registry = metrics.registry
        routeSeries = metrics.routeSeries
    }

    func limited(route: String, outcome: String) {
        if let counter = counters[route]?[outcome] { return counter.increment(by: 1) }
        let labels = [("route", route), ("outcome", outcome)]
        let series = registry.makeCounter(
            descriptor: MetricNameDescriptor(
                namespace: "happypath", metricName: "rate_limited", unitName: "total",
                helpText: "Requests a route's rate limit held back: queued (waited for a token) or rejected (429)."),
            labels: labels)
        let counter = routeSeries.counter(series, family: "happypath_rate_limited_total", labels: labels)
        counters[route, default: [:]][outcome] = counter
        counter.increment(by: 1)
    }

    func queueDepth(route: String, _ depth: Int) {
        registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "happypath", metricName: "rate_limit_queue_depth", unitName: "",
                helpText: "Requests waiting in a route's rate-limit queue for their token, in the whole process."),
            labels: [("route", route)]
        ).set(Double(depth))
    }

    func waited(route: String, _ wait: Duration) {
        registry.makeDurationHistogram(
            descriptor: MetricNameDescriptor(
                namespace: "happypath", metricName: "rate_limit_queue_wait", unitName: "seconds",
                helpText: "How long requests waited in a route's rate-limit queue before going on."),
            labels: [("route", route)],
            buckets: [
                .milliseconds(1), .milliseconds(10), .milliseconds(50), .milliseconds(100), .milliseconds(250),
                .milliseconds(500), .seconds(1), .seconds(2), .seconds(5), .seconds(10), .seconds(30),
            ]
        ).recordNanoseconds(wait.nanoseconds)
    }
}
