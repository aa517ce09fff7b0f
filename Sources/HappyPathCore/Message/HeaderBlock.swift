/// The header fields of a request as they go upstream, in one allocation:
/// each field is stored as `Name: value` followed by a NUL byte (`Name;`
/// for an empty value), which is the form libcurl takes, so a try hands libcurl pointers into this block
/// instead of copying every field into a list of its own. Each entry is
/// preceded by the lengths of its name and value (two `UInt32`s), so
/// walking the fields never scans their bytes.
///
/// Filled once by its builder, then shared read-only by every try of the
/// command (like `RequestBody`, the storage never moves after that).
/// `@unchecked Sendable` because of that: only the builder writes, before
/// the block is shared; every reader after it only reads.
public final class HeaderBlock: @unchecked Sendable {
    public private(set) var storage: UnsafeMutablePointer<UInt8>
    /// Bytes used, length prefixes and NULs included.
    public private(set) var byteCount = 0
    public private(set) var fieldCount = 0
    private var capacity: Int

    public init(capacity: Int = 512) {
        self.capacity = max(16, capacity)
        storage = .allocate(capacity: self.capacity)
    }

    public convenience init(_ fields: [HTTPField]) {
        self.init(capacity: fields.reduce(16) { $0 + $1.name.utf8.count + $1.value.utf8.count + 3 })
        for field in fields { append(name: field.name, value: field.value) }
    }

    deinit { storage.deallocate() }

    private func reserve(_ extra: Int) {
        guard byteCount + extra > capacity else { return }
        var newCapacity = capacity * 2
        while byteCount + extra > newCapacity { newCapacity *= 2 }
        let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: newCapacity)
        bigger.update(from: storage, count: byteCount)
        storage.deallocate()
        storage = bigger
        capacity = newCapacity
    }

    private func put(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        UnsafeMutableRawPointer(storage + byteCount).copyMemory(from: base, byteCount: bytes.count)
        byteCount += bytes.count
    }

    private static let prefix = 8

    private func putLengths(_ name: Int, _ value: Int) {
        let raw = UnsafeMutableRawPointer(storage + byteCount)
        raw.storeBytes(of: UInt32(truncatingIfNeeded: name), as: UInt32.self)
        (raw + 4).storeBytes(of: UInt32(truncatingIfNeeded: value), as: UInt32.self)
        byteCount += Self.prefix
    }

    private func putSeparator() {
        storage[byteCount] = UInt8(ascii: ":")
        storage[byteCount + 1] = UInt8(ascii: " ")
        byteCount += 2
    }

    private func endField() {
        storage[byteCount] = 0
        byteCount += 1
        fieldCount += 1
    }

    /// Adds `name: value`. The caller has checked both (the request parser did).
    public func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        reserve(name.count + value.count + 3 + Self.prefix)
        putLengths(name.count, value.count)
        put(name)
        if value.isEmpty {
            // libcurl reads `Name:` with nothing after it as "do not send
            // this header"; `Name;` is how it is told to send an empty value.
            // The entry keeps its usual length (`Name;` and two NULs), so
            // walking the block is the same for every field.
            storage[byteCount] = UInt8(ascii: ";")
            storage[byteCount + 1] = 0
            byteCount += 2
        } else {
            putSeparator()
            put(value)
        }
        endField()
    }

    public func append(name: StaticString, value: UnsafeRawBufferPointer) {
        append(name: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount), value: value)
    }

    public func append(name: StaticString, value: StaticString) {
        append(name: name, value: UnsafeRawBufferPointer(start: value.utf8Start, count: value.utf8CodeUnitCount))
    }

    public func append(name: String, value: String) {
        var name = name
        var value = value
        name.withUTF8 { n in value.withUTF8 { v in append(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) } }
    }

    public func append(name: StaticString, value: String) {
        var value = value
        value.withUTF8 { append(name: name, value: UnsafeRawBufferPointer($0)) }
    }

    /// Adds `name: ` and lets `write` fill exactly `valueLength` bytes in place.
    public func append(
        name: StaticString, valueLength: Int, _ write: (UnsafeMutableBufferPointer<UInt8>) -> Void
    ) {
        reserve(name.utf8CodeUnitCount + valueLength + 3 + Self.prefix)
        putLengths(name.utf8CodeUnitCount, valueLength)
        put(UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        putSeparator()
        write(UnsafeMutableBufferPointer(start: storage + byteCount, count: valueLength))
        byteCount += valueLength
        endField()
    }

    /// Every field in order: its name, its value, and the whole NUL-terminated
    /// `Name: value` entry as a C string.
    public func forEach(
        _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer, _ entry: UnsafePointer<CChar>) -> Void
    ) {
        var at = 0
        let raw = UnsafeRawPointer(storage)
        while at < byteCount {
            // Unaligned loads: entries are packed.
            let nameCount = Int(raw.loadUnaligned(fromByteOffset: at, as: UInt32.self))
            let valueCount = Int(raw.loadUnaligned(fromByteOffset: at + 4, as: UInt32.self))
            let start = at + Self.prefix
            body(
                UnsafeRawBufferPointer(start: raw + start, count: nameCount),
                UnsafeRawBufferPointer(start: raw + start + nameCount + 2, count: valueCount),
                (raw + start).assumingMemoryBound(to: CChar.self))
            at = start + nameCount + valueCount + 3
        }
    }

    /// The first value of the field named `name` (given in lower case;
    /// fields match in any case), as a string.
    public func value(for name: StaticString) -> String? {
        var found: String?
        forEach { n, v, _ in
            if found == nil, HTTPBytes.equals(n, name) { found = String(decoding: v, as: UTF8.self) }
        }
        return found
    }

    /// Whether a field named `name` (given in lower case) is present.
    public func contains(_ name: StaticString) -> Bool {
        var found = false
        forEach { n, _, _ in if !found, HTTPBytes.equals(n, name) { found = true } }
        return found
    }

    /// The fields as name/value strings (tests, diagnostics).
    public var fields: [HTTPField] {
        var out: [HTTPField] = []
        forEach { n, v, _ in
            out.append(HTTPField(name: String(decoding: n, as: UTF8.self), value: String(decoding: v, as: UTF8.self)))
        }
        return out
    }
}

extension HeaderBlock {
    /// The fields as `Name: value\r\n` lines: how a stored delivery keeps them.
    public var lines: [UInt8] { lines(dropping: nil) }

    /// The same, without the fields named `name` (given in lower case).
    public func lines(dropping name: StaticString?) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(byteCount)
        forEach { n, v, _ in
            if let name, HTTPBytes.equals(n, name) { return }
            out.append(contentsOf: n)
            out.append(UInt8(ascii: ":"))
            out.append(UInt8(ascii: " "))
            out.append(contentsOf: v)
            out.append(UInt8(ascii: "\r"))
            out.append(UInt8(ascii: "\n"))
        }
        return out
    }

    /// The block for `lines` (as `lines` writes them); a line without `: ` is skipped.
    public convenience init(lines: [UInt8]) {
        self.init(capacity: lines.count + 64)
        lines.withUnsafeBytes { all in
            var start = 0
            var i = 0
            while i + 1 < all.count {
                if all[i] == UInt8(ascii: "\r"), all[i + 1] == UInt8(ascii: "\n") {
                    let line = UnsafeRawBufferPointer(rebasing: all[start..<i])
                    if let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > 0 {
                        var valueStart = colon + 1
                        if valueStart < line.count, line[valueStart] == UInt8(ascii: " ") { valueStart += 1 }
                        append(
                            name: UnsafeRawBufferPointer(rebasing: line[..<colon]),
                            value: UnsafeRawBufferPointer(rebasing: line[valueStart...]))
                    }
                    i += 2
                    start = i
                } else {
                    i += 1
                }
            }
        }
    }
}
