import HappyPathCore

/// An HTTP/1.1 answer's head: the staged fields, then the status line and
/// fields composed with the framing the connection's machine chose
/// (HTTPConnection+ClientStream.swift). Kept by the connection and reused
/// from request to request.
struct ResponseState {
    /// `Name: value\r\n` lines, in order.
    var staged = ByteBuffer(capacity: 512)
    /// Each staged line: where it starts, where its name ends, where it ends.
    var entries: [(start: Int, nameEnd: Int, end: Int)] = []
    var removed: [Bool] = []
    var anyRemoved = false
    var hasDate = false
    var headOut = ByteBuffer(capacity: 1024)
    var headPending = false
    var chunkLine = ByteBuffer(capacity: 32)
    var version = HTTPVersion.http11
    var isHead = false
    /// Trailer fields for the last chunk, `Name: value\r\n` lines (no
    /// storage until an answer has some).
    var trailers: [UInt8] = []

    mutating func reset(version: HTTPVersion, isHead: Bool) {
        clearStaged()
        headPending = false
        self.version = version
        self.isHead = isHead
    }

    mutating func clearStaged() {
        staged.count = 0
        entries.removeAll(keepingCapacity: true)
        anyRemoved = false
        hasDate = false
        if !trailers.isEmpty { trailers.removeAll(keepingCapacity: true) }
    }

    func deallocate() {
        staged.deallocate()
        headOut.deallocate()
        chunkLine.deallocate()
    }

    mutating func stage(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        // The framing is the stream's alone (`writeHead(contentLength:)`),
        // so that a response can never carry two.
        if name.count == 14, HTTPBytes.equals(name, "content-length") { return }
        if name.count == 17, HTTPBytes.equals(name, "transfer-encoding") { return }
        let start = staged.count
        staged.append(name)
        let nameEnd = staged.count
        staged.append(": ")
        staged.append(value)
        staged.append("\r\n")
        entries.append((start, nameEnd, staged.count))
        if name.count == 4, HTTPBytes.equals(name, "date") { hasDate = true }
    }

    /// A trailer field for the last chunk (the caller checked that the
    /// client takes trailers and the answer is chunked).
    mutating func stageTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        trailers.append(contentsOf: name)
        trailers.append(contentsOf: [0x3A, 0x20])
        trailers.append(contentsOf: value)
        trailers.append(contentsOf: [0x0D, 0x0A])
    }

    mutating func removeNominated(by connectionValue: UnsafeRawBufferPointer) {
        removed.removeAll(keepingCapacity: true)
        let bytes = staged.bytes
        let entries = self.entries
        NominatedFields.mark(
            count: entries.count, name: { UnsafeRawBufferPointer(rebasing: bytes[entries[$0].start..<entries[$0].nameEnd]) },
            connectionValue: connectionValue, nominated: &removed)
        anyRemoved = removed.contains(true)
    }

    mutating func composeHead(
        status: Int, contentLength: Int?, chunked: Bool, close: Bool, server: HTTPServer, reason: [UInt8]? = nil
    ) {
        headOut.count = 0
        headOut.append("HTTP/1.1 ")
        headOut.append(decimal: status)
        headOut.append(byte: 0x20)
        if let reason {
            reason.withUnsafeBytes { headOut.append($0) }
        } else {
            headOut.append(reasonPhrase(status))
        }
        headOut.append("\r\n")
        if anyRemoved {
            for (k, e) in entries.enumerated() where !(k < removed.count && removed[k]) {
                headOut.append(UnsafeRawBufferPointer(rebasing: staged.bytes[e.start..<e.end]))
            }
        } else {
            headOut.append(staged.bytes)
        }
        if !hasDate { server.dateHeader.withLine { headOut.append($0) } }
        if let contentLength {
            headOut.append("Content-Length: ")
            headOut.append(decimal: contentLength)
            headOut.append("\r\n")
        } else if chunked {
            headOut.append("Transfer-Encoding: chunked\r\n")
        }
        if close {
            headOut.append("Connection: close\r\n")
        } else if version == .http10 {
            headOut.append("Connection: keep-alive\r\n")
        }
        headOut.append("\r\n")
    }
}

/// The proxy's own reason phrase for `status` (RFC 9110 section 15).
public func reasonPhrase(_ status: Int) -> StaticString {
    switch status {
    case 100: "Continue"
    case 101: "Switching Protocols"
    case 102: "Processing"
    case 103: "Early Hints"
    case 200: "OK"
    case 201: "Created"
    case 202: "Accepted"
    case 203: "Non-Authoritative Information"
    case 204: "No Content"
    case 205: "Reset Content"
    case 206: "Partial Content"
    case 300: "Multiple Choices"
    case 301: "Moved Permanently"
    case 302: "Found"
    case 303: "See Other"
    case 304: "Not Modified"
    case 307: "Temporary Redirect"
    case 308: "Permanent Redirect"
    case 400: "Bad Request"
    case 401: "Unauthorized"
    case 403: "Forbidden"
    case 404: "Not Found"
    case 405: "Method Not Allowed"
    case 406: "Not Acceptable"
    case 408: "Request Timeout"
    case 409: "Conflict"
    case 410: "Gone"
    case 411: "Length Required"
    case 412: "Precondition Failed"
    case 413: "Content Too Large"
    case 414: "URI Too Long"
    case 415: "Unsupported Media Type"
    case 416: "Range Not Satisfiable"
    case 417: "Expectation Failed"
    case 421: "Misdirected Request"
    case 422: "Unprocessable Content"
    case 425: "Too Early"
    case 426: "Upgrade Required"
    case 428: "Precondition Required"
    case 429: "Too Many Requests"
    case 431: "Request Header Fields Too Large"
    case 451: "Unavailable For Legal Reasons"
    case 500: "Internal Server Error"
    case 501: "Not Implemented"
    case 502: "Bad Gateway"
    case 503: "Service Unavailable"
    case 504: "Gateway Timeout"
    case 505: "HTTP Version Not Supported"
    default:
        status < 200
            ? "Informational"
            : status < 300 ? "Success" : status < 400 ? "Redirection" : status < 500 ? "Client Error" : "Server Error"
    }
}
