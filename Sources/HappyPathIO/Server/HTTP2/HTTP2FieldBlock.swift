import CNghttp2
import HappyPathCore

/// Header fields on their way to nghttp2: names lower-cased (HTTP/2 wants
/// them so, and nghttp2 does not police what it sends), values as they
/// came, as bytes rather than `String`s (a value byte that is not UTF-8, an
/// upstream's obs-text, goes out unchanged), all in one array. Made into
/// `nghttp2_nv` for the length of one `submit_*` call, which copies them.
public struct HTTP2FieldBlock: Sendable, Equatable {
    struct Entry: Sendable, Equatable {
        var name: Range<Int>
        var value: Range<Int>
    }

    private var bytes: [UInt8] = []
    private var entries: [Entry] = []

    public init() {}

    public init(_ fields: [HTTPField]) {
        for field in fields { append(field.name, field.value) }
    }

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }

    /// Appends a field, its name lower-cased.
    public mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        let n = bytes.count
        for b in name { bytes.append(HTTPBytes.lower(b)) }
        let v = bytes.count
        bytes.append(contentsOf: value)
        entries.append(Entry(name: n..<v, value: v..<bytes.count))
    }

    public mutating func append(_ name: String, _ value: String) {
        var name = name
        var value = value
        name.withUTF8 { n in value.withUTF8 { v in append(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) } }
    }

    public mutating func append(contentsOf other: HTTP2FieldBlock) {
        other.bytes.withUnsafeBytes { raw in
            for e in other.entries {
                append(name: UnsafeRawBufferPointer(rebasing: raw[e.name]), value: UnsafeRawBufferPointer(rebasing: raw[e.value]))
            }
        }
    }

    public mutating func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        entries.removeAll(keepingCapacity: true)
    }

    /// Drops the fields that a `Connection` value names (their bytes stay
    /// until `removeAll`).
    public mutating func removeNominated(by connectionValue: UnsafeRawBufferPointer) {
        guard !entries.isEmpty else { return }
        var marks: [Bool] = []
        let entries = self.entries
        bytes.withUnsafeBytes { raw in
            NominatedFields.mark(
                count: entries.count, name: { UnsafeRawBufferPointer(rebasing: raw[entries[$0].name]) },
                connectionValue: connectionValue, nominated: &marks)
        }
        guard marks.contains(true) else { return }
        var k = 0
        self.entries.removeAll { _ in
            defer { k += 1 }
            return marks[k]
        }
    }

    /// The fields as strings (tests, logs).
    public var fields: [HTTPField] {
        bytes.withUnsafeBytes { raw in
            entries.map {
                HTTPField(
                    name: String(decoding: raw[$0.name], as: UTF8.self), value: String(decoding: raw[$0.value], as: UTF8.self))
            }
        }
    }

    /// nghttp2's name/value array over the block, valid during `body` only
    /// (nghttp2 copies names and values in `submit_*`; it never writes them).
    func withNV<R>(_ body: (UnsafeMutableBufferPointer<nghttp2_nv>) -> R) -> R {
        if bytes.isEmpty {
            // Never a nil base address, even for fields all empty.
            var one = self
            one.bytes = [0]
            return one.withNV(body)
        }
        return bytes.withUnsafeBytes { raw in
            let base = UnsafeMutablePointer(mutating: raw.baseAddress!.assumingMemoryBound(to: UInt8.self))
            var nv = entries.map { e in
                nghttp2_nv(
                    name: base + e.name.lowerBound, value: base + e.value.lowerBound, namelen: e.name.count,
                    valuelen: e.value.count, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            }
            return nv.withUnsafeMutableBufferPointer { body($0) }
        }
    }
}
