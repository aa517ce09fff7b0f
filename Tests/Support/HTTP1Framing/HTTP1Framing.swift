import HappyPathCore

/// One request the parser framed out of a byte stream.
public struct FramedRequest: Equatable, Sendable, CustomStringConvertible {
    public var method: [UInt8]
    public var target: [UInt8]
    public var body: [UInt8]
    /// Whether the connection stays open after it; when it does not, the
    /// bytes that follow are never read.
    public var keepAlive: Bool

    public init(method: [UInt8], target: [UInt8], body: [UInt8], keepAlive: Bool) {
        self.method = method
        self.target = target
        self.body = body
        self.keepAlive = keepAlive
    }

    public var description: String {
        let m = String(decoding: method, as: UTF8.self)
        let t = String(decoding: target, as: UTF8.self)
        let b = String(decoding: body, as: UTF8.self)
        return "\(m) \(t.debugDescription) body=\(b.debugDescription)\(keepAlive ? "" : " (close)")"
    }
}

/// Everything a connection's bytes frame into: the requests, in order, then
/// how the stream ended.
public struct Framing: Equatable, Sendable, CustomStringConvertible {
    public enum End: Equatable, Sendable {
        /// Every byte belongs to a framed request (or is an empty line before one).
        case consumedAll
        /// A request has started and not ended.
        case incomplete
        case refused(HTTP1Refusal)
        /// The last request does not keep the connection open: what follows is never read.
        case closed
    }

    public var requests: [FramedRequest]
    public var end: End

    public init(requests: [FramedRequest], end: End) {
        self.requests = requests
        self.end = end
    }

    public var description: String {
        "\(requests.count) request(s) \(requests.map(\.description)) then \(end)"
    }
}

/// Limits under which the only refusals are the protocol's: nothing a fuzz
/// input or an oracle case can reach is refused for its size alone.
public let generousLimits = RequestLimits(
    maxHeadBytes: 80 * 1024, maxRequestLineBytes: 80 * 1024, maxFields: 10_000, maxBodyBytes: Int.max / 2)

/// Frames a whole byte stream as a connection would see it: every request
/// head scanned and parsed, its body read by Content-Length or decoded as
/// chunked, and the bytes after it taken as the next pipelined request.
///
/// `arrivals` are the offsets at which the stream is cut into reads; the
/// framing must not depend on them (every call traps when an invariant of
/// the parser breaks, so a fuzzer can call this directly).
public func frameAll(_ bytes: [UInt8], limits: RequestLimits = generousLimits, arrivals: [Int] = []) -> Framing {
    var framer = StreamFramer(limits: limits)
    var from = 0
    for cut in arrivals.sorted() where cut > from && cut < bytes.count {
        framer.feed(bytes[from..<cut])
        from = cut
    }
    framer.feed(bytes[from...])
    return framer.finish()
}

/// The per-connection state machine behind `frameAll`, fed one read at a time.
public struct StreamFramer {
    private enum State {
        case head
        case contentLength(FramedRequest, remaining: Int)
        case chunked(FramedRequest, ChunkedDecoder)
        case finished(Framing.End)
    }

    private let limits: RequestLimits
    private var state = State.head
    private var scanner = RequestHeadScanner()
    /// Bytes received and not yet consumed; the scanner's offsets are into this.
    private var pending: [UInt8] = []
    private var fields: [HTTP1Field] = []
    public private(set) var requests: [FramedRequest] = []

    public init(limits: RequestLimits) { self.limits = limits }

    public mutating func feed<C: Collection<UInt8>>(_ read: C) {
        if case .finished = state { return }
        pending.append(contentsOf: read)
        step()
    }

    public mutating func finish() -> Framing {
        let end: Framing.End
        switch state {
        case let .finished(e): end = e
        // Only empty lines left (RFC 9112 section 2.2 lets a server ignore them) is not a started request.
        case .head: end = scanner.started ? .incomplete : .consumedAll
        case .contentLength, .chunked: end = .incomplete
        }
        return Framing(requests: requests, end: end)
    }

    /// What routes and upstreams see is a normal path: no dot-segment in
    /// any spelling (`.`, `..`, `%2e`, `..;`), and normalizing it again
    /// changes nothing.
    private func checkPath(_ head: RequestHead, normalized: String?) {
        guard head.form != .asterisk else { return }
        let raw = Array(pending[head.pathAndQuery])
        let pathBytes = raw.prefix { $0 != UInt8(ascii: "?") }
        let path = normalized ?? String(decoding: pathBytes, as: UTF8.self)
        for segment in path.split(separator: "/", omittingEmptySubsequences: false) {
            precondition(!PathNormalizer.isDotLike(segment), "dot-segment '\(segment)' left in \(path)")
            precondition(!segment.lowercased().contains("%2e"), "encoded dot left in \(path)")
        }
        precondition(PathNormalizer.normalize(path, limits.path) == .success(path), "normalizing \(path) again changes it")
    }

    private mutating func step() {
        while true {
            switch state {
            case .finished:
                return
            case .head:
                let scanned = pending.withUnsafeBytes { scanner.scan($0, limits: limits) }
                switch scanned {
                case .incomplete:
                    return
                case let .refused(r):
                    state = .finished(.refused(r))
                case let .complete(start, end):
                    precondition(0 <= start && start < end && end <= pending.count, "head \(start)..<\(end) outside the buffer")
                    var normalized: String?
                    let line = scanner.requestLine
                    let parsed = pending.withUnsafeBytes {
                        RequestHeadParser.parse(
                            $0, requestStart: start, end: end, limits: limits, fields: &fields, normalizedPath: &normalized,
                            requestLine: line)
                    }
                    switch parsed {
                    case let .failure(r):
                        state = .finished(.refused(r))
                    case let .success(head):
                        checkRanges(head, start: start, end: end)
                        checkPath(head, normalized: normalized)
                        let request = FramedRequest(
                            method: Array(pending[head.method]), target: Array(pending[head.target]), body: [],
                            keepAlive: head.keepAlive)
                        pending.removeFirst(end)
                        scanner.reset()
                        switch head.framing {
                        case .none: emit(request)
                        case let .contentLength(n):
                            precondition(n > 0 && n <= limits.maxBodyBytes, "Content-Length framing of \(n)")
                            state = .contentLength(request, remaining: n)
                        case .chunked: state = .chunked(request, ChunkedDecoder(limits: limits))
                        }
                    }
                }
            case .contentLength(var request, let remaining):
                let take = min(remaining, pending.count)
                request.body += pending[0..<take]
                pending.removeFirst(take)
                if take == remaining {
                    emit(request)
                } else {
                    state = .contentLength(request, remaining: remaining - take)
                    return
                }
            case .chunked(var request, var decoder):
                let result = pending.withUnsafeBytes { buf in
                    decoder.decode(buf) { request.body.append(contentsOf: $0) }
                }
                switch result {
                case let .needMore(consumed):
                    precondition(consumed >= 0 && consumed <= pending.count, "needMore(\(consumed)) of \(pending.count)")
                    pending.removeFirst(consumed)
                    state = .chunked(request, decoder)
                    return
                case let .done(consumed):
                    precondition(consumed >= 0 && consumed <= pending.count, "done(\(consumed)) of \(pending.count)")
                    precondition(request.body.count == decoder.bodyBytes, "chunk sizes add up to \(decoder.bodyBytes), \(request.body.count) bytes delivered")
                    pending.removeFirst(consumed)
                    emit(request)
                case let .refused(r):
                    state = .finished(.refused(r))
                }
            }
        }
    }

    private mutating func emit(_ request: FramedRequest) {
        requests.append(request)
        state = request.keepAlive ? .head : .finished(.closed)
    }

    /// Every range the parser hands out lies inside the head it parsed.
    private func checkRanges(_ head: RequestHead, start: Int, end: Int) {
        let inHead = start..<end
        func inside(_ r: Range<Int>, _ what: String) {
            precondition(r.lowerBound >= start && r.upperBound <= end && r.lowerBound <= r.upperBound, "\(what) \(r) outside head \(inHead)")
        }
        precondition(head.headLength == end, "headLength \(head.headLength) != end \(end)")
        inside(head.method, "method")
        precondition(!head.method.isEmpty && !head.target.isEmpty, "empty method or target")
        inside(head.target, "target")
        inside(head.pathAndQuery, "path and query")
        precondition(head.pathAndQuery.upperBound == head.target.upperBound, "path and query is not the target's tail")
        if let host = head.host { inside(host, "host") }
        for f in fields {
            inside(f.nameStart..<f.nameEnd, "field name")
            inside(f.valueStart..<f.valueEnd, "field value")
            precondition(f.nameStart < f.nameEnd && f.nameEnd < f.valueStart + 1, "field \(f) out of order")
        }
    }
}

/// The fuzz check on the parser: framing `bytes` whole, byte by byte, and
/// cut at `cut` (any value; reduced into range) must all give one answer.
/// Traps otherwise. Returns the whole-stream framing.
@discardableResult
public func checkFramingInvariants(_ bytes: [UInt8], cut: Int) -> Framing {
    let whole = frameAll(bytes)
    let split = frameAll(bytes, arrivals: [bytes.isEmpty ? 0 : abs(cut % (bytes.count + 1))])
    precondition(whole == split, "whole vs split at \(cut): \(whole) vs \(split)")
    let trickled = frameAll(bytes, arrivals: Array(0..<bytes.count))
    precondition(whole == trickled, "whole vs byte by byte: \(whole) vs \(trickled)")
    // A prefix of the stream frames a prefix of the requests, and a refusal
    // decided on a prefix is final: more bytes never turn it into a request.
    let prefix = frameAll(Array(bytes.prefix(abs(cut % (bytes.count + 1)))))
    precondition(prefix.requests.count <= whole.requests.count, "prefix framed more: \(prefix) vs \(whole)")
    precondition(Array(whole.requests.prefix(prefix.requests.count)) == prefix.requests, "prefix framed differently: \(prefix) vs \(whole)")
    switch prefix.end {
    case .refused, .closed: precondition(prefix == whole, "refusal on a prefix not final: \(prefix) vs \(whole)")
    case .incomplete, .consumedAll: break
    }
    return whole
}

/// FNV-1a of the input: a cut point that varies with the input without
/// spending input bytes on it.
public func fnv1a(_ bytes: [UInt8]) -> Int {
    var h: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in bytes {
        h ^= UInt64(b)
        h &*= 0x100_0000_01b3
    }
    return Int(truncatingIfNeeded: h >> 1)
}
