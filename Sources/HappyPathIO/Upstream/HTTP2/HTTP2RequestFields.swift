import CNghttp2
import HappyPathCore

/// A try's request head as nghttp2 takes it: `:method`, `:scheme`,
/// `:authority` and `:path`, then the command's fields (names lower-cased),
/// the replacing fields instead of same-named ones, and `content-length`
/// when the body's length is known. nghttp2 does not police what it sends,
/// so connection-specific fields, `host` and any `content-length` of the
/// command are left out here (the edge already dropped them), and `te` goes
/// only as `trailers`. One per connection, its storage reused by each try.
struct HTTP2RequestFields {
    private var block = HTTP2FieldBlock()

    /// Builds the fields of `request` and calls `body` with nghttp2's array
    /// over them (valid during the call only: `submit_request` copies it).
    mutating func build<R>(
        _ request: UpstreamRequest, scheme: String, authority: String, contentLength: Int?,
        _ body: (UnsafeMutableBufferPointer<nghttp2_nv>) -> R
    ) -> R {
        block.removeAll()
        append(":method", request.method)
        append(":scheme", scheme)
        append(":authority", authority)
        append(":path", request.target)
        let replacing = request.replacing
        let replacingAlso = request.replacingAlso
        request.headers.forEach { name, value, _ in
            guard Self.isSent(name, value) else { return }
            if let replacing, Self.named(name, replacing) { return }
            if let replacingAlso, Self.named(name, replacingAlso) { return }
            block.append(name: name, value: value)
        }
        if let replacing { block.append(replacing.name, replacing.value) }
        if let replacingAlso { block.append(replacingAlso.name, replacingAlso.value) }
        if let contentLength { append("content-length", String(contentLength)) }
        return block.withNV(body)
    }

    private mutating func append(_ name: StaticString, _ value: String) {
        var value = value
        value.withUTF8 { v in block.append(name: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount), value: UnsafeRawBufferPointer(v)) }
    }

    /// Whether a command's field goes in an HTTP/2 request (RFC 9113 section 8.2.2).
    static func isSent(_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 2 where HTTPBytes.equals(name, "te"): return HTTPBytes.equals(value, "trailers")
        case 4 where HTTPBytes.equals(name, "host"): return false
        case 14 where HTTPBytes.equals(name, "content-length"): return false
        default: return !HopByHop.isHopByHop(name) && name.first != UInt8(ascii: ":")
        }
    }

    private static func named(_ name: UnsafeRawBufferPointer, _ field: HTTPField) -> Bool {
        var fieldName = field.name
        return fieldName.withUTF8 { HTTPBytes.equalsIgnoringCase(name, UnsafeRawBufferPointer($0)) }
    }

    /// `scheme://authority/` into its scheme and authority.
    static func split(_ origin: String) -> (scheme: String, authority: String) {
        let bytes = Array(origin.utf8)
        var i = 0
        while i + 2 < bytes.count, !(bytes[i] == 0x3A && bytes[i + 1] == 0x2F && bytes[i + 2] == 0x2F) { i += 1 }
        guard i + 2 < bytes.count else { return ("http", origin) }
        var end = i + 3
        while end < bytes.count, bytes[end] != 0x2F { end += 1 }
        let scheme = String(decoding: bytes[0..<i].map { HTTPBytes.lower($0) }, as: UTF8.self)
        return (scheme, String(decoding: bytes[(i + 3)..<end], as: UTF8.self))
    }
}
