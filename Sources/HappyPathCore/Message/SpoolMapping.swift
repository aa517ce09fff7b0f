#if canImport(Glibc)
    import Glibc
#endif

/// A spool file without a name, mapped into memory, that holds a request
/// body kept for retries (`limits.body_in_memory`): the bytes are written
/// and read through `base` as through any memory, but its pages are the
/// kernel's page cache, written to disk and given back under pressure, not
/// the process's own memory.
///
/// - **Counted.** Its capacity is reserved in `budget` (the client's share
///   of `limits.max_spooled_bytes`) and given back when it is freed.
/// - **Allocated up front.** Its blocks are allocated (`posix_fallocate`)
///   before a byte is written, so a full disk says so at `init` or `grow`,
///   never with a fault as the body is read in.
/// - **Growing.** A body whose length is learned as it arrives (chunked,
///   or HTTP/2 without `content-length`) grows it by doubling: the file is
///   extended, mapped again whole, and the old mapping let go. The bytes
///   stay where they are (in the file); only `base` moves.
///
/// Owned by one body on one loop while it is written; once written it is
/// only read (and may be freed on another thread, as a `RequestBody`).
public final class SpoolMapping: @unchecked Sendable {
    /// Makes a spool file of the given capacity for a body (nil: the
    /// share, the directory or the disk cannot take it).
    public typealias Maker = (Int) -> SpoolMapping?

    public private(set) var base: UnsafeMutableRawPointer
    /// Bytes mapped and allocated (and reserved in the budget).
    public private(set) var capacity: Int
    private let fd: Int32
    private let budget: BodyBudget
    /// The length mapped at `base` (the capacity, or more after `trim`).
    private var mapped: Int

    /// `capacity` bytes in the file `open` makes; nil, with nothing left
    /// behind, when the budget, the directory or the disk cannot take them.
    public init?(capacity: Int, budget: BodyBudget, open: () -> Int32) {
        guard capacity > 0, budget.reserve(capacity) else { return nil }
        let fd = open()
        guard fd >= 0 else {
            budget.release(capacity)
            return nil
        }
        guard posix_fallocate(fd, 0, off_t(capacity)) == 0, let base = Self.map(fd, capacity) else {
            close(fd)
            budget.release(capacity)
            return nil
        }
        self.fd = fd
        self.base = base
        self.capacity = capacity
        self.budget = budget
        mapped = capacity
    }

    /// Makes room for at least `needed` bytes (doubling when the budget
    /// allows, else exactly `needed`); false, with the mapping as it was,
    /// when the budget or the disk cannot take them.
    public func grow(toHold needed: Int) -> Bool {
        guard needed > capacity else { return true }
        var size = max(needed, Self.doubled(capacity))
        if !budget.reserve(size - capacity) {
            size = needed
            guard budget.reserve(size - capacity) else { return false }
        }
        guard posix_fallocate(fd, 0, off_t(size)) == 0, let moved = Self.map(fd, size) else {
            budget.release(size - capacity)
            // Blocks allocated past the old capacity are given back.
            _ = ftruncate(fd, off_t(capacity))
            return false
        }
        munmap(base, mapped)
        base = moved
        capacity = size
        mapped = size
        return true
    }

    /// The body ended at `count` bytes: the file is cut there and the rest
    /// of the reservation given back. Nothing past `count` is read again.
    public func trim(to count: Int) {
        guard count > 0, count < capacity, ftruncate(fd, off_t(count)) == 0 else { return }
        budget.release(capacity - count)
        capacity = count
    }

    deinit {
        munmap(base, mapped)
        close(fd)
        budget.release(capacity)
    }

    /// A file from `make` that holds `bytes` (a body so far, moving out of
    /// memory), with room for `preferred` bytes when that can be had, else
    /// exactly `needed`; nil when neither.
    public static func holding(
        _ bytes: UnsafeRawBufferPointer, room needed: Int, preferred: Int, from make: Maker
    ) -> SpoolMapping? {
        guard let file = make(preferred) ?? (preferred > needed ? make(needed) : nil) else { return nil }
        if let base = bytes.baseAddress, !bytes.isEmpty { file.base.copyMemory(from: base, byteCount: bytes.count) }
        return file
    }

    /// Twice `n`, or `n` where twice would not fit an `Int`.
    public static func doubled(_ n: Int) -> Int { n > Int.max / 2 ? n : n * 2 }

    private static func map(_ fd: Int32, _ count: Int) -> UnsafeMutableRawPointer? {
        guard let base = mmap(nil, count, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
            base != UnsafeMutableRawPointer(bitPattern: -1)
        else { return nil }
        return base
    }
}
