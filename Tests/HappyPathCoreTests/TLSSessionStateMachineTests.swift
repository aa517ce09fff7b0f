import HappyPathCore
import Testing

@Suite struct TLSSessionStateMachineTests {
    typealias M = TLSSessionStateMachine
    enum Event { case start, ready, stepped(M.StepResult), deadline }

    func run(_ events: [Event]) -> (actions: [M.Actions], state: M.State) {
        var m = M()
        var out: [M.Actions] = []
        for e in events {
            switch e {
            case .start: out.append(m.start())
            case .ready: out.append(m.socketReady())
            case let .stepped(r): out.append(m.stepped(r))
            case .deadline: out.append(m.deadlinePassed())
            }
        }
        return (out, m.state)
    }

    @Test func aHandshakeInOneStep() {
        let r = run([.start, .stepped(.done(version: 13))])
        #expect(r.actions == [
            M.Actions(deadline: true, step: .handshake),
            M.Actions(deadline: false, writeInterest: false, step: .startHTTP(version: 13)),
        ])
        #expect(r.state == .established(version: 13))
    }

    @Test func aHandshakeOverSeveralReadsAndAFullSendBuffer() {
        let r = run([
            .start, .stepped(.wantRead), .ready, .stepped(.wantWrite), .ready, .stepped(.wantRead), .ready,
            .stepped(.done(version: 12)),
        ])
        #expect(r.actions == [
            M.Actions(deadline: true, step: .handshake),
            M.Actions(writeInterest: false),
            M.Actions(step: .handshake),
            M.Actions(writeInterest: true),
            M.Actions(step: .handshake),
            M.Actions(writeInterest: false),
            M.Actions(step: .handshake),
            M.Actions(deadline: false, writeInterest: false, step: .startHTTP(version: 12)),
        ])
    }

    @Test func aTrickledHelloMeetsTheDeadline() {
        let r = run([.start, .stepped(.wantRead), .ready, .stepped(.wantRead), .deadline, .ready, .deadline])
        #expect(r.actions[4] == M.Actions(deadline: false, writeInterest: false, step: .close(.timeout)))
        #expect(r.actions[5] == M.Actions(), "nothing after the close")
        #expect(r.actions[6] == M.Actions())
        #expect(r.state == .failed(.timeout))
    }

    @Test(arguments: TLSHandshakeFailure.allCases.filter { $0 != .timeout })
    func aFailedStepClosesWithItsReason(_ reason: TLSHandshakeFailure) {
        let r = run([.start, .stepped(.failed(reason)), .deadline, .stepped(.done(version: 13))])
        #expect(r.actions[1] == M.Actions(deadline: false, writeInterest: false, step: .close(reason)))
        #expect(r.actions[2] == M.Actions(), "the deadline was cancelled")
        #expect(r.actions[3] == M.Actions())
        #expect(r.state == .failed(reason))
    }

    @Test func afterTheHandshakeTheMachineStaysOutOfTheWay() {
        let r = run([.start, .stepped(.done(version: 13)), .ready, .deadline, .start])
        #expect(r.actions[2...].allSatisfy { $0 == M.Actions() })
        #expect(r.state == .established(version: 13))
    }

    @Test func readinessBeforeTheStartIsIgnored() {
        let r = run([.ready, .deadline, .stepped(.wantRead)])
        #expect(r.actions.allSatisfy { $0 == M.Actions() })
        #expect(r.state == .idle)
    }
}
