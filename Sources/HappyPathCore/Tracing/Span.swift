/// A finished span, as the OTLP exporter sends it.
public struct Span: Sendable {
    public enum Kind: UInt64, Sendable {
        case server = 2
        case client = 3
    }

    public enum Value: Sendable, Equatable {
        case string(String)
        case int(Int64)
        case bool(Bool)
    }

    public var trace: TraceContext
    public var spanID: UInt64
    /// 0: a root span.
    public var parentID: UInt64
    public var name: String
    public var kind: Kind
    /// Wall clock, nanoseconds since 1970.
    public var start: UInt64
    public var end: UInt64
    public var attributes: [(String, Value)]
    public var failed: Bool
    /// Other spans this one follows from (a delivery round: the request that was accepted).
    public var links: [TraceContext]

    public init(
        trace: TraceContext, spanID: UInt64, parentID: UInt64, name: String, kind: Kind, start: UInt64, end: UInt64,
        attributes: [(String, Value)] = [], failed: Bool = false, links: [TraceContext] = []
    ) {
        self.trace = trace
        self.spanID = spanID
        self.parentID = parentID
        self.name = name
        self.kind = kind
        self.start = start
        self.end = end
        self.attributes = attributes
        self.failed = failed
        self.links = links
    }
}

/// OTLP/HTTP's body: an `ExportTraceServiceRequest` in protobuf (the
/// opentelemetry-proto messages, v1), written by hand: one resource (the
/// service), one instrumentation scope, the spans.
public enum OTLPEncoder {
    public static func exportRequest(_ spans: [Span], serviceName: String, version: String) -> [UInt8] {
        var scope = ProtoWriter()
        scope.message(1) { s in  // InstrumentationScope
            s.string(1, "happypath")
            s.string(2, version)
        }
        for span in spans { scope.message(2) { encode(span, into: &$0) } }
        var resourceSpans = ProtoWriter()
        resourceSpans.message(1) { r in  // Resource
            r.message(1) { keyValue(&$0, "service.name", .string(serviceName)) }
        }
        resourceSpans.bytes(2, scope.bytes)  // ScopeSpans
        var request = ProtoWriter()
        request.bytes(1, resourceSpans.bytes)  // ResourceSpans
        return request.bytes
    }

    static func encode(_ span: Span, into w: inout ProtoWriter) {
        w.bytes(1, span.trace.traceIDBytes)
        w.bytes(2, TraceContext.bigEndian(span.spanID))
        if span.parentID != 0 { w.bytes(4, TraceContext.bigEndian(span.parentID)) }
        w.string(5, span.name)
        w.varint(6, span.kind.rawValue)
        w.fixed64(7, span.start)
        w.fixed64(8, span.end)
        for (key, value) in span.attributes { w.message(9) { keyValue(&$0, key, value) } }
        for link in span.links {
            w.message(13) { l in
                l.bytes(1, link.traceIDBytes)
                l.bytes(2, TraceContext.bigEndian(link.spanID))
            }
        }
        // Status: error when the request (or try) failed; unset otherwise.
        if span.failed { w.message(15) { $0.varint(3, 2) } }
    }

    static func keyValue(_ w: inout ProtoWriter, _ key: String, _ value: Span.Value) {
        w.string(1, key)
        w.message(2) { v in  // AnyValue
            switch value {
            case let .string(s): v.string(1, s)
            case let .bool(b): v.varint(2, b ? 1 : 0)
            case let .int(n): v.varint(3, UInt64(bitPattern: n))
            }
        }
    }
}
