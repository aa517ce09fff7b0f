internal import CShims
import HappyPathCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Spool files for the whole process: where they go (`storage.spool_dir`),
/// how much of one answer may be read ahead of a slow client there
/// (`limits.read_ahead`), which request bodies are kept there instead of
/// memory (`limits.body_in_memory`), and the disk budget they share
/// (`limits.max_spooled_bytes`) with each client's share of it. Shared by
/// every worker.
///
/// An answer is read from its upstream at the upstream's pace: what its
/// client's connection cannot take yet goes into the connection's memory
/// (`limits.connection_buffer`), then into a spool file, so the upstream
/// connection and its concurrency slot are free once the upstream sent its
/// last byte, as nginx's `proxy_buffering` reads into temporary files.
public final class Spool: Sendable {
    /// The directory spool files are made in (each unlinked at once).
    public let directory: String
    private let perAnswerLimit: Atomic<Int>
    /// `limits.max_spooled_bytes`, and each client's share of it
    /// (`limits.max_buffered_per_client`'s eighth of it by default).
    public let shares: ClientShares

    private let bodyLimit: Atomic<Int>
    /// Answer spool files open now, and how many may be (a quarter of the
    /// process's descriptors, so that slow clients' spools never leave
    /// `accept` without one): past it an answer waits for its client instead.
    private let answerFiles = Atomic<Int>(0)
    public let maxAnswerFiles: Int

    /// - Parameter maxAnswerFiles: nil: a quarter of the process's descriptors.
    public init(
        directory: String, perAnswer: Int, maxSpooled: Int, perClient: Int, bodyInMemory: Int = Int.max,
        maxAnswerFiles: Int? = nil
    ) {
        self.directory = directory
        perAnswerLimit = Atomic(perAnswer)
        bodyLimit = Atomic(bodyInMemory)
        var limit = rlimit()
        let descriptors = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 ? Int(clamping: limit.rlim_cur) : 1024
        self.maxAnswerFiles = maxAnswerFiles ?? max(16, min(descriptors, 1 << 20) / 4)
        shares = ClientShares(process: BodyBudget(limit: maxSpooled), perClient: perClient)
    }

    /// Bytes one answer may hold in its spool file (a reload may change it).
    public var perAnswer: Int {
        get { perAnswerLimit.load(ordering: .relaxed) }
        set { perAnswerLimit.store(newValue, ordering: .relaxed) }
    }

    /// A request body larger than this is kept in a spool file (a reload may change it).
    public var bodyInMemory: Int {
        get { bodyLimit.load(ordering: .relaxed) }
        set { bodyLimit.store(newValue, ordering: .relaxed) }
    }

    /// Bytes in spool files now, all clients together.
    public var spooled: Int { shares.process.current }

    /// A file of its own in `directory`, already unlinked (no name is left
    /// behind, even after a crash), or -1.
    public func openFile() -> Int32 { AnswerSpool.openUnlinked(in: directory) }

    /// `openFile` for an answer's spool, within `maxAnswerFiles` (-1 past
    /// it); give it back with `answerFileClosed`.
    public func openAnswerFile() -> Int32 {
        guard answerFiles.wrappingAdd(1, ordering: .relaxed).newValue <= maxAnswerFiles else {
            answerFiles.wrappingSubtract(1, ordering: .relaxed)
            return -1
        }
        let fd = openFile()
        if fd < 0 { answerFiles.wrappingSubtract(1, ordering: .relaxed) }
        return fd
    }

    public func answerFileClosed() { answerFiles.wrappingSubtract(1, ordering: .relaxed) }

    /// Answer spool files open now.
    public var openAnswerFiles: Int { answerFiles.load(ordering: .relaxed) }

    /// Removes what a process killed between making a spool file and
    /// unlinking it may have left (the fallback without `O_TMPFILE` only):
    /// files named `happypath-spool.*` in `directory`. How many.
    @discardableResult
    public func sweep() -> Int {
        guard let dir = opendir(directory) else { return 0 }
        defer { closedir(dir) }
        var removed = 0
        while let entry = readdir(dir) {
            // Read in place: a dirent may end before `d_name`'s 256 bytes do
            // (copying the field read past its block: AddressSanitizer).
            let name = withUnsafeMutablePointer(to: &entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 1) { String(cString: $0) }
            }
            guard name.hasPrefix(AnswerSpool.namePrefix) else { continue }
            if unlink(directory + "/" + name) == 0 { removed += 1 }
        }
        return removed
    }
}

/// One client connection's answer bytes read ahead of the client: a spool
/// file (opened at the first byte, unlinked at once) taken from the front
/// as the client drains (closed once the client caught up, so an idle
/// connection holds neither a descriptor nor disk), then a short tail in memory for what the file
/// could not take (a full disk, the client's share spent: the answer waits
/// for the client from then on, as it would without a spool). Bytes come
/// out in the order they went in.
///
/// Every byte in the file is reserved in the client's share of the disk
/// budget (`account`) until it is read and its space given back: the
/// file's front is freed as the client reads (a hole punched every MiB).
///
/// On the loop's thread; the file is read and written with plain calls
/// (the page cache takes them, as nginx's temporary files are written).
public final class AnswerSpool {
    static let namePrefix = "happypath-spool."

    private var fd: Int32 = -1
    private let open: () -> Int32
    /// Told each time the spool closes a file `open` gave it.
    private let closed: (() -> Void)?
    /// The client's share of `limits.max_spooled_bytes`.
    let account: BodyBudget
    /// `limits.read_ahead`: bytes the file may hold at once (a kept-alive
    /// connection's spool takes a reloaded value at its next answer).
    var limit: Int
    /// Where what waits in memory (`tail`) is counted.
    let pool: MemoryPool?
    private var written = 0
    private var readTo = 0
    /// The file's front already given back (a hole punched, or the file cut).
    private var freed = 0
    private var tail = ByteQueue()
    /// A write failed (or the share was spent): nothing more goes to the
    /// file until the client caught up with all of it.
    public private(set) var failed = false

    /// Bytes the spool gives back (a hole punched) at a time.
    static let freeStep = 1 << 20

    public init(
        account: BodyBudget, limit: Int, pool: MemoryPool? = nil, open: @escaping () -> Int32, closed: (() -> Void)? = nil
    ) {
        self.account = account
        self.limit = limit
        self.pool = pool
        self.open = open
        self.closed = closed
    }

    deinit { close() }

    /// Bytes waiting: in the file and in the tail.
    public var held: Int { written - readTo + tail.count }
    public var isEmpty: Bool { held == 0 }
    /// Bytes in the file now (reserved in the account).
    public var fileBytes: Int { written - freed }

    /// Bytes the answer may still read ahead: within `limit` (what the file
    /// holds on disk, its read front until a hole is punched included), the
    /// client's share and the process's budget; 0 after a failure.
    public var room: Int {
        guard !failed, tail.isEmpty else { return 0 }
        return max(0, min(limit - fileBytes, account.available))
    }

    /// Appends `pieces` after everything held: to the file while it takes
    /// them (and the account has room), else to the tail.
    public func append(_ pieces: [UnsafeRawBufferPointer]) {
        for piece in pieces where !piece.isEmpty { append(piece) }
    }

    public func append(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        var rest = bytes
        if !failed, tail.isEmpty {
            let n = writeToFile(bytes)
            rest = UnsafeRawBufferPointer(rebasing: bytes[n...])
        }
        guard !rest.isEmpty else { return }
        failed = true
        tail.append(rest)
        pool?.add(rest.count)
    }

    /// Writes as much of `bytes` as the file and the account take; how much.
    private func writeToFile(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard account.reserve(bytes.count) else { return 0 }
        if fd < 0 { fd = open() }
        var done = 0
        if fd >= 0 {
            while done < bytes.count {
                let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(written + done))
                if n > 0 {
                    done += n
                } else if n < 0, errno == EINTR {
                    continue
                } else {
                    break  // ENOSPC, EFBIG, EIO: the rest waits in memory
                }
            }
        }
        written += done
        account.release(bytes.count - done)
        return done
    }

    /// Copies up to `max` bytes from the front into `buffer`: how many, or
    /// nil if the file could not be read (the answer is broken off).
    public func read(into buffer: UnsafeMutableRawPointer, max: Int) -> Int? {
        guard max > 0 else { return 0 }
        if readTo < written {
            let want = min(max, written - readTo)
            var n: Int
            repeat { n = pread(fd, buffer, want, off_t(readTo)) } while n < 0 && errno == EINTR
            guard n > 0 else { return nil }
            readTo += n
            giveBack()
            return n
        }
        let n = tail.take(into: buffer, max: max)
        pool?.add(-n)
        if tail.isEmpty { failed = false }
        return n
    }

    /// The file's read front goes back to the account: the whole file once
    /// the client caught up with it, else a hole every `freeStep`.
    private func giveBack() {
        if readTo == written {
            // Caught up: the file goes (a spill later makes a new one), so an
            // idle connection holds no descriptor and no disk.
            closeFile()
            account.release(written - freed)
            (written, readTo, freed) = (0, 0, 0)
            return
        }
        let end = readTo & ~4095  // whole pages
        guard end - freed >= Self.freeStep else { return }
        // The blocks go, the offsets stay.
        if hp_punch_hole(fd, Int64(freed), Int64(end - freed)) == 0 {
            account.release(end - freed)
            freed = end
        }
    }

    private func closeFile() {
        guard fd >= 0 else { return }
        Glibc.close(fd)
        fd = -1
        closed?()
    }

    /// Lets the file go; what it held goes back to the account, and the tail to its pool.
    public func close() {
        closeFile()
        account.release(written - freed)
        (written, readTo, freed) = (0, 0, 0)
        pool?.add(-tail.count)
        tail.removeAll()
        failed = false
    }

    /// A file in `directory`, unlinked before anyone could see it: `O_TMPFILE`
    /// where the file system has it, else a named file unlinked at once. -1
    /// when neither can be made.
    static func openUnlinked(in directory: String) -> Int32 { hp_open_unlinked(directory) }
}
