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
