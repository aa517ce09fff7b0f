import HappyPathCore

/// What a request that ends in a failure writes to its client, decided
/// from how its tries ended and the route's settings. Pure: the driver
/// (`Exchange`) gathers the inputs after `ExchangeStateMachine` answers
/// `.answer(failure)`, then writes what this says.
///
/// In order: the route's `fallback` when it names this way of failing (a
/// kept answer for serve_stale, else its fixed answer; the driver looks
/// for them); else, when the failure is the upstream's own answer, that
/// answer passed through whole (`upstream_errors: pass`) or its fields
/// kept under the problem body; else the problem alone. A gRPC call gets
/// no fallback and no problem body: the upstream's own gRPC error passed
/// through, or the problem as a gRPC status (docs/grpc.md).
public struct ExchangeAnswer: Sendable, Equatable {
    /// What is written when no fallback applies, or the fallback has
    /// nothing to answer with (no kept answer found and no fixed one).
    public enum Written: Sendable, Equatable {
        /// The problem built from the failure, with the route's own fields.
        case problem
        /// The problem as the body, with the fields clients act on kept from
        /// the upstream's answer with this status (credentials scrubbed).
        case problemKeepingUpstreamFields(status: Int)
        /// The upstream's own answer with this status, whole, as it gave it
        /// (`upstream_errors: pass` and its body held whole).
        case passThrough(status: Int)
        /// A gRPC call: the problem as a Trailers-Only answer (HTTP 200,
        /// `grpc-status`, `grpc-message`, `grpc-status-details-bin`).
        case grpcStatus
    }

    /// Tried first: the route's fallback for this reason (nil: none applies).
    public var fallback: FallbackConfiguration.Reason?
    /// Written when `fallback` is nil or has nothing to answer with.
    public var otherwise: Written

    public init(fallback: FallbackConfiguration.Reason?, otherwise: Written) {
        self.fallback = fallback
        self.otherwise = otherwise
    }

    /// What the driver knows when the machine gives up.
    public struct Inputs: Sendable, Equatable {
        /// Why the client gets no upstream answer (the machine's `.answer`).
        public var failure: ExchangeStateMachine.Failure
        /// The route's `fallback.on` (nil: the route has no `fallback`).
        public var fallbackOn: Set<FallbackConfiguration.Reason>?
        /// `upstream_errors: pass`.
        public var passesErrors: Bool
        /// The status of the last try's answer, as the relay holds it (0: none).
        public var heldStatus: Int
        /// The held answer's body is whole (it fit under the relay's hold limit).
        public var heldBodyComplete: Bool
        /// The request is a gRPC call (its `content-type`, over HTTP/2).
        public var grpc: Bool
        /// The held answer carries its own `grpc-status`: the upstream's
        /// gRPC error, whatever its HTTP status.
        public var heldCarriesGRPCStatus: Bool

        public init(
            failure: ExchangeStateMachine.Failure, fallbackOn: Set<FallbackConfiguration.Reason>?, passesErrors: Bool,
            heldStatus: Int, heldBodyComplete: Bool, grpc: Bool = false, heldCarriesGRPCStatus: Bool = false
        ) {
            self.grpc = grpc
            self.heldCarriesGRPCStatus = heldCarriesGRPCStatus
            self.failure = failure
            self.fallbackOn = fallbackOn
            self.passesErrors = passesErrors
            self.heldStatus = heldStatus
            self.heldBodyComplete = heldBodyComplete
        }
    }

    public static func decide(_ inputs: Inputs) -> ExchangeAnswer {
        if inputs.grpc { return decideGRPC(inputs) }
        var fallback: FallbackConfiguration.Reason?
        if let on = inputs.fallbackOn, let reason = inputs.failure.fallbackReason, on.contains(reason) { fallback = reason }
        // Only the answer the relay holds is the upstream's words for this
        // failure: a held answer of another status belongs to an earlier try.
        guard case let .upstreamAnswer(status) = inputs.failure, inputs.heldStatus == status else {
            return ExchangeAnswer(fallback: fallback, otherwise: .problem)
        }
        if inputs.passesErrors, inputs.heldBodyComplete {
            return ExchangeAnswer(fallback: fallback, otherwise: .passThrough(status: status))
        }
        return ExchangeAnswer(fallback: fallback, otherwise: .problemKeepingUpstreamFields(status: status))
    }

    /// A gRPC client reads a status and its details, nothing else: no
    /// fallback body, no problem body. The upstream's own gRPC error (an
    /// answer with `grpc-status`, whatever its HTTP status) passes as it
    /// came, never re-wrapped, as does any held answer with
    /// `upstream_errors: pass` (its client reads the HTTP status by gRPC's
    /// table). Anything else, an upstream HTTP error without `grpc-status`
    /// included, is the proxy's failure, answered as a gRPC status.
    private static func decideGRPC(_ inputs: Inputs) -> ExchangeAnswer {
        guard case let .upstreamAnswer(status) = inputs.failure, inputs.heldStatus == status, inputs.heldBodyComplete,
            inputs.heldCarriesGRPCStatus || inputs.passesErrors
        else { return ExchangeAnswer(fallback: nil, otherwise: .grpcStatus) }
        return ExchangeAnswer(fallback: nil, otherwise: .passThrough(status: status))
    }
}

extension ExchangeStateMachine.Failure {
    /// The way of failing a route's `fallback.on` names (nil: no fallback
    /// answers it: the client's own request, a refused token, shutdown).
    public var fallbackReason: FallbackConfiguration.Reason? {
        switch self {
        case .timeout: .timeout
        case .overloaded, .shed: .overloaded
        case .circuitOpen: .circuitOpen
        case .unreachable: .unreachable
        case .paused: .paused
        case let .parkExpired(reason, _, _):
            switch reason {
            case .unreachable: .unreachable
            case .circuitOpen: .circuitOpen
            case .paused: .paused
            case .auth: nil
            }
        case let .upstreamAnswer(status): status >= 500 ? .serverError : nil
        case .badGateway, .upstreamTLS, .unavailable: .serverError
        case .tokenRefusedAfterRefresh, .tokenRefreshFailed, .shuttingDown, .requestBodyTooLarge: nil
        }
    }
}
