/// Bytes waiting in order (an answer staged for a slow reader): appended at
/// the back, taken from the front by advancing a read index. What was taken
/// is dropped only when it outweighs what waits, so taking a little at a
/// time from a large queue costs time linear in the bytes, never a copy of
/// the rest on every take (as `Array.removeFirst` would).
public struct ByteQueue: Sendable {
    private var storage: [UInt8] = []
    /// Bytes of `storage` already taken.
    private var head = 0

    public init() {}

    /// Bytes waiting.
    public var count: Int { storage.count - head }
    public var isEmpty: Bool { count == 0 }

    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        compact()
        storage.append(contentsOf: bytes)
    }

    public mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// Copies up to `max` bytes from the front into `buffer` and drops them; how many.
    public mutating func take(into buffer: UnsafeMutableRawPointer, max: Int) -> Int {
        let n = Swift.min(Swift.max(0, max), count)
        guard n > 0 else { return 0 }
        storage.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress! + head, byteCount: n) }
        head += n
        if head == storage.count {
            storage.removeAll(keepingCapacity: storage.capacity <= Self.keptCapacity)
            head = 0
        }
        return n
    }

    /// Drops everything (the memory too).
    public mutating func removeAll() {
        storage = []
        head = 0
    }

    /// The bytes waiting, copied (tests).
    public var bytes: [UInt8] { Array(storage[head...]) }

    /// Capacity kept for reuse once the queue empties; a burst's larger
    /// block is given back.
    static let keptCapacity = 64 * 1024

    /// Drops the taken bytes once they are at least half of the storage:
    /// each byte is moved at most once per doubling, so the cost stays
    /// linear in the bytes that pass.
    private mutating func compact() {
        guard head > 0, head >= storage.count - head else { return }
        moved &+= storage.count - head
        storage.removeFirst(head)
        head = 0
    }

    /// Bytes moved to the front by compactions so far (tests: the cost stays linear).
    public private(set) var moved = 0
}
