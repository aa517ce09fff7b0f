import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A client connection's read side: the read buffer and the body being
/// read. `HTTPConnection` reads into it as its state machine says; the
/// machine parses and decodes from it.
///
/// The buffer holds, from `requestStart`, the current request's head (its
/// fields are offsets into `requestBytes`), then what follows (body bytes,
/// pipelined requests). Bytes before `requestStart` belong to answered
/// requests; they are dropped when the buffer is full or empty, not per
/// request. A Content-Length body is read straight into its own storage;
/// a chunked one is decoded once, into the storage that becomes the body.
struct RequestInput {
    private(set) var buffer = ByteBuffer(capacity: 4096)
    private var requestStart = 0
    private var body: RequestBody?
    private var bodyFilled = 0
    private var decoded: GrowingBody

    init(budget: BodyBudget?) { decoded = GrowingBody(budget: budget) }

    /// A chunked body about to be decoded is counted in `budget`, and moves
    /// to `spill`'s file past `inMemory` bytes.
    mutating func countChunkedBody(
        in budget: BodyBudget?, inMemory: Int = .max, spill: SpoolMapping.Maker? = nil
    ) {
        decoded.count(in: budget, inMemory: inMemory, spill: spill)
    }

    mutating func deallocate() {
        buffer.deallocate()
        decoded.discard()
    }

    /// The current request's bytes, from its first: what its head's offsets point into.
    var requestBytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: buffer.bytes[requestStart...]) }

    /// Bytes read and not yet consumed by a request before the current one.
    var buffered: Int { buffer.count - requestStart }

    // MARK: - Reading

    /// Reads into the buffer (making room first), from the socket or
    /// through its TLS session; what `read` returned.
    mutating func read(from fd: Int32, tls: TLSSession?) -> Int {
        if buffer.room < 1024 {
            // Drop the answered requests' bytes before growing the buffer.
            if requestStart > 0 {
                buffer.removeFirst(requestStart)
                requestStart = 0
            }
            if buffer.room < 1024 { buffer.reserve(max(4096, buffer.capacity)) }
        }
        let n = tls?.read(buffer.end, buffer.room) ?? Glibc.read(fd, buffer.end, buffer.room)
        if n > 0 { buffer.count += n }
        return n
    }

    /// Reads up to `remaining` bytes of a Content-Length body into its storage.
    mutating func readBody(from fd: Int32, remaining: Int, tls: TLSSession?) -> Int {
        let at = body!.baseAddress! + bodyFilled
        let n = tls?.read(at, remaining) ?? Glibc.read(fd, at, remaining)
        if n > 0 { bodyFilled += n }
        return n
    }

    /// Reads and throws away (a lingering close).
    func discard(from fd: Int32, tls: TLSSession?) -> Int {
        tls?.read(buffer.base, buffer.capacity) ?? Glibc.read(fd, buffer.base, buffer.capacity)
    }

    // MARK: - The body

    /// Makes the storage of a body of `length` bytes (`spooled` when given,
    /// else in memory counted in `budget`) and moves in what the buffer
    /// already holds of it. The bytes moved; nil if the body does not fit the budget.
    mutating func startBody(length: Int, headLength: Int, budget: BodyBudget?, spooled: RequestBody? = nil) -> Int? {
        if let spooled {
            body = spooled
        } else if let budget {
            guard let storage = RequestBody(count: length, budget: budget) else { return nil }
            body = storage
        } else {
            body = RequestBody(count: length)
        }
        let buffered = min(length, buffer.count - requestStart - headLength)
        if buffered > 0 {
            body!.baseAddress!.copyMemory(from: buffer.base + requestStart + headLength, byteCount: buffered)
        }
        bodyFilled = buffered
        return buffered
    }

    /// Decodes the chunked body bytes buffered after a head of `headLength`
    /// bytes; the head stays (its fields point into it), the raw bytes
    /// decoded go.
    mutating func decodeChunked(
        headLength: Int, with machine: inout HTTP1ServerConnectionStateMachine
    ) -> HTTP1ServerConnectionStateMachine.Actions {
        let pending = UnsafeRawBufferPointer(rebasing: requestBytes[headLength...])
        let (consumed, actions) = machine.decodeChunked(pending) { decoded.append($0) }
        let start = requestStart + headLength
        buffer.remove(start..<(start + consumed))
        return actions
    }

    /// A chunked body decoded to its end becomes the body.
    mutating func finishChunked() { body = decoded.finish() }

    /// The body read, handed over once (the request keeps no copy).
    mutating func takeBody() -> RequestBody {
        defer { body = nil }
        return body ?? .empty
    }

    /// The answered request's body, if it was never taken.
    mutating func forgetBody() { body = nil }

    /// A refused or abandoned request's body, given back.
    mutating func dropBody() {
        decoded.discard()
        body = nil
    }

    /// The request whose bytes end `end` bytes after its first is answered:
    /// the next one starts there (an empty buffer starts over, smaller).
    mutating func advance(by end: Int) {
        requestStart += end
        if requestStart == buffer.count {
            buffer.count = 0
            requestStart = 0
            buffer.shrink(to: 16 * 1024)
        }
    }
}
