import Testing

/// One row of a state machine's table: an event, what it must produce and
/// the state after it (nil: not checked here, a step that only sets up or
/// moves the clock).
struct TableStep<Event: Sendable, Outcome: Sendable & Equatable, State: Sendable & Equatable>: Sendable {
    let event: Event
    let outcome: Outcome?
    let state: State?

    init(_ event: Event, outcome: Outcome?, _ state: State? = nil) {
        self.event = event
        self.outcome = outcome
        self.state = state
    }

    /// An event whose outcome does not matter here.
    init(_ event: Event) { self.init(event, outcome: nil) }
}

/// A named story of steps: one argument of a table test.
struct TableScenario<Event: Sendable, Outcome: Sendable & Equatable, State: Sendable & Equatable>: Sendable,
    CustomTestStringConvertible
{
    let name: String
    let steps: [TableStep<Event, Outcome, State>]
    var testDescription: String { name }
}

/// Plays `scenario` through `feed` (the machine's outcome for an event, nil
/// for one that has none), checking each step's outcome and the state after it.
func play<Event, Outcome, State>(
    _ scenario: TableScenario<Event, Outcome, State>, feed: (Event) -> Outcome?, state: () -> State,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    for (i, step) in scenario.steps.enumerated() {
        let outcome = feed(step.event)
        if let expected = step.outcome {
            #expect(outcome == expected, "step \(i): \(step.event)", sourceLocation: sourceLocation)
        }
        if let expected = step.state {
            #expect(state() == expected, "state after step \(i): \(step.event)", sourceLocation: sourceLocation)
        }
    }
}

/// A seeded generator (SplitMix64), so that a random sequence of events
/// that finds a bug is found again from its seed.
struct SeededRandom: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
