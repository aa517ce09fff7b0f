/// One gRPC message on the wire (gRPC over HTTP/2,
/// "Length-Prefixed-Message"): a compressed-flag byte, the message's length
/// as four bytes big-endian, then the message.
public enum GRPCFrame {
    public static let prefixLength = 5

    /// `message`, uncompressed, with its prefix.
    public static func encode(_ message: [UInt8]) -> [UInt8] {
        precondition(message.count <= Int(UInt32.max), "a gRPC message's length fits four bytes")
        let length = UInt32(message.count)
        return [0, UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)]
            + message
    }

    /// Why bytes are not the one message of a unary answer.
    public enum Failure: Error, Equatable, Sendable {
        /// Fewer than five bytes, or fewer than the prefix announces.
        case truncated
        /// The compressed flag is set (or is neither 0 nor 1); the proxy asks for no compression.
        case compressed
        /// The announced length is over the reader's limit.
        case tooLong(UInt32)
        /// Bytes after the message.
        case trailingBytes
    }

    /// The message of `bytes`, which must hold exactly one uncompressed
    /// message of at most `limit` bytes. The length is compared before any
    /// arithmetic, so a peer's `FF FF FF FF` is a `tooLong`, never a trap.
    public static func single(_ bytes: ArraySlice<UInt8>, limit: Int) -> Result<ArraySlice<UInt8>, Failure> {
        guard bytes.count >= prefixLength else { return .failure(.truncated) }
        let start = bytes.startIndex
        guard bytes[start] == 0 else { return .failure(.compressed) }
        var length: UInt32 = 0
        for i in 1...4 { length = length << 8 | UInt32(bytes[start + i]) }
        guard UInt64(length) <= UInt64(max(0, limit)) else { return .failure(.tooLong(length)) }
        let available = bytes.count - prefixLength
        guard Int(length) <= available else { return .failure(.truncated) }
        guard Int(length) == available else { return .failure(.trailingBytes) }
        return .success(bytes[(start + prefixLength)...])
    }
}
