/// One answer's body fanned out to several readers (issue 50's coalesced
/// answer: docs/plans/coalescing.md, section 7): the pieces are kept once,
/// and each member reads them from its own cursor at its own pace. Pure (no
/// I/O): the driver appends what the upstream sends, asks what a member has
/// still to get, says what it sent, and cuts the members `lagging` names.
///
/// - **Kept once.** A piece is kept until every member has had it; `kept`
///   is what the buffer holds now (the driver counts it in its memory pool).
/// - **Bounded.** A member more than `bound` bytes behind the furthest one
///   is `lagging`: the driver cuts it, and what only it still needed is let
///   go. So the buffer holds at most `bound` plus the last piece.
/// - **Linear.** Each byte is appended once and let go once; a member's
///   read is a slice of a piece (found by a binary search over the pieces
///   held), never a copy of the rest, however small the pieces come.
public struct FanOutBuffer: Sendable {
    public typealias Member = Int

    /// How far a member may fall behind the furthest before it is `lagging`.
    public let bound: Int
    /// The pieces, oldest first; those before `first` were let go.
    private var pieces: [[UInt8]] = []
    /// Where each piece starts in the whole body.
    private var starts: [Int] = []
    private var first = 0
    /// Where the first piece held starts in the whole body.
    private var base = 0
    /// The body's length so far.
    public private(set) var end = 0
    /// Each member's position in the whole body.
    private var cursors: [Member: Int] = [:]

    public init(bound: Int) {
        self.bound = max(0, bound)
    }

    /// Bytes held now.
    public var kept: Int { end - base }
    public var members: Int { cursors.count }

    /// A member that reads from the body's start (while nothing was let go)
    /// or, joining later, from what is held now.
    public mutating func add(_ member: Member) {
        cursors[member] = base
    }

    /// A member left (its client went, or it was cut): what only it still
    /// needed is let go. `trimming: false` leaves that to one `trim()` after
    /// a round over many members (each trim looks at every member).
    public mutating func remove(_ member: Member, trimming: Bool = true) {
        cursors[member] = nil
        if trimming { trim() }
    }

    /// The next piece of the body, as the upstream sent it.
    public mutating func append(_ bytes: some Collection<UInt8>) {
        guard !bytes.isEmpty else { return }
        pieces.append(Array(bytes))
        starts.append(end)
        end += bytes.count
        // With no member left, nothing is kept.
        if cursors.isEmpty { trim() }
    }

    /// How far `member` is behind the body's end (0: it has it all; nil: no such member).
    public func behind(_ member: Member) -> Int? {
        cursors[member].map { end - $0 }
    }

    /// What `member` has still to get, at most `max` bytes, from one piece:
    /// empty when it has it all (or is no member).
    public func next(for member: Member, max: Int) -> ArraySlice<UInt8> {
        guard let at = cursors[member], at < end, at >= base, max > 0 else { return [] }
        // The last piece held that starts at or before `at`.
        var low = first
        var high = pieces.count - 1
        while low < high {
            let mid = (low + high + 1) / 2
            if starts[mid] <= at { low = mid } else { high = mid - 1 }
        }
        let from = at - starts[low]
        return pieces[low][from..<Swift.min(pieces[low].count, from + max)]
    }

    /// `member` sent `count` bytes of what `next` gave it (`trimming`: as `remove`).
    public mutating func advance(_ member: Member, by count: Int, trimming: Bool = true) {
        guard let at = cursors[member], count > 0 else { return }
        cursors[member] = Swift.min(end, at + count)
        if trimming { trim() }
    }

    /// The members more than `bound` behind the furthest one, in member
    /// order: the driver cuts them (and `remove`s them).
    public var lagging: [Member] {
        // Nobody can be further behind than what is held.
        guard kept > bound, let furthest = cursors.values.max() else { return [] }
        return cursors.filter { furthest - $0.value > bound }.map(\.key).sorted()
    }

    /// Lets go of the pieces every member has had.
    public mutating func trim() {
        let slowest = cursors.values.min() ?? end
        while first < pieces.count, starts[first] + pieces[first].count <= slowest {
            base += pieces[first].count
            pieces[first] = []
            first += 1
        }
        // The let-go slots go once they outnumber the pieces held (each moved at most once per halving).
        if first > 0, first * 2 >= pieces.count {
            pieces.removeFirst(first)
            starts.removeFirst(first)
            first = 0
        }
    }
}
