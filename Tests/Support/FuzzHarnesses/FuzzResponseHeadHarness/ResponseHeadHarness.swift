// The check of the FuzzResponseHead target, in a library so that the fuzz
// executable and the seed replay tests (HappyPathFuzzSeedTests) run the same
// code: an upstream's response head (ResponseFraming), a status line, then
// field lines up to the empty line, and the rules for keeping an answer
// (StaleRules).
import HappyPathCore
import HappyPathPolicies

/// What the head did, for the replay driver's output.
struct ResponseHeadCheck: CustomStringConvertible {
    var status: Int?
    var verdict: Result<Int?, ResponseFramingError>?
    var description: String { "status \(status.map(String.init) ?? "invalid"), verdict \(verdict.map { "\($0)" } ?? "-")" }
}

public enum ResponseHeadHarness {
    /// Splits `bytes` into CRLF lines the way the upstream reader does, feeds
    /// them to ResponseFraming and traps on any broken invariant.
    public static func check(_ bytes: [UInt8]) -> String {
        checkReader(bytes)
        return "\(checkHead(bytes))"
    }
}

/// The reader of the heads the proxy reads itself (an upgrade try's:
/// ResponseHeadReader), on the same bytes: where a head ends, found at
/// once or in two parts, is the first empty line; what it reads is what
/// the line says.
func checkReader(_ bytes: [UInt8]) {
    bytes.withUnsafeBytes { raw in
        var first: Int?
        var i = 0
        while i + 3 < raw.count, first == nil {
            if raw[i] == 0x0D, raw[i + 1] == 0x0A, raw[i + 2] == 0x0D, raw[i + 3] == 0x0A { first = i + 4 }
            i += 1
        }
        let end = ResponseHeadReader.end(of: raw, from: 0)
        precondition(end == first, "head end \(String(describing: end)), the first empty line at \(String(describing: first))")
        let split = raw.count / 2
        let inParts =
            ResponseHeadReader.end(of: UnsafeRawBufferPointer(rebasing: raw[0..<split]), from: 0)
            ?? ResponseHeadReader.end(of: raw, from: split)
        precondition(inParts == end, "read in two parts, the head ends elsewhere")
        let head = UnsafeRawBufferPointer(rebasing: raw[0..<(end ?? raw.count)])
        var sawStatus: Int?
        let result = ResponseHeadReader.read(head) { name, value in
            precondition(sawStatus != nil, "a field before the status")
            precondition(!name.isEmpty && !name.contains(0x3A), "a field name that is empty or holds a colon")
            precondition(name.first != 0x20 && name.first != 0x09, "a folded line read as a field")
            precondition(!name.contains(0x0A) && !value.contains(0x0A) && !value.contains(0x0D), "a line break inside a field")
            for edge in [value.first, value.last] { precondition(edge != 0x20 && edge != 0x09, "a value with spaces around it") }
        } status: { status, _ in
            sawStatus = status
        }
        if case let .success(h) = result {
            precondition(h.status == sawStatus, "the status reported is not the one returned")
            precondition((100...599).contains(h.status), "status \(h.status) out of range")
        }
    }
}

/// Splits, feeds, checks; returns what the head did.
func checkHead(_ bytes: [UInt8]) -> ResponseHeadCheck {
    var lines: [ArraySlice<UInt8>] = []
    var start = 0
    var i = 0
    while i + 1 < bytes.count {
        if bytes[i] == 0x0D, bytes[i + 1] == 0x0A {
            lines.append(bytes[start..<i])
            start = i + 2
            i += 2
        } else {
            i += 1
        }
    }
    lines.append(bytes[start...])

    var result = ResponseHeadCheck()
    result.status = lines[0].withUnsafeBytes { ResponseFraming.status(ofLine: $0) }
    if let status = result.status {
        precondition((100...599).contains(status), "status \(status) out of range")
        // `HTTP/1.x NNN` or libcurl's `HTTP/2 NNN` (no minor version).
        let at = lines[0].starts(with: Array("HTTP/2 ".utf8)) ? 7 : 9
        let digits = lines[0].dropFirst(at).prefix(3).reduce(0) { $0 * 10 + Int($1) - 0x30 }
        precondition(digits == status, "status \(status) is not the line's digits \(digits)")
    }

    var framing = ResponseFraming()
    var addedContentLength = false
    var addedTransferEncoding = false
    var fields: [HTTPField] = []
    for line in lines.dropFirst() {
        if line.isEmpty { break }
        let colon = line.firstIndex(of: UInt8(ascii: ":")) ?? line.endIndex
        let name = Array(line[line.startIndex..<colon])
        var value = colon < line.endIndex ? Array(line[(colon + 1)...]) : []
        while let f = value.first, f == 0x20 || f == 0x09 { value.removeFirst() }
        while let l = value.last, l == 0x20 || l == 0x09 { value.removeLast() }
        let lower = String(decoding: name, as: UTF8.self).lowercased()
        fields.append(HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
        let forwarded = name.withUnsafeBytes { n in value.withUnsafeBytes { v in framing.add(name: n, value: v) } }
        if lower == "content-length" || lower == "transfer-encoding" {
            // The proxy writes its own framing: the upstream's is never forwarded.
            precondition(!forwarded, "\(lower) would be forwarded")
            if lower == "content-length" { addedContentLength = true } else { addedTransferEncoding = true }
        }
    }
    let verdict = framing.verdict()
    result.verdict = verdict
    if addedContentLength && addedTransferEncoding {
        guard case .failure = verdict else { preconditionFailure("CL with TE accepted: \(verdict)") }
    }
    if case let .success(length) = verdict {
        if addedTransferEncoding { precondition(length == nil, "a length announced for a chunked response") }
        if length != nil { precondition(addedContentLength, "a length without Content-Length") }
        if addedContentLength && !addedTransferEncoding { precondition(length != nil, "Content-Length lost") }
    }
    checkStaleRules(status: result.status ?? 200, fields: fields)
    return result
}

/// The same fields as an answer `fallback.serve_stale` might keep: what
/// is kept for a request with credentials is kept without, for as long
/// and under the same `Vary` (for everyone only if it said `public` or
/// `s-maxage`, else for the same credentials alone); what is kept for a
/// request without them is everyone's; a Set-Cookie or `Vary: *` is never
/// kept; the time is within the route's.
func checkStaleRules(status: Int, fields: [HTTPField]) {
    let serveStale = Duration.seconds(600)
    let open = StaleRules.decide(method: "GET", status: status, fields: fields, requestHasCredentials: false, serveStale: serveStale)
    let credentialed = StaleRules.decide(
        method: "GET", status: status, fields: fields, requestHasCredentials: true, serveStale: serveStale)
    if let credentialed {
        precondition(
            open?.keepFor == credentialed.keepFor && open?.varyNames == credentialed.varyNames,
            "kept for a user, not for everyone: \(credentialed)")
    }
    guard let open else { return }
    precondition(open.shared, "an answer to a request without credentials kept for one user only")
    precondition(StaleRules.keptStatuses.contains(status), "status \(status) kept")
    precondition(open.keepFor > .zero && open.keepFor <= serveStale, "kept for \(open.keepFor)")
    precondition(!fields.contains { $0.name.lowercased() == "set-cookie" }, "a Set-Cookie answer kept")
    precondition(!open.varyNames.contains("*"), "Vary: * kept")
    precondition(open.varyNames.allSatisfy { $0 == $0.lowercased() && !$0.isEmpty }, "vary names \(open.varyNames)")
    precondition(Set(open.varyNames).count == open.varyNames.count, "repeated vary names \(open.varyNames)")
}
