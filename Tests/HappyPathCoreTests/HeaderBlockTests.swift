import Testing

@testable import HappyPathCore

@Suite struct HeaderBlockTests {
    @Test func fieldsComeBackInOrderAsNulTerminatedEntries() {
        let block = HeaderBlock(capacity: 16)  // grows several times below
        block.append(name: "Accept", value: "text/plain")
        block.append(name: "X-Long", value: String(repeating: "v", count: 300))
        block.append(name: "traceparent", valueLength: 3) { out in
            out[0] = UInt8(ascii: "a")
            out[1] = UInt8(ascii: "b")
            out[2] = UInt8(ascii: "c")
        }
        #expect(block.fieldCount == 3)
        #expect(
            block.fields == [
                HTTPField(name: "Accept", value: "text/plain"),
                HTTPField(name: "X-Long", value: String(repeating: "v", count: 300)),
                HTTPField(name: "traceparent", value: "abc"),
            ])
        var entries: [String] = []
        block.forEach { _, _, entry in entries.append(String(cString: entry)) }
        #expect(entries.first == "Accept: text/plain")
        #expect(entries.last == "traceparent: abc")
        #expect(block.byteCount == entries.reduce(0) { $0 + 8 + $1.utf8.count + 1 })
    }

    @Test func lookupIgnoresCase() {
        let block = HeaderBlock([HTTPField(name: "Idempotency-KEY", value: "k1"), HTTPField(name: "A", value: "")])
        #expect(block.contains("idempotency-key"))
        #expect(block.value(for: "idempotency-key") == "k1")
        #expect(block.value(for: "a") == "")
        #expect(!block.contains("b"))
        #expect(HeaderBlock().fields.isEmpty)
    }

    @Test func valuesWithColonsKeepThem() {
        let block = HeaderBlock([HTTPField(name: "X-Forwarded-Host", value: "example.com:8080")])
        #expect(block.fields == [HTTPField(name: "X-Forwarded-Host", value: "example.com:8080")])
    }
}
