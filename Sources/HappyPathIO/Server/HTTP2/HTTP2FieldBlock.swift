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
        if entries.capacity == 0 {
            // An answer's head: room for a usual one at once, not grown from nothing field by field.
            bytes.reserveCapacity(256)
            entries.reserveCapacity(8)
        }
        let n = bytes.count
        bytes.append(contentsOf: name)
        let v = bytes.count
        bytes.withUnsafeMutableBufferPointer { b in
            for i in n..<v { b[i] = HTTPBytes.lower(b[i]) }
        }
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
    /// With `status`, a `:status` pair comes first (an answer's HEADERS):
    /// the block itself is not copied for it.
    func withNV<R>(status: Int? = nil, _ body: (UnsafeMutableBufferPointer<nghttp2_nv>) -> R) -> R {
        var digits = status.map { String($0) } ?? ""
        return digits.withUTF8 { digits in
            bytes.withUnsafeBytes { raw in
                // Never a nil pointer, even for no field or fields all empty (their lengths are 0).
                let base = UnsafeMutablePointer(
                    mutating: raw.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? Self.statusName.utf8Start)
                let count = entries.count + (status == nil ? 0 : 1)
                let flags = UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)
                return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(count, 1)) { nv in
                    var i = 0
                    if status != nil, let d = digits.baseAddress {
                        nv.initializeElement(
                            at: 0,
                            to: nghttp2_nv(
                                name: UnsafeMutablePointer(mutating: Self.statusName.utf8Start),
                                value: UnsafeMutablePointer(mutating: d),
                                namelen: Self.statusName.utf8CodeUnitCount, valuelen: digits.count, flags: flags))
                        i = 1
                    }
                    for e in entries {
                        nv.initializeElement(
                            at: i,
                            to: nghttp2_nv(
                                name: base + e.name.lowerBound, value: base + e.value.lowerBound, namelen: e.name.count,
                                valuelen: e.value.count, flags: flags))
                        i += 1
                    }
                    return body(UnsafeMutableBufferPointer(rebasing: nv[0..<i]))
                }
            }
        }
    }

    private static let statusName: StaticString = ":status"
}
