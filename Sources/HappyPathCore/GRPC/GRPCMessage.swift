/// The `grpc-message` field: a Unicode text sent as UTF-8 and then
/// percent-encoded (gRPC over HTTP/2, "Status-Message"): every byte outside
/// space…`~` (0x20–0x7E), and `%` itself, is written `%XX`.
public enum GRPCMessage {
    /// The field value for `text`, at most `limit` bytes long (gRPC clients
    /// refuse trailers over 8 KiB by default, and the message also travels in
    /// `grpc-status-details-bin`). A longer text is cut at a character
    /// boundary, never inside a `%XX` or a UTF-8 sequence.
    public static func encode(_ text: String, limit: Int = 2048) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(min(text.utf8.count, limit))
        for scalar in text.unicodeScalars {
            var encoded: [UInt8] = []
            for byte in String(scalar).utf8 {
                if byte >= 0x20, byte <= 0x7E, byte != UInt8(ascii: "%") {
                    encoded.append(byte)
                } else {
                    encoded += [UInt8(ascii: "%"), hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0x0F)]]
                }
            }
            if out.count + encoded.count > limit { break }
            out += encoded
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The text of a received field, decoded leniently as the protocol asks
    /// ("MUST NOT error or throw away the message"): a valid `%XX` becomes its
    /// byte, a broken one (`%`, `%4`, `%zz`) stays as written, bytes outside
    /// the allowed range are kept, and bytes that are not UTF-8 once decoded
    /// become U+FFFD. Reads at most `limit` bytes of the field, so the work
    /// and the result are bounded whatever a peer sends.
    public static func decode(_ field: some Collection<UInt8>, limit: Int = 8192) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(min(field.count, limit))
        var bytes = field.prefix(max(0, limit)).makeIterator()
        var pending: [UInt8] = []  // a `%` and the hex digits read after it so far
        while let byte = bytes.next() {
            if pending.isEmpty {
                if byte == UInt8(ascii: "%") { pending = [byte] } else { out.append(byte) }
                continue
            }
            guard hexValue(byte) != nil else {
                // Not a hex digit: what was pending is literal text; this byte starts afresh.
                out += pending
                pending = []
                if byte == UInt8(ascii: "%") { pending = [byte] } else { out.append(byte) }
                continue
            }
            pending.append(byte)
            if pending.count == 3, let high = hexValue(pending[1]), let low = hexValue(pending[2]) {
                out.append(high << 4 | low)
                pending = []
            }
        }
        out += pending
        return String(decoding: out, as: UTF8.self)
    }

    /// The same for a field held as a `String` (a header value read as Latin-1 or UTF-8).
    public static func decode(_ field: String, limit: Int = 8192) -> String { decode(Array(field.utf8), limit: limit) }

    static let hexDigits: [UInt8] = Array("0123456789ABCDEF".utf8)

    static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        default: nil
        }
    }
}
