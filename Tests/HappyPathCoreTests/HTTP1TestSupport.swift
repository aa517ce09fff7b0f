import HappyPathCore
import Testing

/// Shared helpers for the HTTP/1.1 parser tests.

let defaultLimits = RequestLimits(maxHeadBytes: 8192, maxBodyBytes: 1 << 20)

/// A head the scanner found complete and the parser accepted, with the bytes
/// it was parsed from so that ranges can be read back as text.
struct ParsedRequest: Equatable, CustomStringConvertible {
    let bytes: [UInt8]
    let head: RequestHead
    let fields: [HTTP1Field]
    /// The normalized path, when it differs from the one sent.
    var normalizedPath: String? = nil

    func text(_ range: Range<Int>) -> String { String(decoding: bytes[range], as: UTF8.self) }

    var method: String { text(head.method) }
    var target: String { text(head.target) }
    var pathAndQuery: String { text(head.pathAndQuery) }
    var host: String? { head.host.map(text) }
    var fieldNames: [String] { fields.map { text($0.nameStart..<$0.nameEnd) } }
    var fieldValues: [String] { fields.map { text($0.valueStart..<$0.valueEnd) } }

    var description: String { "ParsedRequest(\(head))" }
}

/// What scanning then parsing a buffer gives.
enum HeadOutcome: Equatable, CustomStringConvertible {
    /// The scanner wants more bytes.
    case incomplete
    case refused(HTTP1Refusal)
    case parsed(ParsedRequest)

    var refusal: HTTP1Refusal? {
        if case let .refused(r) = self { return r }
        return nil
    }

    var request: ParsedRequest? {
        if case let .parsed(p) = self { return p }
        return nil
    }

    var description: String {
        switch self {
        case .incomplete: "incomplete"
        case let .refused(r): "refused(.\(r))"
        case let .parsed(p): "parsed(\(p))"
        }
    }
}

/// Scans `bytes` with one call, then parses the head if it is complete.
func scanWhole(_ bytes: [UInt8], limits: RequestLimits = defaultLimits) -> HeadOutcome {
    var scanner = RequestHeadScanner()
    return bytes.withUnsafeBytes { buf in
        switch scanner.scan(buf, limits: limits) {
        case .incomplete: return .incomplete
        case let .refused(r): return .refused(r)
        case let .complete(start, end): return parseComplete(bytes, buf, start: start, end: end, limits: limits)
        }
    }
}

/// Scans `bytes` as they would arrive one byte per read: the scanner is
/// handed the buffer grown by one byte on every call, and stops at the
/// first answer that is not `.incomplete`.
func scanByteByByte(_ bytes: [UInt8], limits: RequestLimits = defaultLimits) -> HeadOutcome {
    var scanner = RequestHeadScanner()
    var received: [UInt8] = []
    received.reserveCapacity(bytes.count)
    for b in bytes {
        received.append(b)
        let outcome: HeadOutcome? = received.withUnsafeBytes { buf in
            switch scanner.scan(buf, limits: limits) {
            case .incomplete: return nil
            case let .refused(r): return .refused(r)
            case let .complete(start, end):
                // Parse against the whole input, as the whole-buffer path does,
                // so that the two results compare equal (the head's ranges are
                // the same either way).
                return bytes.withUnsafeBytes { all in
                    parseComplete(bytes, all, start: start, end: end, limits: limits)
                }
            }
        }
        if let outcome { return outcome }
    }
    return .incomplete
}

private func parseComplete(
    _ bytes: [UInt8], _ buf: UnsafeRawBufferPointer, start: Int, end: Int, limits: RequestLimits
) -> HeadOutcome {
    var fields: [HTTP1Field] = []
    var normalizedPath: String?
    switch RequestHeadParser.parse(
        buf, requestStart: start, end: end, limits: limits, fields: &fields, normalizedPath: &normalizedPath)
    {
    case let .success(head):
        return .parsed(ParsedRequest(bytes: bytes, head: head, fields: fields, normalizedPath: normalizedPath))
    case let .failure(r): return .refused(r)
    }
}

/// Scans and parses `bytes` both whole and one byte at a time, expects the
/// two to agree, and returns the whole-buffer outcome.
func outcome(
    _ bytes: [UInt8], limits: RequestLimits = defaultLimits, sourceLocation: SourceLocation = #_sourceLocation
) -> HeadOutcome {
    let whole = scanWhole(bytes, limits: limits)
    let trickled = scanByteByByte(bytes, limits: limits)
    #expect(whole == trickled, "whole-buffer and byte-by-byte scans disagree", sourceLocation: sourceLocation)
    return whole
}

func outcome(
    _ text: String, limits: RequestLimits = defaultLimits, sourceLocation: SourceLocation = #_sourceLocation
) -> HeadOutcome {
    outcome(Array(text.utf8), limits: limits, sourceLocation: sourceLocation)
}

/// The helper the brief describes: nil when the head is incomplete.
func parseHead(_ text: String, limits: RequestLimits = defaultLimits) -> Result<RequestHead, HTTP1Refusal>? {
    switch scanWhole(Array(text.utf8), limits: limits) {
    case .incomplete: nil
    case let .refused(r): .failure(r)
    case let .parsed(p): .success(p.head)
    }
}

/// `GET / HTTP/1.1` with `Host: example.com` and the given extra field lines.
func request(_ fieldLines: [String], requestLine: String = "GET / HTTP/1.1", host: String? = "example.com") -> String {
    var lines = [requestLine]
    if let host { lines.append("Host: \(host)") }
    lines += fieldLines
    return lines.joined(separator: "\r\n") + "\r\n\r\n"
}

/// A head as bytes: `prefix`, then `middle` (raw bytes, e.g. control bytes), then `suffix`.
func bytes(_ prefix: String, _ middle: [UInt8], _ suffix: String) -> [UInt8] {
    Array(prefix.utf8) + middle + Array(suffix.utf8)
}

// MARK: - Chunked decoding helpers

/// What decoding a chunked body gives: the final step (offsets relative to
/// the start of the whole input) and the body bytes delivered.
struct ChunkedOutcome: Equatable, CustomStringConvertible {
    enum End: Equatable {
        /// Input ran out; `consumed` bytes of it were used.
        case needMore(consumed: Int)
        /// The body ended after `consumed` bytes of the input.
        case done(consumed: Int)
        case refused(HTTP1Refusal)
    }

    var end: End
    var body: [UInt8]

    var description: String { "\(end), body: \(String(decoding: body, as: UTF8.self).debugDescription)" }
}

/// Decodes `input` in one call.
func decodeWhole(_ input: [UInt8], limits: RequestLimits) -> ChunkedOutcome {
    var decoder = ChunkedDecoder(limits: limits)
    var body: [UInt8] = []
    let step = input.withUnsafeBytes { buf in decoder.decode(buf) { body.append(contentsOf: $0) } }
    let end: ChunkedOutcome.End =
        switch step {
        case let .needMore(c): .needMore(consumed: c)
        case let .done(c): .done(consumed: c)
        case let .refused(r): .refused(r)
        }
    return ChunkedOutcome(end: end, body: body)
}

/// Decodes `input` arriving one byte at a time: every call offers the bytes
/// the last call did not consume, first, then the new byte.
func decodeByteByByte(_ input: [UInt8], limits: RequestLimits) -> ChunkedOutcome {
    var decoder = ChunkedDecoder(limits: limits)
    var body: [UInt8] = []
    var pending: [UInt8] = []
    var consumedTotal = 0  // bytes of `input` the decoder has consumed for good
    for b in input {
        pending.append(b)
        let step = pending.withUnsafeBytes { buf in decoder.decode(buf) { body.append(contentsOf: $0) } }
        switch step {
        case let .needMore(c):
            consumedTotal += c
            pending.removeFirst(c)
        case let .done(c):
            return ChunkedOutcome(end: .done(consumed: consumedTotal + c), body: body)
        case let .refused(r):
            return ChunkedOutcome(end: .refused(r), body: body)
        }
    }
    return ChunkedOutcome(end: .needMore(consumed: consumedTotal), body: body)
}
