import Testing

@testable import HappyPathCore

/// One HTTP/2 connection's life as tables of events and the actions each
/// must produce, on an injected clock (milliseconds from 0): dispatch after
/// the read and its per-turn share, back-pressure, idle, drain, and every
/// defence at its edge (one below, at, and one past its number).
@Suite struct HTTP2ConnectionStateMachineTests {
    typealias M = HTTP2ConnectionStateMachine
    typealias A = M.Actions

    enum Event: Sendable {
        case start
        case open(Int32)
        case ready(Int32)
        case reset(Int32)
        case closed(Int32)
        case frame(M.InboundFrame)
        case dataSent
        case resetSent
        case turn(queue: Int = 0, pending: Int = 0)
        case output(queue: Int = 0, pending: Int = 0)
        /// `nextDispatch` until it answers something other than a stream.
        case dispatch
        case timer
        case drain
        case lost
        case failed
        /// The clock moves on (no action).
        case wait(milliseconds: Int64)
    }

    enum Outcome: Sendable, Equatable {
        case actions(A)
        case dispatched([M.Dispatch])
    }

    typealias Step = TableStep<Event, Outcome, M.State>
    typealias Scenario = TableScenario<Event, Outcome, M.State>

    static let limits = M.Limits(idle: .seconds(60), drainTimeout: .seconds(30))

    static func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

    /// A machine fed `events`; the outcome of each (none for `.wait`).
    struct Run {
        var machine: M
        var now: Int64 = 0
        var outcomes: [Outcome] = []

        init(limits: M.Limits = HTTP2ConnectionStateMachineTests.limits) { machine = M(limits: limits) }

        @discardableResult
        mutating func feed(_ e: Event) -> Outcome? {
            let t = HTTP2ConnectionStateMachineTests.at(now)
            let outcome: Outcome
            switch e {
            case .start: outcome = .actions(machine.start(now: t))
            case let .open(id): outcome = .actions(machine.streamOpened(id, now: t))
            case let .ready(id):
                machine.streamReady(id)
                outcome = .actions(.none)
            case let .reset(id): outcome = .actions(machine.streamReset(id, now: t))
            case let .closed(id): outcome = .actions(machine.streamClosed(id, now: t))
            case let .frame(f): outcome = .actions(machine.frameReceived(f, now: t))
            case .dataSent:
                machine.dataFrameSent()
                outcome = .actions(.none)
            case .resetSent: outcome = .actions(machine.resetSent(now: t))
            case let .turn(q, p): outcome = .actions(machine.turnEnded(outboundQueue: q, outputPending: p, now: t))
            case let .output(q, p): outcome = .actions(machine.outputChanged(outboundQueue: q, outputPending: p, now: t))
            case .dispatch:
                var out: [M.Dispatch] = []
                while true {
                    let d = machine.nextDispatch()
                    out.append(d)
                    if case .stream = d { continue }
                    break
                }
                outcome = .dispatched(out)
            case .timer: outcome = .actions(machine.timerFired(now: t))
            case .drain: outcome = .actions(machine.drain(now: t))
            case .lost: outcome = .actions(machine.connectionLost())
            case .failed: outcome = .actions(machine.sessionFailed())
            case let .wait(ms):
                now += ms
                return nil
            }
            outcomes.append(outcome)
            return outcome
        }

        /// Feeds `event` `times` times; the 1-based index of the first that terminated the session, if any.
        mutating func firstTermination(of event: Event, times: Int) -> Int? {
            for i in 1...times {
                if case let .actions(a)? = feed(event), a.terminate != nil { return i }
            }
            return nil
        }
    }

    static func calm(_ flood: M.Flood) -> A {
        A(terminate: .flood(flood), reading: false, timer: .seconds(2))
    }

    static let scenarios: [Scenario] = [
        Scenario(
            name: "the idle connection: GOAWAY NO_ERROR, then the close once it is written",
            steps: [
                Step(.start, A(timer: .seconds(60)), .open),
                Step(.wait(milliseconds: 60_000)),
                Step(
                    .timer, A(terminate: .idle, reading: false, timer: .seconds(2)),
                    .closing(.idle, deadline: at(62_000))),
                Step(.output(queue: 1, pending: 0), .none),
                Step(.output(queue: 0, pending: 17), .none),
                Step(.output(queue: 0, pending: 0), A(close: .idle), .closed(.idle)),
                Step(.timer, .none),
                Step(.open(1), .none),
            ]),
        Scenario(
            name: "a stream open keeps the connection; its close starts the idle wait again",
            steps: [
                Step(.start, A(timer: .seconds(60))),
                Step(.wait(milliseconds: 10_000)),
                Step(.open(1), .none),
                Step(.wait(milliseconds: 50_000)),
                Step(.timer, .none, .open),  // 60 s: a stream is open, nothing to wait for
                Step(.wait(milliseconds: 20_000)),
                Step(.closed(1), A(timer: .seconds(60))),  // idle from 80 s
                Step(.wait(milliseconds: 59_999)),
                Step(.timer, A(timer: .milliseconds(1))),  // fired early: armed again for the rest
                Step(.wait(milliseconds: 1)),
                Step(.timer, A(terminate: .idle, reading: false, timer: .seconds(2))),
            ]),
        Scenario(
            name: "ready streams are dispatched after the read, in order; one reset in the same read never is",
            steps: [
                Step(.start),
                Step(.open(1)), Step(.open(3)), Step(.open(5)),
                Step(.ready(1)), Step(.ready(5)), Step(.ready(3)),
                Step(.reset(5), .none),
                Step(.turn(), .none),
                Step(.dispatch, dispatched: [.stream(1), .stream(3), .done]),
                Step(.ready(1)),  // a second ready report changes nothing
                Step(.ready(9)),  // nor one for a stream never opened
                Step(.dispatch, dispatched: [.done]),
            ]),
        Scenario(
            name: "drain: GOAWAY with the last stream id, streams in flight finish, new ones are refused",
            steps: [
                Step(.start),
                Step(.open(1)), Step(.open(3)),
                Step(.wait(milliseconds: 1000)),
                Step(
                    .drain, A(goaway: 3, timer: .seconds(30)),
                    .draining(deadline: at(31_000))),
                Step(.drain, .none),
                Step(.open(5), A(refuse: 5)),
                Step(.ready(3)), Step(.turn()),
                Step(.dispatch, dispatched: [.stream(3), .done]),
                Step(.closed(1), .none),
                Step(.wait(milliseconds: 500)),
                Step(.closed(3), A(reading: false, timer: .seconds(2)), .closing(.drained, deadline: at(3500))),
                Step(.output(queue: 0, pending: 0), A(close: .drained), .closed(.drained)),
            ]),
        Scenario(
            name: "drain: streams still open at the deadline are cancelled by the close",
            steps: [
                Step(.start), Step(.open(1)),
                Step(.drain, A(goaway: 1, timer: .seconds(30))),
                Step(.wait(milliseconds: 29_999)),
                Step(.timer, A(timer: .milliseconds(1))),
                Step(.wait(milliseconds: 1)),
                Step(.timer, A(close: .drainTimeout), .closed(.drainTimeout)),
            ]),
        Scenario(
            name: "drain with no stream open ends the session at once",
            steps: [
                Step(.start),
                Step(.drain, A(terminate: .drained, reading: false, timer: .seconds(2))),
                Step(.wait(milliseconds: 2000)),
                Step(.timer, A(close: .drained), .closed(.drained)),
            ]),
        Scenario(
            name: "back-pressure: reading stops above high water or a long outbound queue, resumes at low water",
            steps: [
                Step(.start),
                Step(.turn(pending: 256 * 1024), .none),
                Step(.turn(pending: 256 * 1024 + 1), A(reading: false)),
                Step(.output(pending: 300 * 1024), .none),
                Step(.output(pending: 64 * 1024 + 1), .none),
                Step(.output(pending: 64 * 1024), A(reading: true)),
                Step(.turn(queue: 1000), .none),
                Step(.turn(queue: 1001), A(reading: false)),
                Step(.output(queue: 1001, pending: 0), .none),
                Step(.output(queue: 1000, pending: 0), A(reading: true)),
                Step(.turn(queue: 10_000), A(reading: false)),
                Step(.turn(queue: 10_001), A(terminate: .flood(.outboundQueue), timer: .seconds(2))),
            ]),
        Scenario(
            name: "a terminating GOAWAY the client never reads: closed after the linger",
            steps: [
                Step(.start),
                Step(.turn(queue: 10_001), calm(.outboundQueue)),
                Step(.output(queue: 9000, pending: 100_000), .none),
                Step(.open(1), .none),
                Step(.frame(.ping), .none),
                Step(.wait(milliseconds: 2000)),
                Step(.timer, A(close: .flood(.outboundQueue)), .closed(.flood(.outboundQueue))),
            ]),
        Scenario(
            name: "the client leaves: close now, whatever was under way; nothing after",
            steps: [
                Step(.start), Step(.open(1)), Step(.ready(1)),
                Step(.lost, A(close: .clientClosed), .closed(.clientClosed)),
                Step(.dispatch, dispatched: [.done]),
                Step(.lost, .none), Step(.timer, .none), Step(.drain, .none), Step(.turn(queue: 20_000), .none),
            ]),
        Scenario(
            name: "a client that leaves while our GOAWAY is written ends it with our reason",
            steps: [
                Step(.start), Step(.frame(.data(length: 0, endStream: false))),
                Step(.drain), Step(.lost, A(close: .drained)),
            ]),
        Scenario(
            name: "a fatal session error closes at once",
            steps: [
                Step(.start), Step(.open(1)), Step(.failed, A(close: .sessionError), .closed(.sessionError)),
                Step(.failed, .none),
            ]),
    ]

    @Test(arguments: scenarios)
    func lifecycle(_ scenario: Scenario) {
        var run = Run()
        play(scenario, feed: { run.feed($0) }, state: { run.machine.state })
    }

    // MARK: - Dispatch per turn

    /// (streams ready in one read, dispatched in the first turn, in the second).
    @Test(arguments: [(1, 1, 0), (99, 99, 0), (100, 100, 0), (101, 100, 1), (250, 100, 100)])
    func dispatchesAtMostOneShareATurn(ready: Int, first: Int, second: Int) {
        var run = Run()
        run.feed(.start)
        for i in 0..<ready { run.feed(.open(Int32(2 * i + 1))) }
        for i in 0..<ready { run.feed(.ready(Int32(2 * i + 1))) }
        run.feed(.turn())
        guard case let .dispatched(one)? = run.feed(.dispatch) else { return #expect(Bool(false)) }
        #expect(one.count == first + 1)
        #expect(one.last == (ready > first ? .nextTurn : .done))
        #expect(run.machine.nextDispatch() == (ready > first ? .nextTurn : .done), "asked again: the same answer")
        run.feed(.turn())
        guard case let .dispatched(two)? = run.feed(.dispatch) else { return #expect(Bool(false)) }
        #expect(two.count == second + 1)
        #expect(two.first == (second > 0 ? .stream(Int32(2 * first + 1)) : .done), "the next turn goes on in order")
    }

    @Test func resetStreamsInTheSameReadReachNoExchange() {
        // 499 resets: fewer than the premature-reset rule needs, so the session lives.
        var run = Run()
        run.feed(.start)
        for i in 0..<500 {
            let id = Int32(2 * i + 1)
            run.feed(.open(id))
            run.feed(.ready(id))
            if id != 999 { run.feed(.reset(id)) }
        }
        run.feed(.turn())
        #expect(run.feed(.dispatch) == .dispatched([.stream(999), .done]))
        #expect(run.machine.readyCount == 0)
    }

    @Test func closedStreamsAreSkippedAcrossTurnsInOrder() {
        // 3,000 ready streams, every other one reset before its turn: the
        // 1,500 left come out 100 a turn, in order, the queue read past the closed ones.
        var run = Run()
        run.feed(.start)
        for i in 0..<3000 {
            run.feed(.open(Int32(2 * i + 1)))
            run.feed(.ready(Int32(2 * i + 1)))
        }
        run.feed(.wait(milliseconds: 1000))  // (not premature resets: the session lives)
        for i in stride(from: 0, to: 3000, by: 2) { run.feed(.reset(Int32(2 * i + 1))) }
        var got: [Int32] = []
        var turns = 0
        while true {
            run.feed(.turn())
            turns += 1
            guard case let .dispatched(d)? = run.feed(.dispatch) else { break }
            for case let .stream(id) in d { got.append(id) }
            if d.last == .done { break }
        }
        #expect(turns == 15)
        #expect(got.count == 1500)
        #expect(got == stride(from: 1, to: 3000, by: 2).map { Int32(2 * $0 + 1) })
        #expect(run.machine.readyCount == 0)
    }

    // MARK: - Premature resets (rapid reset)

    /// (streams opened and reset at once, the first reset that ends the session).
    @Test(arguments: [(499, nil), (500, 500), (501, 500)] as [(Int, Int?)])
    func rapidResetEndsTheSessionOnceEnoughStreamsClosed(streams: Int, terminatesAt: Int?) {
        var run = Run()
        run.feed(.start)
        var first: Int?
        for i in 1...streams {
            let id = Int32(2 * i - 1)
            run.feed(.open(id))
            if case let .actions(a)? = run.feed(.reset(id)), a.terminate != nil, first == nil {
                first = i
                #expect(a == A(terminate: .rapidReset, reading: false, timer: .seconds(2)))
            }
        }
        #expect(first == terminatesAt)
    }

    /// 500 streams closed, `premature` of them reset right after opening: more than half ends the session.
    @Test(arguments: [(249, false), (250, false), (251, true)])
    func rapidResetNeedsMoreThanHalf(premature: Int, terminates: Bool) {
        var run = Run()
        run.feed(.start)
        var ended = false
        for i in 1...500 {
            let id = Int32(2 * i - 1)
            run.feed(.open(id))
            let outcome = i <= premature ? run.feed(.reset(id)) : run.feed(.closed(id))
            if case let .actions(a)? = outcome, a.terminate != nil { ended = true }
        }
        #expect(ended == terminates)
        #expect(run.machine.prematureResets == premature)
    }

    /// A reset counts as premature only younger than one second.
    @Test(arguments: [(999, true), (1000, false), (1001, false)] as [(Int64, Bool)])
    func aResetIsPrematureUnderOneSecond(ageMilliseconds: Int64, terminates: Bool) {
        var run = Run()
        run.feed(.start)
        for i in 1...500 { run.feed(.open(Int32(2 * i - 1))) }
        run.feed(.wait(milliseconds: ageMilliseconds))
        var ended = false
        for i in 1...500 {
            if case let .actions(a)? = run.feed(.reset(Int32(2 * i - 1))), a.terminate != nil { ended = true }
        }
        #expect(ended == terminates)
    }

    @Test func aLateClientResetIsNotPremature() {
        var run = Run()
        run.feed(.start)
        run.feed(.open(1))
        run.feed(.wait(milliseconds: 5000))
        run.feed(.reset(1))
        #expect(run.machine.prematureResets == 0)
        #expect(run.machine.streamsClosed == 1)
    }

    // MARK: - Control-frame budgets

    /// Frames with an empty payload and no END_STREAM in a row: the 11th ends the session.
    @Test(
        arguments: [
            (M.InboundFrame.data(length: 0, endStream: false), 10, nil),
            (.data(length: 0, endStream: false), 11, 11),
            (.headers(length: 0, endStream: false), 11, 11),
            (.continuation(length: 0), 12, 11),
            (.data(length: 0, endStream: true), 50, nil),
            (.data(length: 1, endStream: false), 50, nil),
        ] as [(M.InboundFrame, Int, Int?)])
    func emptyFramesInARow(frame: M.InboundFrame, count: Int, terminatesAt: Int?) {
        var run = Run()
        run.feed(.start)
        #expect(run.firstTermination(of: .frame(frame), times: count) == terminatesAt)
        if terminatesAt != nil { #expect(run.machine.state == .closing(.flood(.emptyFrames), deadline: Self.at(2000))) }
    }

    @Test func aFrameWithAPayloadEndsTheRunOfEmptyOnes() {
        var run = Run()
        run.feed(.start)
        for _ in 0..<5 {
            #expect(run.firstTermination(of: .frame(.data(length: 0, endStream: false)), times: 10) == nil)
            run.feed(.frame(.headers(length: 20, endStream: false)))
        }
        run.feed(.frame(.ping))  // other frames leave the run as it is
        #expect(run.firstTermination(of: .frame(.data(length: 0, endStream: false)), times: 11) == 11)
    }

    /// (streams opened, PRIORITY frames sent, the one that ends the session): 100 per stream plus 100.
    @Test(arguments: [(0, 100, nil), (0, 101, 101), (1, 200, nil), (1, 201, 201), (3, 401, 401)] as [(Int, Int, Int?)])
    func priorityFramesPerStreamOpened(streams: Int, frames: Int, terminatesAt: Int?) {
        var run = Run()
        run.feed(.start)
        for i in 0..<streams { run.feed(.open(Int32(2 * i + 1))) }
        #expect(run.firstTermination(of: .frame(.priority), times: frames) == terminatesAt)
    }

    @Test func streamsClosedStillEarnTheirPriorityFrames() {
        var run = Run()
        run.feed(.start)
        run.feed(.open(1))
        run.feed(.closed(1))
        #expect(run.firstTermination(of: .frame(.priority), times: 201) == 201)
    }

    /// (streams opened, DATA frames we sent, WINDOW_UPDATEs received, the
    /// one that ends the session): 10 per DATA frame, 2 per stream, plus 100.
    @Test(
        arguments: [
            (0, 0, 100, nil), (0, 0, 101, 101), (0, 1, 110, nil), (0, 1, 111, 111), (0, 50, 601, 601),
            // httpx opens each stream's window as it opens the stream: 100 GETs at once.
            (100, 0, 300, nil), (100, 0, 301, 301),
        ] as [(Int, Int, Int, Int?)])
    func windowUpdatesPerDataFrameSent(streams: Int, sent: Int, updates: Int, terminatesAt: Int?) {
        var run = Run()
        run.feed(.start)
        for i in 0..<streams { run.feed(.open(Int32(2 * i + 1))) }
        for _ in 0..<sent { run.feed(.dataSent) }
        #expect(run.firstTermination(of: .frame(.windowUpdate), times: updates) == terminatesAt)
        if terminatesAt != nil { #expect(run.machine.state == .closing(.flood(.windowUpdate), deadline: Self.at(2000))) }
    }

    /// (frame, how many within one second, the one that ends the session).
    @Test(
        arguments: [
            (Event.frame(.settings), 100, nil), (.frame(.settings), 101, 101),
            (.frame(.ping), 100, nil), (.frame(.ping), 101, 101),
            (.resetSent, 100, nil), (.resetSent, 101, 101),
        ] as [(Event, Int, Int?)])
    func perSecondBudgets(event: Event, count: Int, terminatesAt: Int?) {
        var run = Run()
        run.feed(.start)
        #expect(run.firstTermination(of: event, times: count) == terminatesAt)
    }

    /// The budget is per second: 100 in one second and 100 in the next is within it.
    @Test(arguments: [Event.frame(.settings), .frame(.ping), .resetSent])
    func perSecondBudgetsStartAgainEachSecond(event: Event) {
        var run = Run()
        run.feed(.start)
        #expect(run.firstTermination(of: event, times: 100) == nil)
        run.feed(.wait(milliseconds: 999))
        #expect(run.firstTermination(of: event, times: 1) == 1, "still the same second")

        var later = Run()
        later.feed(.start)
        #expect(later.firstTermination(of: event, times: 100) == nil)
        later.feed(.wait(milliseconds: 1000))
        #expect(later.firstTermination(of: event, times: 100) == nil)
    }

    @Test func pingsAndSettingsHaveTheirOwnBudgets() {
        var run = Run()
        run.feed(.start)
        #expect(run.firstTermination(of: .frame(.ping), times: 100) == nil)
        #expect(run.firstTermination(of: .frame(.settings), times: 100) == nil)
        #expect(run.firstTermination(of: .resetSent, times: 100) == nil)
    }

    // MARK: - Counts from outside never trap

    @Test func budgetsSaturateInsteadOfTrapping() {
        var limits = Self.limits
        limits.priorityPerStreamOpened = .max
        limits.priorityAllowance = .max
        limits.windowUpdatesPerDataFrameSent = .max
        var run = Run(limits: limits)
        run.feed(.start)
        run.feed(.open(1))
        run.feed(.open(3))
        run.feed(.dataSent)
        run.feed(.dataSent)
        #expect(run.firstTermination(of: .frame(.priority), times: 1000) == nil)
        #expect(run.firstTermination(of: .frame(.windowUpdate), times: 1000) == nil)
    }

    @Test func countersStopAtTheirMaximum() {
        var n = Int.max - 1
        n.addSaturating(5)
        #expect(n == .max)
        n.addSaturating(1)
        #expect(n == .max)
        var window = SecondWindow()
        #expect(window.count(now: Self.at(0)) == 1)
        #expect(window.count(now: Self.at(999)) == 2)
        #expect(window.count(now: Self.at(1000)) == 1)
    }

    @Test func reasonsHaveMetricLabels() {
        #expect(M.Reason.flood(.windowUpdate).label == "flood_window_update")
        #expect(M.Reason.rapidReset.label == "rapid_reset")
        #expect(M.Reason.rapidReset.code == .enhanceYourCalm)
        #expect(M.Reason.flood(.ping).code == .enhanceYourCalm)
        #expect(M.Reason.idle.code == .noError)
        #expect(M.Reason.drained.code == .noError)
        #expect(HTTP2ErrorCode.enhanceYourCalm.rawValue == 0xb)
        #expect(HTTP2ErrorCode.allCases.map(\.rawValue) == Array(0...0xd))
    }
}

extension TableStep where Outcome == HTTP2ConnectionStateMachineTests.Outcome {
    init(_ event: Event, _ actions: HTTP2ConnectionStateMachine.Actions, _ state: State? = nil) {
        self.init(event, outcome: .actions(actions), state)
    }

    init(_ event: Event, dispatched: [HTTP2ConnectionStateMachine.Dispatch], _ state: State? = nil) {
        self.init(event, outcome: .dispatched(dispatched), state)
    }
}

/// Random sequences of events: whatever the client does, no stream is
/// dispatched twice, after its reset or close, or beyond the turn's share,
/// and nothing happens after the close.
@Suite struct HTTP2ConnectionStateMachineRandomTests {
    typealias M = HTTP2ConnectionStateMachine

    @Test(arguments: 0..<40)
    func invariantsHoldOnRandomEvents(seed: Int) {
        var g = SeededRandom(seed: UInt64(seed))
        var limits = M.Limits(idle: .seconds(5), drainTimeout: .seconds(3))
        limits.maxDispatchesPerTurn = 3
        limits.prematureResetMinimumStreams = 40
        var m = M(limits: limits)
        var now: Int64 = 0
        var t: Instant { Instant(nanoseconds: now * 1_000_000) }
        var nextID: Int32 = 1
        var open: Set<Int32> = []
        var ready: Set<Int32> = []
        var gone: Set<Int32> = []
        var dispatched: Set<Int32> = []
        var thisTurn = 0
        var closed = false
        _ = m.start(now: t)
        for _ in 0..<3000 {
            var a = M.Actions.none
            switch Int.random(in: 0..<14, using: &g) {
            case 0, 1:
                a = m.streamOpened(nextID, now: t)
                if a.refuse == nil, !closed, m.openStreams > open.count { open.insert(nextID) }
                nextID += 2
            case 2, 3:
                if let id = open.randomElement(using: &g) {
                    m.streamReady(id)
                    ready.insert(id)
                }
            case 4:
                if let id = open.randomElement(using: &g) {
                    a = m.streamReset(id, now: t)
                    open.remove(id)
                    gone.insert(id)
                }
            case 5:
                if let id = open.randomElement(using: &g) {
                    a = m.streamClosed(id, now: t)
                    open.remove(id)
                    gone.insert(id)
                }
            case 6:
                let frames: [M.InboundFrame] = [
                    .data(length: Int.random(in: 0...2, using: &g), endStream: Bool.random(using: &g)), .priority,
                    .windowUpdate, .settings, .ping, .continuation(length: 0), .other,
                ]
                a = m.frameReceived(frames.randomElement(using: &g)!, now: t)
            case 7:
                m.dataFrameSent()
                a = m.resetSent(now: t)
            case 8:
                // Now and then an outbound queue past the limit (which ends the session).
                let queue = Int.random(in: 0..<200, using: &g) == 0 ? 10_001 : Int.random(in: 0...1100, using: &g)
                a = m.turnEnded(outboundQueue: queue, outputPending: Int.random(in: 0...300_000, using: &g), now: t)
                thisTurn = 0
            case 9, 10:
                while case let .stream(id) = m.nextDispatch() {
                    #expect(open.contains(id) && ready.contains(id), "seed \(seed): \(id) dispatched, never ready or gone")
                    #expect(!gone.contains(id) && !dispatched.contains(id), "seed \(seed): \(id) dispatched again")
                    dispatched.insert(id)
                    thisTurn += 1
                }
                #expect(thisTurn <= limits.maxDispatchesPerTurn, "seed \(seed)")
            case 11:
                a = m.timerFired(now: t)
            case 12:
                now += Int64.random(in: 0...1500, using: &g)
            default:
                if Int.random(in: 0..<200, using: &g) == 0 { a = m.drain(now: t) }
            }
            if closed { #expect(a == .none, "seed \(seed): an action after the close") }
            if a.close != nil {
                closed = true
                #expect(m.isClosed)
            }
            #expect(m.readyCount >= 0 && m.readyCount <= m.openStreams)
        }
    }
}
