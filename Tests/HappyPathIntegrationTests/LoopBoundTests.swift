import Foundation
import HappyPathCore
import HappyPathIO
import Synchronization
import Testing

/// `LoopBound` and `EventLoop.inEventLoop`: a value bound to a loop is
/// read on that loop's thread, and touching it from another thread while
/// the loop runs stops the process (in release builds too).
@Suite struct LoopBoundTests {
    /// Runs `body` on `loop` and waits for its answer.
    private func onLoop<T: Sendable>(_ loop: EventLoop, _ body: @escaping @Sendable () -> T) -> T {
        let answer = Locked<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        loop.execute {
            answer.withLock { $0 = body() }
            done.signal()
        }
        done.wait()
        return answer.withLock { $0! }
    }

    @Test func aLoopBelongsToItsThreadOnlyWhileItRuns() {
        let loop = EventLoop()
        #expect(loop.inEventLoop, "before it runs, whoever sets it up may touch it")
        loop.start(name: "bound")
        #expect(!loop.inEventLoop, "this thread is not the loop's")
        #expect(onLoop(loop) { loop.inEventLoop })
        let other = EventLoop()
        other.start(name: "other")
        #expect(!onLoop(other) { loop.inEventLoop }, "another loop's thread is not this loop's")
        for l in [loop, other] {
            l.execute { l.stop() }
            l.join()
        }
        #expect(loop.inEventLoop, "stopped, it is its holder's again")
        loop.close()
        other.close()
    }

    @Test func aLoopsThreadCarriesItsName() throws {
        let loop = EventLoop()
        loop.start(name: "named-loop-with-a-long-name")
        let comm = onLoop(loop) { try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8) }
        // Linux keeps 15 bytes of a thread's name.
        #expect(comm == "named-loop-with\n")
        loop.execute { loop.stop() }
        loop.join()
        loop.close()
    }

    @Test func aBoundValueIsReadAndChangedOnItsLoop() {
        let loop = EventLoop()
        // Made while the loop is not running yet, as the server does at start.
        let counter = LoopBound([Int](), on: loop)
        loop.start(name: "bound")
        for i in 0..<3 { loop.execute(with: counter) { _ in counter.value.append(i) } }
        #expect(onLoop(loop) { counter.value } == [0, 1, 2])
        // Handed over from this thread while the loop runs.
        let handed = LoopBound(handing: NotSendable(label: "given"), to: loop)
        #expect(onLoop(loop) { handed.value.label } == "given")
        loop.execute { loop.stop() }
        loop.join()
        loop.close()
    }

    @Test func touchingABoundValueOffItsLoopStops() async {
        await #expect(processExitsWith: .failure) {
            let loop = EventLoop()
            let bound = LoopBound(NotSendable(label: "mine"), on: loop)
            loop.start(name: "bound")
            // Not the loop's thread: the check stops the process here.
            _ = bound.value.label
            loop.execute { loop.stop() }
            loop.join()
        }
    }
}

private final class NotSendable {
    let label: String
    init(label: String) { self.label = label }
}
