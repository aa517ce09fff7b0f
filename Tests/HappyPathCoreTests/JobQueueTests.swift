import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The one queue the store's writer and readers and the trace exporter use.
/// Most tests call `take` on the test's own thread (no thread started), so
/// they need no waiting beyond the queue's own timed waits.
@Suite struct JobQueueTests {
    /// Monotonic nanoseconds, as the queue's timed waits count them.
    static func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

    static let millisecond: Int64 = 1_000_000

    @Test func takesItemsInTheOrderTheyWerePushed() {
        let queue = JobQueue<Int>(name: "test-order")
        for i in 0..<300 { queue.push(i) }
        #expect(queue.take(max: 100) == Array(0..<100))
        #expect(queue.take(max: 1) == [100])
        #expect(queue.takeOne() == 101)
        #expect(queue.take(max: 1000) == Array(102..<300))
    }

    @Test func aThreadTakesEverythingInOrderAndStopDrainsWhatWaits() {
        let queue = JobQueue<Int>(name: "test-drain")
        let seen = Locked<[Int]>([])
        for i in 0..<50 { queue.push(i) }
        queue.start { q in
            while let batch = q.take(max: 7) { seen.withLock { $0 += batch } }
        }
        for i in 50..<500 { queue.push(i) }
        queue.stop()
        #expect(seen.withLock { $0 } == Array(0..<500))
        #expect(queue.waiting == 0)
    }

    @Test(arguments: [(capacity: 3, pushed: 5, kept: 3), (capacity: 1, pushed: 1, kept: 1), (capacity: 10, pushed: 4, kept: 4)])
    func refusesItemsBeyondItsCapacity(capacity: Int, pushed: Int, kept: Int) {
        let queue = JobQueue<Int>(name: "test-bound", capacity: capacity)
        #expect(queue.push(contentsOf: 0..<pushed) == kept)
        #expect(queue.push(99) == (kept < capacity))
        #expect(queue.take(max: 100)?.prefix(kept) == ArraySlice(0..<kept))
        // Room again once taken.
        #expect(queue.push(7))
    }

    @Test func onlyAReservedPushUsesTheReserve() {
        let queue = JobQueue<Int>(name: "test-reserve", capacity: 2, reserve: 1)
        #expect(queue.push(contentsOf: [0, 1]) == 2)
        #expect(!queue.push(2), "ordinary work is refused at the capacity")
        #expect(queue.push(3, reserved: true), "a reserved push takes a reserve place")
        #expect(!queue.push(4, reserved: true), "and is refused once the reserve is spent too")
        #expect(!queue.push(5), "ordinary work is still refused while reserved items hold places")
        #expect(queue.take(max: 10) == [0, 1, 3])
        #expect(queue.push(6))
    }

    @Test func anOfferSaysWhyItWasRefused() {
        let queue = JobQueue<Int>(name: "test-offer", capacity: 1)
        #expect(queue.offer(1) == .kept)
        #expect(queue.offer(2) == .full)
        queue.stop()
        #expect(queue.offer(3) == .stopped)
        #expect(queue.push(contentsOf: [4, 5]) == 0, "a stopped queue keeps none")
    }

    @Test func keepsTheFirstItemsOfAGroupThatDoesNotFit() {
        let queue = JobQueue<Int>(name: "test-bound", capacity: 4)
        queue.push(0)
        #expect(queue.push(contentsOf: [1, 2, 3, 4, 5]) == 3)
        #expect(queue.take(max: 10) == [0, 1, 2, 3])
    }

    @Test func refusesItemsOnceStopped() {
        let queue = JobQueue<Int>(name: "test-stopped")
        queue.push(1)
        queue.stop()
        #expect(queue.isStopped)
        #expect(!queue.push(2))
        #expect(queue.push(contentsOf: [3, 4]) == 0)
        // What waited is still taken, without lingering, then nil.
        let start = Self.now()
        #expect(queue.take(max: 10, .linger(10_000 * Self.millisecond)) == [1])
        #expect(Self.now() - start < 5_000 * Self.millisecond)
        #expect(queue.take(max: 10) == nil)
        #expect(queue.take(max: 10, .fill(within: 10_000 * Self.millisecond)) == nil)
    }

    @Test func anIdleWaitEndsEmptyAfterItsTimeOnTheMonotonicClock() {
        let queue = JobQueue<Int>(name: "test-idle")
        let start = Self.now()
        #expect(queue.take(max: 10, .linger(0, idle: 30 * Self.millisecond)) == [])
        #expect(Self.now() - start >= 30 * Self.millisecond)
    }

    @Test func aTimedFlushReturnsWhatWaitsWhenItsTimeIsUp() {
        let queue = JobQueue<Int>(name: "test-fill")
        let start = Self.now()
        #expect(queue.take(max: 10, .fill(within: 20 * Self.millisecond)) == [])
        #expect(Self.now() - start >= 20 * Self.millisecond)
        queue.push(contentsOf: [1, 2])
        let again = Self.now()
        #expect(queue.take(max: 10, .fill(within: 20 * Self.millisecond)) == [1, 2])
        #expect(Self.now() - again >= 20 * Self.millisecond)
    }

    @Test func aFullBatchNeedsNoWait() {
        let queue = JobQueue<Int>(name: "test-full")
        queue.push(contentsOf: 0..<5)
        let start = Self.now()
        #expect(queue.take(max: 5, .fill(within: 60_000 * Self.millisecond)) == Array(0..<5))
        queue.push(contentsOf: 0..<5)
        #expect(queue.take(max: 3, .linger(60_000 * Self.millisecond)) == [0, 1, 2])
        #expect(Self.now() - start < 30_000 * Self.millisecond)
    }

    @Test func lingeringEndsAfterItsTimeWithWhatCame() {
        let queue = JobQueue<Int>(name: "test-linger")
        queue.push(1)
        let start = Self.now()
        #expect(queue.take(max: 10, .linger(20 * Self.millisecond)) == [1])
        #expect(Self.now() - start >= 20 * Self.millisecond)
    }

    /// Another thread fills the batch: the lingering take wakes then, long
    /// before its time is up.
    @Test(arguments: [JobQueue<Int>.Gather.linger(60_000 * 1_000_000), .fill(within: 60_000 * 1_000_000)])
    func aBatchFilledByAnotherThreadEndsTheWait(gather: JobQueue<Int>.Gather) {
        let queue = JobQueue<Int>(name: "test-wake")
        let producer = JobQueue<Int>(name: "test-producer")
        producer.start { _ in
            for i in 0..<8 { queue.push(i) }
        }
        let start = Self.now()
        var got: [Int] = []
        while got.count < 8, let batch = queue.take(max: 8 - got.count, gather) { got += batch }
        #expect(got == Array(0..<8))
        #expect(Self.now() - start < 30_000 * Self.millisecond)
        producer.stop()
    }

    @Test func stopWakesAThreadWaitingForItsFirstItem() {
        let queue = JobQueue<Int>(name: "test-wait")
        let ended = Locked(false)
        queue.start { q in
            while q.take(max: 1) != nil {}
            ended.withLock { $0 = true }
        }
        queue.stop()
        #expect(ended.withLock { $0 })
    }

    @Test func aPoolSharesTheItemsAmongNamedThreads() {
        let queue = JobQueue<Int>(name: "test-pool")
        let names = Locked<Set<String>>([])
        let done = Locked<[Int]>([])
        queue.start(threads: 3) { q in
            let name = currentThreadName()
            names.withLock { _ = $0.insert(name) }
            while let item = q.takeOne() { done.withLock { $0.append(item) } }
        }
        for i in 0..<200 { queue.push(i) }
        queue.stop()
        #expect(done.withLock { $0.sorted() } == Array(0..<200))
        #expect(names.withLock { $0 } == ["test-pool-1", "test-pool-2", "test-pool-3"])
    }

    @Test func aSingleThreadCarriesTheQueuesName() {
        let queue = JobQueue<Int>(name: "a-very-long-thread-name")
        let name = Locked("")
        queue.start { _ in
            let n = currentThreadName()
            name.withLock { $0 = n }
        }
        queue.stop()
        // Linux keeps 15 bytes.
        #expect(name.withLock { $0 } == "a-very-long-thr")
    }

    @Test func aHeldQueueHandsNothingOutUntilReleased() {
        let queue = JobQueue<Int>(name: "test-held", held: true)
        let seen = Locked<[Int]>([])
        queue.start { q in
            while let batch = q.take(max: 10) { seen.withLock { $0 += batch } }
        }
        queue.push(contentsOf: [1, 2, 3])
        #expect(queue.waiting == 3)
        queue.release()
        queue.push(4)
        queue.stop()
        #expect(seen.withLock { $0 } == [1, 2, 3, 4])
    }

    @Test func aQueueStoppedWhileHeldEndsItsThreadWithoutHandingOut() {
        let queue = JobQueue<Int>(name: "test-held", held: true)
        let seen = Locked<[Int]>([])
        let ended = Locked(false)
        queue.start { q in
            while let batch = q.take(max: 10, .linger(0, idle: 1_000 * Self.millisecond)) { seen.withLock { $0 += batch } }
            ended.withLock { $0 = true }
        }
        queue.push(contentsOf: [1, 2])
        queue.stop()
        #expect(ended.withLock { $0 })
        #expect(seen.withLock { $0 }.isEmpty)
    }
}
