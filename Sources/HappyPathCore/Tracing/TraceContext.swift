/// A W3C trace context (`traceparent`, version 00): which trace a request
/// belongs to, which span is its parent, and whether it is sampled.
public struct TraceContext: Sendable, Equatable {
    /// 128 bits, never all zero.
    public var traceHigh: UInt64
    public var traceLow: UInt64
    /// The span this context names (64 bits, never zero).
    public var spanID: UInt64
    public var sampled: Bool

    public init(traceHigh: UInt64, traceLow: UInt64, spanID: UInt64, sampled: Bool) {
        self.traceHigh = traceHigh
        self.traceLow = traceLow
        self.spanID = spanID
        self.sampled = sampled
    }

    /// `00-<32 hex>-<16 hex>-<2 hex>` as W3C Trace Context level 1 reads
    /// it: lower-case hex only, no all-zero ids; a version other than
    /// 00 is read as 00 if it is followed by what 00 has (and is not `ff`).
    /// Nil for anything else: the request then starts a trace of its own.
    public static func parse(_ value: UnsafeRawBufferPointer) -> TraceContext? {
        guard value.count >= 55, let version = hex(value, 0, 2), version != 0xFF else { return nil }
        // Version 00 is exactly 55 characters; a later one may add fields after a dash.
        guard value.count == 55 || (version != 0 && value[55] == UInt8(ascii: "-")) else { return nil }
        guard value[2] == UInt8(ascii: "-"), value[35] == UInt8(ascii: "-"), value[52] == UInt8(ascii: "-"),
            let high = hex(value, 3, 16), let low = hex(value, 19, 16), let span = hex(value, 36, 16),
            let flags = hex(value, 53, 2), high | low != 0, span != 0
        else { return nil }
        return TraceContext(traceHigh: high, traceLow: low, spanID: span, sampled: flags & 1 == 1)
    }

    public static func parse(_ value: String) -> TraceContext? {
        var v = value
        return v.withUTF8 { parse(UnsafeRawBufferPointer($0)) }
    }

    /// Each byte's value as a lower-case hex digit, 0xFF for any other byte
    /// (W3C: upper case is invalid). Every request that carries a
    /// `traceparent` is checked, traced or not, so this is a table.
    private static let hexDigit: [UInt8] = (0...255).map { c -> UInt8 in
        switch c {
        case 0x30...0x39: UInt8(c - 0x30)
        case 0x61...0x66: UInt8(c - 0x61 + 10)
        default: 0xFF
        }
    }

    private static func hex(_ bytes: UnsafeRawBufferPointer, _ at: Int, _ count: Int) -> UInt64? {
        hexDigit.withUnsafeBufferPointer { table in
            var v: UInt64 = 0
            var bad: UInt8 = 0
            for i in at..<(at + count) {
                let d = table[Int(bytes[i])]
                bad |= d & 0xF0
                v = v << 4 | UInt64(d & 0x0F)
            }
            return bad == 0 ? v : nil
        }
    }

    /// The `traceparent` value naming `span` in this trace (version 00).
    public func traceparent(span: UInt64) -> String {
        "00-" + IdentifierGenerator.hex(traceHigh) + IdentifierGenerator.hex(traceLow) + "-" + IdentifierGenerator.hex(span)
            + (sampled ? "-01" : "-00")
    }

    /// The trace id as 16 bytes, big-endian (OTLP's `trace_id`).
    public var traceIDBytes: [UInt8] { Self.bigEndian(traceHigh) + Self.bigEndian(traceLow) }

    static func bigEndian(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * $0)) } }
}
