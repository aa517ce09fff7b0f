import HappyPathCore
import Testing

/// Issue 30: every number from outside is read into a bounded value; the
/// rules docs/contract.md writes down ("Numbers from outside"), as tables.
@Suite struct OutsideValuesTests {
    static let tenYears: Int64 = 315_360_000

    @Test(arguments: [
        ("0", Int64?.some(0)), ("5", .some(5)), (" 120\t", .some(120)), ("007", .some(7)),
        ("9223372036", .some(tenYears)), ("9223372036854775807", .some(tenYears)),
        (String(repeating: "9", count: 400), .some(tenYears)), ("", nil), ("  ", nil), ("-1", nil), ("+5", nil),
        ("1.5", nil), ("1e3", nil), ("1 2", nil), ("\u{663}", nil), ("１２", nil), ("0x10", nil),
    ])
    func deltaSeconds(_ text: String, _ expected: Int64?) {
        #expect(OutsideValues.deltaSeconds(text) == expected, "'\(text)'")
    }

    @Test func deltaSecondsSaturatesAtItsCap() {
        #expect(OutsideValues.deltaSeconds("3601", cap: 3600) == 3600)
        #expect(OutsideValues.deltaSeconds("99", cap: 0) == 0)
        #expect(OutsideValues.deltaSeconds("99", cap: .max) == 99)
        #expect(OutsideValues.deltaSeconds("99999999999999999999", cap: .max) == Self.tenYears)
        #expect(OutsideValues.deltaSeconds("5", cap: .min) == 0)
    }

    /// Retry-After in both forms, clamped to max (retry.max_retry_after, default 1h).
    @Test(arguments: [
        ("9223372036", Int64?.some(3600)), ("60", .some(60)), ("-5", nil), ("garbage", nil),
        ("Sun, 06 Nov 1994 08:49:47 GMT", .some(10)), ("Sun, 06 Nov 1994 08:49:27 GMT", .some(0)),
        ("Fri, 31 Dec 9999 23:59:59 GMT", .some(3600)), ("Sun, 06 Nov 999999999999 08:49:37 GMT", nil),
        ("Sun, 06 Nov -9223372036854775808 08:49:37 GMT", nil), ("Sun, 06 Nov +994 08:49:37 GMT", nil),
        ("Sunday, 06-Nov-94 08:49:37 GMT", nil), ("Sun, 06 Nov 1994 25:49:37 GMT", nil),
    ])
    func retryAfter(_ text: String, _ expected: Int64?) {
        #expect(RetryAfter.seconds(text.utf8, nowUnixSeconds: 784_111_777) == expected, "'\(text)'")
        #expect(RetryAfter.parse(text, nowUnixSeconds: 784_111_777) == expected.map { .seconds($0) })
    }

    @Test func retryAfterAgainstAWallClockAtItsEnds() {
        let date = "Sun, 06 Nov 1994 08:49:37 GMT"
        for now in [Int64.max, .min, 0, -1] {
            let s = RetryAfter.seconds(date.utf8, nowUnixSeconds: now)
            #expect(s != nil && s! >= 0 && s! <= 3600)
        }
        #expect(RetryAfter.parse("100", nowUnixSeconds: 0, max: .seconds(30)) == .seconds(30))
        #expect(RetryAfter.parse("100", nowUnixSeconds: 0, max: .seconds(Int64.max)) == .seconds(100))
    }

    @Test func httpDatesAreFourDigitYearsOnly() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") == 784_111_777)
        #expect(HTTPDate.parse("Thu, 01 Jan 1970 00:00:00 GMT") == 0)
        #expect(HTTPDate.parse("Sat, 01 Jan 0000 00:00:00 GMT") == HTTPDate.earliest)
        #expect(HTTPDate.parse("Fri, 31 Dec 9999 23:59:59 GMT") == HTTPDate.latest)
        #expect(HTTPDate.parse("Sun, 06 Nov 19940 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 UTC") == nil)
        #expect(HTTPDate.parse("Sun, 6 Nov 1994 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse(String(repeating: "Sun, ", count: 10_000)) == nil)
    }

    @Test(arguments: [
        (Double?.some(0.0001), Duration?.some(.seconds(1))), (.some(1e16), .some(.seconds(tenYears))),
        (.some(.infinity), nil), (.some(-.infinity), nil), (.some(.nan), nil), (.some(0), nil), (.some(-1), nil),
        (.some(90.5), .some(.milliseconds(90_500))), (nil, nil), (.some(.greatestFiniteMagnitude), .some(.seconds(tenYears))),
    ])
    func lifetimeSeconds(_ seconds: Double?, _ expected: Duration?) {
        #expect(OutsideValues.lifetimeSeconds(seconds) == expected)
    }

    @Test func wholeSecondsRoundUpAndClamp() {
        #expect(OutsideValues.wholeSeconds(.milliseconds(1)) == 1)
        #expect(OutsideValues.wholeSeconds(.seconds(5)) == 5)
        #expect(OutsideValues.wholeSeconds(.seconds(-5)) == 0)
        #expect(OutsideValues.wholeSeconds(.seconds(Int64.max)) == Self.tenYears)
        #expect(OutsideValues.wholeSeconds(.seconds(100), cap: 30) == 30)
    }

    /// The second line: durations and instants past their range saturate.
    @Test func durationsAndInstantsSaturate() {
        #expect(Duration.seconds(Int64.max).nanoseconds == .max)
        #expect(Duration.seconds(Int64.min).nanoseconds == .min)
        #expect(Duration.seconds(9_223_372_035).nanoseconds == 9_223_372_035_000_000_000)
        #expect(Instant(nanoseconds: .max - 1) + .seconds(10) == Instant(nanoseconds: .max))
        #expect(Instant(nanoseconds: .min + 1) - .seconds(10) == Instant(nanoseconds: .min))
        #expect(Instant(nanoseconds: 5) + .seconds(-10) == Instant(nanoseconds: -9_999_999_995))
    }
}
