import HappyPathCore
import Testing

/// The tunnel's lifecycle as tables of events and the actions they
/// produce, on an injected clock (milliseconds from 0).
@Suite struct TunnelStateMachineTests {
    typealias M = TunnelStateMachine
    typealias A = M.Actions

    enum Event {
        case start(towardClient: Int, towardUpstream: Int)
        /// Bytes read from `side`; `queued` wait toward the other side.
        case moved(M.Side, queued: Int)
        case flushed(toward: M.Side, queued: Int)
        case ended(M.Side)
        case failed(M.Side)
        case timer
        case shutdown
        /// The clock moves on (no action).
        case wait(milliseconds: Int64)
    }

    static let limits = M.Limits(idle: .seconds(10), highWater: 100, lowWater: 20, linger: .seconds(2))

    func run(_ events: [Event]) -> (actions: [A], machine: M) {
        var now: Int64 = 0
        var m = M(limits: Self.limits, now: Instant(nanoseconds: 0))
        var out: [A] = []
        for e in events {
            let at = Instant(nanoseconds: now * 1_000_000)
            switch e {
            case let .start(c, u): out.append(m.start(queuedTowardClient: c, queuedTowardUpstream: u, now: at))
            case let .moved(side, queued): out.append(m.moved(from: side, queued: queued, now: at))
            case let .flushed(side, queued): out.append(m.flushed(toward: side, queued: queued, now: at))
            case let .ended(side): out.append(m.ended(side, now: at))
            case let .failed(side): out.append(m.failed(side))
            case .timer: out.append(m.timerFired(now: at))
            case .shutdown: out.append(m.shutdown())
            case let .wait(ms): now += ms
            }
        }
        return (out, m)
    }

    @Test func opensReadingBothSidesWithTheIdleTimer() {
        let r = run([.start(towardClient: 0, towardUpstream: 0)])
        #expect(r.actions == [A(readClient: true, readUpstream: true, timer: .seconds(10))])
        #expect(r.machine.state == .open)
    }

    @Test func bytesThatCameWithTheHandshakeCountAgainstTheQueue() {
        // 150 bytes already wait toward the upstream: the client is not read yet.
        let r = run([.start(towardClient: 0, towardUpstream: 150), .flushed(toward: .upstream, queued: 10)])
        #expect(r.actions == [A(readClient: false, readUpstream: true, timer: .seconds(10)), A(readClient: true)])
    }

    @Test func aSlowClientPausesTheUpstreamUntilItsQueueDrainsToLowWater() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0),
            .moved(.upstream, queued: 50),  // under high water: nothing
            .moved(.upstream, queued: 101),  // over: stop reading the upstream
            .moved(.upstream, queued: 120),  // (a read already under way) no second pause
            .flushed(toward: .client, queued: 60),  // above low water: still paused
            .flushed(toward: .client, queued: 20),  // at low water: read again
            .flushed(toward: .client, queued: 0),  // already reading: nothing
        ])
        #expect(Array(r.actions.dropFirst()) == [A(), A(readUpstream: false), A(), A(), A(readUpstream: true), A()])
    }

    @Test func aSlowUpstreamPausesTheClient() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0), .moved(.client, queued: 500), .flushed(toward: .upstream, queued: 0),
        ])
        #expect(Array(r.actions.dropFirst()) == [A(readClient: false), A(readClient: true)])
    }

    @Test func theClientsEndIsPassedOnThenBothCloseWhenTheUpstreamEnds() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0),
            .ended(.client),  // nothing queued toward the upstream: half-close it now
            .moved(.upstream, queued: 0),  // the upstream still answers (its close frame)
            .ended(.upstream),
        ])
        #expect(
            Array(r.actions.dropFirst()) == [
                A(readClient: false, endWrite: .upstream, timer: .seconds(2)),
                A(),
                A(readUpstream: false, endWrite: .client, close: .clientClosed),
            ])
        #expect(r.machine.state == .closed(.clientClosed))
    }

    @Test func anEndWaitsForTheBytesQueuedBeforeIt() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0),
            .moved(.upstream, queued: 40),
            .ended(.upstream),  // 40 bytes still go to the client first
            .flushed(toward: .client, queued: 10),
            .flushed(toward: .client, queued: 0),  // now the end follows them
            .ended(.client),
        ])
        #expect(
            Array(r.actions.dropFirst(2)) == [
                A(readUpstream: false, timer: .seconds(2)),
                A(),
                A(endWrite: .client),
                A(readClient: false, endWrite: .upstream, close: .upstreamClosed),
            ])
    }

    @Test func aSideThatNeverEndsIsClosedAfterTheLinger() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0), .ended(.upstream), .wait(milliseconds: 1500), .timer,
            .wait(milliseconds: 500), .timer,
        ])
        // (`wait` adds no action.)
        #expect(r.actions[2] == A(timer: .milliseconds(500)), "a timer that fires early is armed again for the rest")
        #expect(r.actions[3] == A(close: .upstreamClosed))
    }

    @Test func bytesStillMovingPostponeTheLinger() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0), .ended(.client),
            .wait(milliseconds: 1500), .moved(.upstream, queued: 0),  // the upstream still sends at 1.5 s
            .wait(milliseconds: 500), .timer,  // 2 s: 0.5 s since the last byte
            .wait(milliseconds: 1500), .timer,  // 3.5 s: 2 s since the last byte
        ])
        #expect(r.actions[3] == A(timer: .milliseconds(1500)))
        #expect(r.actions[4] == A(close: .clientClosed))
    }

    @Test func aLingerThatEndsWithBytesStuckIsAnError() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0), .moved(.upstream, queued: 50), .ended(.upstream),
            .wait(milliseconds: 2000), .timer,
        ])
        #expect(r.actions[3] == A(close: .error), "50 bytes never reached the client")
    }

    @Test func aResetClosesBothAtOnce() {
        let r = run([.start(towardClient: 0, towardUpstream: 0), .moved(.client, queued: 10), .failed(.upstream), .ended(.client)])
        #expect(r.actions[2] == A(close: .error))
        #expect(r.actions[3] == A(), "nothing after the close")
        #expect(r.machine.state == .closed(.error))
    }

    @Test func aResetAfterAnEndKeepsTheEndsReason() {
        // A client that closes without reading the upstream's last bytes resets.
        let r = run([.start(towardClient: 0, towardUpstream: 0), .ended(.upstream), .failed(.client)])
        #expect(r.actions[2] == A(close: .upstreamClosed))
    }

    @Test func quietForTheIdleTimeoutCloses() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0),
            .wait(milliseconds: 4000), .moved(.client, queued: 0),  // activity at 4 s
            .wait(milliseconds: 6000), .timer,  // 10 s: only 6 s quiet
            .wait(milliseconds: 4000), .timer,  // 14 s: 10 s quiet
        ])
        #expect(r.actions[2] == A(timer: .seconds(4)))
        #expect(r.actions[3] == A(close: .idle))
        #expect(r.machine.state == .closed(.idle))
    }

    @Test func writesCountAsActivity() {
        let r = run([
            .start(towardClient: 0, towardUpstream: 0), .wait(milliseconds: 9000), .flushed(toward: .client, queued: 0),
            .wait(milliseconds: 1000), .timer,
        ])
        #expect(r.actions[2] == A(timer: .seconds(9)))
    }

    @Test func shutdownClosesAnOpenTunnelOnce() {
        let r = run([.start(towardClient: 0, towardUpstream: 0), .shutdown, .shutdown, .timer, .moved(.client, queued: 1)])
        #expect(Array(r.actions.dropFirst()) == [A(close: .shutdown), A(), A(), A()])
    }

    @Test func aSecondEndOfTheSameSideIsIgnored() {
        let r = run([.start(towardClient: 0, towardUpstream: 0), .ended(.client), .ended(.client)])
        #expect(r.actions[2] == A())
        #expect(r.machine.state == .ending(first: .client, since: Instant(nanoseconds: 0)))
    }

    @Test func lowWaterIsNeverAboveHighWater() {
        #expect(M.Limits(idle: .seconds(1), highWater: 10, lowWater: 50).lowWater == 10)
    }
}
