import HappyPathCore
import HappyPathPolicies
import Testing

/// What a try's end is before it is counted (`TryEndRules`), as tables.
@Suite struct TryEndRulesTests {
    typealias End = ExchangeStateMachine.TryEnd
    static let reset = End.failed(.init(.reset, "connection reset"))
    static let timeout = End.failed(.init(.timeout, "timeout"))
    static func brokeOff(_ message: String) -> End {
        .failed(.init(.invalidResponse, "the response broke off after its head (\(message))"))
    }

    struct ClassifyRow: CustomTestStringConvertible, Sendable {
        let name: String
        let end: End
        let bodyFailure: RequestBodyStream.Failure?
        let headComplete: Bool
        let bytesToClient: Int
        let streaming: Bool
        let verdict: TryEndRules.Verdict
        var testDescription: String { name }
    }

    static let classifyRows: [ClassifyRow] = [
        .init(
            name: "an answer is counted as it is", end: .answered(status: 503, retryAfter: nil, withToken: false),
            bodyFailure: .clientGone, headComplete: true, bytesToClient: 0, streaming: false,
            verdict: .counted(.answered(status: 503, retryAfter: nil, withToken: false), headWasStaged: false)),
        .init(
            name: "a failure while the client's body broke off: the body's, too large", end: reset, bodyFailure: .tooLarge,
            headComplete: false, bytesToClient: 0, streaming: false, verdict: .bodyBroke(tooLarge: true)),
        .init(
            name: "a failure while the client left mid-body", end: reset, bodyFailure: .clientGone, headComplete: true,
            bytesToClient: 10, streaming: true, verdict: .bodyBroke(tooLarge: false)),
        .init(
            name: "a reset before the head: counted as a reset", end: reset, bodyFailure: nil, headComplete: false,
            bytesToClient: 0, streaming: false, verdict: .counted(reset, headWasStaged: false)),
        .init(
            name: "a held head, then a reset: an invalid response", end: reset, bodyFailure: nil, headComplete: true,
            bytesToClient: 0, streaming: false, verdict: .counted(brokeOff("connection reset"), headWasStaged: false)),
        .init(
            name: "a streamed head never written, then a reset: invalid, and the head was staged", end: reset,
            bodyFailure: nil, headComplete: true, bytesToClient: 0, streaming: true,
            verdict: .counted(brokeOff("connection reset"), headWasStaged: true)),
        .init(
            name: "bytes already with the client: the reset stands (the connection is cut)", end: reset, bodyFailure: nil,
            headComplete: true, bytesToClient: 1, streaming: true, verdict: .counted(reset, headWasStaged: false)),
        .init(
            name: "a held head and the try's limit: a timeout, not a broken answer", end: timeout, bodyFailure: nil,
            headComplete: true, bytesToClient: 0, streaming: false, verdict: .counted(timeout, headWasStaged: false)),
        .init(
            name: "a streamed head never written and a stall: invalid", end: timeout, bodyFailure: nil, headComplete: true,
            bytesToClient: 0, streaming: true, verdict: .counted(brokeOff("timeout"), headWasStaged: true)),
    ]

    @Test(arguments: classifyRows)
    func classify(_ row: ClassifyRow) {
        let verdict = TryEndRules.classify(
            row.end, bodyFailure: row.bodyFailure, headComplete: row.headComplete, bytesToClient: row.bytesToClient,
            streaming: row.streaming)
        #expect(verdict == row.verdict)
    }

    struct FinishedRow: CustomTestStringConvertible, Sendable {
        let name: String
        let failure: ExchangeStateMachine.TryFailure?
        let headComplete: Bool
        let retryAfter: Int64?
        let grpc: GRPCStatus?
        let end: End
        var testDescription: String { name }
    }

    static let finishedRows: [FinishedRow] = [
        .init(
            name: "a failure is the try's end", failure: .init(.unreachable, "refused"), headComplete: false, retryAfter: nil,
            grpc: nil, end: .failed(.init(.unreachable, "refused"))),
        .init(
            name: "closed inside the head: a reset", failure: nil, headComplete: false, retryAfter: nil, grpc: nil,
            end: .failed(.init(.reset, TryEndRules.closedInHead))),
        .init(
            name: "a whole answer with its Retry-After", failure: nil, headComplete: true, retryAfter: 3, grpc: nil,
            end: .answered(status: 503, retryAfter: .seconds(3), withToken: true)),
        .init(
            name: "a held gRPC status: a gRPC answer", failure: nil, headComplete: true, retryAfter: nil, grpc: .unavailable,
            end: .grpcAnswered(status: 503, grpcStatus: .unavailable, retryAfter: nil)),
    ]

    @Test(arguments: finishedRows)
    func finished(_ row: FinishedRow) {
        let end = TryEndRules.finished(
            failure: row.failure, headComplete: row.headComplete, status: 503, retryAfterSeconds: row.retryAfter,
            heldGRPCStatus: row.grpc, withToken: true)
        #expect(end == row.end)
    }

    @Test func aPacingAnswerHasNoWaitOfItsOwn() {
        #expect(
            TryEndRules.withoutWait(.answered(status: 429, retryAfter: .seconds(2), withToken: true))
                == .answered(status: 429, retryAfter: nil, withToken: true))
        #expect(
            TryEndRules.withoutWait(.grpcAnswered(status: 200, grpcStatus: .resourceExhausted, retryAfter: .seconds(1)))
                == .grpcAnswered(status: 200, grpcStatus: .resourceExhausted, retryAfter: nil))
        #expect(TryEndRules.withoutWait(Self.reset) == Self.reset)
    }

    @Test func theMachineGoesBackToTryingWhenAStreamedHeadWasNeverWritten() {
        var machine = ExchangeStateMachine(
            .init(
                deadline: Instant(nanoseconds: 10_000_000_000), retry: RetryPolicy(.init()), parkFor: .zero,
                parkWhileOpen: false, endpoints: 1, method: "GET", hasIdempotencyKey: false, refreshOn: []))
        _ = machine.start()
        _ = machine.admitted(.send(probe: false), at: Instant(nanoseconds: 0))
        _ = machine.streamingStarted(status: 200)
        let verdict = machine.classify(Self.reset, bodyFailure: nil, headComplete: true, bytesToClient: 0)
        #expect(verdict == .counted(Self.brokeOff("connection reset"), headWasStaged: true))
        #expect(machine.state == .trying && machine.streamedStatus == 0)
    }
}
