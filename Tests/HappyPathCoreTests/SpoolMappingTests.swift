import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Request bodies kept for retries past `limits.body_in_memory` in a mapped
/// spool file: one that grows (chunked HTTP/1.1, HTTP/2 without a length),
/// the streamed HTTP/2 body's replay copy, and the fall back to memory when
/// the file cannot take more. Every byte comes back in order, and every
/// reservation is given back.
@Suite struct SpoolMappingTests {
    /// A file without a name in the temp directory, as the proxy makes them.
    static func openUnlinked() -> Int32 {
        var template = Array("/tmp/happypath-spooltest.XXXXXX".utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        if fd >= 0 { _ = template.withUnsafeBufferPointer { unlink($0.baseAddress!) } }
        return fd
    }

    static func pattern(_ n: Int, seed: Int = 7) -> [UInt8] {
        (0..<n).map { UInt8(truncatingIfNeeded: $0 &* seed &+ $0 >> 9) }
    }

    static func read(_ body: RequestBodyStream, max: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: max)
        let r = out.withUnsafeMutableBytes { body.read(into: $0.baseAddress!, max: max) }
        if case let .bytes(n) = r { return Array(out[..<n]) }
        return []
    }

    static func readAll(_ body: RequestBodyStream) -> [UInt8] {
        var all: [UInt8] = []
        while true {
            let piece = read(body, max: 50_000)
            if piece.isEmpty { return all }
            all += piece
        }
    }

    @Test func aMappingGrowsKeepsItsBytesAndGivesItsReservationBack() throws {
        let share = BodyBudget(limit: 1 << 20)
        do {
            let file = try #require(SpoolMapping(capacity: 1000, budget: share, open: Self.openUnlinked))
            #expect(share.current == 1000)
            let bytes = Self.pattern(1000)
            bytes.withUnsafeBytes { file.base.copyMemory(from: $0.baseAddress!, byteCount: 1000) }
            #expect(file.grow(toHold: 1500))
            #expect(file.capacity == 2000 && share.current == 2000)
            #expect(Array(UnsafeRawBufferPointer(start: file.base, count: 1000)) == bytes)
            // Past what the share has for doubling, exactly what is needed.
            #expect(file.grow(toHold: 600_000))
            #expect(file.capacity == 600_000 && share.current == 600_000)
            #expect(!file.grow(toHold: 2 << 20))
            #expect(file.capacity == 600_000 && share.current == 600_000)
            file.trim(to: 1000)
            #expect(share.current == 1000)
            #expect(Array(UnsafeRawBufferPointer(start: file.base, count: 1000)) == bytes)
        }
        #expect(share.current == 0)
        // Refused by the share, or by a directory that gives no file: nothing held.
        #expect(SpoolMapping(capacity: 2 << 20, budget: share, open: Self.openUnlinked) == nil)
        #expect(SpoolMapping(capacity: 10, budget: share) { -1 } == nil)
        #expect(share.current == 0)
    }

    /// The replay copy of a streamed body moves to its file past
    /// `inMemory`, is read from it as it arrives, replayed whole, and handed
    /// to a try that starts after the end in one piece; the memory budget
    /// is given back at the move, the share when the body goes.
    @Test func aStreamedBodysReplayCopyMovesToItsFile() throws {
        let memory = BodyBudget(limit: 1 << 20)
        let share = BodyBudget(limit: 4 << 20)
        var asked: [Int] = []
        let body = Self.pattern(300_000)
        do {
            let stream = RequestBodyStream(
                declaredLength: nil, ahead: 1 << 20, budget: memory, inMemory: 64 << 10,
                spill: { capacity in
                    asked.append(capacity)
                    return SpoolMapping(capacity: capacity, budget: share, open: Self.openUnlinked)
                })
            body[..<60_000].withUnsafeBytes { stream.append($0) }
            #expect(!stream.isSpooled && memory.current == 60_000)
            #expect(Self.read(stream, max: 10_000) == Array(body[..<10_000]))
            body[60_000..<100_000].withUnsafeBytes { stream.append($0) }
            #expect(stream.isSpooled && asked == [200_000])
            #expect(memory.current == 0 && share.current == 200_000)
            body[100_000...].withUnsafeBytes { stream.append($0) }
            #expect(share.current == 400_000)
            stream.finish()
            #expect(Self.read(stream, max: 90_000) == Array(body[10_000..<100_000]))
            #expect(stream.rewind())
            #expect(Self.readAll(stream) == body)
            let whole = try #require(stream.completeBody)
            #expect(Array(whole) == body)
        }
        #expect(memory.current == 0 && share.current == 0)
    }

    /// A client's memory share smaller than `inMemory`: when it refuses,
    /// the copy moves to its file rather than stop being kept (HTTP/2 and
    /// chunked HTTP/1.1 alike).
    @Test func aFullMemoryShareSendsTheCopyToItsFile() throws {
        let memory = BodyBudget(limit: 32 << 10)
        let share = BodyBudget(limit: 4 << 20)
        let body = Self.pattern(200_000, seed: 17)
        let stream = RequestBodyStream(
            declaredLength: nil, ahead: 1 << 20, budget: memory, inMemory: 64 << 10,
            spill: { SpoolMapping(capacity: $0, budget: share, open: Self.openUnlinked) })
        var growing = GrowingBody(budget: nil)
        growing.count(in: memory, inMemory: 64 << 10) { SpoolMapping(capacity: $0, budget: share, open: Self.openUnlinked) }
        for start in stride(from: 0, to: body.count, by: 20_000) {
            body[start..<(start + 20_000)].withUnsafeBytes { stream.append($0) }
            #expect(body[start..<(start + 20_000)].withUnsafeBytes { growing.append($0) })
        }
        stream.finish()
        #expect(stream.isSpooled && stream.replayable && growing.isSpooled)
        #expect(memory.current == 0)
        #expect(Self.readAll(stream) == body)
        #expect(growing.finish().bytes == body)
    }

    /// A body that announced its length gets a file of exactly that length.
    @Test func anAnnouncedLengthIsTheFilesSize() throws {
        let share = BodyBudget(limit: 4 << 20)
        var asked: [Int] = []
        let stream = RequestBodyStream(
            declaredLength: 1_000_000, ahead: 1 << 20, budget: nil, inMemory: 1000,
            spill: { capacity in
                asked.append(capacity)
                return SpoolMapping(capacity: capacity, budget: share, open: Self.openUnlinked)
            })
        let body = Self.pattern(1_000_000, seed: 13)
        for start in stride(from: 0, to: body.count, by: 16_384) {
            body[start..<min(start + 16_384, body.count)].withUnsafeBytes { stream.append($0) }
        }
        stream.finish()
        #expect(asked == [1_000_000] && share.current == 1_000_000)
        #expect(Self.readAll(stream) == body)
    }

    /// A file that cannot grow ends the keeping as a full budget does: no
    /// replay, and the reader still gets every byte in order.
    @Test func aFileThatCannotGrowEndsTheKeepingAndLosesNoByte() throws {
        let share = BodyBudget(limit: 150_000)
        let stream = RequestBodyStream(
            declaredLength: nil, ahead: 1 << 20, budget: nil, inMemory: 50_000,
            spill: { SpoolMapping(capacity: $0, budget: share, open: Self.openUnlinked) })
        let body = Self.pattern(400_000, seed: 5)
        var got: [UInt8] = []
        for start in stride(from: 0, to: body.count, by: 40_000) {
            body[start..<(start + 40_000)].withUnsafeBytes { stream.append($0) }
            got += Self.read(stream, max: 25_000)
        }
        #expect(!stream.isSpooled && !stream.replayable)
        #expect(share.current == 0)
        stream.finish()
        got += Self.readAll(stream)
        #expect(got == body)
        #expect(!stream.rewind())
    }

    /// A chunked body grows in its file past `inMemory`, becomes a spooled
    /// `RequestBody` cut to its length, and comes back to memory (within
    /// the budget) when the file cannot grow.
    @Test func aChunkedBodyGrowsInItsFileAndComesBackWhenItCannot() throws {
        let memory = BodyBudget(limit: 1 << 20)
        let share = BodyBudget(limit: 300_000)
        let body = Self.pattern(250_000, seed: 11)
        do {
            var growing = GrowingBody(budget: nil)
            growing.count(in: memory, inMemory: 64 << 10) { SpoolMapping(capacity: $0, budget: share, open: Self.openUnlinked) }
            for start in stride(from: 0, to: body.count, by: 10_000) {
                #expect(body[start..<(start + 10_000)].withUnsafeBytes { growing.append($0) })
            }
            #expect(growing.isSpooled && memory.current == 0)
            let kept = growing.finish()
            #expect(kept.isSpooled && kept.bytes == body)
            #expect(share.current == 250_000)
        }
        #expect(share.current == 0 && memory.current == 0)

        let larger = Self.pattern(500_000, seed: 3)
        var growing = GrowingBody(budget: nil)
        growing.count(in: memory, inMemory: 64 << 10) { SpoolMapping(capacity: $0, budget: share, open: Self.openUnlinked) }
        for start in stride(from: 0, to: larger.count, by: 10_000) {
            #expect(larger[start..<(start + 10_000)].withUnsafeBytes { growing.append($0) })
        }
        #expect(!growing.isSpooled && share.current == 0)
        let kept = growing.finish()
        #expect(!kept.isSpooled && kept.bytes == larger)
        #expect(memory.current == 500_000)
    }
}
