import HappyPathCore

/// Outlier ejection for one upstream's endpoints (docs/reachability.md): an
/// endpoint whose last `consecutiveFailures` tries failed leaves the
/// rotation for `baseEjection`, unless that would put more than
/// `maxEjectedPercent` of the endpoints out at once or leave none in. A
/// success resets the endpoint's count. A pure value with the time passed
/// in; the upstream's guard holds it behind its lock, shared by the workers.
///
/// On the hot path only with two endpoints or more: `pick` once per try and
/// `record` once per try's end, each a short loop over the endpoints with
/// no allocation; instants are compared as nanoseconds.
public struct OutlierDetector: Sendable {
    /// What `record` decided.
    public enum Verdict: Sendable, Equatable {
        /// Nothing changed in the rotation.
        case none
        /// The endpoint was ejected until then.
        case ejected(endpoint: Int, until: Instant)
    }

    @usableFromInline struct Endpoint: Sendable {
        @usableFromInline var consecutiveFailures = 0
        /// Monotonic nanoseconds; 0: in the rotation. `Int64.max` while
        /// drained, so `pick` skips a drained endpoint with the comparison it
        /// already makes (draining adds nothing to the hot path).
        @usableFromInline var ejectedUntil: Int64 = 0
        /// Taken out by an operator (`drain`) until `undrain`: never returns
        /// by itself, and outlier detection leaves it alone.
        @usableFromInline var drained = false

        @usableFromInline init() {}
    }

    public let configuration: Configuration
    @usableFromInline var endpoints: [Endpoint]

    public init(endpoints: Int, configuration: Configuration = Configuration()) {
        self.configuration = configuration
        self.endpoints = Array(repeating: Endpoint(), count: endpoints)
    }

    public var endpointCount: Int { endpoints.count }

    /// `preferred`, or the next endpoint after it that is not ejected; an
    /// endpoint whose ejection is over is back in the rotation. If every
    /// one is ejected (`record` always keeps one in): `preferred` anyway.
    @inlinable
    public mutating func pick(preferred: Int, at now: Instant) -> Int {
        let count = endpoints.count
        var i = preferred
        for _ in 0..<count {
            if endpoints[i].ejectedUntil > now.nanoseconds {
                i = i + 1 == count ? 0 : i + 1
                continue
            }
            endpoints[i].ejectedUntil = 0
            return i
        }
        // All out (`drain` always keeps one endpoint undrained): one that is
        // only ejected, not one an operator drained.
        if endpoints[preferred].drained, let kept = endpoints.firstIndex(where: { !$0.drained }) { return kept }
        return preferred
    }

    /// A try on `endpoint` ended. A success resets its count of failures in
    /// a row; a failure counts, and the one that reaches
    /// `consecutiveFailures` ejects it, if the bound on ejected endpoints
    /// allows (if not, the count starts again at the next failure).
    @inlinable
    public mutating func record(endpoint i: Int, failure: Bool, at now: Instant) -> Verdict {
        guard failure else {
            endpoints[i].consecutiveFailures = 0
            return .none
        }
        endpoints[i].consecutiveFailures += 1
        guard endpoints[i].consecutiveFailures >= configuration.consecutiveFailures, !endpoints[i].drained else {
            return .none
        }
        let ejectedNow = ejectedCount(at: now)
        guard mayEject(alreadyOut: ejectedNow) else { return .none }
        let until = now.nanoseconds &+ configuration.baseEjectionNanoseconds
        endpoints[i].consecutiveFailures = 0
        endpoints[i].ejectedUntil = until
        return .ejected(endpoint: i, until: Instant(nanoseconds: until))
    }

    /// Whether one more endpoint may go out with `alreadyOut` out now: the
    /// share stays within `maxEjectedPercent` and one endpoint stays in.
    @inlinable
    func mayEject(alreadyOut: Int) -> Bool {
        let count = endpoints.count
        return alreadyOut + 1 < count && (alreadyOut + 1) * 100 <= count * configuration.maxEjectedPercent
    }

    @inlinable
    func ejectedCount(at now: Instant) -> Int {
        var out = 0
        for e in endpoints where e.ejectedUntil > now.nanoseconds { out += 1 }
        return out
    }

    // MARK: - Draining

    /// What `drain` decided.
    public enum DrainResult: Sendable, Equatable {
        /// Out of the rotation now (or it already was drained).
        case drained
        /// Refused: no other endpoint would be left undrained.
        case lastEndpoint
    }

    /// An operator takes `endpoint` out of the rotation until `undrain`:
    /// tries already sent finish, new ones go to the others. The last
    /// undrained endpoint is refused (an outlier ejection ends by itself,
    /// a drain does not, so an upstream all drained would never answer).
    /// A drained endpoint counts as out for `max_ejected_percent`.
    public mutating func drain(_ endpoint: Int) -> DrainResult {
        if endpoints[endpoint].drained { return .drained }
        guard endpoints.indices.contains(where: { $0 != endpoint && !endpoints[$0].drained }) else { return .lastEndpoint }
        endpoints[endpoint].drained = true
        endpoints[endpoint].ejectedUntil = .max
        endpoints[endpoint].consecutiveFailures = 0
        return .drained
    }

    /// Back in the rotation at once, its failures forgotten. True if it was drained.
    @discardableResult
    public mutating func undrain(_ endpoint: Int) -> Bool {
        guard endpoints[endpoint].drained else { return false }
        endpoints[endpoint] = Endpoint()
        return true
    }

    /// Whether an operator drained `endpoint`.
    public func isDrained(_ endpoint: Int) -> Bool { endpoints[endpoint].drained }

    /// Where each endpoint stands at `now` (admin state and status page).
    public enum Rotation: Sendable, Equatable {
        case inRotation
        /// Ejected by outlier detection; back at `until`.
        case ejected(until: Instant)
        case drained
    }

    public func rotation(at now: Instant) -> [Rotation] {
        endpoints.map { e in
            if e.drained { return .drained }
            return e.ejectedUntil > now.nanoseconds ? .ejected(until: Instant(nanoseconds: e.ejectedUntil)) : .inRotation
        }
    }

    /// Whether `endpoint` is out of the rotation at `now`.
    public func isEjected(_ endpoint: Int, at now: Instant) -> Bool { endpoints[endpoint].ejectedUntil > now.nanoseconds }

    /// Indices of the endpoints out of the rotation at `now` (admin state).
    public func ejected(at now: Instant) -> Set<Int> { Set(endpoints.indices.filter { isEjected($0, at: now) }) }

    /// Failed tries in a row counted for `endpoint` since its last success
    /// or ejection.
    public func consecutiveFailures(of endpoint: Int) -> Int { endpoints[endpoint].consecutiveFailures }
}
