import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A point on a monotonic time line, in nanoseconds from an arbitrary origin.
public struct Instant: Comparable, Hashable, Sendable {
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.nanoseconds < rhs.nanoseconds }

    /// Saturating: an instant past the range is the range's end, not a
    /// wrapped one in the past (values from outside are clamped before
    /// they get here; this is the second line).
    public static func + (lhs: Instant, rhs: Duration) -> Instant {
        let (sum, overflow) = lhs.nanoseconds.addingReportingOverflow(rhs.nanoseconds)
        return Instant(nanoseconds: overflow ? (rhs.nanoseconds > 0 ? .max : .min) : sum)
    }

    public static func - (lhs: Instant, rhs: Duration) -> Instant {
        let (difference, overflow) = lhs.nanoseconds.subtractingReportingOverflow(rhs.nanoseconds)
        return Instant(nanoseconds: overflow ? (rhs.nanoseconds > 0 ? .min : .max) : difference)
    }

    public static func - (lhs: Instant, rhs: Instant) -> Duration {
        .nanoseconds(lhs.nanoseconds &- rhs.nanoseconds)
    }
}

extension Duration {
    /// Whole nanoseconds, saturating; durations here are far below the range.
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        // Past about 292 years either way: the nearest bound, never a wrapped value.
        if seconds >= 9_223_372_036 { return .max }
        if seconds <= -9_223_372_036 { return .min }
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// Whole milliseconds, rounded up so a short positive wait never becomes zero.
    public var millisecondsRoundedUp: Int64 {
        let ns = nanoseconds
        return ns <= 0 ? 0 : (ns + 999_999) / 1_000_000
    }

    public var seconds: Double { Double(nanoseconds) / 1e9 }

    /// `250ms`, `2s`, `1.5s`, `2m`: the way the config writes durations.
    public var configText: String {
        let ms = nanoseconds / 1_000_000
        if ms < 1000 { return "\(ms)ms" }
        if ms % 60_000 == 0 { return "\(ms / 60_000)m" }
        if ms % 1000 == 0 { return "\(ms / 1000)s" }
        return "\(Double(ms) / 1000)s"
    }
}

/// Where policies read the time. Production uses `MonotonicClock`; tests use
/// `ManualClock` and move time by hand, so no test sleeps to wait for time.
public protocol Clock: Sendable {
    func now() -> Instant
    /// The wall clock, in seconds since 1970: only for dates that come from
    /// outside (an upstream's `Retry-After: <HTTP-date>`).
    func wallSeconds() -> Int64
    /// The wall clock in milliseconds since 1970: for times that outlive
    /// the process (a stored delivery's age and next attempt).
    func wallMilliseconds() -> Int64
}

extension Clock {
    public func wallSeconds() -> Int64 { Int64(time(nil)) }

    public func wallMilliseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }
}

public struct MonotonicClock: Clock {
    public init() {}

    public func now() -> Instant {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Instant(nanoseconds: Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec))
    }
}

public final class ManualClock: Clock {
    private let current: Locked<(Instant, wall: Int64)>

    /// - Parameter wallSeconds: the wall clock at `start`; it moves with `advance`.
    public init(start: Instant = Instant(nanoseconds: 1_000_000_000), wallSeconds: Int64 = 1_700_000_000) {
        current = Locked((start, wallSeconds * 1_000_000_000))
    }

    public func now() -> Instant { current.withLock { $0.0 } }

    public func wallSeconds() -> Int64 { current.withLock { $0.wall / 1_000_000_000 } }

    public func wallMilliseconds() -> Int64 { current.withLock { $0.wall / 1_000_000 } }

    public func advance(by duration: Duration) {
        current.withLock {
            $0.0 = $0.0 + duration
            $0.wall += duration.nanoseconds
        }
    }
}
