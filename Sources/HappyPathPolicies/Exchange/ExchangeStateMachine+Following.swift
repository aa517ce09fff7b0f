import HappyPathCore

// MARK: - Following another request's try (`coalesce:`, docs/coalescing.md)

/// A request on a coalescing route that arrived while an identical one's
/// try was out follows that try instead of sending its own: it holds
/// nothing (no slot, no place in the queue or the lot, no budget), and
/// waits up to its own deadline. The group (`CoalesceGroupStateMachine`)
/// decides what it gets; these events carry that decision to its machine.
///
/// ```
///  start ▶ admitting ─ follow ▶ following ─ shared ▶ streaming ─▶ finished
///                        ▲          │ ╲─ sharedFailure / deadline / drain ▶ answer problem
///                        ╰ promoted ╯  (the leader ended without a verdict:
///                                        this request leads a new try)
/// ```
extension ExchangeStateMachine {
    /// The worker found a group for this request's key: it follows. The
    /// one timer is its own deadline (`timerFired` answers `.timeout`).
    public mutating func follow(at now: Instant) -> Action {
        guard state == .admitting, attempt == 0 else { return .none }
        state = .following
        return .follow(limit: remaining(at: now))
    }

    /// The leader ended before its answer could serve the group (its
    /// deadline, its budget, a shed, its client left): this follower leads
    /// a new try, admitted as any request is. Past its own deadline, it is
    /// answered `.timeout` instead.
    public mutating func promoted(at now: Instant) -> Action {
        guard state == .following else { return .none }
        guard remaining(at: now) > .zero else { return fail(.timeout) }
        state = .admitting
        return .admit
    }

    /// The leader's answer is this request's too: its head goes to the
    /// client now, and its body as it comes (`sharedEnded`).
    public mutating func shared(status: Int) -> Action {
        guard state == .following else { return .none }
        state = .streaming
        streamedStatus = status
        return .stream
    }

    /// The shared answer is over for this request: whole, or cut short
    /// (the leader's try broke off, or this client fell too far behind).
    public mutating func sharedEnded(complete: Bool) -> Action {
        guard state == .streaming else { return .none }
        return finish(complete ? .completed : .truncated)
    }

    /// The leader's try ended in a failure every follower shares (the
    /// route's retries ran in full a moment ago, or a gate a new try would
    /// meet as well): this request answers it as its own.
    public mutating func sharedFailure(_ failure: Failure) -> Action {
        guard state == .following else { return .none }
        return fail(failure)
    }
}
