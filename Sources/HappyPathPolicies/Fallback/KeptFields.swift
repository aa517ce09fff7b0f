import HappyPathCore

/// The end-to-end fields of an answer kept for `fallback.serve_stale`, as
/// raw bytes in one array: each field is the lengths of its name and value
/// (two `UInt32`s) followed by their bytes. Every answer on a route that
/// keeps answers is copied as it streams, so the copy is one append per
/// field into one allocation and makes no strings; strings are made only
/// when a kept answer is served (iterating it as `HTTPField`s), which is
/// rare.
public struct KeptFields: Sendable, Equatable {
    /// The packed fields.
    public private(set) var bytes: [UInt8] = []
    /// Fields held.
    public private(set) var count = 0

    /// The longest name or value kept: far above any field libcurl passes
    /// on (it refuses header lines over 100 KiB), so the lengths fit their
    /// `UInt32`s; a longer one is not kept (`append` says false).
    public static let maxPart = Int(Int32.max)

    static let prefix = 8

    public init() {}

    /// Empty, with room for `capacity` bytes (lengths included) before it grows.
    public init(capacity: Int) {
        // Made empty with its room at once (cheaper than growing an empty array).
        bytes = [UInt8](unsafeUninitializedCapacity: Swift.max(0, capacity)) { _, initialized in initialized = 0 }
    }

    public init(_ fields: [HTTPField]) {
        bytes.reserveCapacity(fields.reduce(0) { $0 + Self.prefix + $1.name.utf8.count + $1.value.utf8.count })
        for field in fields {
            var name = field.name
            var value = field.value
            name.withUTF8 { n in
                value.withUTF8 { v in _ = append(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
            }
        }
    }

    /// Adds one field as it came; false (nothing added) if a part is over `maxPart`.
    @discardableResult
    public mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        guard name.count <= Self.maxPart, value.count <= Self.maxPart else { return false }
        bytes.appendPacked(UInt32(truncatingIfNeeded: name.count), UInt32(truncatingIfNeeded: value.count), name, value)
        count += 1
        return true
    }

    public mutating func removeAll(keepingCapacity: Bool = false) {
        bytes.removeAll(keepingCapacity: keepingCapacity)
        count = 0
    }

    /// Each field in order, as its name's and value's bytes.
    public func forEachField(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws -> Void) rethrows {
        try bytes.withUnsafeBytes { raw in
            var at = 0
            while at < raw.count {
                // Unaligned loads: entries are packed.
                let nameCount = Int(raw.loadUnaligned(fromByteOffset: at, as: UInt32.self))
                let valueCount = Int(raw.loadUnaligned(fromByteOffset: at + 4, as: UInt32.self))
                let name = at + Self.prefix
                let value = name + nameCount
                try body(
                    UnsafeRawBufferPointer(rebasing: raw[name..<value]),
                    UnsafeRawBufferPointer(rebasing: raw[value..<(value + valueCount)]))
                at = value + valueCount
            }
        }
    }

    /// The fields for which `keep` says true, in order.
    public func filtered(_ keep: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Bool) -> KeptFields {
        var out = KeptFields(capacity: bytes.count)
        forEachField { name, value in if keep(name, value) { out.append(name: name, value: value) } }
        return out
    }

    /// The room its bytes take (what the store counts).
    public var capacity: Int { bytes.capacity }

    /// The same fields with no more room than they need (`withoutSlack`).
    public func compacted() -> KeptFields {
        var out = self
        out.bytes = bytes.withoutSlack()
        return out
    }
}

extension Array where Element == UInt8 {
    /// Appends two `UInt32`s and then the bytes of `first` and `second`.
    /// A usual field (its name, its value and their lengths under 256
    /// bytes) is put together on the stack and appended in one call: each
    /// append into an array is a call with its checks, the copies on the
    /// stack are not.
    mutating func appendPacked(
        _ a: UInt32, _ b: UInt32, _ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer = .init(start: nil, count: 0)
    ) {
        let total = 8 + first.count + second.count
        guard total <= 256 else {
            var lengths = (a, b)
            Swift.withUnsafeBytes(of: &lengths) { append(contentsOf: $0) }
            append(contentsOf: first)
            append(contentsOf: second)
            return
        }
        withUnsafeTemporaryAllocation(byteCount: 256, alignment: 8) { scratch in
            scratch.storeBytes(of: a, toByteOffset: 0, as: UInt32.self)
            scratch.storeBytes(of: b, toByteOffset: 4, as: UInt32.self)
            if let from = first.baseAddress { (scratch.baseAddress! + 8).copyMemory(from: from, byteCount: first.count) }
            if let from = second.baseAddress {
                (scratch.baseAddress! + 8 + first.count).copyMemory(from: from, byteCount: second.count)
            }
            append(contentsOf: UnsafeRawBufferPointer(rebasing: scratch[..<total]))
        }
    }

    /// The same bytes in an array with no more room than they need, when
    /// this one holds much more (one copied as it streamed may hold twice
    /// the room it needs): what a kept answer holds is what it counts.
    @usableFromInline
    func withoutSlack() -> [UInt8] {
        guard capacity - count > count / 8 + 64 else { return self }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            initialized = buffer.initialize(fromContentsOf: self)
        }
    }
}

/// The fields as `HTTPField`s: for serving a kept answer, and for tests.
extension KeptFields: Sequence {
    public func makeIterator() -> IndexingIterator<[HTTPField]> {
        var fields: [HTTPField] = []
        fields.reserveCapacity(count)
        forEachField { name, value in
            fields.append(HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
        }
        return fields.makeIterator()
    }

    public var underestimatedCount: Int { count }
}
