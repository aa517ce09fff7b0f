#if canImport(Glibc)
    import Glibc
#endif

/// A request body that is still arriving while its exchange runs: an
/// HTTP/2 request handed to its exchange at its head (docs/http2.md,
/// "Request bodies"). The client's stream fills it as DATA arrives
/// (`append`, `finish`); the try in flight reads it (`read`), as libcurl asks
/// for bytes to send.
///
/// - **Back-pressure.** The producer may run at most `ahead` bytes ahead of
///   the reader (`room`): the stream takes bytes from its session (giving
///   the client window back) only while there is room, and the reader's
///   progress calls `onRoom`. A client stream whose upstream does not read
///   stops at its window.
/// - **Replay.** The bytes are kept from the first while `budget`
///   (`limits.max_buffered_bytes`) takes them, so a retry reads them again
///   from the start (`rewind`). Once the budget refuses, what the reader
///   took is let go: the body is no longer `replayable`, and the exchange
///   retries no more (gRFC A6's rule: a call is retried only while its
///   request fits the buffer). Past `inMemory` bytes (`limits.body_in_memory`)
///   the kept copy moves to a spool file (`spill`, counted in the client's
///   share of `limits.max_spooled_bytes`, not in `budget`), mapped, so it
///   is read the same way; a disk or share that cannot take more ends the
///   keeping as a full budget does. A body its route can never send twice is
///   not kept at all (`keeps: false`): only what its reader has not taken
///   is held, and it stays replayable only until its first byte is read
///   (a try refused at connect, then parked, still sends it whole).
/// - **Nothing complete before it is known whole.** With a declared length,
///   the last byte is held from the reader until the client's END_STREAM
///   confirms the length (`finish`): an upstream that reads the declared
///   length has a complete request, so a body that turns out malformed
///   (a DATA frame past the length, a bad trailer) must fail while the
///   upstream still misses a byte, and it sees a cut request, not one.
/// - **Waiting.** A read with nothing new returns `.wait`; the reader is
///   called back once (`onAvailable`) when bytes, the end or a failure
///   arrive. The callbacks run on the loop, from the producer's or the
///   reader's own calls, never from inside the other's.
///
/// One reader at a time (a hedge, which would need a second, is not sent
/// for such a body). On the loop's thread.
public final class RequestBodyStream {
    /// Why the body will not complete.
    public enum Failure: Sendable, Equatable {
        /// It passed `limits.max_request_body`.
        case tooLarge
        /// The client reset its stream or left.
        case clientGone
        /// The request turned out malformed (a bad trailer): it is not sent.
        case malformed
    }

    public enum ReadResult: Sendable, Equatable {
        /// This many bytes were copied.
        case bytes(Int)
        /// Nothing yet: `onAvailable` is called when something arrives.
        case wait
        /// The whole body was read.
        case end
        /// The body will not complete (`failure` says why), or a rewound
        /// reader asks for bytes already let go.
        case failed
    }

    /// The body's length as the client announced it (`content-length`), if it did.
    public let declaredLength: Int?
    /// How far the producer may run ahead of the reader.
    public let ahead: Int
    /// Bytes appended so far (the body's length once `ended`).
    public private(set) var received = 0
    /// Bytes let go from the front (never read again): nonzero once the
    /// budget refused to keep more.
    public private(set) var dropped = 0
    /// The reader's position, from the body's first byte.
    public private(set) var readOffset = 0
    /// The client sent all of the body.
    public private(set) var ended = false
    public private(set) var failure: Failure?
    /// The reader waits for `onAvailable`.
    public private(set) var readerWaiting = false
    /// Called when the reader makes room (it took bytes).
    public var onRoom: (() -> Void)?
    /// Called once after a `.wait`, when bytes, the end or a failure arrive.
    public var onAvailable: (() -> Void)?

    private let budget: BodyBudget?
    private var reserved = 0
    private var keepsAll = true
    /// The bytes from `dropped` to `received` (`mapping`'s when it is set).
    private var storage: UnsafeMutableRawPointer?
    private var capacity = 0
    /// Kept bytes past this go to a spool file.
    private let inMemory: Int
    /// Makes a spool file of at least the given capacity (nil: none).
    private let spill: SpoolMapping.Maker?
    /// The spool file the kept copy is in, once it moved there.
    private var mapping: SpoolMapping?

    /// - Parameters:
    ///   - keeps: keep the bytes for a replay (while `budget` takes them).
    ///   - inMemory: past this many bytes, keep them in `spill`'s file instead.
    public init(
        declaredLength: Int?, ahead: Int, budget: BodyBudget?, keeps: Bool = true, inMemory: Int = .max,
        spill: SpoolMapping.Maker? = nil
    ) {
        self.declaredLength = declaredLength
        self.ahead = max(1, ahead)
        self.budget = budget
        keepsAll = keeps
        self.inMemory = inMemory
        self.spill = spill
    }

    deinit {
        // A spool file is let go (and its reservation given back) with `mapping`.
        if mapping == nil { free(storage) }
        budget?.release(reserved)
    }

    /// A retry may read the body again from its first byte.
    public var replayable: Bool { dropped == 0 && failure == nil }

    /// The whole body in one piece, once it ended and every byte is kept
    /// (nil otherwise): a try that starts then sends it as a whole body
    /// would be sent, with its length, and reads nothing as it goes.
    /// Valid while the body lives and nothing is appended (nothing is, after the end).
    public var completeBody: UnsafeRawBufferPointer? {
        guard ended, dropped == 0, failure == nil else { return nil }
        return UnsafeRawBufferPointer(start: storage, count: received)
    }

    /// How many more bytes the producer may append now.
    public var room: Int { max(0, ahead - (received - readOffset)) }

    /// Bytes held now (in memory or in the spool file).
    public var held: Int { received - dropped }

    /// The kept copy is in a spool file.
    public var isSpooled: Bool { mapping != nil }

    // MARK: - The producer (the client's stream)

    /// Body bytes from the client, in order.
    public func append(_ bytes: UnsafeRawBufferPointer) {
        guard !ended, failure == nil, !bytes.isEmpty, let base = bytes.baseAddress else { return }
        if keepsAll {
            let needed = received + bytes.count
            if mapping == nil, needed > inMemory { moveToFile(needing: needed) }
            if mapping == nil {
                if budget?.reserve(bytes.count) ?? true {
                    reserved += bytes.count
                } else {
                    // Memory refuses: the file may still take it.
                    moveToFile(needing: needed)
                    if mapping == nil { stopKeeping() }
                }
            }
            if let mapping {
                if mapping.grow(toHold: needed) {
                    storage = mapping.base
                    capacity = mapping.capacity
                } else {
                    leaveFile()
                }
            }
        }
        let used = received - dropped
        if used + bytes.count > capacity {
            capacity = max(used + bytes.count, capacity * 2, 16 * 1024)
            storage = realloc(storage, capacity)!
        }
        (storage! + used).copyMemory(from: base, byteCount: bytes.count)
        received += bytes.count
        wake()
    }

    /// The client's END_STREAM: the body is complete.
    public func finish() {
        guard !ended, failure == nil else { return }
        ended = true
        wake()
    }

    /// The body will not complete; a waiting reader hears it.
    public func fail(_ why: Failure) {
        guard failure == nil, !ended else { return }
        failure = why
        wake()
    }

    // MARK: - The reader (the try in flight)

    /// Copies up to `max` bytes from the reader's position into `into`.
    public func read(into: UnsafeMutableRawPointer, max: Int) -> ReadResult {
        if failure != nil || readOffset < dropped { return .failed }
        let available = readable - readOffset
        guard available > 0 else {
            if ended { return .end }
            readerWaiting = true
            return .wait
        }
        let n = Swift.min(available, Swift.max(0, max))
        guard n > 0 else { return .bytes(0) }
        into.copyMemory(from: storage! + (readOffset - dropped), byteCount: n)
        readOffset += n
        if !keepsAll { letGoOfRead() }
        onRoom?()
        return .bytes(n)
    }

    /// How far the reader may read: every byte received, but the last one
    /// of a declared length only once the body ended.
    private var readable: Int {
        guard !ended, let declaredLength, received >= declaredLength else { return received }
        return max(0, declaredLength - 1)
    }

    /// A new try reads from the first byte: false if those bytes are gone.
    public func rewind() -> Bool {
        guard replayable else { return false }
        readOffset = 0
        readerWaiting = false
        return true
    }

    /// The try that read ends: a later `.wait` is a new reader's.
    public func readerLeft() {
        readerWaiting = false
    }

    // MARK: - Private

    private func wake() {
        guard readerWaiting else { return }
        readerWaiting = false
        onAvailable?()
    }

    /// The budget refused: from now on only the bytes not yet read are
    /// held (at most `ahead` and what the client's window lets in).
    private func stopKeeping() {
        keepsAll = false
        budget?.release(reserved)
        reserved = 0
        letGoOfRead()
    }

    /// The kept copy (every byte so far, `dropped` is 0) moves to a spool
    /// file with room for `needed` bytes (the announced length when it is
    /// larger), and its memory and reservation are given back. Stays in
    /// memory when no file can be had.
    private func moveToFile(needing needed: Int) {
        let doubled = SpoolMapping.doubled(needed)
        guard let spill,
            let file = SpoolMapping.holding(
                UnsafeRawBufferPointer(start: storage, count: received), room: needed,
                preferred: declaredLength.map { $0 >= needed ? $0 : doubled } ?? doubled, from: spill)
        else { return }
        free(storage)
        budget?.release(reserved)
        reserved = 0
        storage = file.base
        capacity = file.capacity
        mapping = file
    }

    /// The spool file cannot take more: the keeping ends (as when the
    /// budget refuses), and the bytes not yet read go back to memory.
    private func leaveFile() {
        keepsAll = false
        let rest = received - readOffset
        let moved = malloc(max(rest, 16 * 1024))!
        if rest > 0 { moved.copyMemory(from: storage! + (readOffset - dropped), byteCount: rest) }
        dropped = readOffset
        storage = moved
        capacity = max(rest, 16 * 1024)
        mapping = nil
    }

    private func letGoOfRead() {
        let n = readOffset - dropped
        guard n > 0, let storage else { return }
        let rest = received - readOffset
        if rest > 0 { storage.copyMemory(from: storage + n, byteCount: rest) }
        dropped = readOffset
    }
}
