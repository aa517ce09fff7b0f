/// The frames an upstream may send that cost the proxy work without
/// moving any response forward, each bounded by a token bucket per
/// connection: a burst, then a steady rate. Past a bound the connection is
/// a flood (CVE-2019-9512, -9515, -9518 on the client side): it is ended
/// with GOAWAY ENHANCE_YOUR_CALM. Pure: the session reports each frame's
/// header as it begins, with the loop's clock.
public struct HTTP2FloodGuard: Sendable {
    public enum Kind: Int, Sendable, CaseIterable {
        /// SETTINGS (not an ACK): each needs an ACK and a new look at the limits.
        case settings
        /// PING (not an ACK): each needs an ACK.
        case ping
        /// RST_STREAM for a stream the proxy does not have open (a reset of
        /// one of its own streams ends that stream, and is bounded by them).
        case strayReset
        /// DATA with no byte and no END_STREAM.
        case emptyData
        /// PRIORITY (ignored: RFC 9218 priorities are what the proxy says it uses).
        case priority

        /// The frame's words in the close reason.
        public var words: String {
            switch self {
            case .settings: "SETTINGS frames"
            case .ping: "PING frames"
            case .strayReset: "RST_STREAM frames for streams it did not have"
            case .emptyData: "empty DATA frames"
            case .priority: "PRIORITY frames"
            }
        }
    }

    /// A kind's bound: `burst` at once, then `perSecond`.
    public struct Bound: Sendable, Equatable {
        public var burst: Int
        public var perSecond: Int

        public init(burst: Int, perSecond: Int) {
            self.burst = burst
            self.perSecond = perSecond
        }
    }

    /// The bounds: far above what a server does (a gRPC server's keepalive
    /// and BDP pings, a SETTINGS change now and then) and far below what a
    /// flood needs to hurt.
    public static let bounds: [Kind: Bound] = [
        .settings: Bound(burst: 100, perSecond: 10),
        .ping: Bound(burst: 200, perSecond: 50),
        .strayReset: Bound(burst: 200, perSecond: 50),
        .emptyData: Bound(burst: 200, perSecond: 50),
        .priority: Bound(burst: 200, perSecond: 50),
    ]

    /// Tokens per kind, in thousandths (integer arithmetic, no drift).
    private var milliTokens: [Int]
    private var last: Instant?
    private let table: [Bound]

    public init(bounds: [Kind: Bound] = Self.bounds) {
        table = Kind.allCases.map { bounds[$0] ?? Bound(burst: Int.max / 2000, perSecond: 0) }
        milliTokens = table.map { $0.burst * 1000 }
    }

    /// A frame of `kind` began at `now`: false when it is past its bound.
    public mutating func frame(_ kind: Kind, at now: Instant) -> Bool {
        refill(at: now)
        let i = kind.rawValue
        guard milliTokens[i] >= 1000 else { return false }
        milliTokens[i] -= 1000
        return true
    }

    private mutating func refill(at now: Instant) {
        guard let last else {
            self.last = now
            return
        }
        let elapsed = now - last
        guard elapsed > .zero else { return }
        // Whole milliseconds, the rest kept for the next refill; past 10 s
        // every bucket is full long before, and the clock starts afresh.
        let ms = Int(min(elapsed, .seconds(10)).nanoseconds / 1_000_000)
        guard ms > 0 else { return }
        self.last = elapsed >= .seconds(10) ? now : last + .milliseconds(ms)
        for i in milliTokens.indices {
            milliTokens[i] = min(table[i].burst * 1000, milliTokens[i] + table[i].perSecond * ms)
        }
    }

    /// Why the connection ends, for a kind past its bound (this guard's bound).
    public func reason(_ kind: Kind) -> String {
        let b = table[kind.rawValue]
        return "the upstream sent more \(kind.words) than \(b.burst) at once and \(b.perSecond) a second (a flood): ended with GOAWAY ENHANCE_YOUR_CALM"
    }
}
