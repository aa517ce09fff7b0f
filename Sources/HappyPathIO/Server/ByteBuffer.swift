#if canImport(Glibc)
    import Glibc
#endif

/// A growable run of bytes in one malloc'd block, for the connection's read
/// buffer, its output queue and the staged response head. Not copy-on-write:
/// each is owned by exactly one connection, on its loop's thread.
struct ByteBuffer {
    private(set) var base: UnsafeMutableRawPointer
    private(set) var capacity: Int
    /// Bytes in use: `base[0..<count]`.
    var count = 0

    init(capacity: Int) {
        self.capacity = max(64, capacity)
        base = malloc(self.capacity)!
    }

    func deallocate() { Glibc.free(base) }

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }
    var room: Int { capacity - count }
    var end: UnsafeMutableRawPointer { base + count }

    mutating func reserve(_ extra: Int) {
        guard count + extra > capacity else { return }
        var newCapacity = capacity * 2
        while newCapacity < count + extra { newCapacity *= 2 }
        base = realloc(base, newCapacity)!
        capacity = newCapacity
    }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        reserve(bytes.count)
        (base + count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        count += bytes.count
    }

    mutating func append(_ literal: StaticString) {
        append(UnsafeRawBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    mutating func append(byte: UInt8) {
        reserve(1)
        base.storeBytes(of: byte, toByteOffset: count, as: UInt8.self)
        count += 1
    }

    /// Decimal digits of a non-negative number, without a String.
    mutating func append(decimal value: Int) {
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes of scratch
        withUnsafeMutableBytes(of: &digits) { scratch in
            var v = max(0, value)
            var i = scratch.count
            repeat {
                i -= 1
                scratch[i] = UInt8(0x30 + v % 10)
                v /= 10
            } while v > 0
            append(UnsafeRawBufferPointer(rebasing: scratch[i...]))
        }
    }

    /// Lower-case hex digits (chunk sizes).
    mutating func append(hex value: Int) {
        var digits: (UInt64, UInt64) = (0, 0)
        withUnsafeMutableBytes(of: &digits) { scratch in
            var v = max(0, value)
            var i = scratch.count
            repeat {
                i -= 1
                let d = UInt8(v & 0xF)
                scratch[i] = d < 10 ? 0x30 + d : 0x57 + d
                v >>= 4
            } while v > 0
            append(UnsafeRawBufferPointer(rebasing: scratch[i...]))
        }
    }

    /// Drops the first `n` bytes, moving the rest to the front.
    mutating func removeFirst(_ n: Int) {
        guard n > 0 else { return }
        if n < count { memmove(base, base + n, count - n) }
        count = max(0, count - n)
    }

    /// Drops `range`, moving what follows it down.
    mutating func remove(_ range: Range<Int>) {
        guard !range.isEmpty else { return }
        if range.upperBound < count { memmove(base + range.lowerBound, base + range.upperBound, count - range.upperBound) }
        count -= range.count
    }

    /// Gives memory back after a burst (a huge head or a slow client's
    /// backlog), keeping `capacity` bytes.
    mutating func shrink(to target: Int) {
        guard capacity > target * 2, count <= target else { return }
        base = realloc(base, target)!
        capacity = target
    }
}
