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

    /// The mode a `Content-Type` names (nil: not gRPC-Web):
    /// `application/grpc-web` or `application/grpc-web-text`, in any case,
    /// alone or followed by a codec (`+proto`, `+json`: `+` and a token)
    /// and then parameters (`; charset=…`). Anything else is not gRPC-Web
    /// (`application/grpc` is gRPC). Allocates nothing.
    public static func mode(contentType value: some Collection<UInt8>) -> Mode? {
        parse(value)?.mode
    }

    /// The mode and the codec's range (after `+`, empty without one) of a
    /// gRPC-Web content type: one reading for every caller.
    static func parse<C: Collection<UInt8>>(_ value: C) -> (mode: Mode, codec: Range<C.Index>)? {
        var i = value.startIndex
        func at(_ literal: StaticString) -> Bool {
            var j = i
            for k in 0..<literal.utf8CodeUnitCount {
                guard j != value.endIndex, HTTPBytes.lower(value[j]) == literal.utf8Start[k] else { return false }
                j = value.index(after: j)
            }
            i = j
            return true
        }
        while i != value.endIndex, value[i] == 0x20 || value[i] == 0x09 { i = value.index(after: i) }
        guard at("application/grpc-web") else { return nil }
        let mode: Mode = at("-text") ? .text : .binary
        var codec = i..<i
        if i != value.endIndex, value[i] == UInt8(ascii: "+") {
            i = value.index(after: i)
            let start = i
            var count = 0
            while i != value.endIndex, HTTPBytes.isToken(value[i]) {
                count += 1
                guard count <= 32 else { return nil }
                i = value.index(after: i)
            }
            guard count > 0 else { return nil }
            codec = start..<i
        }
        // Then the end, or parameters (whitespace and `;`).
        guard i == value.endIndex || value[i] == UInt8(ascii: ";") || value[i] == 0x20 || value[i] == 0x09 else { return nil }
        return (mode, codec)
    }

    /// The `content-type` the upstream call carries for a gRPC-Web
    /// request's: `application/grpc`, with the request's codec kept
    /// (`application/grpc-web-text+proto` becomes `application/grpc+proto`).
    public static func upstreamContentType(_ value: some Collection<UInt8>) -> String {
        "application/grpc" + codec(value)
    }

    /// The `content-type` of a gRPC-Web answer: the request's type, its
    /// codec kept, without parameters (`application/grpc-web-text+proto`).
    public static func answerContentType(_ mode: Mode, request value: some Collection<UInt8>) -> String {
        (mode == .text ? "application/grpc-web-text" : "application/grpc-web") + codec(value)
    }

    /// `+proto` (or another codec's name), lower-cased, or nothing.
    static func codec(_ value: some Collection<UInt8>) -> String {
        guard let codec = parse(value)?.codec, !codec.isEmpty else { return "" }
        return "+" + String(decoding: value[codec].map(HTTPBytes.lower), as: UTF8.self)
    }

    /// Why a request body is not a sequence of whole gRPC frames (a flag
    /// byte, 0 or 1, a four-byte length, that many bytes), or nil when it
    /// is. A trailer frame has no place in a request. Linear in the body;
    /// no length is added before it is checked against what is left.
    public static func frameProblem(_ body: UnsafeRawBufferPointer) -> String? {
        var at = 0
        var index = 0
        while at < body.count {
            let left = body.count - at
            guard left >= 5 else { return "message \(index + 1) is cut off in its 5-byte frame header" }
            let flag = body[at]
            guard flag <= 1 else { return "message \(index + 1) has the frame flag \(flag) (only 0 and 1 are a message)" }
            var length = 0
            for i in 1...4 { length = length << 8 | Int(body[at + i]) }
            guard length <= left - 5 else {
                return "message \(index + 1) declares \(length) bytes but \(left - 5) follow"
            }
            at += 5 + length
            index += 1
        }
        return nil
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

/// Where a stream of gRPC frames stands as its bytes pass: inside a
/// frame's five-byte header, inside its message, or between two frames
/// (`atBoundary`), where a gRPC-Web answer cut short may still end with a
/// trailer frame of the proxy's. Constant state; a message's bytes are
/// skipped in one step, so time is linear in the headers alone.
public struct GRPCFrameCursor: Sendable {
    private var headerSeen = 0
    private var length = 0
    private var left = 0

    public init() {}

    public var atBoundary: Bool { headerSeen == 0 && left == 0 }

    public mutating func advance(_ bytes: UnsafeRawBufferPointer) {
        var i = 0
        while i < bytes.count {
            if left > 0 {
                let take = min(left, bytes.count - i)
                left -= take
                i += take
                continue
            }
            // The flag byte, then four bytes of length (at most 2^32 - 1: no overflow).
            if headerSeen > 0 { length = length << 8 | Int(bytes[i]) }
            headerSeen += 1
            i += 1
            if headerSeen == 5 {
                left = length
                headerSeen = 0
                length = 0
            }
        }
    }
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

/// A gRPC-Web request's body as the upstream call sends it: decoded from
/// base64 in text mode, and in both modes checked to be whole gRPC frames,
/// so that a malformed body is the proxy's clean refusal, not the
/// upstream's guess.
public enum GRPCWebRequest {
    public struct Refusal: Error, Equatable, Sendable {
        /// What is wrong, for the `grpc-message` (the problem's detail).
        public let detail: String
    }

    /// `body` (whole) in `mode`: the body to send, or why none is.
    public static func body(_ body: RequestBody, mode: GRPCWeb.Mode) -> Result<RequestBody, Refusal> {
        let raw = UnsafeRawBufferPointer(start: body.baseAddress, count: body.count)
        guard mode == .text else {
            if let problem = GRPCWeb.frameProblem(raw) { return .failure(Refusal(detail: "The gRPC-Web body is not whole gRPC frames: \(problem).")) }
            return .success(body)
        }
        var decoder = GRPCWebTextDecoder()
        var out: [UInt8] = []
        out.reserveCapacity(body.count / 4 * 3 + 3)
        if let failure = decoder.feed(raw, into: &out) ?? decoder.finish() {
            switch failure {
            case let .invalid(offset):
                return .failure(Refusal(detail: "The gRPC-Web text body is not base64 at byte \(offset)."))
            case .truncated:
                return .failure(Refusal(detail: "The gRPC-Web text body ends inside a base64 group of four characters."))
            }
        }
        let problem = out.withUnsafeBytes { GRPCWeb.frameProblem($0) }
        if let problem { return .failure(Refusal(detail: "The gRPC-Web body is not whole gRPC frames: \(problem).")) }
        let decoded = RequestBody(count: out.count)
        if let base = decoded.baseAddress { out.withUnsafeBytes { base.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
        return .success(decoded)
    }
}
