import HappyPathCore
import Testing

/// The life of one client connection, as a table: each scenario is a story
/// of events and the actions (and state) each one must produce. Read top to
/// bottom, this is the specification of keep-alive, pipelining,
/// 100-continue, the four client waits, the lingering close and drain; the
/// answer's framing is the table after it.
@Suite struct HTTP1ServerConnectionStateMachineTests {
    typealias M = HTTP1ServerConnectionStateMachine
    typealias A = M.Actions

    enum Event: Sendable {
        case start
        /// Bytes of the current request arrive (appended to what is buffered) and are parsed.
        case bytes(String)
        case readReady(buffered: Int)
        case bodyStarted(buffered: Int)
        case admission(Bool)
        /// The delegate holds the head before its body's storage (a rate limit), then lets it come.
        case holdBody
        case releaseBody
        case bodyRead(Int)
        /// Chunked body bytes (the pending ones) are decoded; `fits`: the budget takes them.
        case chunks(String, fits: Bool = true)
        case answered(buffered: Int = 0, outputPending: Bool = false)
        case queued
        case progressed
        case drained
        case notify(outputPending: Bool)
        case writeFailed
        case timer
        case eof
        case drain(buffered: Int = 0, outputPending: Bool = false)

    }

    enum Expect: Sendable, Equatable {
        case actions(A)
        case plan(M.ReadPlan)
    }

    struct Step: Sendable {
        let event: Event
        let expect: Expect
        let state: M.State?
        init(_ event: Event, _ actions: A = .none, _ state: M.State? = nil) {
            self.event = event
            expect = .actions(actions)
            self.state = state
        }
        init(_ event: Event, plan: M.ReadPlan, _ state: M.State? = nil) {
            self.event = event
            expect = .plan(plan)
            self.state = state
        }
    }

    struct Scenario: Sendable, CustomTestStringConvertible {
        let name: String
        let steps: [Step]
        var testDescription: String { name }
    }

    static let limits = M.Limits(request: RequestLimits(maxHeadBytes: 1024, maxBodyBytes: 1 << 20))
    static let get = "GET /p HTTP/1.1\r\nHost: a\r\n\r\n"

    static func arm(_ w: M.Wait, _ step: M.Step = .none) -> A { A(timer: .arm(w), step: step) }
    static let dispatch = A(timer: .cancel, step: .dispatch)
    static let linger = A(timer: .arm(.linger), step: .halfClose)
    /// A head whose 5-byte body has not arrived.
    static let post5 = "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
    static let close = A(step: .close)

    static let scenarios: [Scenario] = [
        Scenario(
            name: "keep-alive: a request, its answer, the idle wait, the idle timeout",
            steps: [
                Step(.start, arm(.idle), .idle),
                Step(.bytes(get), dispatch, .dispatched),
                Step(.answered(), arm(.idle), .idle),
                Step(.timer, close, .closed),
                Step(.readReady(buffered: 0), plan: .ignore),
            ]),
        Scenario(
            name: "a head trickled in must end within the timeout: 408, then the lingering close",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("GE"), arm(.head), .head),
                Step(.bytes("T /p HTTP/1.1\r\n"), .none, .head),
                Step(.timer, A(step: .refuse(.headTimeout)), .dispatched),
                Step(.answered(), linger, .lingering),
                Step(.readReady(buffered: 0), plan: .discard),
                Step(.eof, close, .closed),
            ]),
        Scenario(
            name: "a malformed head is refused and the connection closes after the answer",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("GET /p HTTP/1.1\nHost: a\r\n\r\n"), A(timer: .cancel, step: .refuse(.bareLineFeed)), .dispatched),
                Step(.answered(outputPending: true), .none, .dispatched),
                Step(.drained, linger, .lingering),
                Step(.timer, close, .closed),
            ]),
        Scenario(
            name: "pipelined: reading pauses past the read-ahead limit, the next request is parsed on the next pass",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.readReady(buffered: 100), plan: .input),
                Step(.readReady(buffered: limits.readAhead), plan: .pause),
                Step(.answered(buffered: 30), A(timer: .arm(.idle), reading: true, step: .parseNext), .idle),
                Step(.readReady(buffered: 30), plan: .parseBuffered),
                Step(.readReady(buffered: 30), plan: .input),
            ]),
        Scenario(
            name: "Expect: 100-continue: the body is invited only once the delegate admits the request",
            steps: [
                Step(.start, arm(.idle)),
                Step(
                    .bytes("PUT /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"),
                    A(timer: .arm(.head), step: .startBody), .head),
                Step(.bodyStarted(buffered: 0), A(timer: .cancel, step: .askAdmission), .admitting),
                Step(.admission(true), arm(.body, .writeContinue), .body),
                Step(.readReady(buffered: 0), plan: .body(remaining: 5)),
                Step(.bodyRead(3), arm(.body), .body),
                Step(.readReady(buffered: 0), plan: .body(remaining: 2)),
                Step(.bodyRead(2), dispatch, .dispatched),
                Step(.answered(), arm(.idle), .idle),
            ]),
        Scenario(
            name: "a head held before its body (rate limit): no storage, no client wait, read-ahead bounded; released: read",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(post5), A(timer: .arm(.head), step: .startBody), .head),
                Step(.holdBody, A(timer: .cancel), .admitting),
                Step(.admission(true), .none, .admitting),
                Step(.readReady(buffered: 50), plan: .input),
                Step(.readReady(buffered: limits.readAhead), plan: .pause),
                Step(.releaseBody, A(reading: true, step: .startBody), .head),
                Step(.bodyStarted(buffered: 2), arm(.body), .body),
                Step(.bodyRead(3), dispatch, .dispatched),
                Step(.answered(), arm(.idle), .idle),
            ]),
        Scenario(
            name: "a held head answered (429): the body is never read and the connection ends",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(post5), A(timer: .arm(.head), step: .startBody)),
                Step(.holdBody, A(timer: .cancel), .admitting),
                Step(.answered(), linger, .lingering),
                Step(.releaseBody, .none, .lingering),
            ]),
        Scenario(
            name: "a held head's client leaves: closed, the request is told",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(post5), A(timer: .arm(.head), step: .startBody)),
                Step(.holdBody, A(timer: .cancel), .admitting),
                Step(.eof, A(step: .close), .closed),
            ]),
        Scenario(
            name: "Expect: 100-continue answered from inside the admission: no invitation, the connection ends",
            steps: [
                Step(.start, arm(.idle)),
                Step(
                    .bytes("PUT /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"),
                    A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 0), A(timer: .cancel, step: .askAdmission), .admitting),
                Step(.answered(), linger, .lingering),
                Step(.admission(false), .none, .lingering),
            ]),
        Scenario(
            name: "a body bytes arrived with the head does not wait for an invitation",
            steps: [
                Step(.start, arm(.idle)),
                Step(
                    .bytes("PUT /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nab"),
                    A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 2), arm(.body), .body),
            ]),
        Scenario(
            name: "a stalled body gets 408",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabcd"), A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 4), arm(.body), .body),
                Step(.timer, A(step: .refuse(.bodyTimeout)), .dispatched),
                Step(.answered(), linger, .lingering),
            ]),
        Scenario(
            name: "a Content-Length body already buffered whole is dispatched at once",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok"), A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 2), dispatch, .dispatched),
            ]),
        Scenario(
            name: "a chunked body is decoded as it comes and dispatched at its last chunk",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 0), arm(.body), .body),
                Step(.chunks("5\r\nhello\r\n"), .none, .body),
                Step(.chunks("0\r\n\r\n"), dispatch, .dispatched),
                Step(.answered(), arm(.idle), .idle),
            ]),
        Scenario(
            name: "a chunked body that outgrows the budget is refused",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 0), arm(.body)),
                Step(.chunks("5\r\nhello\r\n", fits: false), A(timer: .cancel, step: .refuse(.bodyOverBudget)), .dispatched),
            ]),
        Scenario(
            name: "a malformed chunk is refused",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 0), arm(.body)),
                Step(.chunks("zz\r\n"), A(timer: .cancel, step: .refuse(.badChunkSize)), .dispatched),
            ]),
        Scenario(
            name: "a client that leaves mid-answer: its request is told, reading stops, the connection ends after the answer",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.eof, A(reading: false, step: .clientLost), .dispatched),
                // Lingering reads again: what the client still sends is dropped.
                Step(.answered(), A(timer: .arm(.linger), reading: true, step: .halfClose), .lingering),
            ]),
        Scenario(
            name: "a client that leaves between requests closes the connection",
            steps: [
                Step(.start, arm(.idle)),
                Step(.eof, close, .closed),
                Step(.timer, .none, .closed),
            ]),
        Scenario(
            name: "a client that leaves in the middle of a head closes the connection",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("GET /p"), arm(.head), .head),
                Step(.eof, close, .closed),
            ]),
        Scenario(
            name: "HTTP/1.0 without keep-alive ends after its answer",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("GET /p HTTP/1.0\r\n\r\n"), dispatch),
                Step(.answered(), linger, .lingering),
            ]),
        Scenario(
            name: "Connection: close ends after the answer, once its output is written",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes("GET /p HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), dispatch),
                Step(.queued, A(timer: .arm(.writeStall), writeInterest: true)),
                Step(.progressed, arm(.writeStall)),
                Step(.answered(outputPending: true), .none, .dispatched),
                Step(.drained, A(timer: .arm(.linger), writeInterest: false, step: .halfClose), .lingering),
                Step(.eof, close, .closed),
            ]),
        Scenario(
            name: "a client that stops reading its answer is closed at the write-stall timeout",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.queued, A(timer: .arm(.writeStall), writeInterest: true)),
                Step(.queued, .none),
                Step(.timer, close, .closed),
            ]),
        Scenario(
            name: "the write side drains: the watch stops and the stall timer goes",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.queued, A(timer: .arm(.writeStall), writeInterest: true)),
                Step(.drained, A(timer: .cancel, writeInterest: false), .dispatched),
            ]),
        Scenario(
            name: "a 100 Continue the kernel did not take: the stall wait, then the body wait again",
            steps: [
                Step(.start, arm(.idle)),
                Step(
                    .bytes("PUT /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"),
                    A(timer: .arm(.head), step: .startBody)),
                Step(.bodyStarted(buffered: 0), A(timer: .cancel, step: .askAdmission), .admitting),
                Step(.admission(true), arm(.body, .writeContinue), .body),
                Step(.queued, A(timer: .arm(.writeStall), writeInterest: true), .body),
                Step(.drained, A(timer: .arm(.body), writeInterest: false), .body),
                Step(.timer, A(step: .refuse(.bodyTimeout)), .dispatched),
            ]),
        Scenario(
            name: "a request that asks to hear of its output drained is told once it is written",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.notify(outputPending: false), A(step: .checkDrained)),
                Step(.drained, A(step: .notifyDrained)),
                Step(.queued, A(timer: .arm(.writeStall), writeInterest: true)),
                Step(.notify(outputPending: true), .none),
                Step(.drained, A(timer: .cancel, writeInterest: false, step: .notifyDrained)),
                Step(.drained, .none),
            ]),
        Scenario(
            name: "a failed write closes, and the open request is told by the close",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.writeFailed, close, .closed),
                Step(.answered(), .none, .closed),
            ]),
        Scenario(
            name: "drain closes an idle connection at once",
            steps: [
                Step(.start, arm(.idle)),
                Step(.drain(), close, .closed),
            ]),
        Scenario(
            name: "drain lets the request under way finish, then closes",
            steps: [
                Step(.start, arm(.idle)),
                Step(.bytes(get), dispatch),
                Step(.drain(), .none, .dispatched),
                Step(.answered(buffered: 30), linger, .lingering),
            ]),
        Scenario(
            name: "drain with a pipelined request buffered serves it, then closes",
            steps: [
                Step(.start, arm(.idle)),
                Step(.drain(buffered: 10), .none, .idle),
                Step(.bytes(get), dispatch),
                Step(.answered(), linger, .lingering),
            ]),
    ]

    @Test(arguments: scenarios)
    func connectionLife(_ scenario: Scenario) {
        var m = M(limits: Self.limits)
        var buffer: [UInt8] = []
        for (k, step) in scenario.steps.enumerated() {
            let got: Expect
            switch step.event {
            case .start: got = .actions(m.start())
            case let .bytes(text):
                buffer += Array(text.utf8)
                got = .actions(buffer.withUnsafeBytes { m.parse($0) })
            case let .readReady(buffered): got = .plan(m.readReady(buffered: buffered))
            case let .bodyStarted(buffered): got = .actions(m.bodyStarted(buffered: buffered))
            case let .admission(granted): got = .actions(m.admission(granted))
            case .holdBody: got = .actions(m.holdBody())
            case .releaseBody: got = .actions(m.releaseBody())
            case let .bodyRead(n): got = .actions(m.bodyRead(n))
            case let .chunks(text, fits):
                let bytes = Array(text.utf8)
                got = .actions(bytes.withUnsafeBytes { m.decodeChunked($0) { _ in fits }.actions })
            case let .answered(buffered, pending):
                got = .actions(m.responseEnded(buffered: buffered, outputPending: pending))
                buffer = []
            case .queued: got = .actions(m.outputQueued())
            case .progressed: got = .actions(m.outputProgressed())
            case .drained: got = .actions(m.outputDrained())
            case let .notify(pending): got = .actions(m.notifyWhenDrained(outputPending: pending))
            case .writeFailed: got = .actions(m.writeFailed())
            case .timer: got = .actions(m.timerFired())
            case .eof: got = .actions(m.readEnded())
            case let .drain(buffered, pending): got = .actions(m.drain(buffered: buffered, outputPending: pending))
            }
            #expect(got == step.expect, "step \(k + 1): \(step.event)")
            if let state = step.state { #expect(m.state == state, "state after step \(k + 1): \(step.event)") }
        }
        #expect(m.requestsAnswered <= m.requestsDispatched)
    }

    // MARK: - Framing the answer

    struct Framing: Sendable, CustomTestStringConvertible {
        let request: String
        let status: Int
        let length: Int?
        var whole = false
        let head: M.ResponseHead
        let framing: M.BodyFraming
        var testDescription: String { "\(request.prefix(16)) \(status) \(length.map(String.init) ?? "-")\(whole ? " whole" : "")" }
    }

    static let framings: [Framing] = [
        Framing(
            request: get, status: 200, length: 5,
            head: .init(contentLength: 5, chunked: false, close: false, hasBody: true), framing: .length(remaining: 5)),
        Framing(
            request: get, status: 200, length: nil,
            head: .init(contentLength: nil, chunked: true, close: false, hasBody: true), framing: .chunked),
        Framing(
            request: "GET /p HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", status: 200, length: nil,
            head: .init(contentLength: nil, chunked: false, close: true, hasBody: true), framing: .untilClose),
        Framing(
            request: "HEAD /p HTTP/1.1\r\nHost: a\r\n\r\n", status: 200, length: 5,
            head: .init(contentLength: 5, chunked: false, close: false, hasBody: false), framing: .none),
        Framing(
            request: get, status: 304, length: 5,
            head: .init(contentLength: nil, chunked: false, close: false, hasBody: false), framing: .none),
        Framing(
            request: get, status: 204, length: 0,
            head: .init(contentLength: nil, chunked: false, close: false, hasBody: false), framing: .none),
        Framing(
            request: get, status: 404, length: 3, whole: true,
            head: .init(contentLength: 3, chunked: false, close: false, hasBody: true), framing: .none),
        Framing(
            request: "GET /p HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", status: 200, length: 1,
            head: .init(contentLength: 1, chunked: false, close: true, hasBody: true), framing: .length(remaining: 1)),
    ]

    @Test(arguments: framings)
    func answerIsFramedByTheServer(_ f: Framing) {
        var m = M(limits: Self.limits)
        _ = m.start()
        let actions = Array(f.request.utf8).withUnsafeBytes { m.parse($0) }
        #expect(actions.step == .dispatch)
        #expect(m.responseStarted(status: f.status, contentLength: f.length, whole: f.whole) == f.head)
        #expect(m.framing == f.framing)
    }

    @Test func neverMoreBodyThanAnnounced() {
        var m = M(limits: Self.limits)
        _ = m.start()
        _ = Array(Self.get.utf8).withUnsafeBytes { m.parse($0) }
        _ = m.responseStarted(status: 200, contentLength: 10)
        #expect(m.bodyBytes(4) == 4)
        #expect(m.responseShort)
        #expect(m.bodyBytes(100) == 6)
        #expect(m.bodyBytes(1) == 0)
        #expect(!m.responseShort)
    }

    @Test func aRefusalBeforeAnyHeadAnnouncesTheClose() {
        var m = M(limits: Self.limits)
        #expect(m.timerFired() == .none)  // not armed: nothing to fire
        _ = Array("GET / HTTP/1.1\r\n\0".utf8).withUnsafeBytes { m.parse($0) }
        #expect(m.state == .head)
        #expect(m.timerFired().step == .refuse(.headTimeout))
        #expect(m.responseStarted(status: 408, contentLength: 10, whole: true).close)
    }
}
