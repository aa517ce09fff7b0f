import Testing

@testable import HappyPathCore

/// W3C `traceparent` and the OTLP protobuf encoding, as pure values.
@Suite struct TracingTests {
    @Test func aValidTraceparentIsRead() throws {
        let c = try #require(TraceContext.parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        #expect(c.traceHigh == 0x4bf9_2f35_77b3_4da6 && c.traceLow == 0xa3ce_929d_0e0e_4736)
        #expect(c.spanID == 0x00f0_67aa_0ba9_02b7 && c.sampled)
        #expect(TraceContext.parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")?.sampled == false)
        #expect(c.traceparent(span: 0xabc) == "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000abc-01")
        #expect(c.traceIDBytes == [0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36])
        // A later version may carry more after a dash; its first fields are read as 00's.
        #expect(TraceContext.parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra") != nil)
    }

    @Test(arguments: [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // all-zero span id
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  // 00 is exactly 55
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "",
    ])
    func anInvalidTraceparentIsNone(_ value: String) {
        #expect(TraceContext.parse(value) == nil)
    }

    @Test func theWireFormatIsProtobufs() {
        var w = ProtoWriter()
        w.varint(1, 300)
        #expect(w.bytes == [0x08, 0xAC, 0x02])
        w = ProtoWriter()
        w.string(2, "hi")
        #expect(w.bytes == [0x12, 0x02, 0x68, 0x69])
        w = ProtoWriter()
        w.fixed64(7, 1)
        #expect(w.bytes == [0x39, 1, 0, 0, 0, 0, 0, 0, 0])
        w = ProtoWriter()
        w.message(1) { $0.varint(3, 2) }
        #expect(w.bytes == [0x0A, 0x02, 0x18, 0x02])
        // A negative int attribute is its two's complement, ten bytes.
        w = ProtoWriter()
        w.varint(3, UInt64(bitPattern: -1))
        #expect(w.bytes.count == 11 && w.bytes.last == 0x01)
    }

    @Test func aSpanIsEncodedWithItsIdsAndAttributes() {
        let trace = TraceContext(traceHigh: 1, traceLow: 2, spanID: 3, sampled: true)
        let span = Span(
            trace: trace, spanID: 0x10, parentID: 0x20, name: "GET /", kind: .server, start: 5, end: 9,
            attributes: [("http.route", .string("/"))], failed: true)
        let bytes = OTLPEncoder.exportRequest([span], serviceName: "svc", version: "1")
        // The trace id (16 bytes), the span id and the parent id appear as written.
        let traceID: [UInt8] = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        #expect(contains(bytes, [0x0A, 0x10] + traceID))
        #expect(contains(bytes, [0x12, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x10]))
        #expect(contains(bytes, [0x22, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x20]))
        #expect(contains(bytes, Array("service.name".utf8)) && contains(bytes, Array("http.route".utf8)))
        #expect(contains(bytes, [0x7A, 0x02, 0x18, 0x02]), "status: error")
    }

    func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count else { return false }
        for i in 0...(haystack.count - needle.count) where Array(haystack[i..<(i + needle.count)]) == needle { return true }
        return false
    }
}
