import HappyPathCore
import Testing

/// One HTTP/2 stream's life as tables of events and what each must
/// produce, on an injected clock (milliseconds from 0): the request, its
/// hand-over, the answer's framing, the early answer, resets and the idle wait.
@Suite struct HTTP2StreamStateMachineTests {
    typealias M = HTTP2StreamStateMachine
    typealias A = M.Actions
    typealias Head = M.ResponseHead

    enum Event: Sendable {
        case start
        case head(isHead: Bool = false, end: Bool)
        case refused(end: Bool = false)
        case hold
        case release
        case stream
        case body(Int, end: Bool = false)
        case dispatched
        case answer(Int, length: Int?)
        case bytes(Int)
        case sent(Int)
        case ended(trailers: Bool = false)
        case endSent
        case clientReset
        case malformed
        case aborted
        case closed
        case tunnel
        case timer
        /// The clock moves on (no outcome).
        case wait(milliseconds: Int64)
    }

    enum Outcome: Sendable, Equatable {
        case actions(A)
        case head(Head?, A)
        case accepted(Int, A)
        case dispatch(M.Dispatch?)
    }

    typealias Step = TableStep<Event, Outcome, M.State>
    typealias Scenario = TableScenario<Event, Outcome, M.State>

    static let idle: Duration = .seconds(30)
    static let arm = A(timer: .arm(idle))
    static let cancel = A(timer: .cancel)

    struct Run {
        var machine = M(idle: HTTP2StreamStateMachineTests.idle, now: Instant(nanoseconds: 0))
        var now: Int64 = 0

        mutating func feed(_ e: Event) -> Outcome? {
            let t = Instant(nanoseconds: now * 1_000_000)
            switch e {
            case .start: return .actions(machine.start(now: t))
            case let .head(isHead, end): return .actions(machine.headComplete(isHead: isHead, endStream: end, now: t))
            case let .refused(end): return .actions(machine.refused(endStream: end, now: t))
            case .hold: return .actions(machine.holdBody(now: t))
            case .release: return .actions(machine.releaseBody(now: t))
            case .stream: return .actions(machine.releaseBody(streaming: true, now: t))
            case let .body(n, end): return .actions(machine.bodyReceived(n, endStream: end, now: t))
            case .dispatched: return .dispatch(machine.dispatched())
            case let .answer(status, length):
                let r = machine.responseStarted(status: status, contentLength: length, now: t)
                return .head(r?.head, r?.actions ?? .none)
            case let .bytes(n):
                let r = machine.bodyBytes(n, now: t)
                return .accepted(r.accepted, r.actions)
            case let .sent(n): return .actions(machine.dataSent(n, now: t))
            case let .ended(trailers): return .actions(machine.responseEnded(trailers: trailers, now: t))
            case .endSent: return .actions(machine.endStreamSent(now: t))
            case .clientReset: return .actions(machine.clientReset(now: t))
            case .malformed: return .actions(machine.malformed(now: t))
            case .aborted: return .actions(machine.aborted(now: t))
            case .closed: return .actions(machine.closed(now: t))
            case .tunnel:
                machine.becameTunnel()
                return nil
            case .timer: return .actions(machine.timerFired(now: t))
            case let .wait(ms):
                now += ms
                return nil
            }
        }
    }

    /// A GET with END_STREAM on its HEADERS, handed to its exchange.
    static let getDispatched: [Step] = [
        Step(.start, arm, .head),
        Step(.head(end: true), A(timer: .cancel, ready: .request), .ready),
        Step(.dispatched, outcome: .dispatch(.request), .dispatched),
    ]

    static let scenarios: [Scenario] = [
        Scenario(
            name: "a streamed body: ready at its head, its bytes passed on as they come, through the answer",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true), .body),
                Step(.hold, cancel, .held),
                Step(.body(10), .none, .held),
                Step(.stream, A(pass: 10, ready: .request), .ready),
                Step(.body(20), A(pass: 20), .ready),
                Step(.dispatched, outcome: .dispatch(.request), .dispatched),
                Step(.wait(milliseconds: 60_000)),
                Step(.timer, .none, .dispatched),  // the exchange's timeouts bound a client that stops sending
                Step(.body(5), A(pass: 5)),
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.body(7, end: true), A(pass: 7, passEnd: true), .answering),
                Step(.bytes(3), outcome: .accepted(3, arm)),
                Step(.sent(3), cancel),
                Step(.ended(), A(end: .endStream), .ended),
                Step(.endSent, .none, .ended),
                Step(.closed, .none, .closed(.complete)),
            ]),
        Scenario(
            name: "a streamed body answered before its end: what still comes is dropped, RST NO_ERROR after our END_STREAM",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel),
                Step(.stream, A(ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
                Step(.answer(200, length: 0), outcome: .head(Head(endStream: true, contentLength: 0), .none), .ended),
                Step(.body(9), .none),
                Step(.endSent, A(reset: .noError), .closed(.answeredEarly)),
            ]),
        Scenario(
            name: "a tunnel (RFC 8441): our END_STREAM first leaves the client's side open, its bytes still pass, then both close",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel),
                Step(.stream, A(ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none), .answering),
                Step(.tunnel),
                Step(.body(9), A(pass: 9)),
                Step(.ended(), A(end: .endStream), .ended),
                Step(.endSent, .none, .ended),
                Step(.body(4), A(pass: 4), .ended),
                Step(.body(0, end: true), A(passEnd: true), .ended),
                Step(.closed, .none, .closed(.complete)),
            ]),
        Scenario(
            name: "becoming a tunnel needs a streamed body being answered: a plain answer still resets NO_ERROR",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel),
                Step(.stream, A(ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
                Step(.answer(200, length: 0), outcome: .head(Head(endStream: true, contentLength: 0), .none), .ended),
                Step(.tunnel),
                Step(.endSent, A(reset: .noError), .closed(.answeredEarly)),
            ]),
        Scenario(
            name: "a streamed body's client reset tells the exchange once",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel),
                Step(.stream, A(ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
                Step(.clientReset, A(cancelExchange: true), .closed(.clientReset)),
                Step(.body(9), .none),
                Step(.closed, .none),
            ]),
        Scenario(
            name: "streaming asked for a body that already ended: stored whole, as without",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel),
                Step(.body(4, end: true), .none, .held),
                Step(.stream, A(startBody: true, consume: 4, ready: .request), .ready),
                Step(.body(1), .none),
            ]),
        Scenario(
            name: "a body that is not streamed passes nothing on once dispatched",
            steps: [
                Step(.start, arm),
                Step(.refused(end: false), A(timer: .cancel, ready: .refused), .ready),
                Step(.body(5), .none),
                Step(.dispatched, outcome: .dispatch(.refused)),
                Step(.body(5), .none),
            ]),
        Scenario(
            name: "a GET: answered with a length, never more bytes than announced, closed complete",
            steps: getDispatched + [
                Step(.answer(200, length: 5), outcome: .head(Head(endStream: false, contentLength: 5), .none), .answering),
                Step(.bytes(3), outcome: .accepted(3, arm)),  // bytes wait for the client: its wait begins
                Step(.bytes(4), outcome: .accepted(2, .none)),
                Step(.bytes(1), outcome: .accepted(0, .none)),
                Step(.sent(4), .none),
                Step(.sent(1), cancel),
                Step(.ended(), A(end: .endStream), .ended),
                Step(.endSent, .none, .ended),
                Step(.closed, .none, .closed(.complete)),
                Step(.closed, .none),
                Step(.timer, .none),
            ]),
        Scenario(
            name: "a POST: its body stored and acknowledged as it comes, ready at the client's END_STREAM",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true), .body),
                Step(.body(100), A(consume: 100), .body),
                Step(.body(0), .none),
                Step(.body(50, end: true), A(timer: .cancel, consume: 50, ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
                Step(.dispatched, outcome: .dispatch(nil)),
            ]),
        Scenario(
            name: "an answer without a length: every byte goes, the trailers end it",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.bytes(1_000_000), outcome: .accepted(1_000_000, arm)),
                Step(.sent(1_000_000), cancel),
                Step(.ended(trailers: true), A(end: .trailers), .ended),
            ]),
        Scenario(
            name: "an answer that ends short of its Content-Length is reset INTERNAL_ERROR",
            steps: getDispatched + [
                Step(.answer(200, length: 10), outcome: .head(Head(endStream: false, contentLength: 10), .none)),
                Step(.bytes(9), outcome: .accepted(9, arm)),
                Step(.ended(trailers: true), A(timer: .cancel, reset: .internalError), .closed(.shortAnswer)),
                Step(.endSent, .none),
            ]),
        Scenario(
            name: "an answer the exchange breaks off is reset INTERNAL_ERROR, the exchange not told, once",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.bytes(9), outcome: .accepted(9, arm)),
                Step(.aborted, A(timer: .cancel, reset: .internalError), .closed(.aborted)),
                Step(.aborted, .none),
                Step(.clientReset, .none),
                Step(.closed, .none, .closed(.aborted)),
            ]),
        Scenario(
            name: "an answer that ends at its Content-Length ends the stream",
            steps: getDispatched + [
                Step(.answer(200, length: 10), outcome: .head(Head(endStream: false, contentLength: 10), .none)),
                Step(.bytes(10), outcome: .accepted(10, arm)),
                Step(.ended(), A(end: .endStream), .ended),
            ]),
        Scenario(
            name: "a 1xx leaves the state as it is; the final answer follows",
            steps: getDispatched + [
                Step(
                    .answer(103, length: nil),
                    outcome: .head(Head(informational: true, endStream: false, contentLength: nil), .none), .dispatched),
                Step(.answer(200, length: 2), outcome: .head(Head(endStream: false, contentLength: 2), .none), .answering),
                Step(.answer(200, length: 2), outcome: .head(nil, .none)),
                Step(.answer(100, length: nil), outcome: .head(nil, .none)),
            ]),
        Scenario(
            name: "refused while its body comes: the body is dropped, RST NO_ERROR after our END_STREAM",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.body(10), A(consume: 10)),
                Step(.refused(), A(timer: .cancel, ready: .refused), .ready),
                Step(.body(10), .none),
                Step(.dispatched, outcome: .dispatch(.refused), .dispatched),
                Step(.answer(413, length: 20), outcome: .head(Head(endStream: false, contentLength: 20), .none)),
                Step(.bytes(20), outcome: .accepted(20, arm)),
                Step(.sent(20), cancel),
                Step(.ended(), A(end: .endStream)),
                Step(.endSent, A(reset: .noError), .closed(.answeredEarly)),
                Step(.closed, .none, .closed(.answeredEarly)),
            ]),
        Scenario(
            name: "an early answer the client's END_STREAM overtook needs no reset",
            steps: [
                Step(.start, arm),
                Step(.refused(end: false), A(timer: .cancel, ready: .refused), .ready),
                Step(.body(5, end: true), .none),
                Step(.dispatched, outcome: .dispatch(.refused)),
                Step(.answer(431, length: 0), outcome: .head(Head(endStream: true, contentLength: 0), .none), .ended),
                Step(.endSent, .none, .ended),
                Step(.closed, .none, .closed(.complete)),
            ]),
        Scenario(
            name: "a held head: its body neither stored nor acknowledged until released",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel, .held),
                Step(.hold, .none),
                Step(.body(1000), .none, .held),
                Step(.body(500), .none),
                Step(.wait(milliseconds: 60_000)),
                Step(.timer, .none, .held),  // the delegate's hold has its own timer
                Step(.release, A(timer: .arm(idle), startBody: true, consume: 1500), .body),
                Step(.body(10, end: true), A(timer: .cancel, consume: 10, ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
            ]),
        Scenario(
            name: "a held head whose body ended meanwhile is ready at its release",
            steps: [
                Step(.start, arm), Step(.head(end: false)), Step(.hold, cancel),
                Step(.body(100, end: true), .none),
                Step(.release, A(startBody: true, consume: 100, ready: .request), .ready),
            ]),
        Scenario(
            name: "a hold comes before the body or not at all",
            steps: [Step(.start, arm), Step(.head(end: false)), Step(.body(1), A(consume: 1)), Step(.hold, .none, .body)]),
        Scenario(
            name: "a held head answered from the hold (a rate limit's 429): RST NO_ERROR after the answer",
            steps: [
                Step(.start, arm), Step(.head(end: false)), Step(.hold, cancel),
                Step(.body(100), .none),
                Step(.answer(429, length: 0), outcome: .head(Head(endStream: true, contentLength: 0), .none), .ended),
                Step(.endSent, A(reset: .noError), .closed(.answeredEarly)),
            ]),
        Scenario(
            name: "malformed trailers on a stored body: never ready, reset PROTOCOL_ERROR, nobody to tell",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true), .body),
                Step(.body(5), A(consume: 5), .body),
                Step(.malformed, A(timer: .cancel, reset: .protocolError), .closed(.malformed)),
                Step(.body(0, end: true), .none),
                Step(.dispatched, outcome: .dispatch(nil)),
            ]),
        Scenario(
            name: "malformed trailers on a streamed body: the exchange is told, the stream reset PROTOCOL_ERROR",
            steps: [
                Step(.start, arm),
                Step(.head(end: false), A(startBody: true)),
                Step(.hold, cancel),
                Step(.stream, A(ready: .request), .ready),
                Step(.dispatched, outcome: .dispatch(.request)),
                Step(.body(5), A(pass: 5)),
                Step(.malformed, A(reset: .protocolError, cancelExchange: true), .closed(.malformed)),
                Step(.malformed, .none),
            ]),
        Scenario(
            name: "a client reset before dispatch: the exchange never hears of the request",
            steps: [
                Step(.start, arm), Step(.head(end: true), A(timer: .cancel, ready: .request)),
                Step(.clientReset, .none, .closed(.clientReset)),
                Step(.dispatched, outcome: .dispatch(nil)),
                Step(.answer(200, length: 1), outcome: .head(nil, .none)),
            ]),
        Scenario(
            name: "a client reset while the exchange works: told once",
            steps: getDispatched + [
                Step(.clientReset, A(cancelExchange: true), .closed(.clientReset)),
                Step(.clientReset, .none), Step(.closed, .none), Step(.timer, .none),
                Step(.bytes(5), outcome: .accepted(0, .none)),
                Step(.ended(), .none),
            ]),
        Scenario(
            name: "a client reset mid-answer, bytes waiting: told, and the wait ends",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.bytes(10), outcome: .accepted(10, arm)),
                Step(.clientReset, A(timer: .cancel, cancelExchange: true), .closed(.clientReset)),
            ]),
        Scenario(
            name: "a client reset while the head is held: the delegate holding it is told",
            steps: [Step(.start, arm), Step(.head(end: false)), Step(.hold, cancel), Step(.clientReset, A(cancelExchange: true))]),
        Scenario(
            name: "a client reset after the whole answer: nothing to tell",
            steps: getDispatched + [
                Step(.answer(204, length: nil), outcome: .head(Head(endStream: true, contentLength: nil), .none), .ended),
                Step(.clientReset, .none, .closed(.clientReset)),
            ]),
        Scenario(
            name: "the session closes a stream under a working exchange: told once",
            steps: getDispatched + [Step(.closed, A(cancelExchange: true), .closed(.lost)), Step(.clientReset, .none)]),
        Scenario(
            name: "a head that never completes is reset CANCEL after the idle time",
            steps: [
                Step(.start, arm),
                Step(.wait(milliseconds: 29_999)),
                Step(.timer, A(timer: .arm(.milliseconds(1)))),
                Step(.wait(milliseconds: 1)),
                Step(.timer, A(reset: .cancel), .closed(.idle)),
                Step(.timer, .none),
            ]),
        Scenario(
            name: "a body that trickles: each byte postpones the reset",
            steps: [
                Step(.start, arm), Step(.head(end: false)),
                Step(.wait(milliseconds: 20_000)), Step(.body(1), A(consume: 1)),
                Step(.wait(milliseconds: 20_000)), Step(.timer, A(timer: .arm(.seconds(10)))),
                Step(.wait(milliseconds: 9_999)), Step(.timer, A(timer: .arm(.milliseconds(1)))),
                Step(.wait(milliseconds: 1)), Step(.timer, A(reset: .cancel), .closed(.idle)),
            ]),
        Scenario(
            name: "slow read: answer bytes the client does not take reset CANCEL, and the exchange is told",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.wait(milliseconds: 100_000)),  // the upstream is slow: no client wait meanwhile
                Step(.bytes(100), outcome: .accepted(100, arm)),
                Step(.wait(milliseconds: 15_000)), Step(.sent(50), .none),  // the window took 50: progress
                Step(.wait(milliseconds: 30_000)), Step(.timer, A(reset: .cancel, cancelExchange: true), .closed(.idle)),
            ]),
        Scenario(
            name: "a window opened a byte at a time is no progress: reset after the idle time all the same",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.bytes(65_536), outcome: .accepted(65_536, arm)),
                Step(.wait(milliseconds: 10_000)), Step(.sent(1), .none),
                Step(.wait(milliseconds: 10_000)), Step(.sent(1), .none),
                Step(.wait(milliseconds: 10_000)), Step(.sent(1), .none),
                Step(.timer, A(reset: .cancel, cancelExchange: true), .closed(.idle)),
            ]),
        Scenario(
            name: "a KiB taken (or all that waited) is progress: the wait starts again",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.bytes(65_536), outcome: .accepted(65_536, arm)),
                Step(.wait(milliseconds: 20_000)), Step(.sent(1_000), .none), Step(.sent(24), .none),
                Step(.wait(milliseconds: 20_000)), Step(.timer, A(timer: .arm(.seconds(10)))),
                Step(.wait(milliseconds: 10_000)), Step(.sent(64_512), cancel, .answering),
            ]),
        Scenario(
            name: "while the exchange works, no client wait runs",
            steps: getDispatched + [Step(.wait(milliseconds: 1_000_000)), Step(.timer, .none, .dispatched)]),
        Scenario(
            name: "an answer whose last bytes wait for the client still times out after its end",
            steps: getDispatched + [
                Step(.answer(200, length: nil), outcome: .head(Head(endStream: false, contentLength: nil), .none)),
                Step(.bytes(10), outcome: .accepted(10, arm)),
                Step(.ended(), A(end: .endStream), .ended),
                Step(.wait(milliseconds: 30_000)), Step(.timer, A(reset: .cancel), .closed(.idle)),
            ]),
    ]

    @Test(arguments: scenarios)
    func lifecycle(_ scenario: Scenario) {
        var run = Run()
        play(scenario, feed: { run.feed($0) }, state: { run.machine.state })
    }

    // MARK: - Framing

    /// (request is HEAD, status, Content-Length given, the head framed, the state after).
    @Test(
        arguments: [
            (false, 200, 10, Head(endStream: false, contentLength: 10), M.State.answering),
            (false, 200, nil, Head(endStream: false, contentLength: nil), .answering),
            (false, 200, 0, Head(endStream: true, contentLength: 0), .ended),
            (true, 200, 10, Head(endStream: true, contentLength: 10), .ended),
            (true, 200, nil, Head(endStream: true, contentLength: nil), .ended),
            (false, 204, 10, Head(endStream: true, contentLength: nil), .ended),
            (false, 304, 10, Head(endStream: true, contentLength: 10), .ended),
            (false, 404, 3, Head(endStream: false, contentLength: 3), .answering),
            (false, 100, nil, Head(informational: true, endStream: false, contentLength: nil), .dispatched),
            (true, 103, nil, Head(informational: true, endStream: false, contentLength: nil), .dispatched),
        ] as [(Bool, Int, Int?, Head, M.State)])
    func answerFraming(isHead: Bool, status: Int, length: Int?, expected: Head, state: M.State) {
        var run = Run()
        _ = run.feed(.start)
        _ = run.feed(.head(isHead: isHead, end: true))
        _ = run.feed(.dispatched)
        #expect(run.feed(.answer(status, length: length)) == .head(expected, .none))
        #expect(run.machine.state == state)
        if state == .ended {
            #expect(run.feed(.bytes(5)) == .accepted(0, .none), "no body after a head that ended the stream")
            #expect(run.feed(.ended()) == .actions(.none), "the exchange's end changes nothing")
        }
    }

    /// (announced, offered in one call, accepted): never past the length.
    @Test(arguments: [(10, 9, 9), (10, 10, 10), (10, 11, 10), (1, 1_000_000, 1)])
    func neverMoreThanAnnounced(length: Int, offered: Int, accepted: Int) {
        var run = Run()
        _ = run.feed(.start)
        _ = run.feed(.head(end: true))
        _ = run.feed(.dispatched)
        _ = run.feed(.answer(200, length: length))
        guard case let .accepted(n, _)? = run.feed(.bytes(offered)) else { return #expect(Bool(false)) }
        #expect(n == accepted)
        #expect(run.machine.framing == .length(remaining: length - accepted))
    }

    /// (body bytes sent of 10 announced, the end's outcome).
    @Test(arguments: [(9, A(reset: .internalError)), (10, A(end: .endStream))])
    func endingAtTheLengthOrShortOfIt(sent: Int, end: A) {
        var run = Run()
        _ = run.feed(.start)
        _ = run.feed(.head(end: true))
        _ = run.feed(.dispatched)
        _ = run.feed(.answer(200, length: 10))
        _ = run.feed(.bytes(sent))
        _ = run.feed(.sent(sent))
        #expect(run.feed(.ended()) == .actions(end))
    }

    /// (quiet milliseconds before the timer, reset): the idle time's edge.
    @Test(arguments: [(29_999, false), (30_000, true), (30_001, true)] as [(Int64, Bool)])
    func idleResetAtItsEdge(quiet: Int64, resets: Bool) {
        var run = Run()
        _ = run.feed(.start)
        _ = run.feed(.wait(milliseconds: quiet))
        let outcome = run.feed(.timer)
        #expect(outcome == .actions(resets ? A(reset: .cancel) : A(timer: .arm(.milliseconds(30_000 - quiet)))))
    }

    // MARK: - Counts from outside never trap

    @Test func negativeAndHugeCountsNeitherTrapNorWrap() {
        var run = Run()
        _ = run.feed(.start)
        _ = run.feed(.head(end: false))
        #expect(run.feed(.body(-5)) == .actions(.none))
        _ = run.feed(.refused())
        _ = run.feed(.dispatched)
        #expect(run.feed(.answer(200, length: -1)) == .head(Head(endStream: true, contentLength: 0), .none))

        var open = Run()
        _ = open.feed(.start)
        _ = open.feed(.head(end: true))
        _ = open.feed(.dispatched)
        _ = open.feed(.answer(200, length: nil))
        #expect(open.feed(.bytes(-3)) == .accepted(0, .none))
        _ = open.feed(.bytes(.max))
        _ = open.feed(.bytes(.max))
        #expect(open.machine.pendingOutput == .max)
        _ = open.feed(.sent(-1))
        #expect(open.machine.pendingOutput == .max)
        _ = open.feed(.sent(.max))
        _ = open.feed(.sent(.max))
        #expect(open.machine.pendingOutput == 0)

        var held = Run()
        _ = held.feed(.start)
        _ = held.feed(.head(end: false))
        _ = held.feed(.hold)
        _ = held.feed(.body(.max))
        _ = held.feed(.body(.max))
        #expect(held.machine.heldBytes == .max)
    }
}

extension TableStep where Outcome == HTTP2StreamStateMachineTests.Outcome {
    init(_ event: Event, _ actions: HTTP2StreamStateMachine.Actions, _ state: State? = nil) {
        self.init(event, outcome: .actions(actions), state)
    }
}

/// Random sequences of events on one stream: the exchange hears of a
/// cancel at most once, a streamed body's bytes are only passed on (its end once), no byte goes past an announced length, the stream
/// ends one way only, nothing happens once it is closed, and while it
/// waits on the client its timer is armed.
@Suite struct HTTP2StreamStateMachineRandomTests {
    typealias M = HTTP2StreamStateMachine

    @Test(arguments: 0..<300)
    func invariantsHoldOnRandomEvents(seed: Int) {
        var g = SeededRandom(seed: UInt64(seed))
        var now: Int64 = 0
        var t: Instant { Instant(nanoseconds: now * 1_000_000) }
        var m = M(idle: .seconds(1), now: t)
        var armed = false
        var cancels = 0, readies = 0, ends = 0, resets = 0, passEnds = 0
        var announced: Int?
        var accepted = 0
        func apply(_ a: M.Actions) {
            switch a.timer {
            case .arm?: armed = true
            case .cancel?: armed = false
            case nil: break
            }
            if a.cancelExchange { cancels += 1 }
            if a.ready != nil { readies += 1 }
            if a.end != nil { ends += 1 }
            if a.reset != nil { resets += 1 }
            if a.passEnd { passEnds += 1 }
            #expect(!(a.end != nil && a.reset != nil), "seed \(seed): an end and a reset at once")
            // Body bytes go to the exchange only for a streamed body, never also stored; its end once.
            if a.pass > 0 || a.passEnd { #expect(m.streaming && a.consume == 0, "seed \(seed): passed but not streaming") }
            #expect(passEnds <= 1, "seed \(seed): the streamed body ended twice")
        }
        apply(m.start(now: t))
        for _ in 0..<60 {
            let wasClosed = m.isClosed
            var a = M.Actions.none
            // Mostly the event that moves the stream on from where it is, else any.
            let natural: [Int]
            switch m.state {
            case .head: natural = [0, 1]
            case .body: natural = [4, 4, 2, 1]
            case .held: natural = [3, 4, 6]
            case .ready: natural = [5]
            case .dispatched: natural = [6]
            case .answering: natural = [7, 8, 9]
            case .ended: natural = [8, 10, 12]
            case .closed: natural = [15]
            }
            let pick =
                Int.random(in: 0..<3, using: &g) > 0 ? natural.randomElement(using: &g)! : Int.random(in: 0..<16, using: &g)
            switch pick {
            case 0: a = m.headComplete(isHead: Int.random(in: 0..<5, using: &g) == 0, endStream: Bool.random(using: &g), now: t)
            case 1: a = m.refused(endStream: Bool.random(using: &g), now: t)
            case 2: a = m.holdBody(now: t)
            case 3: a = m.releaseBody(streaming: Bool.random(using: &g), now: t)
            case 4: a = m.bodyReceived(Int.random(in: -1...100, using: &g), endStream: Bool.random(using: &g), now: t)
            case 5: _ = m.dispatched()
            case 6:
                let status = [100, 200, 204, 304, 404, 503].randomElement(using: &g)!
                let length = [nil, 0, 10, 1000].randomElement(using: &g)!
                if let r = m.responseStarted(status: status, contentLength: length, now: t) {
                    #expect(!wasClosed)
                    a = r.actions
                    if !r.head.informational, !r.head.endStream { announced = r.head.contentLength }
                }
            case 7:
                let r = m.bodyBytes(Int.random(in: -1...600, using: &g), now: t)
                accepted += r.accepted
                a = r.actions
                if let announced { #expect(accepted <= announced, "seed \(seed): past the announced length") }
            case 8: a = m.dataSent(Int.random(in: -1...600, using: &g), now: t)
            case 9: a = m.responseEnded(trailers: Bool.random(using: &g), now: t)
            case 10: a = m.endStreamSent(now: t)
            case 11: a = Bool.random(using: &g) ? m.clientReset(now: t) : m.malformed(now: t)
            case 12: a = m.closed(now: t)
            case 13:
                if armed {
                    armed = false
                    a = m.timerFired(now: t)
                }
            default: now += Int64.random(in: 0...700, using: &g)
            }
            if wasClosed { #expect(a == .none, "seed \(seed): an action after the close") }
            apply(a)
            let waiting: Bool
            switch m.state {
            case .head, .body: waiting = true
            case .answering, .ended: waiting = m.pendingOutput > 0
            default: waiting = false
            }
            #expect(!waiting || armed, "seed \(seed): waits on the client with no timer (\(m.state))")
            if m.isClosed { #expect(!armed, "seed \(seed): a timer left armed on a closed stream") }
        }
        #expect(cancels <= 1 && readies <= 1 && ends <= 1 && resets <= 1, "seed \(seed)")
    }
}
