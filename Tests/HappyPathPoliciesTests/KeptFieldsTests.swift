import HappyPathCore
import HappyPathPolicies
import Testing

/// A kept answer's fields as raw bytes (`KeptFields`): what goes in comes
/// out, in order, byte for byte, and holds no more room than it counts.
@Suite struct KeptFieldsTests {
    static let cases: [[HTTPField]] = [
        [],
        [HTTPField(name: "Content-Type", value: "text/plain")],
        [HTTPField(name: "X-Empty", value: "")],
        [HTTPField(name: "Set-Cookie", value: "a=1"), HTTPField(name: "set-cookie", value: "b=2")],
        [HTTPField(name: "X-Long", value: String(repeating: "v", count: 70_000)), HTTPField(name: "Vary", value: "Accept")],
        [HTTPField(name: "X-Text", value: "caf\u{E9} \u{1F600}")],
        (0..<40).map { HTTPField(name: "X-Field-\($0)", value: "value \($0)") },
        // Either side of the 256 bytes a field is put together in on the stack.
        [HTTPField(name: "X-Ab", value: String(repeating: "s", count: 244))],
        [HTTPField(name: "X-Ab", value: String(repeating: "h", count: 245))],
        [HTTPField(name: String(repeating: "n", count: 300), value: "v")],
    ]

    @Test(arguments: cases)
    func fieldsComeBackAsTheyWent(fields: [HTTPField]) {
        let kept = KeptFields(fields)
        #expect(kept.count == fields.count)
        #expect(Array(kept) == fields)
        var raw: [(name: [UInt8], value: [UInt8])] = []
        kept.forEachField { raw.append((Array($0), Array($1))) }
        #expect(raw.map(\.name) == fields.map { Array($0.name.utf8) })
        #expect(raw.map(\.value) == fields.map { Array($0.value.utf8) })
        // Eight bytes of lengths per field, then its bytes: nothing else.
        #expect(kept.bytes.count == fields.reduce(0) { $0 + 8 + $1.name.utf8.count + $1.value.utf8.count })
    }

    /// Appended from raw bytes as a streamed answer's are: the same as made from text.
    @Test(arguments: cases)
    func appendingBytesIsTheSameAsText(fields: [HTTPField]) {
        var kept = KeptFields(capacity: 512)
        for field in fields {
            var name = field.name
            var value = field.value
            let added = name.withUTF8 { n in
                value.withUTF8 { v in kept.append(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
            }
            #expect(added)
        }
        #expect(kept == KeptFields(fields))
    }

    @Test func filteredKeepsTheOrderOfWhatItKeeps() {
        let fields = [
            HTTPField(name: "A", value: "1"), HTTPField(name: "Keep-Alive", value: "x"), HTTPField(name: "B", value: "2"),
            HTTPField(name: "keep-alive", value: "y"), HTTPField(name: "C", value: ""),
        ]
        let kept = KeptFields(fields).filtered { name, _ in !HTTPBytes.equals(name, "keep-alive") }
        #expect(Array(kept) == [fields[0], fields[2], fields[4]])
        #expect(kept.count == 3)
        #expect(Array(KeptFields().filtered { _, _ in true }).isEmpty)
    }

    /// Fields copied into a large array as they streamed give back the
    /// slack; a snug array is kept as it is.
    @Test func compactedHoldsNoMoreThanItNeeds() {
        var roomy = KeptFields(capacity: 8192)
        var name = "Content-Type"
        var value = "text/plain"
        name.withUTF8 { n in
            value.withUTF8 { v in _ = roomy.append(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
        }
        #expect(roomy.capacity >= 8192)
        let compact = roomy.compacted()
        #expect(compact == roomy)
        #expect(compact.capacity < 128, "\(compact.capacity)")
        let snug = KeptFields([HTTPField(name: "X", value: String(repeating: "y", count: 1000))])
        #expect(snug.compacted().capacity == snug.capacity)
    }

    /// What a kept answer counts grows with its fields' bytes.
    @Test func theFieldsCountAgainstTheStore() {
        let t0 = Instant(nanoseconds: 1_000_000_000)
        func stored(_ fields: [HTTPField]) -> Int {
            let store = StaleStore(maxBytes: 1 << 20, maxEntryBytes: 1 << 20)
            store.keep(
                StaleEntry(
                    status: 200, reason: nil, fields: fields, body: [], receivedAt: t0, expiresAt: t0 + .seconds(60),
                    varyNames: [], varyValues: [], path: "/"),
                key: "k")
            return store.usage.bytes
        }
        let small = stored([HTTPField(name: "A", value: "1")])
        let large = stored([HTTPField(name: "A", value: String(repeating: "1", count: 10_000))])
        // Counted by capacity, which malloc rounds up as it likes: a small answer's may be a few dozen bytes more.
        #expect(large - small >= 9_999 - 64, "\(small) \(large)")
    }
}
