import HappyPathCore

/// Whether a try may be sent now: one decision, its gates asked in a fixed
/// order (deadline → pause → reachability → credentials → circuit breaker →
/// connection slot), each only if the ones before it passed. The gates are
/// the shared state (health verdict, token, breaker, the worker's slots),
/// behind a protocol so the order and the verdicts are tested on their own.
public enum Admission {
    /// What the gates answer, asked in this order.
    public protocol Gates {
        /// Whether the upstream paused itself (`pacing`): nothing is sent to
        /// it until the pause ends.
        mutating func pause() -> Pause
        /// The health checker's verdict for the upstream.
        mutating func isReachable() -> Bool
        /// Credentials to inject are at hand (or none are needed); `false`:
        /// wait for the token refresh (the gate starts it if it must).
        mutating func hasCredentials() -> Bool
        /// The breaker's admission. `.probe` takes a half-open probe's place.
        mutating func breaker() -> CircuitBreakerStateMachine.Admission
        /// A connection slot for the try, a place in the upstream's queue, or neither.
        mutating func slot() -> Slot
        /// A probe's place was taken but no try will be sent: give it back.
        mutating func abandonProbe()
    }

    public enum Slot: Sendable, Equatable { case acquired, queued, full }

    public enum Pause: Sendable, Equatable {
        /// Not paused (or no `pacing`).
        case none
        /// Paused, `while_paused: wait`: wait for the pause's end.
        case wait
        /// Paused, `while_paused: fail`: answer now.
        case fail
    }

    public enum Verdict: Sendable, Equatable {
        /// Send a try now (the slot is held). `probe`: it is the breaker's half-open probe.
        case send(probe: Bool)
        /// Wait in the upstream's queue for a slot.
        case queue(probe: Bool)
        /// Wait until the upstream recovers. `probeAfter`: the breaker is
        /// open and lets a probe through after this long.
        case park(ExchangeStateMachine.ParkReason, probeAfter: Duration?)
        case refuse(Refusal)
    }

    public enum Refusal: Sendable, Equatable {
        /// The deadline passed before a try could start.
        case deadline
        /// `max_connections` tries in flight and as many waiting.
        case overloaded
        /// The breaker is open and the upstream's `while_open` is `fail`.
        case circuitOpen(retryAfter: Duration)
        /// The upstream is paused and its `while_paused` is `fail`.
        case paused
    }

    /// - Parameters:
    ///   - remaining: time left before the request's deadline.
    ///   - parkWhileOpen: `while_open: park` with a `park_for` above zero.
    public static func decide(remaining: Duration, parkWhileOpen: Bool, gates: inout some Gates) -> Verdict {
        guard remaining > .zero else { return .refuse(.deadline) }
        switch gates.pause() {
        case .none: break
        case .wait: return .park(.paused, probeAfter: nil)
        case .fail: return .refuse(.paused)
        }
        guard gates.isReachable() else { return .park(.unreachable, probeAfter: nil) }
        guard gates.hasCredentials() else { return .park(.auth, probeAfter: nil) }
        let probe: Bool
        switch gates.breaker() {
        case .allow: probe = false
        case .probe: probe = true
        case let .reject(retryAfter):
            return parkWhileOpen ? .park(.circuitOpen, probeAfter: retryAfter) : .refuse(.circuitOpen(retryAfter: retryAfter))
        }
        switch gates.slot() {
        case .acquired: return .send(probe: probe)
        case .queued: return .queue(probe: probe)
        case .full:
            if probe { gates.abandonProbe() }
            return .refuse(.overloaded)
        }
    }
}
