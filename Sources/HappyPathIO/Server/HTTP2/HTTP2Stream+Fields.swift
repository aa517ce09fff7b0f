import HappyPathCore

/// The answer's fields as a stream frames them: names it drops, the `date`
/// it adds, and the `Name: value` lines of an upstream's informational block.
extension HTTP2Stream {
    /// `date`, as bytes for the field block (a StaticString's storage is static).
    static var dateName: UnsafeRawBufferPointer {
        let name: StaticString = "date"
        return UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
    }

    /// Connection-specific fields (RFC 9113 section 8.2.2, less `Connection`
    /// itself, whose value is kept) and the framing fields, which are the stream's.
    static func dropped(_ name: UnsafeRawBufferPointer) -> Bool {
        HTTPBytes.equals(name, "keep-alive") || HTTPBytes.equals(name, "proxy-connection")
            || HTTPBytes.equals(name, "transfer-encoding") || HTTPBytes.equals(name, "upgrade")
            || HTTPBytes.equals(name, "content-length")
    }

    /// Each `Name: value` line of a CRLF-separated block (the value without
    /// its surrounding spaces and tabs); a line without a colon is skipped.
    static func forEachLine(
        _ block: UnsafeRawBufferPointer, _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void
    ) {
        var start = 0
        while start < block.count {
            var end = start
            while end < block.count, block[end] != UInt8(ascii: "\n") { end += 1 }
            var lineEnd = end
            if lineEnd > start, block[lineEnd - 1] == UInt8(ascii: "\r") { lineEnd -= 1 }
            if let colon = block[start..<lineEnd].firstIndex(of: UInt8(ascii: ":")), colon > start {
                var v = colon + 1
                var w = lineEnd
                while v < w, block[v] == 0x20 || block[v] == 0x09 { v += 1 }
                while w > v, block[w - 1] == 0x20 || block[w - 1] == 0x09 { w -= 1 }
                body(UnsafeRawBufferPointer(rebasing: block[start..<colon]), UnsafeRawBufferPointer(rebasing: block[v..<w]))
            }
            start = end + 1
        }
    }
}
