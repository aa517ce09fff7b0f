import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct LogThrottleTests {
    @Test func theFirstIsLoggedAtOnceAndTheRestAreCountedUntilTheIntervalEnds() {
        let clock = ManualClock()
        var log = LogThrottle(every: .seconds(5))
        // (advance before, expected answer)
        let table: [(Duration, Int?)] = [
            (.zero, 1),  // first: at once
            (.seconds(1), nil),
            (.seconds(1), nil),
            (.milliseconds(2999), nil),  // 4.999 s after the line
            (.milliseconds(1), 4),  // 5 s: a line for the three held back and this one
            (.seconds(4), nil),
            (.seconds(60), 2),
            (.seconds(60), 1),  // quiet since: one
        ]
        for (i, (advance, expected)) in table.enumerated() {
            clock.advance(by: advance)
            #expect(log.occurred(at: clock.now()) == expected, "row \(i)")
        }
    }
}
