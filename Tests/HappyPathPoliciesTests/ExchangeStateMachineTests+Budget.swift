import HappyPathCore
import HappyPathPolicies

/// The retry budget as the machine asks for it: a retry the rules allow
/// is an action (`.withdrawRetry`), and the budget's answer the next event
/// (`retryBudget(granted:)`); walked by `lifeOfARequest` with the others.
extension ExchangeStateMachineTests {
    static let budgetScenarios: [Scenario] = [
        Scenario(
            "a retry asks the budget first, then backs off",
            history: ["503"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.endedOnly(ok(503)), .withdrawRetry, .awaitingRetryBudget),
                Step(.timer, .none, .awaitingRetryBudget),
                Step(.retryBudget(granted: true), .backOff(.milliseconds(50)), .backingOff),
                Step(.retryBudget(granted: true), .none, .backingOff),
                Step(.wait(.milliseconds(50))),
                Step(.timer, .admit, .admitting),
            ]),
        Scenario(
            "the budget refuses the retry: the last answer is mapped",
            history: ["503"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.endedOnly(ok(503)), .withdrawRetry),
                Step(.retryBudget(granted: false), .answer(.upstreamAnswer(status: 503), abandonProbe: false), .finished),
            ]),
        Scenario(
            "the budget refuses the retry of a reset: unavailable",
            history: ["connection reset"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.endedOnly(failed(.reset)), .withdrawRetry),
                Step(.retryBudget(granted: false), .answer(.unavailable, abandonProbe: false), .finished),
            ]),
        Scenario(
            "a retry after a pacing answer spends no budget",
            history: ["503"],
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.endedPaced(ok(503)), .backOff(.milliseconds(50)), .backingOff),
            ]),
        Scenario(
            "a budget answer with no retry waiting is ignored",
            [
                Step(.start, .admit),
                Step(.retryBudget(granted: true), .none, .admitting),
                Step(.admitted(.send(probe: false)), send1),
                Step(.retryBudget(granted: false), .none, .trying),
            ]),
        Scenario(
            "the client leaves while the budget is asked",
            [
                Step(.start, .admit),
                Step(.admitted(.send(probe: false)), send1),
                Step(.endedOnly(failed(.reset)), .withdrawRetry),
                Step(.clientGone, .finish(.clientClosed, abandonProbe: false), .finished),
                Step(.retryBudget(granted: true), .none, .finished),
            ]),
    ]
}
