import Testing

@testable import HappyPathCore

/// `grpc-timeout`: 1–8 digits and a unit, read from clients (so never a
/// trap), and written for each try with the time that remains.
@Suite struct GRPCTimeoutTests {
    @Test(arguments: [
        ("1H", Duration.seconds(3600)),
        ("2M", .seconds(120)),
        ("1S", .seconds(1)),
        ("250m", .milliseconds(250)),
        ("100u", .microseconds(100)),
        ("5n", .nanoseconds(5)),
        ("0n", .zero),
        ("00000001S", .seconds(1)),
        ("99999999n", .nanoseconds(99_999_999)),
        ("99999999S", .seconds(99_999_999)),
        ("99999999H", .seconds(359_999_996_400)),
    ])
    func aValidFieldIsADuration(_ field: String, _ expected: Duration) {
        #expect(GRPCTimeout.parse(field) == expected)
    }

    @Test(arguments: [
        "", "S", "1", "10", "100000000S", "999999999999999999999H", "1s", "1h", "1ms", "1x", "-1S", "+1S", " 1S",
        "1S ", "1 S", "1.5S", "1SS", "S1", "0x1S", "١S", "1\u{0}S",
    ])
    func anythingElseIsRefused(_ field: String) {
        #expect(GRPCTimeout.parse(field) == nil)
    }

    @Test(arguments: [
        (Duration.nanoseconds(1), "1n"),
        (.nanoseconds(99_999_999), "99999999n"),
        (.milliseconds(100), "100000u"),
        (.milliseconds(1500), "1500000u"),
        (.nanoseconds(100_000_001), "100000u"),  // rounded down: the try must not outlive the exchange
        (.seconds(99), "99000000u"),
        (.seconds(100), "100000m"),
        (.seconds(100_000), "100000S"),
        (.seconds(99_999_999), "99999999S"),
        (.seconds(100_000_000), "1666666M"),
        (.seconds(6_000_000_000), "1666666H"),
        (.seconds(359_999_996_400), "99999999H"),
        (.seconds(Int64.max), "99999999H"),
    ])
    func theRemainingTimeIsWrittenInTheFinestUnitThatFits(_ remaining: Duration, _ field: String) {
        #expect(GRPCTimeout.format(remaining) == field)
        // Whatever is written reads back as at most the time that remained.
        if let written = GRPCTimeout.format(remaining), let read = GRPCTimeout.parse(written) {
            #expect(read <= remaining)
        }
    }

    @Test(arguments: [Duration.zero, .nanoseconds(-1), .seconds(-5), .seconds(Int64.min)])
    func nothingIsWrittenWhenNoTimeRemains(_ remaining: Duration) {
        #expect(GRPCTimeout.format(remaining) == nil)
    }

    @Test func subNanosecondRemainderIsNoTime() {
        #expect(GRPCTimeout.format(Duration(secondsComponent: 0, attosecondsComponent: 500)) == nil)
    }
}
