/// Tells HTTP/2 by prior knowledge (h2c) from HTTP/1.1 on a cleartext
/// connection, from its first bytes: an HTTP/2 client opens with the 24-byte
/// connection preface `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n` (RFC 9113 section
/// 3.4), which no HTTP/1.1 request can start with (`PRI` is no method the
/// proxy serves, and HTTP/1.1 has no version 2.0).
///
/// Asked only for a connection's first request, after each read, with every
/// byte read so far. The answer is known as soon as one byte differs from
/// the preface (`POST` at its second byte, `GET` at its first), so an
/// HTTP/1.1 client never waits for more bytes than it sent; a strict prefix
/// of the preface waits for more (the head timer still runs). The bytes
/// are handed on as they are: nghttp2 reads the preface again itself, and
/// the HTTP/1.1 parser reads its request from the first byte.
public enum HTTP2Preface {
    /// The client connection preface (nghttp2's `NGHTTP2_CLIENT_MAGIC`).
    public static let magic: StaticString = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    /// Its length, 24 bytes.
    public static var count: Int { magic.utf8CodeUnitCount }

    public enum Match: Sendable, Equatable {
        /// The bytes start with the whole preface: hand the connection to HTTP/2.
        case http2
        /// A byte differs from the preface: HTTP/1.1, as before.
        case http1
        /// Every byte so far matches, but the preface is not whole yet: read more.
        case needMore
    }

    /// Compares the first bytes of a connection with the preface, and no
    /// more of them than it has (the bytes after it are HTTP/2 frames).
    public static func match(_ bytes: UnsafeRawBufferPointer) -> Match {
        let preface = magic.utf8Start
        let n = min(bytes.count, count)
        for i in 0..<n where bytes[i] != preface[i] { return .http1 }
        return n == count ? .http2 : .needMore
    }

    /// `match` over an array (tests, and callers holding bytes in one).
    public static func match(_ bytes: [UInt8]) -> Match {
        bytes.withUnsafeBytes { match($0) }
    }
}
