/// Decodes a chunked request body (RFC 9112 section 7.1) incrementally, as
/// bytes arrive. Strict: the chunk size is hex digits only and must fit the
/// body limit, chunk extensions must follow the grammar (and are dropped),
/// chunk data must be followed by CRLF, and trailer lines are checked like
/// header fields and bounded by the head limit (then dropped: the body goes
/// upstream with a Content-Length).
///
/// A pending line is examined once: `lineScanned` remembers how far, so a
/// body trickled in byte by byte still costs time linear in its size.
public struct ChunkedDecoder: Sendable {
    /// The longest chunk-size line (size and extensions) accepted.
    public static let maxChunkLine = 4096

    private enum State: Sendable {
        case sizeLine
        case data(remaining: Int)
        case dataCR
        case dataLF
        case trailerLine
        case done
    }

    private var state = State.sizeLine
    private var lineScanned = 0
    private var trailerBytes = 0
    private var trailerFields = 0
    public private(set) var bodyBytes = 0
    private let limits: RequestLimits

    public init(limits: RequestLimits) { self.limits = limits }

    public enum Step: Sendable, Equatable {
        /// All of `input` up to `consumed` is used; call again with more bytes.
        case needMore(consumed: Int)
        /// The body ended `consumed` bytes into `input` (pipelined bytes may follow).
        case done(consumed: Int)
        case refused(HTTP1Refusal)
    }

    /// Decodes what it can of `input`, handing body bytes to `body` in order.
    /// Unconsumed bytes (a partial line) must be offered again, first, with
    /// whatever arrives next.
    public mutating func decode(_ input: UnsafeRawBufferPointer, body: (UnsafeRawBufferPointer) -> Void) -> Step {
        var i = 0
        let n = input.count
        while true {
            switch state {
            case .done:
                return .done(consumed: i)
            case let .data(remaining):
                guard i < n else { return .needMore(consumed: i) }
                let take = min(remaining, n - i)
                body(UnsafeRawBufferPointer(rebasing: input[i..<(i + take)]))
                i += take
                state = take == remaining ? .dataCR : .data(remaining: remaining - take)
            case .dataCR:
                guard i < n else { return .needMore(consumed: i) }
                guard input[i] == 0x0D else { return .refused(.missingChunkTerminator) }
                i += 1
                state = .dataLF
            case .dataLF:
                guard i < n else { return .needMore(consumed: i) }
                guard input[i] == 0x0A else { return .refused(.missingChunkTerminator) }
                i += 1
                state = .sizeLine
            case .sizeLine, .trailerLine:
                // Find the line's LF, continuing where the last call stopped.
                var j = i + lineScanned
                while j < n, input[j] != 0x0A { j += 1 }
                let isTrailer: Bool
                if case .trailerLine = state { isTrailer = true } else { isTrailer = false }
                if j == n {
                    lineScanned = n - i
                    if isTrailer {
                        if trailerBytes + lineScanned > limits.maxHeadBytes { return .refused(.trailersTooLarge) }
                    } else if lineScanned > Self.maxChunkLine + 1 {  // + 1: the line's CR may be in
                        return .refused(.chunkLineTooLong)
                    }
                    return .needMore(consumed: i)
                }
                lineScanned = 0
                guard j > i, input[j - 1] == 0x0D else { return .refused(.bareLineFeed) }
                let lineEnd = j - 1  // the CR
                let result = isTrailer ? trailerLine(input, i, lineEnd) : sizeLine(input, i, lineEnd)
                if let refusal = result { return .refused(refusal) }
                i = j + 1
            }
        }
    }

    /// `1*HEXDIG *( BWS ";" BWS ext-name [ BWS "=" BWS ext-value ] )`.
    private mutating func sizeLine(_ input: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> HTTP1Refusal? {
        if end - start > Self.maxChunkLine { return .chunkLineTooLong }
        var i = start
        var size = 0
        var significant = 0
        while i < end, let digit = hexValue(input[i]) {
            // 15 significant hex digits already exceed any body limit: stop before overflow.
            if size > 0 || digit > 0 { significant += 1 }
            guard significant < 15 else { return .badChunkSize }
            size = size << 4 | digit
            i += 1
        }
        guard i > start else { return .badChunkSize }
        if let refusal = Self.extensions(input, i, end) { return refusal }
        for k in start..<end where input[k] == 0x0D { return .badChunkExtension }
        if size == 0 {
            state = .trailerLine
            return nil
        }
        guard bodyBytes + size <= limits.maxBodyBytes else { return .bodyTooLarge }
        bodyBytes += size
        state = .data(remaining: size)
        return nil
    }

    /// Chunk extensions with no whitespace around `;` and `=`. The grammar
    /// allows "bad whitespace" there (RFC 9112 section 7.1.1), but parsers
    /// disagree on it (llhttp refuses it) and it is a known smuggling
    /// vector; the extensions are dropped anyway. Quoted values may hold spaces.
    private static func extensions(_ input: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> HTTP1Refusal? {
        var i = start
        func isSpace(_ k: Int) -> Bool { k < end && (input[k] == 0x20 || input[k] == 0x09) }
        while true {
            if i == end { return nil }
            if isSpace(i) { return .badChunkExtension }
            guard input[i] == UInt8(ascii: ";") else { return i == start ? .badChunkSize : .badChunkExtension }
            i += 1
            let nameStart = i
            while i < end, HTTPBytes.isToken(input[i]) { i += 1 }
            guard i > nameStart else { return .badChunkExtension }
            if i < end, input[i] == UInt8(ascii: "=") {
                i += 1
                guard i < end, !isSpace(i) else { return .badChunkExtension }
                if input[i] == UInt8(ascii: "\"") {
                    i += 1
                    var closed = false
                    while i < end {
                        let c = input[i]
                        if c == UInt8(ascii: "\"") {
                            closed = true
                            i += 1
                            break
                        }
                        if c == UInt8(ascii: "\\") {
                            i += 1
                            guard i < end, HTTPBytes.isFieldValue(input[i]) else { return .badChunkExtension }
                        } else if !HTTPBytes.isFieldValue(c) {
                            return .badChunkExtension
                        }
                        i += 1
                    }
                    guard closed else { return .badChunkExtension }
                } else {
                    let valueStart = i
                    while i < end, HTTPBytes.isToken(input[i]) { i += 1 }
                    guard i > valueStart else { return .badChunkExtension }
                }
            }
        }
    }

    private mutating func trailerLine(_ input: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> HTTP1Refusal? {
        trailerBytes += end - start + 2
        if trailerBytes > limits.maxHeadBytes { return .trailersTooLarge }
        if end == start {
            state = .done
            return nil
        }
        if input[start] == 0x20 || input[start] == 0x09 { return .badTrailer }
        for k in start..<end where input[k] == 0x0D { return .badTrailer }
        trailerFields += 1
        if trailerFields > limits.maxFields { return .trailersTooLarge }
        switch RequestHeadParser.parseFieldLine(input, start, end) {
        case let .success(field):
            // Framing and routing fields are not allowed in trailers (RFC 9110
            // section 6.5.1); a reader that merged them would frame differently.
            let name = UnsafeRawBufferPointer(rebasing: input[field.nameStart..<field.nameEnd])
            if HTTPBytes.equals(name, "content-length") || HTTPBytes.equals(name, "transfer-encoding")
                || HTTPBytes.equals(name, "host")
            {
                return .badTrailer
            }
            return nil
        case .failure: return .badTrailer
        }
    }

    @inline(__always)
    private func hexValue(_ b: UInt8) -> Int? {
        switch b {
        case 0x30...0x39: Int(b - 0x30)
        case 0x41...0x46: Int(b - 0x41 + 10)
        case 0x61...0x66: Int(b - 0x61 + 10)
        default: nil
        }
    }
}
