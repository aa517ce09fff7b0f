import HappyPathCore

/// What the exchange holds besides its state, as books the machine keeps:
/// the upstream's slot (and its place in the queue), its place in the
/// parking lot, the adaptive limit's sample of the try, and whether it
/// ended in a tunnel. The driver takes and gives back the real things;
/// each event here says what it did or asks what to do (table rows in
/// ExchangeStateMachineTests+Holdings).
extension ExchangeStateMachine {
    // MARK: - The slot

    /// The slot (or the place in the queue) is given back, after a try or
    /// when everything is let go: what that takes.
    public mutating func releaseSlot() -> SlotRelease {
        defer { slot = .none }
        switch slot {
        case .none: return .none
        case .queued: return .leaveQueue
        case .held: return .release
        case .streams: return .endStream
        }
    }

    /// The answer streams on: its slot moved among the upstream's streams.
    public mutating func slotMovedToStreams() {
        guard slot == .held else { return }
        slot = .streams
    }

    /// A hedge won: the slot of the try it beat goes with that try to the
    /// losers (the driver frees it there). Whether there was one.
    public mutating func handOffSlot() -> Bool {
        guard slot == .held else { return false }
        slot = .none
        return true
    }

    /// A hedge goes on as the exchange's try, with the slot it took.
    public mutating func adoptSlot() { slot = .held }

    /// The upstream switched protocols: the tunnel keeps the slot (as it
    /// was held), the exchange no longer does. A place in the queue (never
    /// so: a try is out) stays booked, for `releaseSlot` to leave.
    public mutating func keepSlotForTunnel() -> Slot {
        guard slot != .queued else { return .none }
        defer { slot = .none }
        return slot
    }

    // MARK: - The parking lot

    /// The worker took the request into its lot (after `.park`).
    public mutating func parkAccepted() {
        guard case let .parked(reason, _) = state else { return }
        lot = reason
    }

    /// Everything is let go: whether the request was in the lot (the
    /// driver takes it out).
    public mutating func leaveLot() -> Bool {
        defer { lot = nil }
        return lot != nil
    }

    // MARK: - The adaptive limit's sample

    /// A try went with `inFlight` tries in flight on an adaptive upstream.
    public mutating func sampleSent(at now: Instant, inFlight: Int) { sample = .sent(at: now, inFlight: inFlight) }

    /// The head came (inside libcurl's callback): read now, given later.
    public mutating func sampleMeasured(at now: Instant) {
        guard case let .sent(at, inFlight) = sample else { return }
        sample = .measured(from: at, to: now, inFlight: inFlight)
    }

    /// The try's latency so far, to give the limit now (it ran out of time).
    public mutating func takeSample(at now: Instant) -> (from: Instant, to: Instant, inFlight: Int)? {
        guard case let .sent(at, inFlight) = sample else { return nil }
        sample = .none
        return (at, now, inFlight)
    }

    /// The sample `sampleMeasured` read, to give the limit now (outside libcurl's callbacks).
    public mutating func takeMeasured() -> (from: Instant, to: Instant, inFlight: Int)? {
        guard case let .measured(from, to, inFlight) = sample else { return nil }
        sample = .none
        return (from, to, inFlight)
    }

    /// A try that ended without a sample (a reset, an error status) takes none.
    public mutating func dropSample() {
        if case .sent = sample { sample = .none }
    }

    // MARK: - The tunnel

    /// The upstream's `101` went to the client: the response is the tunnel.
    public mutating func switchedProtocols() -> Action {
        guard state == .trying else { return .none }
        switched = true
        return streamingStarted(status: 101)
    }
}
