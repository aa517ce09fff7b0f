import HappyPathCore
import HappyPathPolicies
import Testing

/// The books the machine keeps of what its exchange holds (its slot or its
/// place in the queue, its place in the parking lot, the adaptive limit's
/// sample, a tunnel), as a table: each row an event, the action it gives,
/// and the books after it. The driver only performs what these say.
@Suite struct ExchangeHoldingsTests {
    typealias M = ExchangeStateMachine
    static let t0 = Instant(nanoseconds: 1_000_000_000)

    enum Event: Sendable {
        case start
        case admitted(Admission.Verdict)
        case slotGranted
        case shed
        case parkAccepted
        case replay
        case tokenRefreshFailed
        case releaseSlot(M.SlotRelease)
        case leaveLot(Bool)
        case movedToStreams
        case handOff(Bool)
        case adopt
        case keepForTunnel(M.Slot)
        case switched
        case sampleSent(at: Int64, inFlight: Int)
        case measured(at: Int64)
        case takeSample(at: Int64, expect: Int64?)
        case takeMeasured(expect: Int64?)
        case dropSample
        case timer
    }

    struct Row: Sendable {
        let event: Event
        let action: M.Action
        let slot: M.Slot
        let lot: M.ParkReason?
        let sample: M.Sample
        init(_ event: Event, _ action: M.Action = .none, slot: M.Slot = .none, lot: M.ParkReason? = nil, sample: M.Sample = .none) {
            self.event = event
            self.action = action
            self.slot = slot
            self.lot = lot
            self.sample = sample
        }
    }

    struct Story: CustomTestStringConvertible, Sendable {
        let name: String
        let rows: [Row]
        var testDescription: String { name }
        init(_ name: String, _ rows: [Row]) {
            self.name = name
            self.rows = rows
        }
    }

    static func ns(_ ms: Int64) -> Instant { t0 + .milliseconds(ms) }

    static let stories: [Story] = [
        Story(
            "a slot for the try, given back as a release",
            [
                Row(.start, .admit),
                Row(.admitted(.send(probe: false)), .send(attempt: 1, limit: .seconds(3)), slot: .held),
                Row(.releaseSlot(.release)),
                Row(.releaseSlot(.none)),
            ]),
        Story(
            "a place in the queue, then a slot; a second slot goes back",
            [
                Row(.start, .admit),
                Row(.admitted(.queue(probe: false)), .waitForSlot(limit: .seconds(5)), slot: .queued),
                Row(.slotGranted, .send(attempt: 1, limit: .seconds(3)), slot: .held),
                Row(.slotGranted, .returnSlot, slot: .held),
            ]),
        Story(
            "a place in the queue left when the request gives up",
            [
                Row(.start, .admit),
                Row(.admitted(.queue(probe: false)), .waitForSlot(limit: .seconds(5)), slot: .queued),
                Row(.releaseSlot(.leaveQueue)),
            ]),
        Story(
            "shed: the queue let it go already, nothing to leave",
            [
                Row(.start, .admit),
                Row(.admitted(.queue(probe: false)), .waitForSlot(limit: .seconds(5)), slot: .queued),
                Row(.shed, .answer(.shed(.normal), abandonProbe: false)),
                Row(.releaseSlot(.none)),
            ]),
        Story(
            "an answer that streams moves its slot among the streams, ended as a stream",
            [
                Row(.start, .admit),
                Row(.admitted(.send(probe: false)), .send(attempt: 1, limit: .seconds(3)), slot: .held),
                Row(.movedToStreams, slot: .streams),
                Row(.movedToStreams, slot: .streams),
                Row(.releaseSlot(.endStream)),
            ]),
        Story(
            "a hedge wins: the beaten try's slot goes with it, the hedge's becomes the exchange's",
            [
                Row(.start, .admit),
                Row(.admitted(.send(probe: false)), .send(attempt: 1, limit: .seconds(3)), slot: .held),
                Row(.handOff(true)),
                Row(.handOff(false)),
                Row(.adopt, slot: .held),
            ]),
        Story(
            "a tunnel keeps the slot as it was held",
            [
                Row(.start, .admit),
                Row(.admitted(.send(probe: false)), .send(attempt: 1, limit: .seconds(3)), slot: .held),
                Row(.switched, .stream, slot: .held),
                Row(.keepForTunnel(.held)),
                Row(.releaseSlot(.none)),
            ]),
        Story(
            "parked: in the lot once the worker took it, out when replayed",
            [
                Row(.start, .admit),
                Row(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Row(.parkAccepted, lot: .unreachable),
                Row(.replay, .admit),
                Row(.replay),
                Row(.leaveLot(false)),
            ]),
        Story(
            "parked until it expires: taken out of the lot as it is answered",
            [
                Row(.start, .admit),
                Row(.admitted(.park(.unreachable, probeAfter: nil)), .park(.unreachable, limit: .seconds(5), probeAfter: nil)),
                Row(.parkAccepted, lot: .unreachable),
                Row(.timer, .answer(.parkExpired(.unreachable, waited: .seconds(5), byDeadline: true), abandonProbe: false), lot: .unreachable),
                Row(.leaveLot(true)),
            ]),
        Story(
            "a failed refresh reaches only a request in the lot for a token",
            [
                Row(.start, .admit),
                Row(.admitted(.park(.auth, probeAfter: nil)), .park(.auth, limit: .seconds(5), probeAfter: nil)),
                Row(.tokenRefreshFailed),
                Row(.parkAccepted, lot: .auth),
                Row(.tokenRefreshFailed, .answer(.tokenRefreshFailed(reason: "401"), abandonProbe: false), lot: .auth),
            ]),
        Story(
            "a sample read at the head, given when the try ended",
            [
                Row(.sampleSent(at: 0, inFlight: 3), sample: .sent(at: ns(0), inFlight: 3)),
                Row(.measured(at: 40), sample: .measured(from: ns(0), to: ns(40), inFlight: 3)),
                Row(.dropSample, sample: .measured(from: ns(0), to: ns(40), inFlight: 3)),
                Row(.takeSample(at: 50, expect: nil), sample: .measured(from: ns(0), to: ns(40), inFlight: 3)),
                Row(.takeMeasured(expect: 40)),
                Row(.takeMeasured(expect: nil)),
            ]),
        Story(
            "a try that runs out of time is a sample up to now; a reset is none",
            [
                Row(.sampleSent(at: 0, inFlight: 1), sample: .sent(at: ns(0), inFlight: 1)),
                Row(.takeSample(at: 3000, expect: 3000)),
                Row(.sampleSent(at: 3100, inFlight: 1), sample: .sent(at: ns(3100), inFlight: 1)),
                Row(.dropSample),
                Row(.measured(at: 3200)),
            ]),
    ]

    @Test(arguments: stories)
    func theBooksOfWhatIsHeld(_ story: Story) {
        var retry = RetryPolicy.Configuration()
        retry.jitter = false
        var machine = M(
            .init(
                deadline: Self.t0 + .seconds(5), retry: RetryPolicy(retry), parkFor: .seconds(10), parkWhileOpen: true,
                endpoints: 1, method: "GET", hasIdempotencyKey: false, refreshOn: [401]))
        for (i, row) in story.rows.enumerated() {
            var action = M.Action.none
            switch row.event {
            case .start: action = machine.start()
            case let .admitted(verdict): action = machine.admitted(verdict, at: Self.t0)
            case .slotGranted: action = machine.slotGranted(at: Self.t0)
            case .shed: action = machine.shed(.normal)
            case .parkAccepted: machine.parkAccepted()
            case .replay: action = machine.replay()
            case .tokenRefreshFailed: action = machine.tokenRefreshFailed("401")
            case let .releaseSlot(expected): #expect(machine.releaseSlot() == expected, "row \(i + 1)")
            case let .leaveLot(expected): #expect(machine.leaveLot() == expected, "row \(i + 1)")
            case .movedToStreams: machine.slotMovedToStreams()
            case let .handOff(expected): #expect(machine.handOffSlot() == expected, "row \(i + 1)")
            case .adopt: machine.adoptSlot()
            case let .keepForTunnel(expected): #expect(machine.keepSlotForTunnel() == expected, "row \(i + 1)")
            case .switched:
                action = machine.switchedProtocols()
                #expect(machine.switched && machine.streamedStatus == 101, "row \(i + 1)")
            case let .sampleSent(at, inFlight): machine.sampleSent(at: Self.ns(at), inFlight: inFlight)
            case let .measured(at): machine.sampleMeasured(at: Self.ns(at))
            case let .takeSample(at, expect): #expect(machine.takeSample(at: Self.ns(at))?.to == expect.map(Self.ns), "row \(i + 1)")
            case let .takeMeasured(expect): #expect(machine.takeMeasured()?.to == expect.map(Self.ns), "row \(i + 1)")
            case .dropSample: machine.dropSample()
            case .timer: action = machine.timerFired(at: Self.t0 + .seconds(5))
            }
            #expect(action == row.action, "row \(i + 1): action")
            #expect(machine.slot == row.slot, "row \(i + 1): slot")
            #expect(machine.lot == row.lot, "row \(i + 1): lot")
            #expect(machine.sample == row.sample, "row \(i + 1): sample")
        }
    }
}
