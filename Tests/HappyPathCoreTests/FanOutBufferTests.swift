import HappyPathCore
import Testing

/// Issue 50's fan-out of one answer to several readers (`FanOutBuffer`):
/// kept once, read at each member's pace, bounded by cutting the laggard.
@Suite struct FanOutBufferTests {
    /// Reads everything `member` has still to get, `step` bytes at a time.
    static func drain(_ b: inout FanOutBuffer, _ member: Int, step: Int = .max) -> [UInt8] {
        var out: [UInt8] = []
        while true {
            let piece = b.next(for: member, max: step)
            if piece.isEmpty { return out }
            out += piece
            b.advance(member, by: piece.count)
        }
    }

    @Test func aPieceIsKeptUntilEveryMemberHadIt() {
        var b = FanOutBuffer(bound: 1 << 20)
        b.add(0)
        b.add(1)
        b.append(Array("hello ".utf8))
        b.append(Array("world".utf8))
        #expect(b.kept == 11)
        #expect(Self.drain(&b, 0) == Array("hello world".utf8))
        #expect(b.kept == 11, "member 1 has had nothing yet")
        #expect(b.next(for: 1, max: 3) == Array("hel".utf8)[...])
        b.advance(1, by: 3)
        #expect(b.next(for: 1, max: 100) == Array("lo ".utf8)[...], "one piece at a time")
        b.advance(1, by: 3)
        #expect(b.kept == 5, "the first piece is let go once both passed it")
        #expect(Self.drain(&b, 1) == Array("world".utf8))
        #expect(b.kept == 0)
        #expect(b.behind(0) == 0 && b.behind(1) == 0 && b.behind(7) == nil)
    }

    @Test func aLaggardIsNamedAndItsBytesGoWhenItIsCut() {
        var b = FanOutBuffer(bound: 10)
        b.add(0)
        b.add(1)
        b.add(2)
        for _ in 0..<4 { b.append([UInt8](repeating: 7, count: 5)) }
        _ = Self.drain(&b, 0)
        _ = Self.drain(&b, 1, step: 12)
        b.advance(2, by: 9)
        #expect(b.lagging == [2], "20 against 9: 11 behind the furthest")
        #expect(b.kept == 15, "from member 2's piece on")
        b.remove(2)
        #expect(b.lagging.isEmpty)
        #expect(b.kept == 0)
        #expect(b.members == 2)
    }

    @Test func withNoMemberNothingIsKept() {
        var b = FanOutBuffer(bound: 64)
        b.append([1, 2, 3])
        #expect(b.kept == 0)
        b.add(0)
        #expect(b.next(for: 0, max: 10).isEmpty, "a member joins at what is held: nothing")
        b.append([4, 5])
        #expect(Self.drain(&b, 0) == [4, 5])
        #expect(b.end == 5)
    }

    @Test func emptyAndNonsenseCountsChangeNothing() {
        var b = FanOutBuffer(bound: -5)
        #expect(b.bound == 0)
        b.add(0)
        b.append([UInt8]())
        #expect(b.end == 0 && b.kept == 0)
        b.append([9])
        b.advance(0, by: -3)
        b.advance(0, by: 0)
        b.advance(42, by: 1)
        #expect(b.behind(0) == 1)
        b.advance(0, by: 1_000)
        #expect(b.behind(0) == 0, "never past the end")
        #expect(b.next(for: 0, max: 0).isEmpty && b.next(for: 1, max: 5).isEmpty)
    }

    /// Many one-byte pieces, read one at a time by two members: what each
    /// reads is the body, and what is held follows the slower one.
    @Test func manySmallPieces() {
        var b = FanOutBuffer(bound: .max)
        b.add(0)
        b.add(1)
        let body = (0..<20_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        for byte in body { b.append([byte]) }
        #expect(Self.drain(&b, 0, step: 1) == body)
        #expect(b.kept == body.count)
        var second: [UInt8] = []
        for i in 0..<body.count {
            let piece = b.next(for: 1, max: 1)
            second += piece
            b.advance(1, by: piece.count)
            if i % 5_000 == 4_999 { #expect(b.kept == body.count - i - 1) }
        }
        #expect(second == body)
        #expect(b.kept == 0)
    }

    /// Random appends, reads, joins and leaves against a model (the whole
    /// body and each member's position): every member reads exactly the
    /// body from where it joined, and the buffer holds what the slowest
    /// member still needs and no more than the rest of that piece besides.
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8])
    func matchesTheModel(seed: UInt64) {
        var g = SeededRandom(seed: seed)
        var b = FanOutBuffer(bound: 300)
        var body: [UInt8] = []
        var position: [Int: Int] = [:]
        var read: [Int: [UInt8]] = [:]
        var joinedAt: [Int: Int] = [:]
        var nextMember = 0
        for _ in 0..<3_000 {
            switch g.next() % 6 {
            case 0:
                let piece = (0..<Int(g.next() % 64)).map { _ in UInt8(truncatingIfNeeded: g.next()) }
                b.append(piece)
                body += piece
            case 1 where position.count < 6:
                let held = body.count - b.kept
                b.add(nextMember)
                position[nextMember] = held
                joinedAt[nextMember] = held
                read[nextMember] = []
                nextMember += 1
            case 2 where !position.isEmpty:
                let m = Array(position.keys).sorted()[Int(g.next() % UInt64(position.count))]
                b.remove(m)
                position[m] = nil
            default:
                guard !position.isEmpty else { continue }
                let m = Array(position.keys).sorted()[Int(g.next() % UInt64(position.count))]
                let piece = b.next(for: m, max: Int(g.next() % 100) + 1)
                read[m, default: []] += piece
                b.advance(m, by: piece.count)
                position[m]! += piece.count
            }
            for m in b.lagging {
                #expect((position.values.max() ?? 0) - position[m]! > 300, "seed \(seed): named lagging within the bound")
                b.remove(m)
                position[m] = nil
            }
            // Pieces go whole: what is held is what the slowest still needs, plus at most the rest of its piece.
            let needed = body.count - (position.values.min() ?? body.count)
            #expect(b.kept >= needed && b.kept - needed < 64, "seed \(seed): \(b.kept) held, \(needed) needed")
            if position.isEmpty { #expect(b.kept == 0) }
            #expect(b.end == body.count)
        }
        for (m, bytes) in read where position[m] != nil {
            let from = joinedAt[m]!
            #expect(bytes == Array(body[from..<(from + bytes.count)]), "seed \(seed), member \(m)")
        }
    }
}

