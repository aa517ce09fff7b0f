import HappyPathCore
import Testing

/// The pool, connection and stream machines of the proxy's own HTTP/2
/// client (issue 46), as tables of events and the actions they produce,
/// on an injected clock.
@Suite struct HTTP2ClientPoolStateMachineTests {
    typealias M = HTTP2ClientPoolStateMachine
    enum Event: Sendable {
        case want(Int)
        case replayed(Int)
        case opened(Int, Int)
        case capacity(Int, Int)
        case ended(Int)
        case goaway(Int)
        case closed(Int, HTTP2ConnectFailure?)
        case cancelled(Int)
        case at(Int)  // seconds on the clock, then `timer`
        case heard(Int)
        case pong(Int)
        case shutdown
    }
    /// Per connection: id, phase, streams.
    struct Summary: Sendable, Equatable {
        var connections: [String]
        var waiting: [Int]
    }

    static func play(_ scenario: TableScenario<Event, [M.Action], Summary>, maxConnections: Int = 2) {
        var m = M(maxConnections: maxConnections, idleTimeout: .seconds(60))
        var now = Instant(nanoseconds: 0)
        HappyPathCoreTests.play(
            scenario,
            feed: { event in
                switch event {
                case let .want(t): return m.want(t, at: now)
                case let .replayed(t): return m.want(t, at: now, replayed: true)
                case let .opened(c, n): return m.opened(c, maxStreams: n, at: now)
                case let .capacity(c, n): return m.capacityChanged(c, maxStreams: n, at: now)
                case let .ended(c): return m.streamEnded(c, at: now)
                case let .goaway(c): return m.goaway(c)
                case let .closed(c, why): return m.connectionClosed(c, failure: why)
                case let .cancelled(t):
                    m.cancelled(t)
                    return []
                case let .at(s):
                    now = Instant(nanoseconds: Int64(s) * 1_000_000_000)
                    return m.timer(at: now)
                case let .heard(c):
                    m.heard(c, at: now)
                    return []
                case let .pong(c): return m.pingAnswered(c, at: now)
                case .shutdown: return m.shutdown()
                }
            },
            state: {
                Summary(
                    connections: m.connections.map { "\($0.id) \($0.phase) \($0.streams)" }, waiting: m.waiting)
            })
    }

    static let scenarios: [TableScenario<Event, [M.Action], Summary>] = [
        TableScenario(
            name: "the first try opens a connection and waits for its SETTINGS",
            steps: [
                TableStep(.want(1), outcome: [.open(1)], Summary(connections: ["1 opening 0"], waiting: [1])),
                TableStep(.want(2), outcome: [], Summary(connections: ["1 opening 0"], waiting: [1, 2])),
                TableStep(
                    .opened(1, 100), outcome: [.assign(1, 1), .assign(2, 1)],
                    Summary(connections: ["1 ready 2"], waiting: [])),
                TableStep(.want(3), outcome: [.assign(3, 1)], Summary(connections: ["1 ready 3"], waiting: [])),
            ]),
        TableScenario(
            name: "a full connection opens a second; the oldest with room is filled first",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 1), outcome: [.assign(1, 1)]),
                TableStep(.want(2), outcome: [.open(2)], Summary(connections: ["1 ready 1", "2 opening 0"], waiting: [2])),
                TableStep(.opened(2, 1), outcome: [.assign(2, 2)]),
                TableStep(.want(3), outcome: [], Summary(connections: ["1 ready 1", "2 ready 1"], waiting: [3])),
                TableStep(.ended(2), outcome: [.assign(3, 2)], Summary(connections: ["1 ready 1", "2 ready 1"], waiting: [])),
                TableStep(.ended(1), outcome: []),
                TableStep(.want(4), outcome: [.assign(4, 1)], Summary(connections: ["1 ready 1", "2 ready 1"], waiting: [])),
            ]),
        TableScenario(
            name: "no more than maxConnections: the rest wait for room",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 1), outcome: [.assign(1, 1)]),
                TableStep(.want(2), outcome: [.open(2)]),
                TableStep(.opened(2, 1), outcome: [.assign(2, 2)]),
                TableStep(.want(3), outcome: [], Summary(connections: ["1 ready 1", "2 ready 1"], waiting: [3])),
                TableStep(.want(4), outcome: [], Summary(connections: ["1 ready 1", "2 ready 1"], waiting: [3, 4])),
                TableStep(.capacity(1, 3), outcome: [.assign(3, 1), .assign(4, 1)]),
            ]),
        TableScenario(
            name: "a burst opens one connection, not one per try",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.want(2), outcome: []),
                TableStep(.want(3), outcome: []),
                TableStep(.opened(1, 2), outcome: [.assign(1, 1), .assign(2, 1), .open(2)]),
                TableStep(.opened(2, 100), outcome: [.assign(3, 2)]),
            ]),
        TableScenario(
            name: "a connection that fails before it is ready fails the tries that waited on it",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.want(2), outcome: []),
                TableStep(
                    .closed(1, "could not connect"), outcome: [.fail(1, "could not connect"), .fail(2, "could not connect")],
                    Summary(connections: [], waiting: [])),
                TableStep(.want(3), outcome: [.open(2)], Summary(connections: ["2 opening 0"], waiting: [3])),
            ]),
        TableScenario(
            name: "a failed TLS handshake fails the waiting tries as TLS failures (not retried)",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(
                    .closed(1, HTTP2ConnectFailure("certificate", tls: true)),
                    outcome: [.fail(1, HTTP2ConnectFailure("certificate", tls: true))],
                    Summary(connections: [], waiting: [])),
            ]),
        TableScenario(
            name: "a ready connection that closes leaves its waiters for a new one",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 1), outcome: [.assign(1, 1)]),
                TableStep(.want(2), outcome: [.open(2)]),
                TableStep(.closed(2, "refused"), outcome: [], Summary(connections: ["1 ready 1"], waiting: [2])),
                TableStep(.closed(1, nil), outcome: [.open(3)], Summary(connections: ["3 opening 0"], waiting: [2])),
            ]),
        TableScenario(
            name: "a GOAWAY drains: nothing new on it, it closes when its last stream ends",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 100), outcome: [.assign(1, 1)]),
                TableStep(.goaway(1), outcome: [], Summary(connections: ["1 draining 1"], waiting: [])),
                TableStep(.want(2), outcome: [.open(2)], Summary(connections: ["1 draining 1", "2 opening 0"], waiting: [2])),
                TableStep(.ended(1), outcome: [.close(1, .drained)]),
                TableStep(.closed(1, nil), outcome: [], Summary(connections: ["2 opening 0"], waiting: [2])),
                TableStep(.opened(2, 100), outcome: [.assign(2, 2)]),
                TableStep(.goaway(2), outcome: []),
                TableStep(.goaway(2), outcome: [], Summary(connections: ["2 draining 1"], waiting: [])),
            ]),
        TableScenario(
            name: "a GOAWAY on an idle connection closes it at once",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 100), outcome: [.assign(1, 1)]),
                TableStep(.ended(1), outcome: []),
                TableStep(.goaway(1), outcome: [.close(1, .drained)]),
            ]),
        TableScenario(
            name: "a GOAWAY before SETTINGS fails the waiters when nothing else is open",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.goaway(1), outcome: [.close(1, .drained), .fail(1, "the upstream sent GOAWAY before its SETTINGS")]),
            ]),
        TableScenario(
            name: "an idle connection closes after the idle timeout, a busy one never",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 100), outcome: [.assign(1, 1)]),
                TableStep(.at(100), outcome: [], Summary(connections: ["1 ready 1"], waiting: [])),
                TableStep(.ended(1), outcome: []),
                TableStep(.at(159), outcome: []),
                TableStep(.at(160), outcome: [.close(1, .idle)], Summary(connections: ["1 draining 0"], waiting: [])),
                TableStep(.at(161), outcome: []),
            ]),
        TableScenario(
            name: "a withdrawn try leaves the queue",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.want(2), outcome: []),
                TableStep(.cancelled(1), outcome: [], Summary(connections: ["1 opening 0"], waiting: [2])),
                TableStep(.opened(1, 100), outcome: [.assign(2, 1)]),
            ]),
        TableScenario(
            name: "a stream limit of 0 takes nothing; a raise takes the waiters",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 0), outcome: [.open(2)]),
                TableStep(.capacity(1, 1), outcome: [.assign(1, 1)]),
            ]),
        TableScenario(
            name: "a connection silent past 10 s is asked a PING before it takes a stream; the ACK lets the try on",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 100), outcome: [.assign(1, 1)]),
                TableStep(.ended(1), outcome: []),
                TableStep(.at(9), outcome: []),
                TableStep(.want(2), outcome: [.assign(2, 1)], Summary(connections: ["1 ready 1"], waiting: [])),
                TableStep(.ended(1), outcome: []),
                TableStep(.heard(1)),
                TableStep(.at(18), outcome: []),
                TableStep(.want(3), outcome: [.assign(3, 1)]),
                TableStep(.at(29), outcome: []),
                TableStep(
                    .want(4), outcome: [.verify(1)], Summary(connections: ["1 verifying 1"], waiting: [4])),
                TableStep(.want(5), outcome: [], Summary(connections: ["1 verifying 1"], waiting: [4, 5])),
                TableStep(.pong(1), outcome: [.assign(4, 1), .assign(5, 1)], Summary(connections: ["1 ready 3"], waiting: [])),
                TableStep(.pong(1), outcome: []),
            ]),
        TableScenario(
            name: "a PING unanswered: the connection closes and the waiting tries go to a new one",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 100), outcome: [.assign(1, 1)]),
                TableStep(.at(11), outcome: []),
                TableStep(.want(2), outcome: [.verify(1)]),
                TableStep(.closed(1, "the upstream did not answer a PING"), outcome: [.open(2)], Summary(connections: ["2 opening 0"], waiting: [2])),
                TableStep(.opened(2, 100), outcome: [.assign(2, 2)]),
            ]),
        TableScenario(
            name: "a replayed try goes before the tries waiting",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.want(2), outcome: []),
                TableStep(.replayed(9), outcome: [], Summary(connections: ["1 opening 0"], waiting: [9, 1, 2])),
                TableStep(.opened(1, 2), outcome: [.assign(9, 1), .assign(1, 1), .open(2)]),
            ]),
        TableScenario(
            name: "shutdown fails the waiters and closes every connection",
            steps: [
                TableStep(.want(1), outcome: [.open(1)]),
                TableStep(.opened(1, 1), outcome: [.assign(1, 1)]),
                TableStep(.want(2), outcome: [.open(2)]),
                TableStep(
                    .shutdown,
                    outcome: [.fail(2, "the proxy is shutting down"), .close(1, .shutdown), .close(2, .shutdown)]),
                TableStep(.want(3), outcome: [.fail(3, "the proxy is shutting down")]),
            ]),
    ]

    @Test(arguments: scenarios) func pool(_ scenario: TableScenario<Event, [M.Action], Summary>) {
        Self.play(scenario)
    }

    /// An upstream that refuses every connection (a failed connect here;
    /// GOAWAY at once or no SETTINGS count the same): from the third in a
    /// row, the next connection waits 100 ms, doubling to 5 s; one that
    /// serves a stream resets it.
    @Test func aStormOfFailedConnectionsBacksOff() {
        var m = M(maxConnections: 2, idleTimeout: .seconds(60))
        var t = Instant(nanoseconds: 1_000_000_000)
        for i in 1...3 {
            #expect(m.want(i, at: t) == [.open(i)])
            #expect(m.connectionClosed(i, failure: "refused", served: false, at: t) == [.fail(i, "refused")])
        }
        #expect(m.failedInARow == 3)
        #expect(m.backoffUntil == t + .milliseconds(100))
        #expect(
            m.want(40, at: t)
                == [.fail(40, "refused (3 connections in a row served nothing; the next opens after a backoff)")],
            "fails at once: no connection to wait for")
        #expect(m.nextDeadline == nil, "nothing waits")
        t = t + .milliseconds(99)
        #expect(m.want(41, at: t).count == 1)
        t = t + .milliseconds(1)
        #expect(m.want(42, at: t) == [.open(4)])
        #expect(m.connectionClosed(4, failure: "refused", served: false, at: t) == [.fail(42, "refused")])
        #expect(m.backoffUntil == t + .milliseconds(200))
        var id = 5
        for _ in 0..<10 {
            t = t + .seconds(6)
            #expect(m.want(id, at: t) == [.open(id)])
            _ = m.connectionClosed(id, failure: "refused", served: false, at: t)
            id += 1
        }
        #expect(m.backoffUntil == t + .seconds(5), "never more than 5 s")
        t = t + .seconds(5)
        #expect(m.want(id, at: t) == [.open(id)])
        #expect(m.opened(id, maxStreams: 10, at: t) == [.assign(id, id)])
        _ = m.streamEnded(id, at: t)
        #expect(m.connectionClosed(id, failure: nil, served: true, at: t) == [])
        #expect(m.failedInARow == 0 && m.backoffUntil == nil)
    }

    @Test func oneConnectionAtMostWhenThatIsTheLimit() {
        Self.play(
            TableScenario(
                name: "max 1",
                steps: [
                    TableStep(.want(1), outcome: [.open(1)]),
                    TableStep(.opened(1, 1), outcome: [.assign(1, 1)]),
                    TableStep(.want(2), outcome: [], Summary(connections: ["1 ready 1"], waiting: [2])),
                    TableStep(.ended(1), outcome: [.assign(2, 1)]),
                ]), maxConnections: 1)
    }

    /// Random events never put more streams on a connection than its
    /// limit, never open past the cap, and every try is assigned, failed
    /// or withdrawn exactly once.
    @Test(arguments: 0..<20) func randomEventsKeepTheBounds(seed: Int) {
        var random = SeededRandom(seed: UInt64(seed))
        var m = M(maxConnections: 3, idleTimeout: .seconds(1))
        var settled: [Int: Int] = [:]
        var streams: [Int: Int] = [:]  // connection -> open streams
        var nextTry = 1
        var now = Instant(nanoseconds: 0)
        func take(_ actions: [M.Action]) {
            for a in actions {
                switch a {
                case let .assign(t, c):
                    settled[t, default: 0] += 1
                    streams[c, default: 0] += 1
                case let .fail(t, _): settled[t, default: 0] += 1
                case let .close(c, _):
                    streams[c] = nil
                    take(m.connectionClosed(c, failure: nil))
                case let .verify(c): if Int.random(in: 0..<2, using: &random) == 0 { take(m.pingAnswered(c, at: now)) }
                case .open: break
                }
            }
        }
        for _ in 0..<400 {
            let ids = m.connections.map(\.id)
            switch Int.random(in: 0..<9, using: &random) {
            case 0, 1, 2:
                take(m.want(nextTry, at: now))
                nextTry += 1
            case 3:
                if let c = m.connections.first(where: { $0.phase == .opening }) {
                    take(m.opened(c.id, maxStreams: Int.random(in: 0...3, using: &random), at: now))
                }
            case 4:
                if let c = ids.randElement(&random), (streams[c] ?? 0) > 0 {
                    streams[c]! -= 1
                    take(m.streamEnded(c, at: now))
                }
            case 5: if let c = ids.randElement(&random) { take(m.goaway(c)) }
            case 6:
                if let c = ids.randElement(&random) {
                    streams[c] = nil
                    take(m.connectionClosed(c, failure: "gone"))
                }
            case 7:
                if let t = m.waiting.first {
                    m.cancelled(t)
                    settled[t, default: 0] += 1
                }
            default:
                now = now + .milliseconds(Int64.random(in: 0...1500, using: &random))
                take(m.timer(at: now))
            }
            #expect(m.connections.filter { $0.phase != .draining }.count <= 3)
            for c in m.connections where c.phase == .ready && c.streams > 0 {
                #expect(c.streams == streams[c.id] ?? 0)
            }
            #expect(settled.values.allSatisfy { $0 == 1 }, "a try settled twice")
        }
        for t in 1..<nextTry where settled[t] == nil { #expect(m.waiting.contains(t), "try \(t) lost") }
    }
}

extension Array {
    fileprivate func randElement(_ random: inout SeededRandom) -> Element? {
        isEmpty ? nil : self[Int.random(in: 0..<count, using: &random)]
    }
}

@Suite struct HTTP2ClientConnectionStateMachineTests {
    typealias M = HTTP2ClientConnectionStateMachine
    enum Event: Sendable {
        case start, resolving, resolved, connected, connectedTLS, handshakeDone, handshakeFailed(String)
        case connectFailed(String), settings(Int), goaway, failed(M.CloseReason), close
        case at(Int)  // milliseconds, then `timer`
        case ping, pong
    }

    static func play(_ scenario: TableScenario<Event, M.Action, M.State>) {
        var m = M(connectTimeout: .seconds(1))
        var now = Instant(nanoseconds: 0)
        HappyPathCoreTests.play(
            scenario,
            feed: { event in
                switch event {
                case .start: return m.start(at: now)
                case .resolving:
                    m.resolving("api.internal")
                    return M.Action.none
                case .resolved:
                    m.resolved()
                    return M.Action.none
                case .connected: return m.connected(at: now)
                case .connectedTLS: return m.connected(at: now, tls: true)
                case .handshakeDone: return m.handshakeDone(at: now)
                case let .handshakeFailed(why): return m.handshakeFailed(why)
                case let .connectFailed(why): return m.connectFailed(why)
                case let .settings(n): return m.settings(maxStreams: n)
                case .goaway: return m.goaway()
                case let .failed(reason): return m.failed(reason)
                case .close: return m.closeRequested()
                case let .at(ms):
                    now = Instant(nanoseconds: Int64(ms) * 1_000_000)
                    return m.timer(at: now)
                case .ping:
                    m.pingSent(at: now)
                    return M.Action.none
                case .pong: return m.pingAnswered() ? .ready(maxStreams: -1) : M.Action.none
                }
            }, state: { m.state })
    }

    static func ms(_ n: Int64) -> Instant { Instant(nanoseconds: n * 1_000_000) }

    static let scenarios: [TableScenario<Event, M.Action, M.State>] = [
        TableScenario(
            name: "connect, SETTINGS, ready; a later SETTINGS changes the limit",
            steps: [
                TableStep(.start, outcome: M.Action.none, .connecting(deadline: ms(1000))),
                TableStep(.at(300), outcome: M.Action.none),
                TableStep(.connected, outcome: .startSession, .awaitingSettings(deadline: ms(1300))),
                TableStep(.settings(100), outcome: .ready(maxStreams: 100), .ready),
                TableStep(.settings(10), outcome: .capacityChanged(maxStreams: 10), .ready),
                TableStep(.at(5000), outcome: M.Action.none, .ready),
            ]),
        TableScenario(
            name: "https: the TLS handshake has its own connect timeout, then SETTINGS has another",
            steps: [
                TableStep(.start),
                TableStep(.at(400), outcome: M.Action.none),
                TableStep(.connectedTLS, outcome: .startHandshake, .handshaking(deadline: ms(1400))),
                TableStep(.settings(100), outcome: M.Action.none, .handshaking(deadline: ms(1400))),
                TableStep(.at(1000), outcome: M.Action.none),
                TableStep(.handshakeDone, outcome: .startSession, .awaitingSettings(deadline: ms(2000))),
                TableStep(.handshakeDone, outcome: M.Action.none),
                TableStep(.settings(100), outcome: .ready(maxStreams: 100), .ready),
            ]),
        TableScenario(
            name: "https: a handshake that stalls times out; one that fails says why",
            steps: [
                TableStep(.start), TableStep(.connectedTLS),
                TableStep(.at(999), outcome: M.Action.none),
                TableStep(.at(1000), outcome: .close(.handshakeTimeout), .closed(.handshakeTimeout)),
                TableStep(.handshakeFailed("late"), outcome: M.Action.none, .closed(.handshakeTimeout)),
            ]),
        TableScenario(
            name: "https: a refused certificate closes the connection as a TLS failure",
            steps: [
                TableStep(.start), TableStep(.connectedTLS),
                TableStep(.handshakeFailed("unknown CA"), outcome: .close(.tlsFailed("unknown CA")), .closed(.tlsFailed("unknown CA"))),
            ]),
        TableScenario(
            name: "a name not resolved within the connect timeout says so",
            steps: [
                TableStep(.start), TableStep(.resolving),
                TableStep(.at(1000), outcome: .close(.resolveTimeout("api.internal")), .closed(.resolveTimeout("api.internal"))),
            ]),
        TableScenario(
            name: "a name resolved: the connect has what is left of the same deadline",
            steps: [
                TableStep(.start), TableStep(.resolving), TableStep(.at(600)), TableStep(.resolved),
                TableStep(.at(1000), outcome: .close(.connectTimeout), .closed(.connectTimeout)),
            ]),
        TableScenario(
            name: "no connection within the connect timeout",
            steps: [
                TableStep(.start),
                TableStep(.at(999), outcome: M.Action.none),
                TableStep(.at(1000), outcome: .close(.connectTimeout), .closed(.connectTimeout)),
                TableStep(.connected, outcome: M.Action.none, .closed(.connectTimeout)),
            ]),
        TableScenario(
            name: "connected but no SETTINGS (not an h2c server)",
            steps: [
                TableStep(.start), TableStep(.at(500)), TableStep(.connected),
                TableStep(.at(1499), outcome: M.Action.none),
                TableStep(.at(1500), outcome: .close(.settingsTimeout), .closed(.settingsTimeout)),
                TableStep(.settings(100), outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a refused connect",
            steps: [
                TableStep(.start),
                TableStep(.connectFailed("Connection refused"), outcome: .close(.connectFailed("Connection refused"))),
                TableStep(.at(2000), outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a GOAWAY drains; the pool closes it",
            steps: [
                TableStep(.start), TableStep(.connected), TableStep(.settings(100)),
                TableStep(.goaway, outcome: .draining, .draining),
                TableStep(.goaway, outcome: M.Action.none, .draining),
                TableStep(.settings(5), outcome: .capacityChanged(maxStreams: 5)),
                TableStep(.close, outcome: .close(.closedByPool), .closed(.closedByPool)),
                TableStep(.close, outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a GOAWAY before SETTINGS is a protocol error",
            steps: [
                TableStep(.start), TableStep(.connected),
                TableStep(.goaway, outcome: .close(.protocolError("GOAWAY before SETTINGS"))),
            ]),
        TableScenario(
            name: "a PING answered in time; one unanswered closes the connection",
            steps: [
                TableStep(.start), TableStep(.connected), TableStep(.settings(100)),
                TableStep(.at(5000), outcome: M.Action.none),
                TableStep(.ping), TableStep(.at(5999), outcome: M.Action.none),
                TableStep(.pong, outcome: .ready(maxStreams: -1), .ready),
                TableStep(.at(9000), outcome: M.Action.none),
                TableStep(.pong, outcome: M.Action.none),
                TableStep(.ping), TableStep(.ping),
                TableStep(.at(9999), outcome: M.Action.none),
                TableStep(.at(10000), outcome: .close(.pingTimeout), .closed(.pingTimeout)),
            ]),
        TableScenario(
            name: "the peer closes a ready connection",
            steps: [
                TableStep(.start), TableStep(.connected), TableStep(.settings(1)),
                TableStep(.failed(.peerClosed("end of stream")), outcome: .close(.peerClosed("end of stream"))),
                TableStep(.failed(.protocolError("x")), outcome: M.Action.none, .closed(.peerClosed("end of stream"))),
            ]),
    ]

    @Test(arguments: scenarios) func connection(_ scenario: TableScenario<Event, M.Action, M.State>) {
        Self.play(scenario)
    }

    @Test func eachReasonSaysWhatHappened() {
        #expect(M.CloseReason.settingsTimeout.failure.contains("h2c"))
        #expect(M.CloseReason.connectTimeout.failure.contains("connect_timeout"))
        #expect(M.CloseReason.connectFailed("Connection refused").failure.hasSuffix("Connection refused"))
        #expect(M.CloseReason.handshakeTimeout.failure.contains("TLS handshake"))
        #expect(M.CloseReason.tlsFailed("unknown CA").connectFailure == HTTP2ConnectFailure("unknown CA", tls: true))
        #expect(!M.CloseReason.handshakeTimeout.connectFailure.tls)
    }
}

@Suite struct HTTP2ClientStreamStateMachineTests {
    typealias M = HTTP2ClientStreamStateMachine
    enum Event: Sendable {
        case assigned, head(String?), data(Int), delivered(Int, Bool), pause, resume, heldDelivered(Bool)
        case closed(M.Outcome), cancel, failedWaiting(HTTP2ConnectFailure)
        case closedResendable(M.Outcome)
        case idle
    }
    struct Summary: Sendable, Equatable {
        var state: M.State
        var paused: Bool
        var held: Int
    }

    static func play(_ scenario: TableScenario<Event, M.Action, Summary>) {
        var m = M()
        HappyPathCoreTests.play(
            scenario,
            feed: { event in
                switch event {
                case .assigned:
                    m.assigned()
                    return M.Action.none
                case let .head(refusal): return m.headEnded(refusal: refusal)
                case let .data(n): return m.data(n)
                case let .delivered(n, taken): return m.delivered(n, taken: taken)
                case .pause:
                    m.pause()
                    return M.Action.none
                case .resume: return m.resume()
                case let .heldDelivered(taken): return m.heldDelivered(taken: taken)
                case let .closed(o): return m.closed(o)
                case let .closedResendable(o): return m.closed(o, canResend: true)
                case .idle: return m.idle()
                case .cancel: return m.cancel()
                case let .failedWaiting(why): return m.failedWaiting(why)
                }
            }, state: { Summary(state: m.state, paused: m.paused, held: m.held) })
    }

    static let scenarios: [TableScenario<Event, M.Action, Summary>] = [
        TableScenario(
            name: "a response taken as it comes",
            steps: [
                TableStep(.assigned), TableStep(.head(nil), outcome: M.Action.none),
                TableStep(.data(100), outcome: .deliver),
                TableStep(.delivered(100, true), outcome: .consume(100), Summary(state: .open, paused: false, held: 0)),
                TableStep(.closed(.complete), outcome: .finish(.complete), Summary(state: .finished, paused: false, held: 0)),
                TableStep(.data(5), outcome: .consume(5)),
            ]),
        TableScenario(
            name: "a refused chunk is held with the later ones, and nothing is consumed until they are taken",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)),
                TableStep(.data(100), outcome: .deliver),
                TableStep(.delivered(100, false), outcome: .hold, Summary(state: .open, paused: true, held: 100)),
                TableStep(.data(50), outcome: .hold, Summary(state: .open, paused: true, held: 150)),
                TableStep(.resume, outcome: .deliverHeldSoon, Summary(state: .open, paused: false, held: 150)),
                TableStep(.data(10), outcome: .hold, Summary(state: .open, paused: false, held: 160)),
                TableStep(.heldDelivered(false), outcome: M.Action.none, Summary(state: .open, paused: true, held: 160)),
                TableStep(.resume, outcome: .deliverHeldSoon),
                TableStep(.heldDelivered(true), outcome: .consume(160), Summary(state: .open, paused: false, held: 0)),
                TableStep(.data(7), outcome: .deliver),
            ]),
        TableScenario(
            name: "the end waits for the held bytes",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)), TableStep(.data(100)), TableStep(.delivered(100, false)),
                TableStep(.closed(.complete), outcome: M.Action.none, Summary(state: .open, paused: true, held: 100)),
                TableStep(.resume, outcome: .deliverHeldSoon),
                TableStep(.heldDelivered(true), outcome: .finish(.complete), Summary(state: .finished, paused: false, held: 0)),
            ]),
        TableScenario(
            name: "a failure does not wait for the held bytes",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)), TableStep(.data(100)), TableStep(.delivered(100, false)),
                TableStep(.closed(.resetByPeer(2)), outcome: .finish(.resetByPeer(2))),
                TableStep(.resume, outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a pause before any byte holds the next chunk; a resume with nothing held does nothing",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)), TableStep(.pause),
                TableStep(.resume, outcome: M.Action.none, Summary(state: .open, paused: false, held: 0)),
                TableStep(.pause),
                TableStep(.data(30), outcome: .hold, Summary(state: .open, paused: true, held: 30)),
                TableStep(.resume, outcome: .deliverHeldSoon),
            ]),
        TableScenario(
            name: "a paused stream that ends with nothing held finishes at once",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)), TableStep(.pause),
                TableStep(.closed(.complete), outcome: .finish(.complete)),
            ]),
        TableScenario(
            name: "a refused head resets the stream and ends the try",
            steps: [
                TableStep(.assigned),
                TableStep(
                    .head("too large"), outcome: .reset(code: 8, outcome: .badResponse("too large")),
                    Summary(state: .finished, paused: false, held: 0)),
                TableStep(.closed(.complete), outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a cancel on the wire resets; in the queue it withdraws; after the end nothing",
            steps: [
                TableStep(.cancel, outcome: .withdraw, Summary(state: .finished, paused: false, held: 0)),
                TableStep(.cancel, outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a cancel of an open stream",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)),
                TableStep(.cancel, outcome: .reset(code: 8, outcome: nil)),
                TableStep(.closed(.complete), outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a cancel of a stream that ended with bytes held resets nothing",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)), TableStep(.data(10)), TableStep(.delivered(10, false)),
                TableStep(.closed(.complete)),
                TableStep(.cancel, outcome: M.Action.none, Summary(state: .finished, paused: true, held: 10)),
            ]),
        TableScenario(
            name: "no connection for a waiting try",
            steps: [
                TableStep(.failedWaiting("refused"), outcome: .finish(.noConnection("refused"))),
                TableStep(.assigned, outcome: M.Action.none, Summary(state: .finished, paused: false, held: 0)),
            ]),
        TableScenario(
            name: "a failed TLS handshake ends a waiting try as a TLS failure",
            steps: [
                TableStep(
                    .failedWaiting(HTTP2ConnectFailure("unknown CA", tls: true)), outcome: .finish(.tlsFailed("unknown CA"))),
            ]),
        TableScenario(
            name: "refused or lost streams whose body cannot be sent again end at once",
            steps: [
                TableStep(.assigned),
                TableStep(.closed(.refused), outcome: .finish(.refused)),
                TableStep(.closed(.connectionLost("x")), outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a refused stream is sent again twice, then the try fails as never sent",
            steps: [
                TableStep(.assigned),
                TableStep(.closedResendable(.refused), outcome: .replay, Summary(state: .waiting, paused: false, held: 0)),
                TableStep(.assigned),
                TableStep(.closedResendable(.unsent("gone")), outcome: .replay),
                TableStep(.assigned),
                TableStep(.closedResendable(.refused), outcome: .finish(.refused), Summary(state: .finished, paused: false, held: 0)),
            ]),
        TableScenario(
            name: "a stream lost after its HEADERS went out is not sent again",
            steps: [
                TableStep(.assigned),
                TableStep(.closedResendable(.connectionLost("reset")), outcome: .finish(.connectionLost("reset"))),
            ]),
        TableScenario(
            name: "a refusal after the head reached the handler is not sent again",
            steps: [
                TableStep(.assigned), TableStep(.head(nil)),
                TableStep(.closedResendable(.refused), outcome: .finish(.refused)),
            ]),
        TableScenario(
            name: "an idle stream times out; one the proxy paused never does",
            steps: [
                TableStep(.idle, outcome: M.Action.none, Summary(state: .waiting, paused: false, held: 0)),
                TableStep(.assigned), TableStep(.head(nil)), TableStep(.pause),
                TableStep(.idle, outcome: M.Action.none, Summary(state: .open, paused: true, held: 0)),
                TableStep(.resume),
                TableStep(
                    .idle, outcome: .reset(code: 8, outcome: .timedOut), Summary(state: .finished, paused: false, held: 0)),
                TableStep(.idle, outcome: M.Action.none),
            ]),
        TableScenario(
            name: "a stream holding bytes for its handler is not idle",
            steps: [
                TableStep(.assigned), TableStep(.data(10)), TableStep(.delivered(10, false)), TableStep(.resume),
                TableStep(.idle, outcome: M.Action.none, Summary(state: .open, paused: false, held: 10)),
            ]),
        TableScenario(
            name: "a replayed try cancelled while it waits again is withdrawn",
            steps: [
                TableStep(.assigned),
                TableStep(.closedResendable(.refused), outcome: .replay),
                TableStep(.cancel, outcome: .withdraw),
            ]),
    ]

    @Test(arguments: scenarios) func stream(_ scenario: TableScenario<Event, M.Action, Summary>) {
        Self.play(scenario)
    }
}
