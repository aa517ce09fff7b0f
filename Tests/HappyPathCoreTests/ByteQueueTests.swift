import HappyPathCore
import Testing

/// `ByteQueue`: bytes come out in the order they went in, however they are
/// taken, and taking a little at a time from a large queue costs time
/// linear in the bytes (no copy of the rest per take).
@Suite struct ByteQueueTests {
    /// Appends of `pieces` sizes, takes of `take` at a time: the bytes in order.
    @Test(arguments: [([1, 2, 3], 1), ([100_000], 7), ([5, 70_000, 3, 200_000], 16_384), ([0, 0, 1], 4)])
    func bytesComeOutInOrder(pieces: [Int], take: Int) {
        var q = ByteQueue()
        var expected: [UInt8] = []
        var next: UInt8 = 0
        for n in pieces {
            let piece = (0..<n).map { _ -> UInt8 in
                next &+= 1
                return next
            }
            expected += piece
            q.append(piece)
        }
        #expect(q.count == expected.count)
        var out: [UInt8] = []
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: take, alignment: 1)
        defer { buffer.deallocate() }
        while !q.isEmpty {
            let n = q.take(into: buffer, max: take)
            #expect(n > 0 && n <= take)
            out += UnsafeRawBufferPointer(start: buffer, count: n)
        }
        #expect(out == expected)
        #expect(q.take(into: buffer, max: take) == 0)
    }

    /// Taking and appending interleaved (a stream's staging as DATA frames
    /// leave and the upstream sends more): what is left is always the
    /// bytes not yet taken, in order.
    @Test func interleavedTakesAndAppendsKeepTheOrder() {
        var q = ByteQueue()
        var model: [UInt8] = []
        var g = SystemRandomNumberGenerator()
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: 10_000, alignment: 1)
        defer { buffer.deallocate() }
        var counter: UInt8 = 0
        for _ in 0..<2_000 {
            if Bool.random(using: &g) {
                let piece = (0..<Int.random(in: 0...5_000, using: &g)).map { _ -> UInt8 in
                    counter &+= 1
                    return counter
                }
                q.append(piece)
                model += piece
            } else {
                let n = q.take(into: buffer, max: Int.random(in: 0...10_000, using: &g))
                #expect(Array(UnsafeRawBufferPointer(start: buffer, count: n)) == Array(model.prefix(n)))
                model.removeFirst(n)
            }
            #expect(q.count == model.count)
        }
        #expect(q.bytes == model)
    }

    /// 1 MiB taken a byte at a time while a byte is appended after every
    /// 1,000 takes: with a copy of the rest per take (`Array.removeFirst`)
    /// that would move about 512 GiB; the queue moves fewer bytes than pass
    /// through it (counted by `moved`, not timed).
    @Test func takingAByteAtATimeMovesFewerBytesThanPass() {
        var q = ByteQueue()
        q.append([UInt8](repeating: 7, count: 1 << 20))
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: 1, alignment: 1)
        defer { buffer.deallocate() }
        var taken = 0
        var appended = 1 << 20
        while q.take(into: buffer, max: 1) == 1 {
            taken += 1
            if taken % 1_000 == 0 {
                q.append([8])
                appended += 1
            }
        }
        #expect(taken == appended)
        #expect(q.moved < appended, "moved \(q.moved) bytes for \(appended) that passed")
    }
}
