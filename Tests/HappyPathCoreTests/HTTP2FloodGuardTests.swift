import HappyPathCore
import Testing

/// `HTTP2FloodGuard`: each kind of frame that moves no response is
/// bounded by its own bucket, on an injected clock.
@Suite struct HTTP2FloodGuardTests {
    static func at(ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

    /// How many of `n` frames at once pass.
    static func passed(_ g: inout HTTP2FloodGuard, _ kind: HTTP2FloodGuard.Kind, _ n: Int, at t: Instant) -> Int {
        var count = 0
        for _ in 0..<n where g.frame(kind, at: t) { count += 1 }
        return count
    }

    @Test func aBurstPassesThenTheRateHolds() {
        var g = HTTP2FloodGuard(bounds: [.settings: .init(burst: 3, perSecond: 10)])
        let t0 = Self.at(ms: 1000)
        #expect(Self.passed(&g, .settings, 4, at: t0) == 3)
        // 100 ms at 10 a second: one more.
        #expect(Self.passed(&g, .settings, 1, at: Self.at(ms: 1100)) == 1)
        #expect(Self.passed(&g, .settings, 1, at: Self.at(ms: 1100)) == 0)
        // 99 ms later: not yet (whole tokens only).
        #expect(Self.passed(&g, .settings, 1, at: Self.at(ms: 1199)) == 0)
        #expect(Self.passed(&g, .settings, 1, at: Self.at(ms: 1200)) == 1)
        // A long quiet refills to the burst, never past it.
        let later = Self.at(ms: 60_000)
        #expect(Self.passed(&g, .settings, 5, at: later) == 3)
    }

    @Test func eachKindHasItsOwnBucket() {
        var g = HTTP2FloodGuard(bounds: [.ping: .init(burst: 1, perSecond: 0), .strayReset: .init(burst: 1, perSecond: 0)])
        let t = Self.at(ms: 0)
        #expect(Self.passed(&g, .ping, 1, at: t) == 1)
        #expect(Self.passed(&g, .ping, 1, at: t) == 0)
        #expect(Self.passed(&g, .strayReset, 1, at: t) == 1)
        #expect(Self.passed(&g, .strayReset, 1, at: t) == 0)
        // A kind with no bound given is not bounded.
        #expect(Self.passed(&g, .emptyData, 10_000, at: t) == 10_000)
    }

    /// The default bounds let a busy gRPC server's pings through (50 a
    /// second for a minute) and stop a flood (10,000 at once) early.
    @Test func theDefaultsTellAServerFromAFlood() {
        var g = HTTP2FloodGuard()
        var ok = 0
        for i in 0..<3000 where g.frame(.ping, at: Self.at(ms: Int64(i) * 20)) { ok += 1 }
        #expect(ok == 3000)
        var flood = HTTP2FloodGuard()
        #expect(Self.passed(&flood, .settings, 10_000, at: Self.at(ms: 5)) == HTTP2FloodGuard.bounds[.settings]!.burst)
        #expect(HTTP2FloodGuard().reason(.settings).contains("SETTINGS frames than 100 at once and 10 a second"))
    }

    /// Frames closer than a millisecond apart still refill at the rate:
    /// the part of a millisecond not yet counted is kept for the next one
    /// (counting from each frame's own time would lose up to half of it).
    @Test func aFractionOfAMillisecondIsKeptForTheNextRefill() {
        var g = HTTP2FloodGuard(bounds: [.ping: .init(burst: 1, perSecond: 1000)])
        #expect(Self.passed(&g, .ping, 1, at: Instant(nanoseconds: 0)) == 1)
        // Every 0.9 ms for 90 ms at 1,000 a second: 100 frames, 90 tokens
        // earned at that rate, 100 refused would be none at all.
        var ok = 0
        for i in 1...100 where g.frame(.ping, at: Instant(nanoseconds: Int64(i) * 900_000)) { ok += 1 }
        #expect(ok == 90, "one token a millisecond, whatever the frames' spacing")
    }

    /// A clock that goes back (or stands still) adds nothing.
    @Test func aClockThatGoesBackAddsNothing() {
        var g = HTTP2FloodGuard(bounds: [.priority: .init(burst: 1, perSecond: 1000)])
        #expect(Self.passed(&g, .priority, 1, at: Self.at(ms: 500)) == 1)
        #expect(Self.passed(&g, .priority, 1, at: Self.at(ms: 100)) == 0)
        #expect(Self.passed(&g, .priority, 1, at: Self.at(ms: 500)) == 0)
        #expect(Self.passed(&g, .priority, 1, at: Self.at(ms: 501)) == 1)
    }
}
