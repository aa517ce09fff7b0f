/// What makes a request a gRPC call, and the status a call ended with as
/// metrics and the access log report it (docs/grpc.md).
public enum GRPCCall {
    /// A request `content-type` that makes a gRPC call: `application/grpc`
    /// alone or followed by `+` (a codec: `application/grpc+proto`) or `;`
    /// (parameters), in any case. `application/grpc-web` is not one.
    public static func isContentType(_ value: UnsafeRawBufferPointer) -> Bool {
        let type: StaticString = "application/grpc"
        let length = type.utf8CodeUnitCount
        guard value.count >= length, HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: value.prefix(length)), type) else {
            return false
        }
        if value.count == length { return true }
        let next = value[length]
        return next == UInt8(ascii: "+") || next == UInt8(ascii: ";")
    }

    /// The `grpc_status` label and access-log value: the code's number
    /// (`14`), or `unknown` when the call ended with no status a client
    /// could read (cut off, or a number that is none of the 17 codes). So
    /// the label has at most 18 values.
    public static func label(_ status: GRPCStatus?) -> String {
        guard let status else { return "unknown" }
        return labels[status.rawValue]
    }

    static let labels = GRPCStatus.allCases.map(\.fieldValue)
}

/// What a response said in its `grpc-status` field (in its head, for a
/// Trailers-Only answer, or in its trailers).
public enum GRPCStatusField: Sendable, Equatable {
    /// No `grpc-status` came.
    case absent
    case status(GRPCStatus)
    /// A value that is none of the 17 codes (or not a number): passed on
    /// unchanged, reported as `unknown`.
    case unrecognized

    /// A received value, read into a bounded number first (`GRPCStatus(fieldValue:)`).
    public init(value: UnsafeRawBufferPointer) {
        if value.count <= GRPCStatus.maxFieldDigits, let status = GRPCStatus(fieldValue: String(decoding: value, as: UTF8.self)) {
            self = .status(status)
        } else {
            self = .unrecognized
        }
    }

    /// The status the client of a complete answer reads: the field's own,
    /// else what gRPC's HTTP-to-gRPC table gives the HTTP status (a `200`
    /// without `grpc-status` is UNKNOWN). Nil for an unrecognized value.
    public func clientStatus(httpStatus: Int) -> GRPCStatus? {
        switch self {
        case .absent: GRPCStatus(httpStatus: httpStatus)
        case let .status(status): status
        case .unrecognized: nil
        }
    }
}
