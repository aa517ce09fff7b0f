import Foundation
import HappyPathDemo
import Testing

/// The demo upstream's `/_demo/throttle?rps=N` (the `throttled` load-test
/// scenario's upstream): the counter alone on a hand-moved wall clock, then
/// the real demo on loopback.
@Suite("demo throttle") struct DemoThrottleTests {
    @Test func passesRpsPerWallSecondThenAnswers429UntilTheNextSecond() {
        var throttle = DemoThrottle()
        let start: Int64 = 1_700_000_000_250
        #expect((0..<3).map { throttle.arrived(rps: 3, nowMilliseconds: start + Int64($0)) } == [.pass, .pass, .pass])
        #expect(throttle.arrived(rps: 3, nowMilliseconds: start + 10) == .throttled(retryAfterSeconds: 1))
        // The last millisecond of the second still rounds up to 1, never 0.
        #expect(throttle.arrived(rps: 3, nowMilliseconds: 1_700_000_000_999) == .throttled(retryAfterSeconds: 1))
        // A new second, a new allowance.
        #expect(throttle.arrived(rps: 3, nowMilliseconds: 1_700_000_001_000) == .pass)
        #expect(
            throttle.seconds == [
                .init(t: 1_700_000_000, received: 5, passed: 3), .init(t: 1_700_000_001, received: 1, passed: 1),
            ])
        #expect(throttle.first429AtMilliseconds == start + 10)
        #expect(
            throttle.json
                == "{\"seconds\":[{\"t\":1700000000,\"received\":5,\"passed\":3},{\"t\":1700000001,\"received\":1,\"passed\":1}],"
                + "\"first_429_at\":1700000000.260}\n")
    }

    @Test func keepsABoundedHistoryAndReportsNullBeforeAny429() {
        var throttle = DemoThrottle(keep: 2)
        for s in 0..<5 { _ = throttle.arrived(rps: 1, nowMilliseconds: Int64(s) * 1000) }
        #expect(throttle.seconds.map(\.t) == [3, 4])
        #expect(throttle.json.hasSuffix("\"first_429_at\":null}\n"))
    }

    /// Twenty requests as fast as one client sends them, five allowed per
    /// second: every second they span passes exactly five (or all it got),
    /// the rest are 429 with `Retry-After: 1`, and the stats say so.
    @Test func theDemoAnswers429AboveRpsAndCountsEverySecond() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        var statuses: [Int] = []
        for i in 0..<20 {
            let r = try HTTP.request(port: demo.port, i % 2 == 0 ? "GET" : "POST", "/_demo/throttle?rps=5")
            statuses.append(r.status)
            if r.status == 429 { #expect(r.header("Retry-After") == "1") }
        }
        #expect(Set(statuses).isSubset(of: [200, 429]))
        let stats = try HTTP.request(port: demo.port, "/_demo/throttle/stats").json
        let seconds = try #require(stats["seconds"] as? [[String: Int]])
        #expect(seconds.map { $0["received"] ?? 0 }.reduce(0, +) == 20)
        #expect(seconds.map { $0["passed"] ?? 0 }.reduce(0, +) == statuses.filter { $0 == 200 }.count)
        for second in seconds {
            #expect(second["passed"] == min(5, second["received"] ?? 0), "\(second)")
        }
        // Twenty requests over loopback take far less than four seconds.
        #expect(statuses.filter { $0 == 429 }.count >= 20 - 5 * seconds.count)
        #expect(seconds.count < 4)
        #expect(stats["first_429_at"] is Double)
        // The index lists the control.
        #expect(try HTTP.request(port: demo.port, "/").text.contains("/_demo/throttle/stats"))
    }
}
