import Foundation
import HappyPathCore
import Testing

@testable import HappyPathIO

#if canImport(Glibc)
    import Glibc
#endif

/// The spool an answer is read ahead into (`limits.read_ahead`): bytes come
/// out in the order they went in, across the file and the memory tail;
/// every byte in the file is reserved in the client's account and given
/// back as the client reads; a full disk, an unopenable directory or a
/// spent share sends the rest to the tail (the answer then waits for its
/// client), never loses a byte; and no file name is left in the directory.
@Suite struct AnswerSpoolTests {
    /// A directory of the test's own, removed with it.
    final class Directory {
        let path = NSTemporaryDirectory() + "happypath-spool-test-" + UUID().uuidString
        init() { try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true) }
        deinit { try? FileManager.default.removeItem(atPath: path) }
        var names: [String] { (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] }
    }

    static func pattern(_ n: Int, seed: Int = 0) -> [UInt8] { (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ seed) } }

    /// Everything the spool holds, read `step` bytes at a time.
    static func drain(_ spool: AnswerSpool, step: Int = 10_000) -> [UInt8]? {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: step)
        while !spool.isEmpty {
            guard let n = buffer.withUnsafeMutableBytes({ spool.read(into: $0.baseAddress!, max: step) }) else { return nil }
            out += buffer[0..<n]
        }
        return out
    }

    @Test func bytesComeOutInOrderAndTheAccountReturnsToZero() throws {
        let dir = Directory()
        let process = BodyBudget(limit: 64 << 20)
        let account = BodyBudget(limit: 8 << 20, parent: process)
        let spool = AnswerSpool(account: account, limit: 16 << 20) { AnswerSpool.openUnlinked(in: dir.path) }
        let a = Self.pattern(300_000, seed: 1)
        let b = Self.pattern(5, seed: 2)
        a.withUnsafeBytes { x in b.withUnsafeBytes { y in spool.append([x, y]) } }
        #expect(spool.held == 300_005)
        #expect(account.current == 300_005 && process.current == 300_005)
        #expect(dir.names.isEmpty, "a spool file has no name: \(dir.names)")
        #expect(Self.drain(spool) == a + b)
        #expect(account.current == 0 && process.current == 0)
        #expect(!spool.failed)
    }

    /// What the answer may still read ahead: its own limit, the client's
    /// share, the process's budget, whichever is least.
    @Test func roomIsTheLeastOfTheLimitTheShareAndTheProcess() {
        let dir = Directory()
        let process = BodyBudget(limit: 1 << 20)
        let account = BodyBudget(limit: 512 << 10, parent: process)
        let spool = AnswerSpool(account: account, limit: 256 << 10) { AnswerSpool.openUnlinked(in: dir.path) }
        #expect(spool.room == 256 << 10)
        Self.pattern(100 << 10).withUnsafeBytes { spool.append($0) }
        #expect(spool.room == 156 << 10)
        // Another answer of the same client takes most of its share.
        #expect(account.reserve(400 << 10))
        #expect(spool.room == 12 << 10)
        // Another client takes the process's budget.
        #expect(process.reserve(process.available))
        #expect(spool.room == 0)
    }

    /// Past the client's share the rest waits in memory, after the file's
    /// bytes, and no more is read ahead until the client caught up.
    @Test func aSpentShareSendsTheRestToTheTail() throws {
        let dir = Directory()
        let pool = MemoryPool()
        let account = BodyBudget(limit: 100_000)
        let spool = AnswerSpool(account: account, limit: 1 << 20, pool: pool) { AnswerSpool.openUnlinked(in: dir.path) }
        let first = Self.pattern(90_000, seed: 3)
        let second = Self.pattern(20_000, seed: 4)
        first.withUnsafeBytes { spool.append($0) }
        second.withUnsafeBytes { spool.append($0) }
        #expect(spool.failed && spool.room == 0)
        #expect(pool.current == 20_000, "the tail is counted in memory")
        #expect(account.current == 90_000)
        #expect(Self.drain(spool, step: 7_000) == first + second)
        #expect(pool.current == 0 && account.current == 0)
        #expect(!spool.failed && spool.room == 100_000, "caught up: reading ahead again")
    }

    /// A full disk (`/dev/full` says ENOSPC to every write): the bytes wait
    /// in the tail, none is lost, the account is not charged for them.
    @Test func aFullDiskFallsBackToMemory() throws {
        let account = BodyBudget(limit: 1 << 20)
        let spool = AnswerSpool(account: account, limit: 1 << 20) { open("/dev/full", O_RDWR | O_CLOEXEC) }
        let bytes = Self.pattern(50_000, seed: 5)
        bytes.withUnsafeBytes { spool.append($0) }
        #expect(spool.failed && spool.room == 0)
        #expect(account.current == 0)
        #expect(Self.drain(spool) == bytes)
    }

    /// A directory no file can be made in: the same.
    @Test func anUnusableDirectoryFallsBackToMemory() throws {
        let account = BodyBudget(limit: 1 << 20)
        let spool = AnswerSpool(account: account, limit: 1 << 20) { AnswerSpool.openUnlinked(in: "/nonexistent/happypath") }
        let bytes = Self.pattern(70_000, seed: 6)
        bytes.withUnsafeBytes { spool.append($0) }
        #expect(spool.failed && account.current == 0)
        #expect(Self.drain(spool) == bytes)
    }

    /// The file's front goes back as the client reads (a hole every MiB),
    /// so a long answer that streams through the spool holds the account
    /// for what waits, not for all that passed; reading it all closes the
    /// file.
    @Test func theFrontIsGivenBackAsTheClientReads() throws {
        let dir = Directory()
        let account = BodyBudget(limit: 64 << 20)
        let spool = AnswerSpool(account: account, limit: 64 << 20) { AnswerSpool.openUnlinked(in: dir.path) }
        let bytes = Self.pattern(5 << 20, seed: 7)
        bytes.withUnsafeBytes { spool.append($0) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while out.count < 3 << 20 {
            let n = try #require(buffer.withUnsafeMutableBytes { spool.read(into: $0.baseAddress!, max: $0.count) })
            out += buffer[0..<n]
        }
        // At least 2 MiB of the 3 read are given back (holes in whole MiB steps).
        #expect(account.current <= 3 << 20, "\(account.current) still reserved after 3 MiB read of 5")
        #expect(spool.held == (5 << 20) - out.count)
        out += try #require(Self.drain(spool, step: 64 << 10))
        #expect(out == bytes)
        #expect(account.current == 0 && spool.fileBytes == 0)
    }

    /// Closing gives back whatever the spool held: the file's bytes to the
    /// account, the tail's to the pool.
    @Test func closeGivesEverythingBack() {
        let dir = Directory()
        let pool = MemoryPool()
        let account = BodyBudget(limit: 10_000)
        let spool = AnswerSpool(account: account, limit: 1 << 20, pool: pool) { AnswerSpool.openUnlinked(in: dir.path) }
        Self.pattern(25_000).withUnsafeBytes { spool.append($0) }
        #expect(account.current == 0 && pool.current == 25_000, "all to the tail: the piece was larger than the share")
        spool.close()
        #expect(account.current == 0 && pool.current == 0 && spool.isEmpty)
        Self.pattern(8_000).withUnsafeBytes { spool.append($0) }
        #expect(account.current == 8_000)
        spool.close()
        #expect(account.current == 0)
    }

    /// At start the directory is swept of names an earlier process may have
    /// left (made, then killed before the unlink); other files stay.
    @Test func theSweepRemovesOnlySpoolNames() throws {
        let dir = Directory()
        for name in ["happypath-spool.abc123", "happypath-spool.zzz999", "keep.me"] {
            _ = FileManager.default.createFile(atPath: dir.path + "/" + name, contents: Data([1]))
        }
        let readAhead = Spool(directory: dir.path, perAnswer: 1 << 20, maxSpooled: 1 << 30, perClient: 1 << 27)
        #expect(readAhead.sweep() == 2)
        #expect(dir.names == ["keep.me"])
        let fd = readAhead.openFile()
        #expect(fd >= 0)
        close(fd)
        #expect(dir.names == ["keep.me"])
    }

    /// A request body kept in a spool file (`limits.body_in_memory`):
    /// written and read through its address like one in memory, counted in
    /// the client's account until it is freed, and never made when the
    /// account, the directory or the device cannot take it.
    @Test func aSpooledBodyIsMappedCountedAndGivenBack() throws {
        let dir = Directory()
        let account = BodyBudget(limit: 4 << 20)
        do {
            let body = try #require(RequestBody(spooling: 3 << 20, budget: account) { AnswerSpool.openUnlinked(in: dir.path) })
            #expect(body.isSpooled && body.count == 3 << 20)
            #expect(account.current == 3 << 20)
            let bytes = Self.pattern(3 << 20, seed: 9)
            bytes.withUnsafeBytes { body.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            #expect(body.bytes == bytes)
            #expect(dir.names.isEmpty)
            // The share has 1 MiB left: a second body of 2 MiB is not made.
            #expect(RequestBody(spooling: 2 << 20, budget: account) { AnswerSpool.openUnlinked(in: dir.path) } == nil)
            #expect(account.current == 3 << 20)
        }
        #expect(account.current == 0, "freed with the body")
        #expect(RequestBody(spooling: 1 << 20, budget: account) { open("/dev/full", O_RDWR | O_CLOEXEC) } == nil)
        #expect(RequestBody(spooling: 1 << 20, budget: account) { -1 } == nil)
        #expect(account.current == 0)
    }

    /// Answer spool files are capped (a quarter of the process's
    /// descriptors by default): past the cap a spool cannot open one, its
    /// bytes wait in memory and the answer waits for its client, and each
    /// close gives a place back.
    @Test func answerFilesAreCapped() {
        let dir = Directory()
        let settings = Spool(directory: dir.path, perAnswer: 1 << 20, maxSpooled: 1 << 30, perClient: 1 << 30, maxAnswerFiles: 3)
        let account = BodyBudget(limit: 1 << 30)
        let spools = (0..<4).map { _ in
            AnswerSpool(account: account, limit: 1 << 20, open: settings.openAnswerFile, closed: settings.answerFileClosed)
        }
        let bytes = Self.pattern(10_000)
        for spool in spools { bytes.withUnsafeBytes { spool.append($0) } }
        #expect(settings.openAnswerFiles == 3)
        #expect(spools.map(\.failed) == [false, false, false, true], "the fourth had no file")
        #expect(Self.drain(spools[3]) == bytes)
        spools[0].close()
        #expect(settings.openAnswerFiles == 2)
        #expect(Self.drain(spools[1]) == bytes, "read to its end: its file closes")
        #expect(settings.openAnswerFiles == 1)
        spools[2].close()
        #expect(settings.openAnswerFiles == 0)
        #expect(Spool(directory: dir.path, perAnswer: 1, maxSpooled: 1, perClient: 1).maxAnswerFiles >= 16)
    }
}
