/// Numbers that come from outside the proxy (a client, an upstream, a token
/// endpoint, the store) become numbers, durations and dates here and
/// nowhere else. Swift traps on overflow, so arithmetic on such a value
/// is a remote kill switch: every function below reads its input into a
/// bounded value first, never traps, costs time linear in its input, and
/// treats anything malformed or out of range as absent (nil). The bounds
/// are written in docs/contract.md ("Numbers from outside"); the fuzz
/// target FuzzOutsideValues checks them on random and extreme input.
public enum OutsideValues {
    /// The longest span of seconds any value from outside may stand for:
    /// ten years, the same bound as a duration in the config file. Far past
    /// any real lifetime or wait, and far below what nanoseconds in 64 bits
    /// hold, so a clamped value can meet `Duration` and `Instant` safely.
    public static let maxSeconds: Int64 = 315_360_000

    /// `delay-seconds` (RFC 9110 section 10.2.3) and `delta-seconds` (RFC
    /// 9111 section 1.2.2): one or more ASCII digits, surrounded by optional
    /// spaces or tabs. A value past `cap` is read as `cap` ("a very long
    /// time"); a sign, a fraction, a non-ASCII digit or an empty value is nil.
    public static func deltaSeconds<C: Collection>(_ text: C, cap: Int64 = maxSeconds) -> Int64?
    where C.Element == UInt8 {
        let cap = max(0, min(cap, maxSeconds))
        var value: Int64 = 0
        var digits = 0
        var trailing = false
        for byte in text {
            switch byte {
            case UInt8(ascii: " "), UInt8(ascii: "\t"):
                if digits > 0 { trailing = true }
            case UInt8(ascii: "0")...UInt8(ascii: "9"):
                guard !trailing else { return nil }
                digits += 1
                // Once at the cap it stays there: no product can overflow.
                if value < cap { value = min(cap, value * 10 + Int64(byte &- 0x30)) }
            default:
                return nil
            }
        }
        return digits > 0 ? value : nil
    }

    public static func deltaSeconds(_ text: some StringProtocol, cap: Int64 = maxSeconds) -> Int64? {
        deltaSeconds(text.utf8, cap: cap)
    }

    /// A count of seconds from a JSON value (`expires_in`: a number, or a
    /// string holding one), clamped to `floor...cap`. Nil: not a number,
    /// NaN or infinite, or not above zero.
    public static func lifetimeSeconds(_ seconds: Double?, floor: Double = 1, cap: Int64 = maxSeconds) -> Duration? {
        guard let seconds, seconds.isFinite, seconds > 0 else { return nil }
        let bounded = min(max(seconds, floor), Double(max(0, min(cap, maxSeconds))))
        // Below 2^53 milliseconds here, so the conversion is exact and cannot trap.
        return .milliseconds(Int64((bounded * 1000).rounded()))
    }

    /// A duration from outside as whole seconds, rounded up and clamped to
    /// `0...cap`: what the proxy writes in a `Retry-After` it sends.
    public static func wholeSeconds(_ duration: Duration, cap: Int64 = maxSeconds) -> Int64 {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0 else { return 0 }
        let rounded = attoseconds > 0 && seconds < Int64.max ? seconds + 1 : seconds
        return min(rounded, max(0, min(cap, maxSeconds)))
    }
}

/// `Retry-After` (RFC 9110 section 10.2.3): delay-seconds or an HTTP-date,
/// read as a wait clamped to `0...max`. Nil: neither form.
public enum RetryAfter {
    /// One hour: what `retry.max_retry_after` defaults to.
    public static let defaultMax: Duration = .seconds(3600)

    /// - Parameters:
    ///   - nowUnixSeconds: the wall clock, for HTTP-dates.
    ///   - max: the longest wait honoured or passed on (`retry.max_retry_after`).
    public static func parse(_ value: String, nowUnixSeconds: Int64, max: Duration = defaultMax) -> Duration? {
        seconds(value.utf8, nowUnixSeconds: nowUnixSeconds, max: max).map { .seconds($0) }
    }

    /// The same wait in whole seconds (what a rewritten field says).
    public static func seconds<C: Collection>(_ value: C, nowUnixSeconds: Int64, max: Duration = defaultMax) -> Int64?
    where C.Element == UInt8 {
        let cap = OutsideValues.wholeSeconds(max)
        if let seconds = OutsideValues.deltaSeconds(value, cap: cap) { return seconds }
        guard let date = HTTPDate.parse(value) else { return nil }
        // Both are bounded: a date within years 0000-9999, the wall clock a real one.
        let now = Swift.min(Swift.max(nowUnixSeconds, HTTPDate.earliest), HTTPDate.latest)
        return Swift.min(cap, Swift.max(0, date - now))
    }
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form servers send
/// (RFC 9110 section 5.6.7). Read strictly: two-digit day, hour, minute and
/// second, a four-digit year, so every date is within years 0000-9999 and
/// its seconds fit with room to spare. The obsolete RFC 850 and asctime
/// forms are not read (nil: the field is treated as absent).
public enum HTTPDate {
    static let months: [[UInt8]] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        .map { Array($0.utf8) }
    /// Seconds since 1970 of 0000-01-01 and of 9999-12-31 23:59:59.
    public static let earliest: Int64 = -62_167_219_200
    public static let latest: Int64 = 253_402_300_799

    /// Seconds since 1970, or nil.
    public static func parse(_ text: String) -> Int64? { parse(text.utf8) }

    public static func parse<C: Collection>(_ text: C) -> Int64? where C.Element == UInt8 {
        // Exactly 29 bytes, optional spaces around it.
        var bytes: [UInt8] = []
        bytes.reserveCapacity(29)
        for byte in text {
            if byte == UInt8(ascii: " "), bytes.isEmpty { continue }
            guard bytes.count < 40 else { return nil }
            bytes.append(byte)
        }
        while bytes.last == UInt8(ascii: " ") { bytes.removeLast() }
        guard bytes.count == 29, bytes[3] == UInt8(ascii: ","), bytes[4] == UInt8(ascii: " "),
            bytes[7] == UInt8(ascii: " "), bytes[11] == UInt8(ascii: " "), bytes[16] == UInt8(ascii: " "),
            bytes[19] == UInt8(ascii: ":"), bytes[22] == UInt8(ascii: ":"), bytes[25] == UInt8(ascii: " "),
            bytes[26...28].elementsEqual("GMT".utf8),
            let day = digits(bytes, 5, 2), let year = digits(bytes, 12, 4), let hour = digits(bytes, 17, 2),
            let minute = digits(bytes, 20, 2), let second = digits(bytes, 23, 2),
            let month = months.firstIndex(where: { $0.elementsEqual(bytes[8..<11]) }),
            (1...31).contains(day), hour < 24, minute < 60, second < 61
        else { return nil }
        return daysFromCivil(year: year, month: Int64(month) + 1, day: day) * 86400 + hour * 3600 + minute * 60 + second
    }

    private static func digits(_ bytes: [UInt8], _ at: Int, _ count: Int) -> Int64? {
        var value: Int64 = 0
        for byte in bytes[at..<(at + count)] {
            guard byte >= 0x30, byte <= 0x39 else { return nil }
            value = value * 10 + Int64(byte - 0x30)
        }
        return value
    }

    /// Days since 1970-01-01 (Howard Hinnant's algorithm), for years 0-9999.
    static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }
}
