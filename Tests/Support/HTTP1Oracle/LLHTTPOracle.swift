import HTTP1Framing
import HappyPathCore
import NIOCore
import NIOEmbedded
import NIOHTTP1

/// How llhttp (swift-nio's `HTTPRequestDecoder`) frames a byte stream.
public struct LLHTTPFraming: Equatable, Sendable, CustomStringConvertible {
    public enum End: Equatable, Sendable {
        case consumedAll
        case incomplete
        case error(HTTPParserError)
        /// The last request does not keep the connection open, or upgrades
        /// it: llhttp reads no further request.
        case closed
    }

    public var requests: [FramedRequest]
    public var end: End

    public var description: String {
        "\(requests.count) request(s) \(requests.map(\.description)) then \(end)"
    }
}

/// Frames `bytes` with llhttp. `HTTPDecoder` is a `ByteToMessageDecoder`
/// that needs a `ChannelHandlerContext` (it is not a single-step decoder),
/// so it runs in an `EmbeddedChannel`: no socket, no event-loop thread.
public func llhttpFrameAll(_ bytes: [UInt8]) -> LLHTTPFraming {
    let channel = EmbeddedChannel(
        handler: ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)))
    var requests: [FramedRequest] = []
    var current: FramedRequest?
    var upgraded = false

    func drain() {
        while let part = try? channel.readInbound(as: HTTPServerRequestPart.self) {
            switch part {
            case let .head(head):
                current = FramedRequest(
                    method: Array(head.method.rawValue.utf8), target: Array(head.uri.utf8), body: [],
                    keepAlive: head.isKeepAlive)
                // llhttp stops at an upgrade (RFC 9110 section 7.8) or a CONNECT:
                // what follows is another protocol.
                if head.method == .CONNECT { upgraded = true }
                if head.headers.contains(name: "upgrade"),
                    head.headers[canonicalForm: "connection"].contains(where: { $0.lowercased() == "upgrade" })
                {
                    upgraded = true
                }
            case var .body(buffer):
                current?.body += buffer.readBytes(length: buffer.readableBytes) ?? []
            case .end:
                if let done = current { requests.append(done) }
                current = nil
            }
        }
        // Bytes forwarded after an upgrade are a ByteBuffer, not a request part.
        while (try? channel.readInbound(as: ByteBuffer.self)) != nil {}
    }

    func ended(_ end: LLHTTPFraming.End) -> LLHTTPFraming {
        drain()
        if upgraded || requests.last?.keepAlive == false {
            // Anything after such a request (llhttp's HPE_CLOSED_CONNECTION included) is never a request.
            if current == nil, case .error = end { return LLHTTPFraming(requests: requests, end: .closed) }
            if current == nil { return LLHTTPFraming(requests: requests, end: .closed) }
        }
        return LLHTTPFraming(requests: requests, end: current == nil ? end : (end == .consumedAll ? .incomplete : end))
    }

    var buffer = channel.allocator.buffer(capacity: bytes.count)
    buffer.writeBytes(bytes)
    do {
        try channel.writeInbound(buffer)
    } catch {
        _ = try? channel.finish()
        return ended(.error(parserError(error)))
    }
    drain()
    // EOF: llhttp's llhttp_finish says whether a message was under way.
    do {
        _ = try channel.finish()
    } catch HTTPParserError.invalidEOFState {
        return ended(.incomplete)
    } catch {
        return ended(.error(parserError(error)))
    }
    return ended(.consumedAll)
}

private func parserError(_ error: any Error) -> HTTPParserError {
    (error as? HTTPParserError) ?? .unknown
}

// MARK: - Comparing the two

/// Reasons the edge refuses requests that llhttp accepts, each on purpose,
/// with the rule it applies. A refusal for any other reason where llhttp
/// accepts is a bug in one of the two parsers.
public let deliberatelyStricter: [HTTP1Refusal: String] = [
    .missingHost: "RFC 9112 3.2: a server MUST respond 400 to an HTTP/1.1 request without Host",
    .repeatedHost: "RFC 9112 3.2: ... or with more than one Host field line",
    .invalidHost: "RFC 9112 3.2: ... or with an invalid Host field value (RFC 3986 3.2.2 authority)",
    .obsFold: "RFC 9112 5.2: a server MUST reject obs-fold (or unfold it); llhttp unfolds it",
    .bareCarriageReturn: "RFC 9112 2.2: a bare CR MUST be treated as invalid (or replaced with SP); llhttp skips one before a request line",
    .bareLineFeed: "RFC 9112 2.2: a bare LF MAY be accepted as a line terminator; the edge does not, so no two readers disagree",
    .badRequestLine: "RFC 9112 3: single SP between the parts; parsing on any whitespace MAY be done but invites smuggling",
    .connectMethod: "RFC 9110 9.3.6: CONNECT asks for a tunnel, which this proxy does not provide",
    .badTarget: "RFC 9112 3.2 / RFC 3986: a request-target is URI characters; llhttp lets some other bytes (and userinfo or odd schemes in absolute form) through",
    .authorityForm: "RFC 9112 3.2.3: authority-form is only for CONNECT",
    .asteriskFormNotOptions: "RFC 9112 3.2.4: asterisk-form is only for OPTIONS",
    .chunkedNotFinal: "RFC 9112 6.3: a request whose final transfer coding is not chunked MUST be answered 400",
    .unsupportedTransferCoding: "RFC 9112 6.1: a server MUST answer 501 to a transfer coding it does not understand",
    .transferEncodingOnHTTP10: "RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing; the server MUST close after it, the edge refuses it",
    .contentLengthWithTransferEncoding: "RFC 9112 6.1: a server MAY reject a message with both; llhttp does only in strict cases",
    .badContentLength: "RFC 9110 8.6: Content-Length is 1*DIGIT (or a list of identical values)",
    .badChunkSize: "RFC 9112 7.1: chunk-size is 1*HEXDIG; sizes above 15 hex digits are beyond any body limit and refused early",
    .badChunkExtension: "RFC 9112 7.1.1: chunk-ext = *( BWS \";\" BWS ext-name [ BWS \"=\" BWS ext-val ] )",
    .badTrailer: "RFC 9112 7.1.2: trailer fields are field lines (RFC 9112 5), checked like header fields",
    .badFieldValue: "RFC 9110 5.5: field values hold no control bytes other than HTAB",
    .badFieldName: "RFC 9110 5.1: a field name is a token",
    .whitespaceBeforeColon: "RFC 9112 5.1: a server MUST reject whitespace between a field name and the colon",
    .whitespaceBeforeFirstField: "RFC 9112 2.2: whitespace before the first field line MUST be rejected (or the line ignored)",
    .badPercentEncoding: "RFC 9110 4.1 (RFC 3986 2.1): pct-encoded is \"%\" HEXDIG HEXDIG; llhttp does not look inside the target",
    .pathAboveRoot: "RFC 9110 4.2.3 (RFC 3986 5.2.4): paths are normalized before routing; one that climbs above the root has no normal form and is refused",
    .dotSegmentParameters: "RFC 9110 4.2.3 (RFC 3986 3.3): a '..' with parameters ('..;x') is read as '..' by servlet containers; refused rather than forwarded",
    .encodedSlash: "RFC 9110 4.2.3: an encoded slash is not a separator and is never decoded; an operator may refuse it (limits.encoded_slashes)",
]

/// Where llhttp refuses a request that RFC 9110/9112 allow and that the edge
/// accepts on purpose: the request has one reading, llhttp's grammar is just
/// narrower. Keyed by llhttp's error; every other llhttp refusal must be
/// one of the edge's too.
public let deliberatelyLenient: [HTTPParserError: String] = [
    .invalidMethod: "RFC 9110 9.1: a method is any token; llhttp knows only the registered ones",
    .invalidVersion: "RFC 9110 2.5: HTTP/1.x with another minor version is read as HTTP/1.1",
    .unexpectedContentLength: "RFC 9110 8.6: repeated identical Content-Length values MAY be read as one (differing ones are refused)",
]

/// A disagreement between the two parsers that is not on either list.
public struct OracleDifference: Error, CustomStringConvertible {
    public let ours: Framing
    public let llhttp: LLHTTPFraming
    public let why: String
    public var description: String { "\(why)\n  ours:   \(ours)\n  llhttp: \(llhttp)" }
}

/// Compares the two framings: the requests both framed must be identical;
/// where llhttp refuses, the edge refuses; where the edge refuses and llhttp
/// does not, the reason must be deliberately stricter. Returns nil when
/// they agree.
public func compareFramings(_ ours: Framing, _ llhttp: LLHTTPFraming, input: [UInt8] = []) -> OracleDifference? {
    func differ(_ why: String) -> OracleDifference { OracleDifference(ours: ours, llhttp: llhttp, why: why) }
    let common = min(ours.requests.count, llhttp.requests.count)
    for k in 0..<common where ours.requests[k] != llhttp.requests[k] {
        // RFC 9110 5.5: the whitespace around a field value (OWS, HTAB
        // included) is not part of it, so `Connection: close<HTAB>` is
        // `close`; llhttp's token match stops at the HTAB and keeps the
        // connection open. The edge closes after that request: it reads
        // fewer requests, never more.
        var same = llhttp.requests[k]
        same.keepAlive = ours.requests[k].keepAlive
        if same == ours.requests[k], !ours.requests[k].keepAlive,
            fieldLine(in: input, named: "connection:", where: { $0.contains(0x09) })
        {
            return nil
        }
        return differ("request \(k) framed differently")
    }
    let oursRefusal: HTTP1Refusal? = if case let .refused(r) = ours.end { r } else { nil }
    // RFC 9110 8.6: a list of identical Content-Length values MAY be read as
    // one, and the edge does; llhttp calls the comma an invalid character.
    if case .error(.invalidContentLength) = llhttp.end, ours.requests.count >= llhttp.requests.count,
        fieldLine(in: input, named: "content-length:", where: { $0.contains(UInt8(ascii: ",")) })
    {
        return nil
    }
    // RFC 9110 5.5 again: `Transfer-Encoding: chunked<HTAB>` is chunked;
    // llhttp's token match stops at the HTAB, reads no body, then refuses
    // the chunk-size line as a request line. The edge reads the chunked body.
    if case .error = llhttp.end, ours.requests.count >= llhttp.requests.count,
        fieldLine(in: input, named: "transfer-encoding:", where: { $0.contains(0x09) })
    {
        return nil
    }
    // RFC 9110 5.6.1: a recipient MUST ignore empty list elements, and the
    // edge does (`Transfer-Encoding: chunked,`); llhttp refuses them.
    if case .error = llhttp.end, ours.requests.count >= llhttp.requests.count,
        fieldLine(in: input, named: "transfer-encoding:", where: hasEmptyListElement)
    {
        return nil
    }

    if ours.requests.count > llhttp.requests.count {
        // The edge framed a request llhttp did not: fine only if llhttp refused it for a narrower grammar.
        if case let .error(e) = llhttp.end, deliberatelyLenient[e] != nil { return nil }
        return differ("the edge framed a request that llhttp did not")
    }
    if ours.requests.count < llhttp.requests.count {
        guard let oursRefusal else { return differ("llhttp framed a request that the edge did not") }
        return deliberatelyStricter[oursRefusal] == nil ? differ("refused for .\(oursRefusal), which llhttp accepts") : nil
    }
    // The same requests; compare how each stream ended.
    switch (ours.end, llhttp.end) {
    case (.refused, .error), (.closed, .closed):
        return nil
    case (.consumedAll, .consumedAll), (.incomplete, .incomplete), (.consumedAll, .incomplete), (.incomplete, .consumedAll):
        // Neither refused and the same requests were framed; whether a partial
        // one is pending (a lone CR, say) only shows once more bytes arrive.
        return nil
    case (.incomplete, .error):
        // llhttp refuses a byte as soon as it sees it; the edge checks a head
        // (or a chunk-size line) once it has ended. End it: the edge must
        // then refuse too, framing nothing more.
        let ended = frameAll(input + Array("\r\n\r\n".utf8))
        if case .refused = ended.end, ended.requests.count == ours.requests.count { return nil }
        if case let .error(e) = llhttp.end, deliberatelyLenient[e] != nil { return nil }
        return differ("llhttp refused; the edge, given the end of the line, did not: \(ended)")
    case let (_, .error(e)):
        return deliberatelyLenient[e] != nil ? nil : differ("llhttp refused, the edge did not")
    case let (.refused(r), .incomplete):
        // The edge judges a request line as soon as it ends (an HTTP/0.9
        // line would otherwise wait for a head that never comes); llhttp may
        // wait for more. End the head: llhttp must then refuse too, unless
        // the edge's reason is a deliberate one.
        let ended = llhttpFrameAll(input + Array("\r\n\r\n".utf8))
        if case .error = ended.end, ended.requests.count == ours.requests.count { return nil }
        return deliberatelyStricter[r] == nil ? differ("refused for .\(r) at the end of the request line; llhttp, given the end of the head, did not: \(ended)") : nil
    case let (.refused(r), _):
        return deliberatelyStricter[r] == nil ? differ("refused for .\(r), which llhttp accepts") : nil
    default:
        return differ("the streams end differently")
    }
}

/// Frames `bytes` with both parsers and compares them.
public func differential(_ bytes: [UInt8]) -> (ours: Framing, llhttp: LLHTTPFraming, difference: OracleDifference?) {
    let ours = frameAll(bytes)
    let theirs = llhttpFrameAll(bytes)
    return (ours, theirs, compareFramings(ours, theirs, input: bytes))
}

/// Whether a line of `input` starts with `name` (a field name and its
/// colon, lower-case; compared without case) and its value passes `test`.
func fieldLine(in input: [UInt8], named name: String, where test: (ArraySlice<UInt8>) -> Bool) -> Bool {
    let name = Array(name.utf8)
    var lineStart = 0
    while lineStart + name.count <= input.count {
        var end = lineStart
        while end < input.count, input[end] != 0x0A { end += 1 }
        if end - lineStart >= name.count,
            zip(input[lineStart..<(lineStart + name.count)], name).allSatisfy({ $0 | 0x20 == $1 | 0x20 }),
            test(input[(lineStart + name.count)..<end])
        {
            return true
        }
        lineStart = end + 1
    }
    return false
}

/// A comma-separated value with an empty element: nothing but whitespace
/// before the first comma, after the last, or between two.
func hasEmptyListElement(_ value: ArraySlice<UInt8>) -> Bool {
    let trimmed = value.filter { $0 != 0x20 && $0 != 0x09 && $0 != 0x0D }
    guard trimmed.contains(UInt8(ascii: ",")) else { return false }
    return trimmed.first == UInt8(ascii: ",") || trimmed.last == UInt8(ascii: ",")
        || zip(trimmed, trimmed.dropFirst()).contains { $0 == UInt8(ascii: ",") && $1 == UInt8(ascii: ",") }
}
