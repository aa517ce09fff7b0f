/// gRPC-Web's wire pieces (the gRPC project's PROTOCOL-WEB): which of its
/// content types a request names, the trailer frame that carries a call's
/// status in the body (a browser cannot read HTTP trailers), and the text
/// mode's base64, read by a bounded streaming decoder. Pure; the proxy's
/// translation to and from gRPC is built on them.
public enum GRPCWeb {
    public enum Mode: Sendable, Equatable {
        /// `application/grpc-web` and `application/grpc-web+proto`: frames as gRPC's.
        case binary
        /// `application/grpc-web-text` (`+proto`): the frames base64-encoded.
        case text
    }

    /// The mode a `Content-Type` names (nil: not gRPC-Web). Parameters
    /// (`; charset=…`) are ignored; case is not significant.
    public static func mode(contentType: some Collection<UInt8>) -> Mode? {
        var type: [UInt8] = []
        for b in contentType {
            if b == UInt8(ascii: ";") { break }
            if b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") { continue }
            guard type.count < 64 else { return nil }
            type.append(b >= 65 && b <= 90 ? b + 32 : b)
        }
        switch String(decoding: type, as: UTF8.self) {
        case "application/grpc-web", "application/grpc-web+proto": return .binary
        case "application/grpc-web-text", "application/grpc-web-text+proto": return .text
        default: return nil
        }
    }

    /// The flag byte of a trailer frame (a message frame's is 0).
    public static let trailerFlag: UInt8 = 0x80

    /// The trailer frame: the flag, the block's length (four bytes,
    /// big-endian), then the trailers as `name: value\r\n` lines with
    /// lowercase names (`grpc-status`, `grpc-message`, ...).
    public static func trailerFrame(_ fields: [(name: String, value: String)]) -> [UInt8] {
        var block: [UInt8] = []
        for (name, value) in fields {
            block += name.lowercased().utf8
            block += [UInt8(ascii: ":"), UInt8(ascii: " ")]
            block += value.utf8
            block += [13, 10]
        }
        let n = UInt32(truncatingIfNeeded: block.count)
        return [trailerFlag, UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)] + block
    }

    /// Base64 of `bytes`, padded: a text-mode answer encodes each piece it
    /// sends on its own (the protocol lets padding end any piece), so a
    /// piece goes out as soon as it is there.
    public static func base64(_ bytes: some Collection<UInt8>) -> [UInt8] { Base64.padded(bytes) }
}

/// A text-mode request body as it arrives, in pieces of any size: base64
/// (the standard alphabet), where padding may end any group of four and
/// decoding starts afresh after it (a client may encode each message on its
/// own). Its state is at most three characters; time is linear in the
/// input; anything but the alphabet and `=` where a group may end is an
/// error, after which it reads nothing more.
public struct GRPCWebTextDecoder: Sendable {
    private var quad: [UInt8] = []
    /// After a `=`: only the rest of this group's padding may follow.
    private var padding = 0
    public private(set) var failed = false

    public init() {}

    public enum Failure: Error, Equatable, Sendable {
        /// A byte that is not base64, or padding where none may be.
        case invalid(offset: Int)
        /// The body ended inside a group of four.
        case truncated
    }

    /// Decodes `bytes`, appending to `out`. A failure stops the decoder for good.
    public mutating func feed(_ bytes: some Collection<UInt8>, into out: inout [UInt8]) -> Failure? {
        guard !failed else { return .invalid(offset: 0) }
        var offset = 0
        for b in bytes {
            defer { offset += 1 }
            if b == UInt8(ascii: "=") {
                // A group may end `xx==` or `xxx=`.
                guard quad.count + padding >= 2, quad.count + padding < 4 else { return fail(offset) }
                padding += 1
                if quad.count + padding == 4 { finishGroup(into: &out) }
                continue
            }
            guard padding == 0, let v = Self.value(b) else { return fail(offset) }
            quad.append(v)
            if quad.count == 4 { finishGroup(into: &out) }
        }
        return nil
    }

    /// The body ended: nothing may be left inside a group.
    public mutating func finish() -> Failure? {
        guard !failed else { return .invalid(offset: 0) }
        guard quad.isEmpty, padding == 0 else {
            failed = true
            return .truncated
        }
        return nil
    }

    private mutating func fail(_ offset: Int) -> Failure {
        failed = true
        return .invalid(offset: offset)
    }

    private mutating func finishGroup(into out: inout [UInt8]) {
        var group: UInt32 = 0
        for i in 0..<4 { group = group << 6 | UInt32(i < quad.count ? quad[i] : 0) }
        let bytes = [UInt8(group >> 16 & 0xFF), UInt8(group >> 8 & 0xFF), UInt8(group & 0xFF)]
        // Two characters give one byte, three give two, four give three.
        out += bytes.prefix(quad.count - 1)
        quad.removeAll(keepingCapacity: true)
        padding = 0
    }

    private static func value(_ b: UInt8) -> UInt8? { Base64.sextet(b) }
}
