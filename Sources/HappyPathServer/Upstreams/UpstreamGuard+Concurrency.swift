import HappyPathAdmin
import HappyPathCore
import HappyPathPolicies
import Synchronization

/// One upstream's slots as every worker's lane publishes them (docs/overload.md):
/// tries in flight, requests queued, and the limit, each a sum over the
/// workers; the adaptive limit's latest baseline and recent latency. Each
/// lane adds the change of its own counts, so the sums are exact whenever
/// no lane is between two steps. Read by `/metrics`, `/admin/state` and the
/// status page only.
final class ConcurrencyGauges: Sendable {
    let inFlight = Atomic<Int>(0)
    let queued = Atomic<Int>(0)
    let streaming = Atomic<Int>(0)
    /// The sum of the lanes' limits (0: no lane yet: `limit(nominal:)` says what applies).
    let lanesLimit = Atomic<Int>(0)
    let lanes = Atomic<Int>(0)
    /// The latest baseline and recent latency any worker's adaptive limit
    /// computed, in nanoseconds (0: no sample yet).
    let baselineNanoseconds = Atomic<Int64>(0)
    let recentNanoseconds = Atomic<Int64>(0)
    /// The limit the last `concurrency_limit` event announced (for the "more than a step" rule).
    let announcedLimit = Atomic<Int>(0)

    /// Tries that may be in flight now across the workers: the lanes'
    /// limits, or before any lane exists `nominal` (the configured start).
    func limit(nominal: Int) -> Int {
        lanes.load(ordering: .relaxed) == 0 ? nominal : lanesLimit.load(ordering: .relaxed)
    }

    /// A lane's counts moved by these amounts.
    @inline(__always)
    func moved(inFlight di: Int, queued dq: Int, streaming ds: Int = 0) {
        if di != 0 { inFlight.wrappingAdd(di, ordering: .relaxed) }
        if dq != 0 { queued.wrappingAdd(dq, ordering: .relaxed) }
        if ds != 0 { streaming.wrappingAdd(ds, ordering: .relaxed) }
    }
}

extension UpstreamGuard {
    /// The limit before any worker has a lane: the adaptive start, or `connections`.
    var nominalLimit: Int { adaptive.map { $0.limit.initialLimit } ?? connections }

    /// The limit of tries in flight across the workers now.
    var concurrencyLimit: Int { concurrency.limit(nominal: nominalLimit) }

    /// The slots as `/metrics`, `/admin/state` and the status page show
    /// them: one reading of the gauges for all three.
    var concurrencyReading: AdminSnapshot.Concurrency {
        let c = concurrency
        return AdminSnapshot.Concurrency(
            limit: concurrencyLimit, inFlight: max(0, c.inFlight.load(ordering: .relaxed)),
            queued: max(0, c.queued.load(ordering: .relaxed)), streaming: max(0, c.streaming.load(ordering: .relaxed)),
            adaptive: adaptive != nil,
            baseline: Double(c.baselineNanoseconds.load(ordering: .relaxed)) / 1e9,
            recent: Double(c.recentNanoseconds.load(ordering: .relaxed)) / 1e9)
    }

    /// A worker's adaptive limit moved from `old` to `new` (its baseline and
    /// recent latency with it). The SSE stream hears of it when the
    /// upstream's limit moved by more than a step since the last event:
    /// a tenth of it, at least 2.
    func limitMoved(from old: Int, to new: Int, baseline: Double, recent: Double) {
        concurrency.lanesLimit.wrappingAdd(new - old, ordering: .relaxed)
        concurrency.baselineNanoseconds.store(Self.nanoseconds(baseline), ordering: .relaxed)
        concurrency.recentNanoseconds.store(Self.nanoseconds(recent), ordering: .relaxed)
        let total = concurrency.lanesLimit.load(ordering: .relaxed)
        let announced = concurrency.announcedLimit.load(ordering: .relaxed)
        guard abs(total - announced) >= max(2, announced / 10) else { return }
        guard concurrency.announcedLimit.compareExchange(expected: announced, desired: total, ordering: .relaxed).exchanged
        else { return }
        events.publish(
            "concurrency_limit",
            [
                ("upstream", name), ("limit", String(total)), ("was", String(announced)),
                ("baseline_ms", Self.milliseconds(baseline)), ("recent_ms", Self.milliseconds(recent)),
            ])
    }

    /// The latency gauges alone moved (a sample that left the limit where it was).
    func latencyMeasured(baseline: Double, recent: Double) {
        concurrency.baselineNanoseconds.store(Self.nanoseconds(baseline), ordering: .relaxed)
        concurrency.recentNanoseconds.store(Self.nanoseconds(recent), ordering: .relaxed)
    }

    /// Seconds (bounded by `AdaptiveLimit` to a day) as nanoseconds.
    private static func nanoseconds(_ seconds: Double) -> Int64 { Int64(min(86_400, max(0, seconds)) * 1e9) }
    /// Seconds as milliseconds with one decimal ("12.5").
    private static func milliseconds(_ seconds: Double) -> String {
        let tenths = Int64(min(86_400, max(0, seconds)) * 10_000)
        return "\(tenths / 10).\(tenths % 10)"
    }

    /// A worker opened its lane with `limit` slots.
    func laneOpened(limit: Int) {
        concurrency.lanes.wrappingAdd(1, ordering: .relaxed)
        let total = concurrency.lanesLimit.wrappingAdd(limit, ordering: .relaxed).newValue
        _ = concurrency.announcedLimit.compareExchange(expected: 0, desired: total, ordering: .relaxed)
    }

    /// A worker forgot its lane, which had `limit` slots and nothing in them.
    func laneClosed(limit: Int) {
        concurrency.lanes.wrappingSubtract(1, ordering: .relaxed)
        concurrency.lanesLimit.wrappingSubtract(limit, ordering: .relaxed)
    }
}
