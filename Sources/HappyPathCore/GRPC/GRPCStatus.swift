/// gRPC's status codes (the `grpc-status` trailer; `google.rpc.Code`), with
/// their numbers, their canonical names and the lower-case hyphenated names
/// the config's `retry.on` lists them by (docs/grpc.md).
public enum GRPCStatus: Int, Sendable, CaseIterable {
    case ok = 0
    case cancelled = 1
    case unknown = 2
    case invalidArgument = 3
    case deadlineExceeded = 4
    case notFound = 5
    case alreadyExists = 6
    case permissionDenied = 7
    case resourceExhausted = 8
    case failedPrecondition = 9
    case aborted = 10
    case outOfRange = 11
    case unimplemented = 12
    case `internal` = 13
    case unavailable = 14
    case dataLoss = 15
    case unauthenticated = 16

    /// The canonical name, as gRPC's documentation and `grpc.StatusCode` spell it: `UNAVAILABLE`.
    public var name: String {
        switch self {
        case .ok: "OK"
        case .cancelled: "CANCELLED"
        case .unknown: "UNKNOWN"
        case .invalidArgument: "INVALID_ARGUMENT"
        case .deadlineExceeded: "DEADLINE_EXCEEDED"
        case .notFound: "NOT_FOUND"
        case .alreadyExists: "ALREADY_EXISTS"
        case .permissionDenied: "PERMISSION_DENIED"
        case .resourceExhausted: "RESOURCE_EXHAUSTED"
        case .failedPrecondition: "FAILED_PRECONDITION"
        case .aborted: "ABORTED"
        case .outOfRange: "OUT_OF_RANGE"
        case .unimplemented: "UNIMPLEMENTED"
        case .internal: "INTERNAL"
        case .unavailable: "UNAVAILABLE"
        case .dataLoss: "DATA_LOSS"
        case .unauthenticated: "UNAUTHENTICATED"
        }
    }

    /// The name in the config (`retry.on: [unavailable, deadline-exceeded]`):
    /// the canonical name in lower case, `_` written `-` like the config's
    /// other list values.
    public var configName: String {
        String(name.lowercased().map { $0 == "_" ? "-" : $0 })
    }

    /// A status from its config name; exact spelling only (`unavailable`,
    /// `deadline-exceeded`), so a typo is a config error rather than a silent no-op.
    public init?(configName: String) {
        guard let match = Self.allCases.first(where: { $0.configName == configName }) else { return nil }
        self = match
    }

    /// The `grpc-status` field's value: the decimal number, no leading zeros.
    public var fieldValue: String { String(rawValue) }

    /// The most digits a `grpc-status` value is read with: every code has
    /// at most two, and three can never overflow.
    public static let maxFieldDigits = 3

    /// A `grpc-status` field received from a peer: `1*DIGIT`, read into a
    /// bounded value first (at most `maxFieldDigits` digits, so no number
    /// from outside can overflow), nil for anything that is not one of the
    /// 17 codes. The caller passes an unknown number on unchanged; it
    /// decides nothing on it.
    public init?(fieldValue: some StringProtocol) {
        let utf8 = fieldValue.utf8
        guard !utf8.isEmpty, utf8.count <= Self.maxFieldDigits else { return nil }
        var n = 0
        for byte in utf8 {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            n = n * 10 + Int(byte - UInt8(ascii: "0"))
        }
        guard let status = GRPCStatus(rawValue: n) else { return nil }
        self = status
    }

    // MARK: - HTTP status → gRPC status

    /// The status a gRPC client gives a response that has no `grpc-status`
    /// but a non-200 HTTP status: gRPC's own table ("HTTP to gRPC Status Code
    /// Mapping" in grpc/grpc's doc/http-grpc-status-mapping.md), for an
    /// upstream (or an intermediary in front of it) that answered a gRPC call
    /// as plain HTTP. Only for that direction: the table is neither symmetric
    /// nor one-to-one. 200 without `grpc-status` is UNKNOWN, since a real OK
    /// carries its status.
    public init(httpStatus: Int) {
        switch httpStatus {
        case 400, 431: self = .internal
        case 401: self = .unauthenticated
        case 403: self = .permissionDenied
        case 404: self = .unimplemented
        case 429, 502, 503, 504: self = .unavailable
        default: self = .unknown
        }
    }
}
