import HappyPathConfig
import HappyPathCore
import HappyPathIO

/// `tracing`: which requests are traced, and where their spans go
/// (docs/operations.md, "Tracing"). Parent-based sampling: a request whose
/// `traceparent` says sampled is traced, one that says not sampled is not,
/// and one without (or with an invalid one) is traced with `sample_ratio`.
/// A traced request's server span and its tries' client spans are handed
/// to the exporter when it ends. Without a `tracing` block there is no
/// tracer, and a request pays one nil check.
final class Tracer: Sendable {
    let exporter: OTLPExporter
    let ratio: Double
    /// The wall clock at `anchor` on the monotonic one, in nanoseconds:
    /// span times are wall times, measured on the monotonic clock.
    private let wallAtAnchor: UInt64
    private let anchor: Instant

    init(_ settings: TracingConfiguration, version: String, clock: Clock) {
        exporter = OTLPExporter(endpoint: settings.endpoint, serviceName: settings.serviceName, version: version)
        ratio = settings.sampleRatio
        anchor = clock.now()
        wallAtAnchor = UInt64(max(0, clock.wallMilliseconds())) &* 1_000_000
    }

    func wall(_ instant: Instant) -> UInt64 {
        UInt64(bitPattern: Int64(bitPattern: wallAtAnchor) &+ (instant - anchor).nanoseconds)
    }

    /// The trace of a request that arrived with `incoming` (its
    /// `traceparent`, if any): nil when it is not sampled.
    func begin(incoming: TraceContext?, ids: inout IdentifierGenerator, at now: Instant) -> RequestTrace? {
        let sampled = incoming?.sampled ?? (ratio >= 1 || Double(ids.next() % 1_000_000) / 1_000_000 < ratio)
        guard sampled else { return nil }
        var context =
            incoming ?? TraceContext(traceHigh: ids.next(), traceLow: Self.nonZero(ids.next()), spanID: 0, sampled: true)
        context.spanID = Self.nonZero(ids.next())
        context.sampled = true
        return RequestTrace(context: context, parentID: incoming?.spanID ?? 0, links: [], startedAt: now)
    }

    /// A delivery round: a trace of its own, linked to the request that was
    /// accepted (whose `traceparent` the stored request carries).
    func beginRound(accepted: TraceContext?, ids: inout IdentifierGenerator, at now: Instant) -> RequestTrace? {
        guard let accepted, accepted.sampled else { return nil }
        let context = TraceContext(
            traceHigh: ids.next(), traceLow: Self.nonZero(ids.next()), spanID: Self.nonZero(ids.next()), sampled: true)
        return RequestTrace(context: context, parentID: 0, links: [accepted], startedAt: now)
    }

    static func nonZero(_ v: UInt64) -> UInt64 { v == 0 ? 1 : v }
}

/// A traced request's spans as they happen: the server span's context, and
/// one record per try (a client span each). Kept by its exchange, on its loop.
struct RequestTrace: Sendable {
    /// The trace, and in `spanID` the request's own (server) span.
    var context: TraceContext
    /// The client's span (from its `traceparent`), or 0: a root.
    var parentID: UInt64
    var links: [TraceContext]
    var startedAt: Instant
    var tries: [TryRecord] = []
    var parked: Duration = .zero
    var parkedSince: Instant?
    /// A coalesced follower: its answer came from another request's try
    /// (linked), and it sent none (docs/coalescing.md).
    var coalesced = false
    /// A leader: the followers its try answered.
    var followers = 0

    struct TryRecord: Sendable {
        var spanID: UInt64
        var startedAt: Instant
        var endedAt: Instant?
        var endpoint: String
        var attempt: Int
        var hedge: Bool
        var outcome: String?
        var status: Int?
    }

    mutating func tryStarted(spanID: UInt64, endpoint: String, attempt: Int, hedge: Bool, at now: Instant) {
        tries.append(TryRecord(spanID: spanID, startedAt: now, endpoint: endpoint, attempt: attempt, hedge: hedge))
    }

    /// A try ended: the one the request goes on with (the earliest still
    /// open), or a hedge that lost (the latest open hedge).
    mutating func tryEnded(lostHedge: Bool, outcome: String, status: Int?, at now: Instant) {
        let i =
            lostHedge
            ? tries.lastIndex(where: { $0.endedAt == nil && $0.hedge }) : tries.firstIndex(where: { $0.endedAt == nil })
        guard let i else { return }
        tries[i].endedAt = now
        tries[i].outcome = outcome
        tries[i].status = status
    }

    mutating func parkedChanged(_ isParked: Bool, at now: Instant) {
        if isParked {
            if parkedSince == nil { parkedSince = now }
        } else if let since = parkedSince {
            parked += now - since
            parkedSince = nil
        }
    }

    /// The spans, once the request is answered.
    func spans(
        tracer: Tracer, endedAt now: Instant, method: String, route: String, upstream: String, status: Int, code: String,
        attempts: Int
    ) -> [Span] {
        var parkedTotal = parked
        if let since = parkedSince { parkedTotal += now - since }
        var attributes: [(String, Span.Value)] = [
            ("http.request.method", .string(method)), ("http.route", .string(route)), ("happypath.code", .string(code)),
            ("happypath.attempts", .int(Int64(attempts))), ("happypath.upstream", .string(upstream)),
            ("happypath.parked_ms", .int(parkedTotal.nanoseconds / 1_000_000)),
        ]
        if coalesced { attributes.append(("happypath.coalesced", .bool(true))) }
        if followers > 0 { attributes.append(("happypath.followers", .int(Int64(followers)))) }
        // No status yet: an accepted deliver-later request is handed to the store.
        if status != 0 { attributes.append(("http.response.status_code", .int(Int64(status)))) }
        let server = Span(
            trace: context, spanID: context.spanID, parentID: parentID, name: "\(method) \(route)", kind: .server,
            start: tracer.wall(startedAt), end: tracer.wall(now), attributes: attributes, failed: status >= 500,
            links: links)
        var out = [server]
        for t in tries {
            var attributes: [(String, Span.Value)] = [
                ("server.address", .string(t.endpoint)), ("happypath.attempt", .int(Int64(t.attempt))),
                ("happypath.hedge", .bool(t.hedge)), ("happypath.try.outcome", .string(t.outcome ?? "cancelled")),
            ]
            if let s = t.status { attributes.append(("http.response.status_code", .int(Int64(s)))) }
            out.append(
                Span(
                    trace: context, spanID: t.spanID, parentID: context.spanID, name: method, kind: .client,
                    start: tracer.wall(t.startedAt), end: tracer.wall(t.endedAt ?? now), attributes: attributes,
                    failed: t.outcome != "success"))
        }
        return out
    }
}
