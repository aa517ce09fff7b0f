import HappyPathCore

// Temporary stand-in until the real window lands (helper branch h-stale).
public struct LatencyWindow: Sendable {
    private var samples: [(Instant, Duration)] = []
    public let seconds: Int
    public init(seconds: Int = 10) { self.seconds = seconds }
    public mutating func record(_ latency: Duration, at now: Instant) {
        samples.append((now, latency))
        if samples.count > 10_000 { samples.removeFirst(5_000) }
    }
    public func quantile(_ q: Double, at now: Instant) -> Duration? {
        let recent = samples.filter { now - $0.0 < .seconds(Int64(seconds)) }.map(\.1).sorted()
        guard recent.count >= 20 else { return nil }
        return recent[min(recent.count - 1, Int(Double(recent.count) * q))]
    }
}
