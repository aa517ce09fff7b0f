/// How the edge normalizes a request's path before it is routed
/// (`normalize.merge_slashes`, `limits.encoded_slashes`).
public struct PathNormalization: Sendable, Equatable {
    /// What to do with `%2F`, `%5C` and a literal `\` in a path.
    public enum EncodedSlashes: String, Sendable, Equatable, CaseIterable {
        /// Forwarded as they came, never decoded: they are not separators.
        case keep
        /// Refused (400): for upstreams that would decode them into separators.
        case reject
    }

    /// `//` collapses to `/` (off by default: some APIs give empty segments a meaning).
    public var mergeSlashes: Bool
    public var encodedSlashes: EncodedSlashes

    public init(mergeSlashes: Bool = false, encodedSlashes: EncodedSlashes = .keep) {
        self.mergeSlashes = mergeSlashes
        self.encodedSlashes = encodedSlashes
    }
}

/// Normalizes the path of a request target the way nginx and Envoy's
/// `normalize_path` do, so that the path a route matches is the path the
/// upstream receives, and neither can be steered with `..`:
///
/// 1. percent-encoded unreserved characters (`%2e`, `%41`, `%7E`…) are
///    decoded (RFC 3986 section 6.2.2.2); every other `%XX` is kept as it
///    came, so `%2F` is never a separator; a `%` not followed by two hex
///    digits is refused;
/// 2. dot-segments are removed (RFC 3986 section 5.2.4), except that a
///    `..` that would climb above the root is refused instead of clamped;
/// 3. with `mergeSlashes`, empty segments are dropped (`//` → `/`).
///
/// The query is not touched. A path that is already normal (the common
/// case) is checked in one pass and nothing is allocated.
public enum PathNormalizer {
    /// `nil` when `path` is already normal; else the normalized path, or why it is refused.
    public static func normalize(_ buffer: UnsafeRawBufferPointer, _ path: Range<Int>, _ options: PathNormalization)
        -> Result<String?, HTTP1Refusal>
    {
        switch scan(buffer, path, options) {
        case let .failure(refusal): return .failure(refusal)
        case .success(false): return .success(nil)
        case .success(true): break
        }
        switch rewrite(buffer, path, options) {
        case let .success(bytes): return .success(String(decoding: bytes, as: UTF8.self))
        case let .failure(refusal): return .failure(refusal)
        }
    }

    /// Convenience for a path held as a string (tests, stored targets).
    public static func normalize(_ path: String, _ options: PathNormalization = PathNormalization())
        -> Result<String, HTTP1Refusal>
    {
        var path = path
        return path.withUTF8 { utf8 in
            let raw = UnsafeRawBufferPointer(utf8)
            return normalize(raw, 0..<raw.count, options).map { $0 ?? String(decoding: raw, as: UTF8.self) }
        }
    }

    /// Whether the path is a dot-segment (`.` or `..`) once decoded; a
    /// segment of a path that `normalize` returned never is.
    public static func isDotSegment(_ segment: Substring) -> Bool { segment == "." || segment == ".." }

    /// A dot-segment, or one with parameters (`..;x`, `.;x`), which a
    /// servlet container reads as one.
    public static func isDotLike(_ segment: Substring) -> Bool {
        isDotSegment(segment) || segment.hasPrefix(".;") || segment.hasPrefix("..;")
    }

    // MARK: - The check (no allocation)

    /// Refuses what is refused whatever the rest says (bad `%`, a refused
    /// slash), and tells whether anything would change.
    private static func scan(_ buffer: UnsafeRawBufferPointer, _ path: Range<Int>, _ options: PathNormalization)
        -> Result<Bool, HTTP1Refusal>
    {
        var changes = false
        var segmentStart = path.lowerBound
        var i = path.lowerBound
        let end = path.upperBound
        while i < end {
            let b = buffer[i]
            if b == UInt8(ascii: "%") {
                guard i + 2 < end, let decoded = hexPair(buffer[i + 1], buffer[i + 2]) else {
                    return .failure(.badPercentEncoding)
                }
                if decoded == UInt8(ascii: "/") || decoded == UInt8(ascii: "\\") {
                    if options.encodedSlashes == .reject { return .failure(.encodedSlash) }
                } else if isUnreserved(decoded) {
                    changes = true
                }
                i += 3
                continue
            }
            if b == UInt8(ascii: "\\"), options.encodedSlashes == .reject { return .failure(.encodedSlash) }
            if b == UInt8(ascii: "/") {
                if i > path.lowerBound {
                    if segmentNeedsWork(buffer, segmentStart, i, options) { changes = true }
                    if isDotWithParameters(buffer, segmentStart, i) { return .failure(.dotSegmentParameters) }
                }
                segmentStart = i + 1
            }
            i += 1
        }
        if end > path.lowerBound {
            if isDot(buffer, segmentStart, end) { changes = true }
            if isDotWithParameters(buffer, segmentStart, end) { return .failure(.dotSegmentParameters) }
        }
        return .success(changes)
    }

    @inline(__always)
    private static func segmentNeedsWork(
        _ buffer: UnsafeRawBufferPointer, _ start: Int, _ end: Int, _ options: PathNormalization
    ) -> Bool {
        (start == end && options.mergeSlashes) || isDot(buffer, start, end)
    }

    /// `.;x` or `..;x`: what precedes the parameters is a dot-segment. RFC
    /// 3986 does not call it one, but servlet containers strip the
    /// parameters before resolving, so it climbs like `..` there.
    @inline(__always)
    private static func isDotWithParameters(_ buffer: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> Bool {
        guard end - start >= 2, buffer[start] == UInt8(ascii: ".") else { return false }
        if buffer[start + 1] == UInt8(ascii: ";") { return true }
        return end - start >= 3 && buffer[start + 1] == UInt8(ascii: ".") && buffer[start + 2] == UInt8(ascii: ";")
    }

    @inline(__always)
    private static func isDot(_ buffer: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> Bool {
        let n = end - start
        guard n == 1 || n == 2 else { return false }
        return buffer[start] == UInt8(ascii: ".") && (n == 1 || buffer[start + 1] == UInt8(ascii: "."))
    }

    // MARK: - The rewrite

    private static func rewrite(_ buffer: UnsafeRawBufferPointer, _ path: Range<Int>, _ options: PathNormalization)
        -> Result<[UInt8], HTTP1Refusal>
    {
        // 1. Decode the unreserved characters (scan checked every '%').
        var decoded: [UInt8] = []
        decoded.reserveCapacity(path.count)
        var i = path.lowerBound
        while i < path.upperBound {
            let b = buffer[i]
            if b == UInt8(ascii: "%"), let d = hexPair(buffer[i + 1], buffer[i + 2]), isUnreserved(d) {
                decoded.append(d)
                i += 3
            } else {
                decoded.append(b)
                i += 1
            }
        }
        // 2. and 3. Segment by segment (split on literal '/' only), onto a
        // stack of kept segments. The path starts with '/' (origin form), so
        // the first split piece is empty and skipped.
        var kept: [Range<Int>] = []
        var pieces = decoded.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).map {
            $0.startIndex..<$0.endIndex
        }
        if decoded.first == UInt8(ascii: "/") { pieces.removeFirst() }
        for (n, piece) in pieces.enumerated() {
            let last = n == pieces.count - 1
            // Decoding may have made one (`%2e%2e;x`).
            let p = decoded[piece]
            if p.count >= 2, p.first == UInt8(ascii: "."),
                p.dropFirst().first == UInt8(ascii: ";")
                    || (p.count >= 3 && p.dropFirst().first == UInt8(ascii: ".") && p.dropFirst(2).first == UInt8(ascii: ";"))
            {
                return .failure(.dotSegmentParameters)
            }
            if isDot(decoded, piece) {
                if piece.count == 2 {
                    guard !kept.isEmpty else { return .failure(.pathAboveRoot) }
                    kept.removeLast()
                }
                // A dot-segment at the end leaves the path ending in '/'.
                if last { kept.append(piece.lowerBound..<piece.lowerBound) }
                continue
            }
            if piece.isEmpty, options.mergeSlashes, !last { continue }
            kept.append(piece)
        }
        var out: [UInt8] = []
        out.reserveCapacity(decoded.count)
        for piece in kept {
            out.append(UInt8(ascii: "/"))
            out.append(contentsOf: decoded[piece])
        }
        if out.isEmpty { out.append(UInt8(ascii: "/")) }
        return .success(out)
    }

    private static func isDot(_ bytes: [UInt8], _ r: Range<Int>) -> Bool {
        (r.count == 1 || r.count == 2) && bytes[r.lowerBound] == UInt8(ascii: ".")
            && (r.count == 1 || bytes[r.lowerBound + 1] == UInt8(ascii: "."))
    }

    // MARK: - Bytes

    /// ALPHA / DIGIT / "-" / "." / "_" / "~" (RFC 3986 section 2.3).
    @inline(__always)
    static func isUnreserved(_ b: UInt8) -> Bool {
        HTTPBytes.inMask(b, 0x03ff_6000_0000_0000, 0x47ff_fffe_87ff_fffe)
    }

    @inline(__always)
    static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case 0x30...0x39: b - 0x30
        case 0x41...0x46: b - 0x41 + 10
        case 0x61...0x66: b - 0x61 + 10
        default: nil
        }
    }

    @inline(__always)
    static func hexPair(_ high: UInt8, _ low: UInt8) -> UInt8? {
        guard let h = hexValue(high), let l = hexValue(low) else { return nil }
        return h << 4 | l
    }
}
