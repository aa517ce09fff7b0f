/// `/_demo/throttle?rps=N`: an upstream that allows N requests per wall-clock
/// second and answers the rest 429 with `Retry-After`, the way a rate-limited
/// API does. It counts, per second, what it received and what it let
/// through, so a load test can check what a proxy in front of it sent.
///
/// A pure value: the demo keeps one for the whole process behind a lock
/// (`DemoUpstream.throttle`) and passes the wall clock in milliseconds, so
/// seconds line up with Unix seconds and tests need no sleeping.
public struct DemoThrottle: Sendable, Equatable {
    /// One wall-clock second: requests received, and answered 200.
    public struct Second: Sendable, Equatable {
        public var t: Int64
        public var received = 0
        public var passed = 0

        public init(t: Int64, received: Int = 0, passed: Int = 0) {
            self.t = t
            self.received = received
            self.passed = passed
        }
    }

    /// The seconds seen, oldest first (at most `keep`; seconds without a
    /// request are not listed).
    public private(set) var seconds: [Second] = []
    /// When the first 429 was answered, in milliseconds since 1970.
    public private(set) var first429AtMilliseconds: Int64?
    /// How many seconds are kept: an hour, bounded memory whatever the run.
    public let keep: Int

    public init(keep: Int = 3600) { self.keep = keep }

    public enum Verdict: Sendable, Equatable {
        case pass
        /// Over the limit: come back after this many whole seconds.
        case throttled(retryAfterSeconds: Int)
    }

    /// A request arrived at `nowMilliseconds`, allowed `rps` per second.
    public mutating func arrived(rps: Int, nowMilliseconds: Int64) -> Verdict {
        let t = nowMilliseconds / 1000
        if seconds.last?.t != t {
            seconds.append(Second(t: t))
            if seconds.count > keep { seconds.removeFirst(seconds.count - keep) }
        }
        seconds[seconds.count - 1].received += 1
        if seconds[seconds.count - 1].passed < rps {
            seconds[seconds.count - 1].passed += 1
            return .pass
        }
        if first429AtMilliseconds == nil { first429AtMilliseconds = nowMilliseconds }
        // Retry-After carries whole seconds (RFC 9110 section 10.2.3): the
        // time to the next second rounded up, and never 0, which a client
        // may take as "at once". Within a second that is always 1.
        let untilNext = 1000 - nowMilliseconds % 1000
        return .throttled(retryAfterSeconds: max(1, Int((untilNext + 999) / 1000)))
    }

    /// The stats as JSON: `{"seconds":[{"t":…,"received":…,"passed":…}],"first_429_at":…}`,
    /// `first_429_at` in seconds since 1970 with milliseconds (null before any 429).
    public var json: String {
        let list = seconds.map { "{\"t\":\($0.t),\"received\":\($0.received),\"passed\":\($0.passed)}" }
        let first = first429AtMilliseconds.map { "\($0 / 1000).\(String(1000 + $0 % 1000).dropFirst())" } ?? "null"
        return "{\"seconds\":[\(list.joined(separator: ","))],\"first_429_at\":\(first)}\n"
    }
}
