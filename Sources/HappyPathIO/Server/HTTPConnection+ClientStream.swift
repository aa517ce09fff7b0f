import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// The HTTP/1.1 connection as the stream of the one request it answers at a
/// time (`current`). The request's head is read in place from the read
/// buffer; the answer's head is composed in `response` (reused from request
/// to request) and framed as the machine decides (`responseStarted`,
/// `bodyBytes`, `responseShort`): `Content-Length`, chunked, or the close.
extension HTTPConnection: ClientStream {
    /// Whether `request` is the one this connection answers now.
    func carries(_ request: HTTPRequest) -> Bool { current === request }

    /// The current request is HTTP/1.1 (a `101` needs it).
    var speaksHTTP11: Bool { head?.version == .http11 }

    // MARK: - The request

    func protocolName(of request: HTTPRequest) -> StaticString {
        head?.version == .http10 ? "HTTP/1.0" : "HTTP/1.1"
    }

    func method(of request: HTTPRequest) -> String? {
        guard current === request, let head else { return nil }
        return String(decoding: UnsafeRawBufferPointer(rebasing: requestBytes[head.method]), as: UTF8.self)
    }

    func target(of request: HTTPRequest) -> String? {
        guard current === request, let head else { return nil }
        let raw = UnsafeRawBufferPointer(rebasing: requestBytes[head.pathAndQuery])
        var t: String
        if let path = machine.normalizedPath {
            // The parser normalized the path (PathNormalizer); the query stays as it came.
            t = path
            if let q = raw.firstIndex(of: UInt8(ascii: "?")) {
                t += String(decoding: UnsafeRawBufferPointer(rebasing: raw[q...]), as: UTF8.self)
            }
        } else {
            t = String(decoding: raw, as: UTF8.self)
        }
        if head.form == .absolute, raw.first != UInt8(ascii: "/") { t = "/" + t }
        return t
    }

    func head(of request: HTTPRequest) -> ClientRequestHead? {
        guard current === request, let head else { return nil }
        return ClientRequestHead(
            isAsteriskForm: head.form == .asterisk, size: head.headLength,
            connectionNominatesFields: head.connectionNominatesFields, isSecure: tls != nil)
    }

    func forEachField(
        of request: HTTPRequest, _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void
    ) {
        guard current === request, head != nil else { return }
        let bytes = requestBytes
        for f in machine.fields {
            body(
                UnsafeRawBufferPointer(rebasing: bytes[f.nameStart..<f.nameEnd]),
                UnsafeRawBufferPointer(rebasing: bytes[f.valueStart..<f.valueEnd]))
        }
    }

    func nominatedFields(of request: HTTPRequest) -> [Bool] {
        guard current === request, head != nil else { return [] }
        let fields = machine.fields
        var marks = [Bool](repeating: false, count: fields.count)
        let bytes = requestBytes
        for f in fields where HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: bytes[f.nameStart..<f.nameEnd]), "connection") {
            NominatedFields.mark(
                count: fields.count,
                name: { UnsafeRawBufferPointer(rebasing: bytes[fields[$0].nameStart..<fields[$0].nameEnd]) },
                connectionValue: UnsafeRawBufferPointer(rebasing: bytes[f.valueStart..<f.valueEnd]), nominated: &marks)
        }
        return marks
    }

    /// The body read, handed over once (the connection keeps no copy).
    func takeBody(of request: HTTPRequest) -> RequestBody {
        guard current === request else { return .empty }
        return input.takeBody()
    }

    /// The delegate lets the body of the head it held come now.
    func resumeReading(for request: HTTPRequest) {
        guard current === request, readEvent != nil else { return }
        perform(machine.releaseBody())
    }

    // MARK: - The answer

    func stageField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request else { return }
        response.stage(name: name, value: value)
    }

    /// Kept for the last chunk only when the answer is chunked and the
    /// client said it takes trailers (`TE: trailers`, RFC 9110 section
    /// 6.5.1); otherwise dropped, as a client that did not ask may not
    /// expect them.
    func stageTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request, machine.framing == .chunked, clientTakesTrailers else { return }
        response.stageTrailer(name: name, value: value)
    }

    /// The request's `TE` lists `trailers`.
    private var clientTakesTrailers: Bool {
        guard head != nil else { return false }
        let bytes = requestBytes
        var takes = false
        for f in machine.fields where HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: bytes[f.nameStart..<f.nameEnd]), "te") {
            forEachListElement(UnsafeRawBufferPointer(rebasing: bytes[f.valueStart..<f.valueEnd])) { token in
                if HTTPBytes.equals(token, "trailers") { takes = true }
            }
        }
        return takes
    }

    func clearStagedFields(for request: HTTPRequest) {
        guard current === request else { return }
        response.clearStaged()
    }

    func removeStagedFields(nominatedBy connectionValue: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request else { return }
        response.removeNominated(by: connectionValue)
    }

    /// Not to an HTTP/1.0 client (it does not know 1xx).
    func writeInformational(status: Int, fields: UnsafeRawBufferPointer, for request: HTTPRequest) {
        guard current === request, head?.version == .http11, !response.headPending, (102..<200).contains(status) else {
            return
        }
        var line = "HTTP/1.1 \(status) \(reasonPhrase(status))\r\n"
        line.withUTF8 { first in
            _ = write([UnsafeRawBufferPointer(first), fields, crlf])
        }
    }

    /// Composes the head now; it leaves with the first body bytes (one
    /// write). `Content-Length` when the length is known, else chunked
    /// (HTTP/1.1) or the close (HTTP/1.0).
    func writeHead(status: Int, contentLength: Int?, reason: [UInt8]?, for request: HTTPRequest) {
        guard current === request else { return }
        let framed = machine.responseStarted(status: status, contentLength: contentLength)
        response.composeHead(
            status: status, contentLength: framed.contentLength, chunked: framed.chunked, close: framed.close,
            server: server, reason: reason)
        response.headPending = true
    }

    func writeBodyPart(_ bytes: UnsafeRawBufferPointer, notifyWhenDrained notify: Bool, for request: HTTPRequest) {
        guard current === request else { return }
        let head = takePendingHead()
        // Never more than announced: the client frames by this length.
        let n = machine.bodyBytes(bytes.count)
        if machine.framing == .chunked, n > 0 {
            response.chunkLine.count = 0
            response.chunkLine.append(hex: n)
            response.chunkLine.append("\r\n")
            write([head, response.chunkLine.bytes, bytes, crlf])
        } else {
            write([head, UnsafeRawBufferPointer(rebasing: bytes[0..<n])])
        }
        if notify, current === request { notifyWhenDrained() }
    }

    func writeWhole(status: Int, body: UnsafeRawBufferPointer, for request: HTTPRequest) -> Bool {
        guard current === request else { return false }
        let framed = machine.responseStarted(status: status, contentLength: body.count, whole: true)
        response.composeHead(
            status: status, contentLength: framed.contentLength, chunked: false, close: framed.close, server: server)
        write([response.headOut.bytes, framed.hasBody ? body : UnsafeRawBufferPointer(start: nil, count: 0)])
        response.headPending = false
        finished(request)
        return true
    }

    func end(_ request: HTTPRequest) -> Bool {
        guard current === request else { return false }
        let head = takePendingHead()
        if machine.framing == .chunked {
            if response.trailers.isEmpty {
                write([head, lastChunk])
            } else {
                let trailers = response.trailers
                _ = trailers.withUnsafeBytes { write([head, zeroChunk, $0, crlf]) }
            }
        } else {
            write([head])
            if machine.responseShort {
                cancel(request)
                return true
            }
        }
        finished(request)
        return true
    }

    /// Closes the connection without telling the request.
    func cancel(_ request: HTTPRequest) {
        // Not this connection's request (any more): nothing of it is left to break off.
        guard current === request else { return }
        current = nil
        close()
    }

    func pendingOutput(for request: HTTPRequest) -> Int {
        guard current === request else { return 0 }
        return pendingOutput
    }

    /// The connection's bound less what is queued (nothing while the spool
    /// holds bytes: they go first), plus what the answer may still read
    /// ahead into the spool.
    func outputRoom(for request: HTTPRequest) -> Int {
        guard current === request else { return 0 }
        let memory = spool?.isEmpty == false ? 0 : server.limits.connectionBuffer - output.pending
        let ahead = readAheadRoom
        return ahead > 0 ? max(0, memory) + ahead : memory
    }

    func permitReadAhead(for request: HTTPRequest) {
        guard current === request, let readAhead = server.limits.spool, readAhead.perAnswer > 0 else { return }
        readsAhead = true
        spool?.limit = readAhead.perAnswer
    }

    /// The staged head if it has not left yet (it goes with the next write).
    private func takePendingHead() -> UnsafeRawBufferPointer {
        defer { response.headPending = false }
        return response.headPending ? response.headOut.bytes : UnsafeRawBufferPointer(start: nil, count: 0)
    }
}

nonisolated(unsafe) private let crlf = UnsafeRawBufferPointer(start: StaticString("\r\n").utf8Start, count: 2)
nonisolated(unsafe) private let zeroChunk = UnsafeRawBufferPointer(start: StaticString("0\r\n").utf8Start, count: 3)
nonisolated(unsafe) private let lastChunk = UnsafeRawBufferPointer(start: StaticString("0\r\n\r\n").utf8Start, count: 5)
