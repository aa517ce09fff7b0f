import HappyPathCore

/// One log line per interval for something that can happen many times a
/// second (a listener pausing, a disk refusing writes): the first
/// occurrence is logged at once, later ones within `every` are only
/// counted, and the next line says how many there were.
public struct LogThrottle: Sendable {
    public let every: Duration
    private var lastLine: Instant?
    private var unlogged = 0

    public init(every: Duration) { self.every = every }

    /// It happened at `now`: the number of occurrences the line should
    /// report (this one included) if a line is due, else nil.
    public mutating func occurred(at now: Instant) -> Int? {
        unlogged += 1
        if let lastLine, now - lastLine < every { return nil }
        lastLine = now
        defer { unlogged = 0 }
        return unlogged
    }
}
