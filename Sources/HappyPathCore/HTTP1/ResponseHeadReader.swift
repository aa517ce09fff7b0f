/// Reads an HTTP/1.1 response head from raw bytes, for the answers the
/// proxy reads itself (an upgrade try's, `UpstreamUpgrade`; libcurl reads
/// every other). Strict: a status line `ResponseFraming` accepts, then
/// field lines `name: value` with a non-empty name and no line folding.
/// Field names and values are checked by whoever receives them
/// (`ResponseFraming.add`), as for libcurl's. Time linear in the head's size.
public enum ResponseHeadReader {
    /// The end of the head (just past its empty line) in `bytes`, looking
    /// from `from` (where the previous look stopped: bytes are scanned once
    /// however they trickle in); nil when it is not there yet.
    public static func end(of bytes: UnsafeRawBufferPointer, from: Int) -> Int? {
        var i = max(0, from - 3)
        while i + 3 < bytes.count {
            if bytes[i + 3] != 0x0A {
                i += bytes[i + 3] == 0x0D ? 1 : 4
                continue
            }
            if bytes[i] == 0x0D, bytes[i + 1] == 0x0A, bytes[i + 2] == 0x0D { return i + 4 }
            i += 1
        }
        return nil
    }

    public struct Head: Sendable, Equatable {
        public var status: Int
        /// The reason phrase's bytes in the head (possibly empty).
        public var reason: Range<Int>
    }

    /// Reads a complete head (up to and including its empty line): the
    /// status line to `status` (the code and the reason phrase), then each
    /// field in order to `field` (name, and value without surrounding
    /// spaces). What was given stays given when a later line is refused.
    public static func read(
        _ head: UnsafeRawBufferPointer, field: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void,
        status statusLine: (_ status: Int, _ reason: UnsafeRawBufferPointer) -> Void = { _, _ in }
    ) -> Result<Head, ResponseFramingError> {
        guard let lineEnd = firstCRLF(head, from: 0),
            let status = ResponseFraming.status(ofLine: UnsafeRawBufferPointer(rebasing: head[0..<lineEnd]))
        else { return .failure(ResponseFramingError(message: "The upstream's answer does not start with an HTTP/1.x status line.")) }
        let reason = lineEnd > 12 ? 13..<lineEnd : lineEnd..<lineEnd
        // A bare CR or LF inside a line: a lenient reader would see two lines (RFC 9112 section 2.2).
        guard !head[reason].contains(0x0D), !head[reason].contains(0x0A) else { return .failure(bareLineBreak) }
        statusLine(status, UnsafeRawBufferPointer(rebasing: head[reason]))
        var start = lineEnd + 2
        while let end = firstCRLF(head, from: start), end > start {
            let line = UnsafeRawBufferPointer(rebasing: head[start..<end])
            start = end + 2
            guard !line.contains(0x0D), !line.contains(0x0A) else { return .failure(bareLineBreak) }
            guard line[0] != 0x20, line[0] != 0x09, let colon = line.firstIndex(of: 0x3A), colon > 0 else {
                return .failure(
                    ResponseFramingError(message: "The upstream sent a field line that is not name: value (or folded onto the previous one)."))
            }
            var valueStart = colon + 1
            var valueEnd = line.count
            while valueStart < valueEnd, line[valueStart] == 0x20 || line[valueStart] == 0x09 { valueStart += 1 }
            while valueEnd > valueStart, line[valueEnd - 1] == 0x20 || line[valueEnd - 1] == 0x09 { valueEnd -= 1 }
            field(UnsafeRawBufferPointer(rebasing: line[0..<colon]), UnsafeRawBufferPointer(rebasing: line[valueStart..<valueEnd]))
        }
        return .success(Head(status: status, reason: reason))
    }

    private static let bareLineBreak = ResponseFramingError(
        message: "The upstream sent a bare CR or LF inside a line of its answer head.")

    private static func firstCRLF(_ bytes: UnsafeRawBufferPointer, from: Int) -> Int? {
        var i = from
        while i + 1 < bytes.count {
            if bytes[i] == 0x0D, bytes[i + 1] == 0x0A { return i }
            i += 1
        }
        return nil
    }
}
