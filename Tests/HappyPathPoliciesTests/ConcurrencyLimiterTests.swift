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
        case acquire(Int)
        /// A hedge's try: a free slot now or nothing.
        case tryAcquire
        case release
        /// A release once drain ran out of time: nobody gets the slot.
        case releaseWithoutHandOver
        case leave(Int)
    }

    enum Decision: Equatable {
        case granted, queued, overloaded
        case hedge(Bool)
        case freed
        case handedOver(to: Int)
        case left(Bool)
    }

    struct Step {
        let event: Event
        let decision: Decision
        /// Slots taken and requests queued after the event.
        let inFlight: Int
        let queued: Int

        init(_ event: Event, _ decision: Decision, inFlight: Int, queued: Int) {
            self.event = event
            self.decision = decision
            self.inFlight = inFlight
            self.queued = queued
        }
    }

    struct Scenario: CustomTestStringConvertible {
        let name: String
        let slots: Int
        let queue: Int
        let steps: [Step]
        var testDescription: String { name }

        init(_ name: String, slots: Int, queue: Int, _ steps: [Step]) {
            self.name = name
            self.slots = slots
            self.queue = queue
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
    ]

    @Test(arguments: scenarios)
    func slotsAndQueue(_ scenario: Scenario) {
        var limiter = Limiter(.init(maxInFlight: scenario.slots, maxQueued: scenario.queue))
        var waiters: [Int: Waiter] = [:]
        func waiter(_ id: Int) -> Waiter {
            if let w = waiters[id] { return w }
            let w = Waiter(id)
            waiters[id] = w
            return w
        }
        for (i, step) in scenario.steps.enumerated() {
            let decision: Decision
            switch step.event {
            case let .acquire(id):
                switch limiter.acquire(waiter(id)) {
                case .granted: decision = .granted
                case .queued: decision = .queued
                case .overloaded: decision = .overloaded
                }
            case .tryAcquire:
                decision = .hedge(limiter.tryAcquire())
            case .release, .releaseWithoutHandOver:
                if case let .handedOver(next) = limiter.release(handOver: step.event.handsOver) {
                    decision = .handedOver(to: next.id)
                } else {
                    decision = .freed
                }
            case let .leave(id):
                decision = .left(limiter.leave(waiter(id)))
            }
            #expect(decision == step.decision, "step \(i)")
            #expect(limiter.inFlight == step.inFlight, "step \(i)")
            #expect(limiter.queued == step.queued, "step \(i)")
        }
    }

    @Test func idleOnlyWithNoSlotTakenAndNobodyWaiting() {
        var limiter = Limiter(.init(maxInFlight: 1))
        #expect(limiter.isIdle)
        let a = Waiter(1)
        let b = Waiter(2)
        _ = limiter.acquire(a)
        _ = limiter.acquire(b)
        #expect(!limiter.isIdle)
        limiter.removeAllWaiters()
        #expect(limiter.queued == 0)
        _ = limiter.release()
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
