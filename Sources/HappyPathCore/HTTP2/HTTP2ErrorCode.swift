/// The error codes of RST_STREAM and GOAWAY frames (RFC 9113 section 7),
/// with their values on the wire. The connection and stream machines name
/// the code a frame carries; the driver passes `rawValue` to nghttp2.
public enum HTTP2ErrorCode: UInt32, Sendable, Equatable, CaseIterable {
    /// Not an error: a drain's GOAWAY, or "stop sending the request" after a
    /// complete early answer (RFC 9113 section 8.1).
    case noError = 0x0
    case protocolError = 0x1
    /// Our side failed: an answer that ended short of its Content-Length.
    case internalError = 0x2
    case flowControlError = 0x3
    case settingsTimeout = 0x4
    case streamClosed = 0x5
    case frameSizeError = 0x6
    /// A stream opened after our GOAWAY: never processed, safe to retry.
    case refusedStream = 0x7
    /// The stream is no longer needed: a stream idle too long.
    case cancel = 0x8
    case compressionError = 0x9
    case connectError = 0xa
    /// A peer that floods or abuses the protocol (rapid reset, control-frame floods).
    case enhanceYourCalm = 0xb
    case inadequateSecurity = 0xc
    case http11Required = 0xd

    /// The label for metrics and logs (`enhance_your_calm`).
    public var label: String {
        switch self {
        case .noError: "no_error"
        case .protocolError: "protocol_error"
        case .internalError: "internal_error"
        case .flowControlError: "flow_control_error"
        case .settingsTimeout: "settings_timeout"
        case .streamClosed: "stream_closed"
        case .frameSizeError: "frame_size_error"
        case .refusedStream: "refused_stream"
        case .cancel: "cancel"
        case .compressionError: "compression_error"
        case .connectError: "connect_error"
        case .enhanceYourCalm: "enhance_your_calm"
        case .inadequateSecurity: "inadequate_security"
        case .http11Required: "http_1_1_required"
        }
    }
}
