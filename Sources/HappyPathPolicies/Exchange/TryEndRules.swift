import HappyPathCore

/// A try's end as the driver saw it, made into what is counted and what the
/// machine hears: pure rules, tested as a table (TryEndRulesTests).
///
/// - `finished`: a transfer's end (a failure, or a whole response) as a
///   `TryEnd`: a response without its whole head is a reset; a held gRPC
///   status that `retry.on` names is a gRPC answer; a `Retry-After` read
///   from the answer goes with it.
/// - `classify`: the client's streamed body breaking off is not the
///   upstream's failure; a head that came whole before the answer broke off
///   with nothing sent to the client is an invalid response (retried, or
///   502), not a cut connection.
/// - `withoutWait`: a pacing answer (the upstream asked for a pause) is
///   waited out by the pause, not by a `Retry-After` of its own.
public enum TryEndRules {
    public enum Verdict: Sendable, Equatable {
        /// Not the upstream's failure: neither counted nor retried
        /// (`ExchangeStateMachine.requestBodyFailed`).
        case bodyBroke(tooLarge: Bool)
        /// Counted (breaker, metrics) and handed to the machine as `end`.
        /// `headWasStaged`: the answer streamed, but its head was staged,
        /// never written: the machine goes back to `trying` first.
        case counted(ExchangeStateMachine.TryEnd, headWasStaged: Bool)
    }

    /// The end of a transfer. `failure` nil: it completed. Inlined into
    /// the driver (once a try: as cheap as the code it replaced there).
    @inlinable
    public static func finished(
        failure: ExchangeStateMachine.TryFailure?, headComplete: Bool, status: Int, retryAfterSeconds: Int64?,
        heldGRPCStatus: GRPCStatus?, withToken: Bool
    ) -> ExchangeStateMachine.TryEnd {
        if let failure { return .failed(failure) }
        guard headComplete else { return .failed(.init(.reset, closedInHead)) }
        let retryAfter = retryAfterSeconds.map { Duration.seconds($0) }
        if let heldGRPCStatus { return .grpcAnswered(status: status, grpcStatus: heldGRPCStatus, retryAfter: retryAfter) }
        return .answered(status: status, retryAfter: retryAfter, withToken: withToken)
    }

    public static let closedInHead = "the connection closed inside the response head"

    /// What a try's `end` is: `bodyFailure`, why the client's streamed body
    /// broke off (nil: it did not; `RequestBodyStream.failure`); `headComplete`, the response head came
    /// whole; `bytesToClient`, what the client got of the answer;
    /// `streaming`, the machine is streaming the answer.
    @inlinable
    public static func classify(
        _ end: ExchangeStateMachine.TryEnd, bodyFailure: RequestBodyStream.Failure?, headComplete: Bool, bytesToClient: Int, streaming: Bool
    ) -> Verdict {
        guard case let .failed(failure) = end else { return .counted(end, headWasStaged: false) }
        if let bodyFailure { return .bodyBroke(tooLarge: bodyFailure == .tooLarge) }
        // The head arrived whole, then the answer broke off (a close, a bad
        // chunk) before any byte reached the client: a response that is not
        // valid HTTP. A streamed head was staged, never written (it leaves
        // with the first body bytes), so the client has nothing yet either.
        // A timeout with a held head is the try's limit, not a broken answer.
        if headComplete, bytesToClient == 0, streaming || failure.kind != .timeout {
            return .counted(
                .failed(.init(.invalidResponse, "the response broke off after its head (\(failure.message))")),
                headWasStaged: streaming)
        }
        return .counted(end, headWasStaged: false)
    }

    /// The same end without a wait of its own (a pacing answer).
    @inlinable
    public static func withoutWait(_ end: ExchangeStateMachine.TryEnd) -> ExchangeStateMachine.TryEnd {
        switch end {
        case let .answered(status, _, withToken): .answered(status: status, retryAfter: nil, withToken: withToken)
        case let .grpcAnswered(status, grpcStatus, _): .grpcAnswered(status: status, grpcStatus: grpcStatus, retryAfter: nil)
        case .failed: end
        }
    }
}

extension ExchangeStateMachine {
    /// A try's end, classified (`TryEndRules.classify`) against the
    /// machine's state: a streamed answer whose head was never written
    /// makes the try a failed one again (`streamFailedBeforeFirstByte`).
    @inlinable
    public mutating func classify(
        _ end: TryEnd, bodyFailure: RequestBodyStream.Failure?, headComplete: Bool, bytesToClient: Int
    ) -> TryEndRules.Verdict {
        let verdict = TryEndRules.classify(
            end, bodyFailure: bodyFailure, headComplete: headComplete, bytesToClient: bytesToClient, streaming: state == .streaming)
        if case .counted(_, headWasStaged: true) = verdict { streamFailedBeforeFirstByte() }
        return verdict
    }
}
