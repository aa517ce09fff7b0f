import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct ConcurrencyLimiterTests {
    /// A waiter stands for a request; the limiter tells them apart by identity.
    final class Waiter {
        let id: Int
        init(_ id: Int) { self.id = id }
    }

    typealias Limiter = ConcurrencyLimiter<Waiter>

    enum Event {
        case acquire(Int, RequestPriority = .normal, client: Int = 0)
        /// The clock moves to this many milliseconds.
        case at(Int64)
        /// A try completed after this many milliseconds, with this many in flight as it started.
        case sample(ms: Int64, inFlight: Int)
        /// A hedge's try: a free slot now or nothing.
        case tryAcquire
        case release
        /// A release once drain ran out of time: nobody gets the slot.
        case releaseWithoutHandOver
        case leave(Int)
        /// The oldest slot's answer streams past its head: it leaves the limit.
        case stream
        case streamEnded
    }

    enum Decision: Equatable {
        case granted, queued, overloaded
        case hedge(Bool)
        case freed
        case handedOver(to: Int)
        case left(Bool)
        case clock
        /// The slots a grown limit opened went to these waiters.
        case started([Int])
        /// `moveToStreams`: the freed slot went to this waiter, was freed,
        /// or the answer kept its slot (no room among the streams).
        case streamedHandingOver(to: Int)
        case streamedFreeing
        case notStreamed
    }

    struct Step {
        let event: Event
        let decision: Decision
        /// Slots taken and requests queued after the event.
        let inFlight: Int
        let queued: Int
        /// The waiters shed by the event (answered OVERLOADED).
        let shed: [Int]
        /// The limit after the event (nil: not checked).
        let limit: Int?

        init(_ event: Event, _ decision: Decision, inFlight: Int, queued: Int, shed: [Int] = [], limit: Int? = nil) {
            self.event = event
            self.decision = decision
            self.inFlight = inFlight
            self.queued = queued
            self.shed = shed
            self.limit = limit
        }
    }

    struct Scenario: CustomTestStringConvertible {
        let name: String
        let slots: Int
        let queue: Int
        let steps: [Step]
        /// An adaptive limit instead of `slots` (its queue sheds at 100 ms / 5 ms).
        let adaptive: AdaptiveLimit.Configuration?
        var testDescription: String { name }

        init(_ name: String, slots: Int, queue: Int, adaptive: AdaptiveLimit.Configuration? = nil, _ steps: [Step]) {
            self.name = name
            self.slots = slots
            self.queue = queue
            self.adaptive = adaptive
            self.steps = steps
        }
    }

    static let scenarios: [Scenario] = [
        Scenario(
            "slots first, then the queue, then overloaded; a release hands the slot to the first waiter", slots: 2,
            queue: 2,
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3), .queued, inFlight: 2, queued: 1),
                Step(.acquire(4), .queued, inFlight: 2, queued: 2),
                Step(.acquire(5), .overloaded, inFlight: 2, queued: 2),
                Step(.release, .handedOver(to: 3), inFlight: 2, queued: 1),
                Step(.acquire(6), .queued, inFlight: 2, queued: 2),
                Step(.release, .handedOver(to: 4), inFlight: 2, queued: 1),
                Step(.release, .handedOver(to: 6), inFlight: 2, queued: 0),
                Step(.release, .freed, inFlight: 1, queued: 0),
                Step(.release, .freed, inFlight: 0, queued: 0),
            ]),
        Scenario(
            "a waiter that leaves the queue is skipped and frees its place", slots: 1, queue: 2,
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2), .queued, inFlight: 1, queued: 1),
                Step(.acquire(3), .queued, inFlight: 1, queued: 2),
                Step(.acquire(4), .overloaded, inFlight: 1, queued: 2),
                Step(.leave(2), .left(true), inFlight: 1, queued: 1),
                Step(.acquire(4), .queued, inFlight: 1, queued: 2),
                Step(.release, .handedOver(to: 3), inFlight: 1, queued: 1),
                Step(.leave(2), .left(false), inFlight: 1, queued: 1),
                Step(.release, .handedOver(to: 4), inFlight: 1, queued: 0),
            ]),
        Scenario(
            "a hedge takes a free slot only, never ahead of a waiter and never queued", slots: 1, queue: 1,
            [
                Step(.tryAcquire, .hedge(true), inFlight: 1, queued: 0),
                Step(.tryAcquire, .hedge(false), inFlight: 1, queued: 0),
                Step(.acquire(1), .queued, inFlight: 1, queued: 1),
                Step(.tryAcquire, .hedge(false), inFlight: 1, queued: 1),
                Step(.release, .handedOver(to: 1), inFlight: 1, queued: 0),
                Step(.release, .freed, inFlight: 0, queued: 0),
                Step(.tryAcquire, .hedge(true), inFlight: 1, queued: 0),
            ]),
        Scenario(
            "once drain ran out of time a freed slot goes to nobody", slots: 1, queue: 1,
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2), .queued, inFlight: 1, queued: 1),
                Step(.releaseWithoutHandOver, .freed, inFlight: 0, queued: 1),
                Step(.leave(2), .left(true), inFlight: 0, queued: 0),
            ]),
        Scenario(
            "a queue of zero refuses as soon as the slots are taken", slots: 1, queue: 0,
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2), .overloaded, inFlight: 1, queued: 0),
                Step(.release, .freed, inFlight: 0, queued: 0),
                Step(.acquire(2), .granted, inFlight: 1, queued: 0),
            ]),
        Scenario(
            "a freed slot goes to the highest priority waiting, then the longest waiting", slots: 1, queue: 4,
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .sheddable), .queued, inFlight: 1, queued: 1),
                Step(.acquire(3), .queued, inFlight: 1, queued: 2),
                Step(.acquire(4, .critical), .queued, inFlight: 1, queued: 3),
                Step(.acquire(5), .queued, inFlight: 1, queued: 4),
                Step(.release, .handedOver(to: 4), inFlight: 1, queued: 3),
                Step(.release, .handedOver(to: 3), inFlight: 1, queued: 2),
                Step(.release, .handedOver(to: 5), inFlight: 1, queued: 1),
                Step(.release, .handedOver(to: 2), inFlight: 1, queued: 0),
            ]),
        Scenario(
            "a full queue makes room for a request that matters more: the newest of the lowest priority is shed",
            slots: 1, queue: 2,
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .sheddable), .queued, inFlight: 1, queued: 1),
                Step(.acquire(3, .sheddable), .queued, inFlight: 1, queued: 2),
                Step(.acquire(4, .critical), .queued, inFlight: 1, queued: 2, shed: [3]),
                Step(.acquire(5, .sheddable), .overloaded, inFlight: 1, queued: 2),
                Step(.acquire(6), .queued, inFlight: 1, queued: 2, shed: [2]),
                Step(.acquire(7), .overloaded, inFlight: 1, queued: 2),
                Step(.acquire(8, .critical), .queued, inFlight: 1, queued: 2, shed: [6]),
                Step(.acquire(9, .critical), .overloaded, inFlight: 1, queued: 2),
            ]),
        Scenario(
            "with only critical requests waiting in a queue that stood 100 ms, those that waited past 100 ms are shed",
            slots: 0, queue: 0, adaptive: adaptive(min: 1, max: 1, initial: 1),
            [
                Step(.acquire(1, .critical), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .sheddable), .queued, inFlight: 1, queued: 1),
                Step(.acquire(3, .critical), .queued, inFlight: 1, queued: 1, shed: [2]),  // a queue of one: room made
                Step(.at(50), .clock, inFlight: 1, queued: 1),
                Step(.acquire(4, .sheddable), .overloaded, inFlight: 1, queued: 1),
                Step(.at(100), .clock, inFlight: 1, queued: 1),
                Step(.acquire(5, .sheddable), .overloaded, inFlight: 1, queued: 1),  // 3 waited 100 ms: not past it
                Step(.at(101), .clock, inFlight: 1, queued: 1),
                Step(.acquire(6, .sheddable), .queued, inFlight: 1, queued: 1, shed: [3]),
            ]),
        Scenario(
            "an adaptive limit keeps a fifth of its slots for the top priority in use",
            slots: 0, queue: 0, adaptive: adaptive(min: 5, max: 5, initial: 5),
            [
                Step(.acquire(1, .critical), .granted, inFlight: 1, queued: 0),  // critical is in use now
                Step(.acquire(2, .sheddable), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3, .sheddable), .granted, inFlight: 3, queued: 0),
                Step(.acquire(4, .sheddable), .granted, inFlight: 4, queued: 0),
                Step(.acquire(5, .sheddable), .queued, inFlight: 4, queued: 1),  // 4 of 5: the last is kept
                Step(.acquire(6, .critical), .granted, inFlight: 5, queued: 1),  // ahead of the waiting sheddable one
                Step(.acquire(7), .queued, inFlight: 5, queued: 2),  // a normal one is below critical too
                Step(.release, .freed, inFlight: 4, queued: 2),  // 1 (critical) ends: 4 held, the reserve kept
                Step(.release, .handedOver(to: 7), inFlight: 4, queued: 1),  // 2 (sheddable) ends
                Step(.release, .handedOver(to: 5), inFlight: 4, queued: 0),  // 3 (sheddable) ends: within its share
                Step(.tryAcquire, .hedge(false), inFlight: 4, queued: 0),  // a hedge is sheddable work
            ]),
        Scenario(
            "with only sheddable requests in use, nothing is kept back",
            slots: 0, queue: 0, adaptive: adaptive(min: 2, max: 2, initial: 2),
            [
                Step(.acquire(1, .sheddable), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .sheddable), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3, .sheddable), .queued, inFlight: 2, queued: 1),
            ]),
        Scenario(
            "at a limit of 1 a critical request gets in past the sheddable try that holds it",
            slots: 0, queue: 0, adaptive: adaptive(min: 1, max: 1, initial: 1),
            [
                Step(.acquire(1, .sheddable), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .critical), .granted, inFlight: 2, queued: 0),  // one more than the lower ones hold
                Step(.acquire(3, .critical), .queued, inFlight: 2, queued: 1),
                Step(.release, .freed, inFlight: 1, queued: 1),  // 1 ends: 2 holds the limit
            ]),
        Scenario(
            "a critical request is not shed while a sheddable try holds a slot it takes next",
            slots: 0, queue: 0, adaptive: adaptive(min: 2, max: 2, initial: 2),
            [
                Step(.acquire(1, .sheddable), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .critical), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3, .critical), .queued, inFlight: 2, queued: 1),
                Step(.at(500), .clock, inFlight: 2, queued: 1),
                // The queue stood 500 ms and 3 waited as long: not shed,
                // the sheddable try 1 holds a slot that goes to it next.
                Step(.acquire(4, .sheddable), .queued, inFlight: 2, queued: 2),
                Step(.release, .handedOver(to: 3), inFlight: 2, queued: 1),
            ]),
        Scenario(
            "a freed slot goes to the waiting client that holds the fewest, whatever the order they came in",
            slots: 0, queue: 0, adaptive: adaptive(min: 3, max: 3, initial: 3),
            [
                Step(.acquire(1, client: 7), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, client: 7), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3, client: 7), .granted, inFlight: 3, queued: 0),
                Step(.acquire(4, client: 7), .queued, inFlight: 3, queued: 1),
                Step(.acquire(5, client: 7), .queued, inFlight: 3, queued: 2),
                Step(.acquire(6, client: 9), .queued, inFlight: 3, queued: 3),
                Step(.release, .handedOver(to: 6), inFlight: 3, queued: 2),  // client 9 held none
                Step(.release, .handedOver(to: 4), inFlight: 3, queued: 1),  // then in order
            ]),
        Scenario(
            "an answer that streams leaves the limit: its slot goes to a waiter, up to max_streams",
            slots: 0, queue: 0, adaptive: adaptive(min: 2, max: 2, initial: 2),
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3), .queued, inFlight: 2, queued: 1),
                Step(.stream, .streamedHandingOver(to: 3), inFlight: 2, queued: 0),
                Step(.stream, .streamedFreeing, inFlight: 1, queued: 0),
                Step(.stream, .notStreamed, inFlight: 1, queued: 0),  // max_streams 2: it keeps its slot
                Step(.streamEnded, .clock, inFlight: 1, queued: 0),
                Step(.stream, .streamedFreeing, inFlight: 0, queued: 0),
            ]),
        Scenario(
            "a standing queue: late sheddable requests go, critical ones are served first and never shed while others wait",
            slots: 0, queue: 0, adaptive: adaptive(min: 1, max: 4, initial: 1),
            [
                Step(.acquire(1, .critical), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2, .sheddable), .queued, inFlight: 1, queued: 1),
                Step(.acquire(3, .critical), .queued, inFlight: 1, queued: 2),
                Step(.at(50), .clock, inFlight: 1, queued: 2),
                Step(.release, .handedOver(to: 3), inFlight: 1, queued: 1),  // stood 50 ms only: nothing shed
                Step(.acquire(4, .critical), .queued, inFlight: 1, queued: 2),
                Step(.at(100), .clock, inFlight: 1, queued: 2),
                Step(.acquire(5, .sheddable), .queued, inFlight: 1, queued: 2, shed: [2]),  // stood 100 ms: 2 waited 100 ms
                Step(.at(103), .clock, inFlight: 1, queued: 2),
                Step(.release, .handedOver(to: 4), inFlight: 1, queued: 1, shed: []),  // 5 waited 3 ms: kept
                Step(.at(110), .clock, inFlight: 1, queued: 1),
                Step(.release, .freed, inFlight: 0, queued: 0, shed: [5]),  // 5 waited 10 ms, in a queue standing since 100
            ]),
        Scenario(
            "an adaptive limit that grows hands its new slots to waiters at once",
            slots: 0, queue: 0, adaptive: adaptive(min: 1, max: 4, initial: 1),
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0, limit: 1),
                Step(.acquire(2), .queued, inFlight: 1, queued: 1),
                Step(.acquire(3), .queued, inFlight: 1, queued: 2),
                // A kind's first sample sets its baseline; its second, at
                // the baseline with the limit used: 1 + √1 = 2.
                Step(.sample(ms: 25, inFlight: 1), .started([]), inFlight: 1, queued: 2, limit: 1),
                Step(.sample(ms: 25, inFlight: 1), .started([2]), inFlight: 2, queued: 1, limit: 2),
            ]),
        Scenario(
            "an adaptive limit that shrinks below the tries in flight frees slots instead of handing them over",
            slots: 0, queue: 0, adaptive: adaptive(min: 1, max: 4, initial: 4),
            [
                Step(.acquire(1), .granted, inFlight: 1, queued: 0),
                Step(.acquire(2), .granted, inFlight: 2, queued: 0),
                Step(.acquire(3), .granted, inFlight: 3, queued: 0),
                Step(.acquire(4), .granted, inFlight: 4, queued: 0),
                Step(.acquire(5), .queued, inFlight: 4, queued: 1),
                Step(.sample(ms: 25, inFlight: 4), .started([]), inFlight: 4, queued: 1, limit: 4),
                Step(.sample(ms: 25, inFlight: 4), .started([]), inFlight: 4, queued: 1, limit: 4),
                // Ratios of 10, each counted as 3 (`mostVote`): their
                // average passes the tolerance of 1.5 at the second.
                Step(.sample(ms: 250, inFlight: 4), .started([]), inFlight: 4, queued: 1, limit: 3),
                Step(.sample(ms: 250, inFlight: 4), .started([]), inFlight: 4, queued: 1, limit: 3),
                Step(.sample(ms: 250, inFlight: 4), .started([]), inFlight: 4, queued: 1, limit: 2),
                Step(.release, .freed, inFlight: 3, queued: 1),
                Step(.release, .freed, inFlight: 2, queued: 1),
                Step(.release, .handedOver(to: 5), inFlight: 2, queued: 0),
            ]),
    ]

    static func adaptive(min: Int, max: Int, initial: Int) -> AdaptiveLimit.Configuration {
        var a = AdaptiveLimit.Configuration()
        a.minLimit = min
        a.maxLimit = max
        a.initialLimit = initial
        a.smoothing = 1
        return a
    }

    @Test(arguments: scenarios)
    func slotsAndQueue(_ scenario: Scenario) {
        var configuration = Limiter.Configuration(maxInFlight: scenario.slots, maxQueued: scenario.queue)
        if let adaptive = scenario.adaptive {
            configuration = .init(
                adaptive: adaptive, queue: QueueShedding(), connections: 1000, workers: 1, maxStreams: adaptive.maxLimit)
        }
        var limiter = Limiter(configuration)
        var now = Instant(nanoseconds: 0)
        var waiters: [Int: Waiter] = [:]
        func waiter(_ id: Int) -> Waiter {
            if let w = waiters[id] { return w }
            let w = Waiter(id)
            waiters[id] = w
            return w
        }
        // Whom each request asked for, and the slots held, oldest first
        // (`.release` and `.stream` are the oldest's).
        var asked: [Int: SlotHolder] = [:]
        var holding: [SlotHolder] = []
        func released(_ r: Limiter.Release) -> Decision {
            guard case let .handedOver(next) = r else { return .freed }
            holding.append(asked[next.id]!)
            return .handedOver(to: next.id)
        }
        for (i, step) in scenario.steps.enumerated() {
            let decision: Decision
            switch step.event {
            case let .acquire(id, priority, client):
                let holder = SlotHolder(priority, client: client)
                asked[id] = holder
                switch limiter.acquire(waiter(id), holder, at: now) {
                case .granted:
                    holding.append(holder)
                    decision = .granted
                case .queued: decision = .queued
                case .overloaded: decision = .overloaded
                }
            case .tryAcquire:
                let granted = limiter.tryAcquire()
                if granted { holding.append(SlotHolder()) }
                decision = .hedge(granted)
            case .release, .releaseWithoutHandOver:
                decision = released(limiter.release(holding.removeFirst(), handOver: step.event.handsOver, at: now))
            case .stream:
                let holder = holding.removeFirst()
                if let r = limiter.moveToStreams(holder, at: now) {
                    if case let .handedOver(to: id) = released(r) {
                        decision = .streamedHandingOver(to: id)
                    } else {
                        decision = .streamedFreeing
                    }
                } else {
                    holding.insert(holder, at: 0)
                    decision = .notStreamed
                }
            case .streamEnded:
                limiter.streamEnded()
                decision = .clock
            case let .leave(id):
                decision = .left(limiter.leave(waiter(id)))
            case let .at(ms):
                now = Instant(nanoseconds: ms * 1_000_000)
                decision = .clock
            case let .sample(ms, inFlight):
                var granted: [Waiter] = []
                let end = Instant(nanoseconds: now.nanoseconds + ms * 1_000_000)
                _ = limiter.sample(from: now, to: end, inFlight: inFlight, granted: &granted)
                for w in granted { holding.append(asked[w.id]!) }
                decision = .started(granted.map(\.id))
            }
            #expect(decision == step.decision, "step \(i)")
            #expect(limiter.takeShed().map(\.0.id) == step.shed, "step \(i)")
            if let limit = step.limit { #expect(limiter.limit == limit, "step \(i)") }
            #expect(limiter.inFlight == step.inFlight, "step \(i)")
            #expect(limiter.queued == step.queued, "step \(i)")
        }
    }

    @Test func idleOnlyWithNoSlotTakenAndNobodyWaiting() {
        var limiter = Limiter(.init(maxInFlight: 1))
        #expect(limiter.isIdle)
        let a = Waiter(1)
        let b = Waiter(2)
        _ = limiter.acquire(a, at: .init(nanoseconds: 0))
        _ = limiter.acquire(b, at: .init(nanoseconds: 0))
        #expect(!limiter.isIdle)
        limiter.removeAllWaiters()
        #expect(limiter.queued == 0)
        _ = limiter.release(at: .init(nanoseconds: 0))
        #expect(limiter.isIdle)
    }

    /// The worker's share: `max_connections` × endpoints split across the
    /// workers, at least one; the queue is as long as the slots.
    @Test(arguments: [(256, 1, 256), (256, 4, 64), (10, 4, 2), (3, 4, 1), (0, 2, 1), (512, 3, 170)])
    func aWorkersShareOfTheConnections(connections: Int, workers: Int, slots: Int) {
        let c = Limiter.Configuration(connections: connections, workers: workers)
        #expect(c.maxInFlight == slots)
        #expect(c.maxQueued == slots)
        #expect(c.validate().isEmpty)
    }

    /// Without `min_limit`, a worker's share never goes below 2 (the
    /// reserve fits inside it); with it, the share of what was given.
    @Test func aWorkersLeastShareOfAnAdaptiveLimit() {
        var a = AdaptiveLimit.Configuration()
        a.minLimit = 2
        a.maxLimit = 100
        let given = Limiter.Configuration(adaptive: a, queue: QueueShedding(), connections: 1000, workers: 4)
        #expect(given.adaptive?.minLimit == 1)
        let unset = Limiter.Configuration(
            adaptive: a, queue: QueueShedding(), connections: 1000, workers: 4,
            minPerWorker: Limiter.Configuration.defaultMinPerWorker)
        #expect(unset.adaptive?.minLimit == 2)
        // Never above the worker's share of max_limit.
        a.maxLimit = 4
        let small = Limiter.Configuration(adaptive: a, queue: QueueShedding(), connections: 1000, workers: 4, minPerWorker: 2)
        #expect(small.adaptive?.minLimit == 1)
    }

    @Test func validationMessages() {
        #expect(Limiter.Configuration(maxInFlight: 1, maxQueued: 0).validate().isEmpty)
        #expect(
            Limiter.Configuration(maxInFlight: 0, maxQueued: -1).validate() == [
                "concurrency: at least 1 try in flight must be allowed, got 0",
                "concurrency: the queue cannot hold fewer than 0 requests, got -1",
            ])
    }
}

extension ConcurrencyLimiterTests.Event {
    var handsOver: Bool {
        if case .releaseWithoutHandOver = self { return false }
        return true
    }
}
