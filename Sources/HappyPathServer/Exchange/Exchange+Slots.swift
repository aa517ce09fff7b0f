import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// An exchange and its upstream's slots (docs/overload.md): the adaptive
/// limit's samples (and the kind of request they are of), answers that
/// stream moved out of the limit (issue 44), and the slot given back.
extension Exchange {
    /// The try's latency so far is a sample of the adaptive limit: taken
    /// as its head completes (an answer the upstream worked out: below 500,
    /// not 429) or as it runs out of time. Refused, shed and failed tries
    /// are never samples (docs/overload.md).
    func sampleTry() {
        guard case .sent = machine.sample, let lane, let sample = machine.takeSample(at: env.clock.now()) else { return }
        env.sampleTry(lane, from: sample.from, to: sample.to, inFlight: sample.inFlight, kind: kind)
    }

    /// What kind of request this is to the adaptive limit (its samples are
    /// compared with its kind's own baseline): the route and the path the
    /// upstream is asked for, without the query, and with every segment
    /// that holds a digit read as one wildcard: `/reports/17` and
    /// `/reports/18` are one kind (an identifier in a path is the usual
    /// REST shape, and a kind per identifier would never have a baseline).
    /// FNV-1a, read once.
    var kind: UInt64 {
        if let storedKind { return storedKind }
        var target = command.target
        let h = target.withUTF8 { Self.kind(route: route.index, target: $0) }
        storedKind = h
        return h
    }

    static func kind(route: Int, target: String) -> UInt64 {
        var target = target
        return target.withUTF8 { kind(route: route, target: $0) }
    }

    static func kind(route: Int, target: UnsafeBufferPointer<UInt8>) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325 ^ UInt64(truncatingIfNeeded: route)
        var segment = h
        var wildcard = false
        for b in target {
            if b == UInt8(ascii: "?") { break }
            if b == UInt8(ascii: "/") {
                h = wildcard ? (h ^ 0x2A) &* 0x100_0000_01b3 : segment
                h = (h ^ UInt64(b)) &* 0x100_0000_01b3
                segment = h
                wildcard = false
                continue
            }
            if b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") { wildcard = true }
            segment = (segment ^ UInt64(b)) &* 0x100_0000_01b3
        }
        return wildcard ? (h ^ 0x2A) &* 0x100_0000_01b3 : segment
    }

    /// `sampleTry` inside a libcurl callback (the response head): read now,
    /// given to the limit by `applySample` when the transfer has ended.
    func measureTry() { machine.sampleMeasured(at: env.clock.now()) }

    /// The sample `measureTry` read, given to the limit (outside libcurl's callbacks).
    func applySample() {
        guard let lane, let m = machine.takeMeasured() else { return }
        env.sampleTry(lane, from: m.from, to: m.to, inFlight: m.inFlight, kind: kind)
    }

    /// A try that ended without a sample (a reset, an error status) takes none.
    func dropSample() { machine.dropSample() }

    /// The answer streams past its head (an event stream, a gRPC call, an
    /// answer read slower than it comes past the read-ahead): on an
    /// adaptive upstream its slot leaves the limit for the upstream's
    /// streams (`max_streams`), so slow clients and long streams cannot
    /// hold the slots short requests need. On the next pass.
    func answerStreams() {
        guard guardian.adaptive != nil, machine.slot == .held, timers.stream == nil, lane != nil else { return }
        let event = env.loop.takeEvent(target: self)
        timers.stream = event
        event.arm(after: .zero)
    }

    func moveSlotToStreams() {
        guard machine.slot == .held, let lane else { return }
        if env.moveToStreams(lane, slotHolder) { machine.slotMovedToStreams() }
    }

    // MARK: - Releasing

    func releaseSlot() {
        switch machine.releaseSlot() {
        case .none:
            break
        case .release:
            if let lane { env.releaseSlot(lane, slotHolder) } else { env.releaseSlot(guardian: guardian, slotHolder) }
        case .endStream:
            if let lane { env.streamEnded(lane) }
        case .leaveQueue:
            if let lane { env.leaveQueue(self, lane: lane) }
        }
    }
}
