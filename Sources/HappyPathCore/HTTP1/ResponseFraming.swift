/// Checks an upstream response head before any of it reaches the client.
///
/// The proxy never forwards an upstream's framing as it came: the client's
/// `Content-Length` or chunked coding is written by the proxy. A head that
/// could be framed two ways (Content-Length with Transfer-Encoding,
/// differing Content-Lengths, a Content-Length that is not a number) or that
/// has an invalid status code makes the try fail (BAD_GATEWAY once the retry
/// rules give up), and the upstream connection is not reused.
public struct ResponseFraming: Sendable {
    private var contentLength: Int?
    private var sawContentLength = false
    private var sawTransferEncoding = false
    private var fault: String?

    public init() {}

    /// A status line: `HTTP/1.x SP 3DIGIT [SP reason]`, or the line libcurl
    /// writes for an HTTP/2 answer, `HTTP/2 SP 3DIGIT [SP]` (no minor
    /// version, never a reason: HTTP/2 has none); status 100...599.
    /// Returns the status, or nil when the line is not valid.
    public static func status(ofLine line: UnsafeRawBufferPointer) -> Int? {
        let n = line.count
        guard n >= 10, line[0] == 0x48, line[1] == 0x54, line[2] == 0x54, line[3] == 0x50, line[4] == 0x2F else {
            return nil
        }
        let digits: Int
        if line[5] == 0x32, line[6] == 0x20 {  // "HTTP/2 "
            guard n == 10 || (n == 11 && line[10] == 0x20) else { return nil }
            digits = 7
        } else {
            guard n >= 12, line[5] == 0x31, line[6] == 0x2E, line[7] >= 0x30, line[7] <= 0x39, line[8] == 0x20 else {
                return nil
            }
            guard n == 12 || line[12] == 0x20 else { return nil }
            digits = 9
        }
        var status = 0
        for i in digits..<digits + 3 {
            let d = line[i]
            guard d >= 0x30, d <= 0x39 else { return nil }
            status = status * 10 + Int(d - 0x30)
        }
        guard (100...599).contains(status) else { return nil }
        return status
    }

    /// Where the reason phrase of a valid status line starts: after
    /// `HTTP/1.x NNN `, or at the end for `HTTP/2` (which has none).
    public static func reasonStart(ofLine line: UnsafeRawBufferPointer) -> Int {
        line.count > 5 && line[5] == 0x32 ? line.count : min(13, line.count)
    }

    /// One header of the final response. Returns whether the proxy forwards
    /// it: never the framing fields (the proxy writes its own).
    public mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        // A name that is not a token, or a value with a control byte (a bare
        // CR could split the line for a lenient client): never forwarded.
        if name.isEmpty || !name.allSatisfy({ HTTPBytes.isToken($0) }) {
            fault = fault ?? "a header name is not a token"
            return false
        }
        if !value.allSatisfy({ HTTPBytes.isFieldValue($0) }) {
            fault = fault ?? "a header value contains a control byte"
            return false
        }
        switch name.count {
        case 14 where HTTPBytes.equals(name, "content-length"):
            sawContentLength = true
            // The same rule as for requests: digits, and several values only if equal.
            switch RequestHeadParser.parseContentLength(value, previous: contentLength) {
            case let .success(n): contentLength = n
            case .failure(.conflictingContentLength): fault = fault ?? "it carries differing Content-Length values"
            case .failure: fault = fault ?? "its Content-Length is not a number"
            }
            return false
        case 17 where HTTPBytes.equals(name, "transfer-encoding"):
            sawTransferEncoding = true
            // libcurl removes the chunked coding and no other: a body still
            // gzip-coded would reach the client with nothing saying so.
            // (Chunked twice would leave a body that is still chunked.)
            var chunked = 0
            var other = false
            forEachListElement(value) { if HTTPBytes.equals($0, "chunked") { chunked += 1 } else { other = true } }
            if other || chunked > 1 { fault = fault ?? "its Transfer-Encoding is not chunked alone" }
            return false
        default:
            return true
        }
    }

    /// After the last header: the length to announce to the client (nil:
    /// unknown, so chunked or close-delimited), or why the head is refused.
    public func verdict() -> Result<Int?, ResponseFramingError> {
        if let fault { return .failure(ResponseFramingError(message: "The upstream sent an invalid response head: \(fault).")) }
        if sawTransferEncoding, sawContentLength {
            return .failure(
                ResponseFramingError(
                    message: "The upstream's response is ambiguous: it carries both Content-Length and Transfer-Encoding."))
        }
        return .success(sawTransferEncoding ? nil : contentLength)
    }
}

public struct ResponseFramingError: Error, Sendable, Equatable {
    public let message: String
}
