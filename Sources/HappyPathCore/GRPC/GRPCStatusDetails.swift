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
public enum Base64 {
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

    /// With `=` padding to a multiple of four characters.
    public static func padded(_ bytes: some Collection<UInt8>) -> [UInt8] {
        var out = Array(unpadded(Array(bytes)).utf8)
        while out.count % 4 != 0 { out.append(UInt8(ascii: "=")) }
        return out
    }
}

// MARK: - Reading an upstream's

extension GRPCStatusDetails {
    /// The longest `grpc-status-details-bin` value read; a longer one gives
    /// no signal (base64 of 8 KiB is 6 KiB of status, far more than a
    /// `RetryInfo` needs).
    public static let maxFieldBytes = 8 * 1024

    /// The wait an upstream's `grpc-status-details-bin` asks for: the
    /// `retry_delay` of the first `google.rpc.RetryInfo` among the
    /// `google.rpc.Status`'s details, at most `max`. Nil when the value is
    /// longer than `maxFieldBytes`, is not base64 (padded or not), is not a
    /// `google.rpc.Status`, or carries no `RetryInfo` with a delay above
    /// zero. Every number is bounded before use (a `Duration`'s seconds
    /// past `max` are `max`), so any value ends in a delay or nil.
    public static func retryDelay(fieldValue: UnsafeRawBufferPointer, max: Duration) -> Duration? {
        guard fieldValue.count <= maxFieldBytes, let status = Base64.decode(fieldValue) else { return nil }
        var reader = ProtoReader(status)
        do {
            while let (field, value) = try reader.next() {
                guard field == 3, case let .bytes(any) = value else { continue }  // repeated google.protobuf.Any details
                if let delay = try retryInfoDelay(any: any, max: max) { return delay }
            }
        } catch {
            return nil
        }
        return nil
    }

    /// A `google.protobuf.Any`: the delay of the `RetryInfo` it packs, nil for another type.
    private static func retryInfoDelay(any: ArraySlice<UInt8>, max: Duration) throws(ProtoReadError) -> Duration? {
        var reader = ProtoReader(any)
        var isRetryInfo = false
        var packed: ArraySlice<UInt8>?
        while let (field, value) = try reader.next() {
            guard case let .bytes(bytes) = value else { continue }
            // string type_url = 1: `type.googleapis.com/google.rpc.RetryInfo`, any host before the last `/`.
            if field == 1 { isRetryInfo = bytes.suffix(retryInfoName.count).elementsEqual(retryInfoName) }
            if field == 2 { packed = bytes }  // bytes value = 2
        }
        guard isRetryInfo, let packed else { return nil }
        var retryInfo = ProtoReader(packed)
        var delay: Duration?
        while let (field, value) = try retryInfo.next() {
            // google.protobuf.Duration retry_delay = 1 (the last one wins, as protobuf merges).
            if field == 1, case let .bytes(duration) = value { delay = try self.duration(duration, max: max) }
        }
        guard let delay, delay > .zero else { return nil }
        return delay
    }

    /// `/google.rpc.RetryInfo`: the end of a `RetryInfo`'s type URL.
    private static let retryInfoName = Array("/google.rpc.RetryInfo".utf8)

    /// A `google.protobuf.Duration` (int64 seconds = 1, int32 nanos = 2),
    /// at most `max`; nil when it is negative or its nanos are out of range.
    private static func duration(_ bytes: ArraySlice<UInt8>, max: Duration) throws(ProtoReadError) -> Duration? {
        var reader = ProtoReader(bytes)
        var seconds: Int64 = 0
        var nanos: Int64 = 0
        while let (field, value) = try reader.next() {
            guard case let .varint(raw) = value else { continue }
            if field == 1 { seconds = Int64(bitPattern: raw) }
            // int32: a negative one is written sign-extended to 64 bits.
            if field == 2 { nanos = Int64(Int32(truncatingIfNeeded: raw)) }
        }
        guard seconds >= 0, (0..<1_000_000_000).contains(nanos) else { return nil }
        // Compared in whole seconds first, so that no seconds reach Duration's arithmetic past `max`.
        let (maxSeconds, _) = max.components
        if seconds >= maxSeconds { return max }
        return Swift.min(.seconds(seconds) + .nanoseconds(nanos), max)
    }
}

extension Base64 {
    /// The bytes of a base64 text, padded (`=`, a multiple of 4 characters)
    /// or not; nil for any other character, a `=` before the end, or a
    /// length no encoding has (one character past a group of four). The
    /// output is at most three quarters of the input, which the caller bounds.
    static func decode(_ text: UnsafeRawBufferPointer) -> [UInt8]? {
        var end = text.count
        var padding = 0
        while end > 0, padding < 2, text[end - 1] == UInt8(ascii: "=") {
            end -= 1
            padding += 1
        }
        if padding > 0, text.count % 4 != 0 { return nil }
        guard end % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(end / 4 * 3 + 2)
        var group: UInt32 = 0
        var count = 0
        for i in 0..<end {
            guard let sextet = sextet(text[i]) else { return nil }
            group = group << 6 | UInt32(sextet)
            count += 1
            if count == 4 {
                out.append(UInt8(truncatingIfNeeded: group >> 16))
                out.append(UInt8(truncatingIfNeeded: group >> 8))
                out.append(UInt8(truncatingIfNeeded: group))
                group = 0
                count = 0
            }
        }
        // A last group of 2 characters is 1 byte, of 3 is 2; its unused low bits are ignored.
        if count == 2 { out.append(UInt8(truncatingIfNeeded: group >> 4)) }
        if count == 3 {
            out.append(UInt8(truncatingIfNeeded: group >> 10))
            out.append(UInt8(truncatingIfNeeded: group >> 2))
        }
        return out
    }

    /// A character's six bits in the standard alphabet.
    static func sextet(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): c - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): c - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0") + 52
        case UInt8(ascii: "+"): 62
        case UInt8(ascii: "/"): 63
        default: nil
        }
    }
}
