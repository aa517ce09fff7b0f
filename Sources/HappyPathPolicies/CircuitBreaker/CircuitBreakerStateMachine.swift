import HappyPathCore

/// The breaker of one upstream as a pure state machine: events in, state and
/// decisions out; the clock is passed in with each event.
public struct CircuitBreakerStateMachine: Sendable {
    public struct Configuration: PolicyConfiguration {
        /// Opens after this many failures in a row. Default 5.
        public var consecutiveFailures: Int = 5
        /// ...or when this share of the window's requests failed. Default 0.5.
        public var failureRate: Double = 0.5
        /// ...once the window holds at least this many requests. Default 20.
        public var minimumRequests: Int = 20
        /// Default 10s.
        public var window: Duration = .seconds(10)
        /// Stays open this long, then lets probes through. Default 5s.
        public var openFor: Duration = .seconds(5)
        /// Probes let through at once while half-open; all must succeed to close. Default 1.
        public var halfOpenProbes: Int = 1
        /// What a request finds while the breaker is open. Default `park`.
        public var whileOpen: WhileOpen = .park

        public init() {}
    }

    /// `circuit_breaker.while_open`.
    public enum WhileOpen: String, Sendable, CaseIterable {
        /// Wait parked (up to `reachability.park_for`) for the probe that closes it.
        case park
        /// Answered at once: 503 CIRCUIT_OPEN.
        case fail
    }

    public enum State: Sendable, Equatable {
        case closed
        case open(until: Instant)
        case halfOpen(probesInFlight: Int, successes: Int)

        /// For metrics: 0 closed, 1 half-open, 2 open.
        public var gauge: Int {
            switch self {
            case .closed: 0
            case .halfOpen: 1
            case .open: 2
            }
        }

        public var name: String {
            switch self {
            case .closed: "closed"
            case .halfOpen: "half_open"
            case .open: "open"
            }
        }
    }

    public enum Admission: Sendable, Equatable {
        case allow
        /// Allowed as a half-open probe: report its result with `probe: true`.
        case probe
        case reject(retryAfter: Duration)
    }

    public enum Transition: Sendable, Equatable {
        case opened, halfOpened, closed
    }

    /// An operator's override (`force`): the breaker stays in that state,
    /// whatever tries report, until released.
    public enum Forced: String, Sendable, Equatable, CaseIterable {
        /// Every try refused, as while open; it never probes by itself.
        case open
        /// Every try let through; failures are not counted.
        case closed
    }

    public let configuration: Configuration
    public private(set) var state: State = .closed
    /// nil: automatic (the breaker follows the tries).
    public private(set) var forced: Forced?
    private var consecutive = 0
    /// first: tries, second: failed tries.
    private var window: SlidingWindow

    public init(_ configuration: Configuration) {
        self.configuration = configuration
        window = SlidingWindow(seconds: Int((configuration.window.nanoseconds + 999_999_999) / 1_000_000_000))
    }

    /// Asks to send a try. May move open → half-open when `openFor` passed.
    public mutating func admit(at now: Instant) -> (Admission, Transition?) {
        if let forced {
            return forced == .open ? (.reject(retryAfter: configuration.openFor), nil) : (.allow, nil)
        }
        switch state {
        case .closed:
            return (.allow, nil)
        case let .open(until):
            guard now >= until else { return (.reject(retryAfter: until - now), nil) }
            state = .halfOpen(probesInFlight: 1, successes: 0)
            return (.probe, .halfOpened)
        case let .halfOpen(inFlight, successes):
            guard inFlight + successes < configuration.halfOpenProbes else {
                return (.reject(retryAfter: configuration.openFor), nil)
            }
            state = .halfOpen(probesInFlight: inFlight + 1, successes: successes)
            return (.probe, nil)
        }
    }

    /// Failures in a row, and the window's tries and failed tries (counted
    /// while closed): what the status page shows beside the state.
    public func failures(at now: Instant) -> (consecutive: Int, requests: Int, failed: Int) {
        let (requests, failed) = window.totals(at: now)
        return (consecutive, requests, failed)
    }

    /// Reports a try's result. `probe` says whether `admit` returned `.probe` for it.
    public mutating func record(failure: Bool, probe: Bool, at now: Instant) -> Transition? {
        guard forced == nil else { return nil }  // the operator decides, not the tries
        if probe, case let .halfOpen(inFlight, successes) = state {
            if failure {
                return trip(now)
            }
            let done = successes + 1
            if done >= configuration.halfOpenProbes {
                reset()
                return .closed
            }
            state = .halfOpen(probesInFlight: max(0, inFlight - 1), successes: done)
            return nil
        }
        guard case .closed = state else { return nil }  // late results of tries sent before it opened
        window.add(first: 1, second: failure ? 1 : 0, at: now)
        consecutive = failure ? consecutive + 1 : 0
        if consecutive >= configuration.consecutiveFailures { return trip(now) }
        let (requests, failures) = window.totals(at: now)
        if failure, requests >= configuration.minimumRequests,
            Double(failures) / Double(requests) >= configuration.failureRate
        {
            return trip(now)
        }
        return nil
    }

    /// A probe that was admitted but never sent (its client left): free its slot.
    public mutating func probeAbandoned() {
        if case let .halfOpen(inFlight, successes) = state {
            state = .halfOpen(probesInFlight: max(0, inFlight - 1), successes: successes)
        }
    }

    // MARK: - Forced by an operator

    /// Forces the breaker open or closed, or (nil) releases it back to
    /// automatic, which starts closed with nothing counted: what was counted
    /// before an override says nothing about the upstream after it. Forced
    /// open, its state reads open with no end (`Instant(nanoseconds: .max)`)
    /// for whoever reads `state`; a probe in flight is forgotten. Returns the
    /// transition of `state`, if it changed.
    public mutating func force(_ forced: Forced?, at now: Instant) -> Transition? {
        let before = state
        self.forced = forced
        switch forced {
        case .open:
            state = .open(until: Instant(nanoseconds: .max))
            consecutive = 0
        case .closed, nil:
            reset()
        }
        switch (before, state) {
        case (.open, .open), (.closed, .closed): return nil
        case (_, .open): return .opened
        default: return .closed
        }
    }

    private mutating func trip(_ now: Instant) -> Transition {
        state = .open(until: now + configuration.openFor)
        consecutive = 0
        return .opened
    }

    private mutating func reset() {
        state = .closed
        consecutive = 0
        window.reset()
    }
}
