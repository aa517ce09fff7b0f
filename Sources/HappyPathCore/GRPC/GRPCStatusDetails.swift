/// The `grpc-status-details-bin` field: a `google.rpc.Status` (gRPC's rich
/// error model, `google/rpc/status.proto`) whose details say why the proxy
/// answered and what the client can do: a `google.rpc.ErrorInfo` (reason,
/// domain, metadata) and, when a wait is known, a `google.rpc.RetryInfo`.
/// grpcio's `grpc_status.rpc_status.from_call`, grpc-go's `status.FromError`
/// and grpc-java's `StatusProto` decode it. Written with `ProtoWriter`.
public struct GRPCStatusDetails: Sendable, Equatable {
    /// `google.rpc.ErrorInfo` (`google/rpc/error_details.proto`).
    public struct ErrorInfo: Sendable, Equatable {
        /// UPPER_SNAKE_CASE, unique within `domain`: the problem code.
        public var reason: String
        /// Who produced the error: `happypath`.
        public var domain: String
        /// A protobuf map; written in this order.
        public var metadata: [(key: String, value: String)]

        public init(reason: String, domain: String = "happypath", metadata: [(key: String, value: String)] = []) {
            self.reason = reason
            self.domain = domain
            self.metadata = metadata
        }

        public static func == (lhs: ErrorInfo, rhs: ErrorInfo) -> Bool {
            lhs.reason == rhs.reason && lhs.domain == rhs.domain
                && lhs.metadata.map(\.key) == rhs.metadata.map(\.key)
                && lhs.metadata.map(\.value) == rhs.metadata.map(\.value)
        }
    }

    public static let errorInfoTypeURL = "type.googleapis.com/google.rpc.ErrorInfo"
    public static let retryInfoTypeURL = "type.googleapis.com/google.rpc.RetryInfo"

    public var code: GRPCStatus
    /// The same text as `grpc-message`, unencoded.
    public var message: String
    public var errorInfo: ErrorInfo?
    /// `RetryInfo.retry_delay`: how long the client should wait before trying again.
    public var retryDelay: Duration?

    public init(code: GRPCStatus, message: String, errorInfo: ErrorInfo? = nil, retryDelay: Duration? = nil) {
        self.code = code
        self.message = message
        self.errorInfo = errorInfo
        self.retryDelay = retryDelay
    }

    // MARK: - Wire format

    /// The serialized `google.rpc.Status`. Fields at their default value are
    /// left out, as proto3 writes them.
    public var encoded: [UInt8] {
        var status = ProtoWriter()
        if code != .ok { status.varint(1, UInt64(code.rawValue)) }  // int32 code
        if !message.isEmpty { status.string(2, message) }  // string message
        if let errorInfo {
            status.message(3) { any in  // repeated google.protobuf.Any details
                any.string(1, Self.errorInfoTypeURL)
                any.message(2) { Self.write(errorInfo, into: &$0) }
            }
        }
        if let retryDelay {
            status.message(3) { any in
                any.string(1, Self.retryInfoTypeURL)
                any.message(2) { retry in  // RetryInfo
                    retry.message(1) { Self.write(retryDelay, into: &$0) }  // google.protobuf.Duration retry_delay
                }
            }
        }
        return status.bytes
    }

    /// The field's value: the serialized status in base64 without padding,
    /// which gRPC's HTTP/2 protocol says implementations should emit (and
    /// must accept padded or not) for `-bin` fields.
    public var fieldValue: String { Base64.unpadded(encoded) }

    static func write(_ info: ErrorInfo, into w: inout ProtoWriter) {
        if !info.reason.isEmpty { w.string(1, info.reason) }
        if !info.domain.isEmpty { w.string(2, info.domain) }
        for (key, value) in info.metadata {
            w.message(3) { entry in  // map<string, string>: repeated entries of key = 1, value = 2
                entry.string(1, key)
                entry.string(2, value)
            }
        }
    }

    /// `google.protobuf.Duration`: int64 seconds, int32 nanos of the same
    /// sign. A negative delay is written as none: a wait is never in the past.
    static func write(_ delay: Duration, into w: inout ProtoWriter) {
        let (seconds, attoseconds) = delay.components
        guard seconds > 0 || (seconds == 0 && attoseconds > 0) else { return }
        let nanos = attoseconds / 1_000_000_000
        w.varint(1, UInt64(seconds))
        if nanos > 0 { w.varint(2, UInt64(nanos)) }
    }
}

/// Base64 (RFC 4648 section 4, the standard alphabet), for `-bin` fields.
enum Base64 {
    static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// Without `=` padding.
    static func unpadded(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var i = 0
        while i < bytes.count {
            let remaining = bytes.count - i
            let b0 = UInt32(bytes[i])
            let b1 = remaining > 1 ? UInt32(bytes[i + 1]) : 0
            let b2 = remaining > 2 ? UInt32(bytes[i + 2]) : 0
            let group = b0 << 16 | b1 << 8 | b2
            let characters = min(remaining, 3) + 1  // 1 byte: 2 characters, 2: 3, 3: 4
            for k in 0..<characters { out.append(alphabet[Int(group >> UInt32(18 - 6 * k) & 0x3F)]) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}
