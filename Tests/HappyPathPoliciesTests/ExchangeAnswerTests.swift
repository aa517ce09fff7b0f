import HappyPathCore
import HappyPathPolicies
import Testing

/// What a failed request writes, as a table: the route's fallback when it
/// names the way of failing, and otherwise the problem, the problem with
/// the upstream's fields, or the upstream's own answer passed through.
@Suite struct ExchangeAnswerTests {
    typealias Failure = ExchangeStateMachine.Failure
    typealias Reason = FallbackConfiguration.Reason

    struct Row: CustomTestStringConvertible, Sendable {
        var name: String
        var failure: Failure
        var fallbackOn: Set<Reason>? = nil
        var passesErrors = false
        var heldStatus = 0
        var heldBodyComplete = true
        var fallback: Reason?
        var otherwise: ExchangeAnswer.Written
        var testDescription: String { name }
    }

    static let all = Set(Reason.allCases)

    static let rows: [Row] = [
        Row(name: "no fallback: a timeout is the problem", failure: .timeout, fallback: nil, otherwise: .problem),
        Row(name: "fallback on timeout", failure: .timeout, fallbackOn: all, fallback: .timeout, otherwise: .problem),
        Row(
            name: "fallback not on timeout", failure: .timeout, fallbackOn: [.serverError, .unreachable], fallback: nil,
            otherwise: .problem),
        Row(
            name: "overloaded, either way", failure: .overloaded(byParking: true), fallbackOn: all, fallback: .overloaded,
            otherwise: .problem),
        Row(
            name: "circuit open", failure: .circuitOpen(retryAfter: .seconds(3)), fallbackOn: all, fallback: .circuitOpen,
            otherwise: .problem),
        Row(name: "unreachable", failure: .unreachable, fallbackOn: all, fallback: .unreachable, otherwise: .problem),
        Row(name: "paused", failure: .paused, fallbackOn: all, fallback: .paused, otherwise: .problem),
        Row(
            name: "parked until unreachable expired", failure: .parkExpired(.unreachable, waited: .seconds(1), byDeadline: false),
            fallbackOn: all, fallback: .unreachable, otherwise: .problem),
        Row(
            name: "parked for a pause", failure: .parkExpired(.paused, waited: .seconds(1), byDeadline: true), fallbackOn: all,
            fallback: .paused, otherwise: .problem),
        Row(
            name: "parked with the breaker open", failure: .parkExpired(.circuitOpen, waited: .seconds(1), byDeadline: false),
            fallbackOn: all, fallback: .circuitOpen, otherwise: .problem),
        Row(
            name: "parked for a token: no fallback answers it",
            failure: .parkExpired(.auth, waited: .seconds(1), byDeadline: false), fallbackOn: all, fallback: nil,
            otherwise: .problem),
        Row(
            name: "a broken answer is a 5xx", failure: .badGateway(message: "m"), fallbackOn: all, fallback: .serverError,
            otherwise: .problem),
        Row(
            name: "TLS is a 5xx", failure: .upstreamTLS(message: "m"), fallbackOn: all, fallback: .serverError,
            otherwise: .problem),
        Row(name: "resets are a 5xx", failure: .unavailable, fallbackOn: all, fallback: .serverError, otherwise: .problem),
        Row(
            name: "a refused token: never a fallback", failure: .tokenRefusedAfterRefresh(status: 401), fallbackOn: all,
            fallback: nil, otherwise: .problem),
        Row(
            name: "a failed refresh: never a fallback", failure: .tokenRefreshFailed(reason: "r"), fallbackOn: all,
            fallback: nil, otherwise: .problem),
        Row(name: "shutting down: never a fallback", failure: .shuttingDown, fallbackOn: all, fallback: nil, otherwise: .problem),
        Row(
            name: "the upstream's 503, held: its fields kept under the problem", failure: .upstreamAnswer(status: 503),
            heldStatus: 503, fallback: nil, otherwise: .problemKeepingUpstreamFields(status: 503)),
        Row(
            name: "the upstream's 503 with a 5xx fallback: the fallback first", failure: .upstreamAnswer(status: 503),
            fallbackOn: [.serverError], heldStatus: 503, fallback: .serverError,
            otherwise: .problemKeepingUpstreamFields(status: 503)),
        Row(
            name: "the upstream's 404: a client error, never a fallback", failure: .upstreamAnswer(status: 404),
            fallbackOn: all, heldStatus: 404, fallback: nil, otherwise: .problemKeepingUpstreamFields(status: 404)),
        Row(
            name: "upstream_errors: pass, the body whole: passed through", failure: .upstreamAnswer(status: 404),
            passesErrors: true, heldStatus: 404, fallback: nil, otherwise: .passThrough(status: 404)),
        Row(
            name: "upstream_errors: pass, a 5xx with a fallback: the fallback first, then passed through",
            failure: .upstreamAnswer(status: 500), fallbackOn: all, passesErrors: true, heldStatus: 500, fallback: .serverError,
            otherwise: .passThrough(status: 500)),
        Row(
            name: "upstream_errors: pass, the body too long to hold: the problem with its fields",
            failure: .upstreamAnswer(status: 502), passesErrors: true, heldStatus: 502, heldBodyComplete: false, fallback: nil,
            otherwise: .problemKeepingUpstreamFields(status: 502)),
        Row(
            name: "the relay holds another status: the problem alone", failure: .upstreamAnswer(status: 503),
            passesErrors: true, heldStatus: 0, fallback: nil, otherwise: .problem),
    ]

    @Test(arguments: rows)
    func decidesWhatAFailedRequestWrites(_ row: Row) {
        let answer = ExchangeAnswer.decide(
            .init(
                failure: row.failure, fallbackOn: row.fallbackOn, passesErrors: row.passesErrors, heldStatus: row.heldStatus,
                heldBodyComplete: row.heldBodyComplete))
        #expect(answer == ExchangeAnswer(fallback: row.fallback, otherwise: row.otherwise))
    }

    struct GRPCRow: CustomTestStringConvertible, Sendable {
        var name: String
        var failure: Failure
        var passesErrors = false
        var heldStatus = 0
        var heldBodyComplete = true
        var carriesGRPCStatus = false
        var otherwise: ExchangeAnswer.Written
        var testDescription: String { name }
    }

    static let grpcRows: [GRPCRow] = [
        GRPCRow(name: "a timeout is a gRPC status", failure: .timeout, otherwise: .grpcStatus),
        GRPCRow(name: "unreachable is a gRPC status", failure: .unreachable, otherwise: .grpcStatus),
        GRPCRow(
            name: "the upstream's 503 with grpc-status passes as it came", failure: .upstreamAnswer(status: 503),
            heldStatus: 503, carriesGRPCStatus: true, otherwise: .passThrough(status: 503)),
        GRPCRow(
            name: "the upstream's 503 without grpc-status is the proxy's status", failure: .upstreamAnswer(status: 503),
            heldStatus: 503, otherwise: .grpcStatus),
        GRPCRow(
            name: "upstream_errors: pass, no grpc-status: passed, read by gRPC's table",
            failure: .upstreamAnswer(status: 502), passesErrors: true, heldStatus: 502, otherwise: .passThrough(status: 502)),
        GRPCRow(
            name: "with grpc-status but too long to hold: the proxy's status", failure: .upstreamAnswer(status: 500),
            heldStatus: 500, heldBodyComplete: false, carriesGRPCStatus: true, otherwise: .grpcStatus),
        GRPCRow(
            name: "a held answer of an earlier try is not this failure's", failure: .upstreamAnswer(status: 503),
            heldStatus: 0, carriesGRPCStatus: true, otherwise: .grpcStatus),
    ]

    /// A gRPC call never gets a fallback or a problem body, whatever the route's `fallback.on`.
    @Test(arguments: grpcRows)
    func decidesWhatAFailedGRPCCallWrites(_ row: GRPCRow) {
        let answer = ExchangeAnswer.decide(
            .init(
                failure: row.failure, fallbackOn: Self.all, passesErrors: row.passesErrors, heldStatus: row.heldStatus,
                heldBodyComplete: row.heldBodyComplete, grpc: true, heldCarriesGRPCStatus: row.carriesGRPCStatus))
        #expect(answer == ExchangeAnswer(fallback: nil, otherwise: row.otherwise))
    }

    /// Every reason `fallback.on` names is reachable from some failure.
    @Test func everyFallbackReasonHasAFailure() {
        let failures: [Failure] = [
            .timeout, .overloaded(byParking: false), .circuitOpen(retryAfter: .zero), .unreachable, .paused,
            .upstreamAnswer(status: 500),
        ]
        #expect(Set(failures.compactMap(\.fallbackReason)) == Set(Reason.allCases))
    }
}
