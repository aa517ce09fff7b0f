import HappyPathCore
import Testing

/// The Redis link's lifecycle as tables of events and the actions they
/// produce, on an injected clock (milliseconds from 0): timeout 50 ms,
/// retry 1 s, a greeting of two commands.
@Suite struct RedisLinkStateMachineTests {
    typealias M = RedisLinkStateMachine
    typealias A = M.Action

    enum Event: Sendable {
        case start
        case connected
        case send(UInt64)
        case reply(error: String? = nil)
        case timer
        case failed(String)
        case stop
        /// The clock moves on (no action).
        case wait(milliseconds: Int64)
    }

    enum Outcome: Sendable, Equatable {
        case actions([A])
        case send(M.Send)
        case reply(M.Reply)
    }

    static func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

    static func play(_ events: [Event], greeting: Int = 2, subscriber: Bool = false) -> ([Outcome], M) {
        var m = M(timeout: .milliseconds(50), retry: .seconds(1), greetingCount: greeting, subscriber: subscriber)
        var now: Int64 = 0
        var out: [Outcome] = []
        for e in events {
            let t = at(now)
            switch e {
            case .start: out.append(.actions(m.start(at: t)))
            case .connected: out.append(.actions(m.connected(at: t)))
            case let .send(id): out.append(.send(m.send(id, at: t)))
            case let .reply(error): out.append(.reply(m.replied(error: error, at: t)))
            case .timer: out.append(.actions(m.timerFired(at: t)))
            case let .failed(why): out.append(.actions(m.failed(why, at: t)))
            case .stop: out.append(.actions(m.stop()))
            case let .wait(ms): now += ms
            }
        }
        return (out, m)
    }

    static let ready: [Event] = [.start, .connected, .reply(), .reply()]

    @Test func connectsGreetsAndIsReady() {
        let (out, m) = Self.play(Self.ready)
        #expect(
            out == [
                .actions([.connect, .armTimer(Self.at(50))]),
                .actions([.sendGreeting, .armTimer(Self.at(50))]),
                .reply(.greeting([])),
                .reply(.greeting([.up(restored: false)])),
            ])
        #expect(m.state == .ready)
        #expect(m.isReady)
        #expect(m.health == .up)
    }

    @Test func refusesCommandsUntilReady() {
        let (out, _) = Self.play([.send(1), .start, .send(2), .connected, .send(3)])
        #expect(out[0] == .send(.refused))
        #expect(out[2] == .send(.refused))
        #expect(out[4] == .send(.refused))
    }

    @Test func aPipelineAnswersInOrderAndArmsTheOldestDeadline() {
        let (out, m) = Self.play(Self.ready + [.send(7), .wait(milliseconds: 10), .send(8), .reply(), .reply()])
        #expect(out[4] == .send(.sent(armTimer: Self.at(50))))
        // The second is not the oldest: no new timer.
        #expect(out[5] == .send(.sent(armTimer: nil)))
        #expect(out[6] == .reply(.answer(7, next: Self.at(60))))
        #expect(out[7] == .reply(.answer(8, next: nil)))
        #expect(m.pending == 0)
    }

    @Test func aLateCommandFailsTheConnectionAndEverythingInFlight() {
        let (out, m) = Self.play(
            Self.ready + [.send(1), .wait(milliseconds: 30), .send(2), .wait(milliseconds: 20), .timer])
        // 1 is past its deadline (50 ms); 2 is lost with the connection.
        #expect(
            out.last
                == .actions([
                    .timedOut([1]), .closeSocket, .fail([2], "a command had no reply within 50ms"), .armTimer(Self.at(1050)),
                    .down("a command had no reply within 50ms"),
                ]))
        #expect(m.state == .waiting(Self.at(1050)))
        #expect(m.health == .down)
        #expect(m.pending == 0)
    }

    @Test func aTimerBeforeTheDeadlineOnlyArmsAgain() {
        let (out, _) = Self.play(Self.ready + [.send(1), .wait(milliseconds: 20), .timer])
        #expect(out.last == .actions([.armTimer(Self.at(50))]))
    }

    @Test func aSlowConnectOrGreetingFails() {
        let (connect, _) = Self.play([.start, .wait(milliseconds: 50), .timer])
        #expect(
            connect.last
                == .actions([.closeSocket, .armTimer(Self.at(1050)), .down("no connect within 50ms")]))
        let (greet, _) = Self.play([.start, .wait(milliseconds: 10), .connected, .wait(milliseconds: 50), .timer])
        #expect(greet.last == .actions([.closeSocket, .armTimer(Self.at(1060)), .down("no greeting within 50ms")]))
    }

    @Test func aRefusedGreetingFailsWithTheServersWords() {
        let (out, m) = Self.play([.start, .connected, .reply(error: "WRONGPASS invalid username-password pair")])
        #expect(
            out.last
                == .reply(
                    .greeting([
                        .closeSocket, .armTimer(Self.at(1000)),
                        .down("the greeting was refused: WRONGPASS invalid username-password pair"),
                    ])))
        #expect(m.health == .down)
    }

    @Test func anOutageIsSaidOnceAndTheReturnOnce() {
        let (out, m) = Self.play(
            [.start, .failed("refused"), .wait(milliseconds: 1000), .timer, .failed("refused"), .wait(milliseconds: 1000), .timer]
                + [.connected, .reply(), .reply()])
        #expect(out[1] == .actions([.closeSocket, .armTimer(Self.at(1000)), .down("refused")]))
        // The retry connects again; its failure is not said again.
        #expect(out[2] == .actions([.connect, .armTimer(Self.at(1050))]))
        #expect(out[3] == .actions([.closeSocket, .armTimer(Self.at(2000))]))
        #expect(out.last == .reply(.greeting([.up(restored: true)])))
        #expect(m.health == .up)
    }

    @Test func aReplyToNothingFailsTheConnection() {
        let (out, m) = Self.play(Self.ready + [.reply()])
        guard case let .reply(.unexpected(actions)) = out.last else {
            Issue.record("not unexpected: \(String(describing: out.last))")
            return
        }
        #expect(actions.first == .closeSocket)
        #expect(m.health == .down)
    }

    @Test func aSubscriberTakesNoCommandsAndHearsMessages() {
        let (out, m) = Self.play([.start, .connected, .reply(), .send(1), .reply(), .reply()], greeting: 1, subscriber: true)
        #expect(out[2] == .reply(.greeting([.up(restored: false)])))
        #expect(out[3] == .send(.refused))
        #expect(out[4] == .reply(.message))
        #expect(out[5] == .reply(.message))
        #expect(!m.isReady)
        #expect(m.state == .ready)
    }

    @Test func stopFailsWhatIsInFlightAndConnectsNoMore() {
        let (out, m) = Self.play(Self.ready + [.send(1), .send(2), .stop, .wait(milliseconds: 2000), .timer, .start])
        #expect(out[6] == .actions([.closeSocket, .fail([1, 2], "the link was closed")]))
        #expect(out[7] == .actions([]))
        #expect(out[8] == .actions([]))
        #expect(m.state == .stopped)
    }

    @Test func aLongPipelineStaysInOrderAcrossCompaction() {
        var events = Self.ready
        for i in 1...200 { events.append(.send(UInt64(i))) }
        for _ in 1...200 { events.append(.reply()) }
        let (out, m) = Self.play(events)
        let answered = out.compactMap { o -> UInt64? in
            if case let .reply(.answer(id, _)) = o { return id }
            return nil
        }
        #expect(answered == Array(1...200))
        #expect(m.pending == 0)
    }
}

@Suite struct RedisEndpointTests {
    @Test(arguments: [
        ("redis://redis:6379/0", RedisEndpoint(host: "redis")),
        ("redis://127.0.0.1", RedisEndpoint(host: "127.0.0.1")),
        ("rediss://cache.example:6380/2", RedisEndpoint(tls: true, host: "cache.example", port: 6380, database: 2)),
        ("redis://:s3cret@h:1/", RedisEndpoint(host: "h", port: 1, password: Secret("s3cret"))),
        ("redis://:a%2Fb%40c@h", RedisEndpoint(host: "h", password: Secret("a/b@c"))),
        ("redis://app:s3cret@[::1]:7000/3", RedisEndpoint(host: "::1", port: 7000, user: "app", password: Secret("s3cret"), database: 3)),
    ])
    func reads(_ text: String, _ expected: RedisEndpoint) throws {
        #expect(try RedisEndpoint.parse(text).get() == expected)
    }

    @Test(arguments: [
        "http://redis:6379", "redis://", "redis://h:0", "redis://h:65536", "redis://h:99999999999999999999",
        "redis://h/x", "redis://h/-1", "redis://:50%@h", "redis://:%zz@h", "redis://h/99999999999", "redis://[::1", "redis://[::1]x",
    ])
    func refuses(_ text: String) {
        guard case .failure = RedisEndpoint.parse(text) else {
            Issue.record("\(text) was read")
            return
        }
    }

    @Test func neverShowsThePassword() throws {
        let e = try RedisEndpoint.parse("redis://app:hunter2@h:6379/1").get()
        #expect(!"\(e)".contains("hunter2"))
        #expect(e.description == "redis://h:6379/1")
        #expect(!String(reflecting: e).contains("hunter2"))
        guard case let .failure(why) = RedisEndpoint.parse("redis://:hunter2@h:0") else { return }
        #expect(!why.description.contains("hunter2"))
    }
}
