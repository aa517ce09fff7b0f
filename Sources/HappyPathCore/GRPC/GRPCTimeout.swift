/// The `grpc-timeout` field (gRPC over HTTP/2, "Timeout"): a positive
/// integer of at most 8 ASCII digits followed by one unit, `H` hours, `M`
/// minutes, `S` seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds.
/// It is the client's deadline, relative to when the request was sent.
public enum GRPCTimeout {
    /// The largest value the field can carry, per unit.
    static let maxValue: Int64 = 99_999_999

    /// The units from the finest to the coarsest, with their length in nanoseconds.
    static let units: [(unit: UInt8, nanoseconds: Int64)] = [
        (UInt8(ascii: "n"), 1), (UInt8(ascii: "u"), 1_000), (UInt8(ascii: "m"), 1_000_000),
        (UInt8(ascii: "S"), 1_000_000_000), (UInt8(ascii: "M"), 60_000_000_000), (UInt8(ascii: "H"), 3_600_000_000_000),
    ]

    /// The longest value read: eight digits (gRPC's limit) and a unit.
    public static let maxFieldBytes = 9

    /// The duration a client's field says, or nil for anything that is not
    /// 1–8 digits and a unit (no sign, no space, no other unit). The digits
    /// are bounded before they are multiplied, so no input can overflow; the
    /// longest, `99999999H`, is about 11,400 years (the proxy's clock
    /// arithmetic saturates, and the route's own timeout is the smaller one).
    /// `0n` is a deadline already past: a call that cannot succeed.
    public static func parse(_ field: some StringProtocol) -> Duration? {
        let utf8 = Array(field.utf8)
        guard utf8.count >= 2, utf8.count <= maxFieldBytes else { return nil }
        var value: Int64 = 0
        for byte in utf8.dropLast() {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int64(byte - UInt8(ascii: "0"))
        }
        switch utf8.last {
        case UInt8(ascii: "H"): return .seconds(value * 3600)
        case UInt8(ascii: "M"): return .seconds(value * 60)
        case UInt8(ascii: "S"): return .seconds(value)
        case UInt8(ascii: "m"): return .milliseconds(value)
        case UInt8(ascii: "u"): return .microseconds(value)
        case UInt8(ascii: "n"): return .nanoseconds(value)
        default: return nil
        }
    }

    /// The field a try carries for the time that `remaining` leaves: the
    /// finest unit whose value fits 8 digits, rounded down, so the upstream's
    /// deadline never ends after the exchange's own. Nil when nothing
    /// remains (no try starts after the deadline). Past what the field can
    /// say (about 11,400 years), the longest it can.
    public static func format(_ remaining: Duration) -> String? {
        let (seconds, attoseconds) = remaining.components
        guard seconds > 0 || (seconds == 0 && attoseconds >= 1_000_000_000) else { return nil }
        // Below about 292 years the whole nanoseconds fit an Int64; above, whole seconds are exact enough.
        if seconds < 9_000_000_000 {
            let ns = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
            for (unit, length) in units where ns / length <= maxValue {
                return String(ns / length) + String(UnicodeScalar(unit))
            }
        }
        let hours = seconds / 3600
        return String(min(hours, maxValue)) + "H"
    }
}
