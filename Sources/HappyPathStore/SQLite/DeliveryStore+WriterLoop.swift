import CSQLite
import HappyPathCore

/// The SQLite store's writer thread: its connection and what only it
/// touches, handed to the thread when the store opens (`JobQueue.start`
/// takes it as `sending`), so no other thread can reach it. What callers
/// read, it publishes in `StoreShared`.
final class SQLiteWriterLoop {
    let settings: StoreSettings
    private let clock: Clock
    private let shared: StoreShared
    /// The connection and its statements (nil while the file cannot be
    /// opened for writing).
    private var writer: Writer?
    /// When to try opening the writer again (or to write the deferred round
    /// ends again).
    private var nextReopen: Instant
    /// Round ends the disk refused. Each is written again every
    /// `reopenInterval` until it goes in, so a round's end is not lost (its
    /// row would stay `in_flight` until the next start); their replies (a
    /// round slot freed) wait for it.
    private var deferred: [WriterOp] = []

    init(settings: StoreSettings, clock: Clock, shared: StoreShared) {
        self.settings = settings
        self.clock = clock
        self.shared = shared
        nextReopen = clock.now() + settings.reopenInterval
    }

    /// Opens the writer connection: recovers rounds left in flight, counts
    /// what is held. At the store's init (on its caller's thread, before the
    /// thread has it), then on the thread.
    func open() throws(StoreError) {
        let writer = try Writer(settings: settings)
        let recovered = try writer.recover(now: clock.wallMilliseconds())
        shared.recovered.withLock { $0 = recovered }
        let bytes = try writer.heldBytes()
        let counts = try writer.countRows()
        shared.held.withLock { $0 = bytes }
        shared.kept.withLock { $0 = counts }
        self.writer = writer
    }

    private func closeWriter() {
        guard let writer else { return }
        let crashed = shared.crashed.withLock { $0 }
        if !crashed, (try? writer.requeueAtStop(now: clock.wallMilliseconds())) != nil {
            shared.kept.withLock { $0.requeueInFlight() }
        }
        if !crashed { try? writer.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
        self.writer = nil
    }

    /// The thread's loop, until the queue stops; then, unless crashed, puts
    /// rounds in flight back to `queued` and empties the WAL file.
    func run(_ queue: JobQueue<WriterOp>) {
        defer { closeWriter() }
        while true {
            // Without a writer connection, wake up to try opening it again
            // even when nothing is waiting.
            let wait = writer == nil || !deferred.isEmpty ? max(0, (nextReopen - clock.now()).nanoseconds) : nil
            guard var batch = queue.take(max: DeliveryStore.maxBatch, .linger(DeliveryStore.lingerNanoseconds, idle: wait))
            else { return }
            if writer == nil, clock.now() >= nextReopen { reopen() }
            if writer != nil, !deferred.isEmpty, clock.now() >= nextReopen {
                nextReopen = clock.now() + settings.reopenInterval
                batch = deferred + batch
                deferred = []
            }
            if !batch.isEmpty { commit(batch) }
        }
    }

    /// Writer thread: one more try at opening the store.
    private func reopen() {
        nextReopen = clock.now() + settings.reopenInterval
        do {
            try open()
            _ = shared.clearFailure()
            shared.report(.writable(requeued: shared.recovered.withLock { $0 }))
        } catch {
            writer = nil
            shared.failed(error)
        }
    }

    private func commit(_ batch: [WriterOp]) {
        guard let writer else {
            // Not open (the disk refused it): nothing can be written.
            let error = shared.failure.withLock { $0 } ?? StoreError(SQLITE_CANTOPEN, "the store is not open")
            for op in batch { op.fail(error) }
            return
        }
        let now = clock.wallMilliseconds()
        let before = Tally(held: shared.held.withLock { $0 }, counts: shared.kept.withLock { $0 })
        var tally = before
        var replies: [() -> Void]
        let changesBefore = writer.connection.totalChanges
        var wrote = false
        do {
            replies = try transaction(batch, writer: writer, now: now, tally: &tally)
            wrote = writer.connection.totalChanges > changesBefore
        } catch {
            tally = before
            shared.failed(error)
            // Nothing new was stored: every submit in the batch is refused;
            // the rest (finishes, claims, replays) is tried again on its own.
            let rest: [WriterOp]
            (rest, replies) = WriterOp.refusingSubmits(batch, error)
            if !rest.isEmpty {
                do {
                    replies += try transaction(rest, writer: writer, now: now, tally: &tally)
                } catch {
                    tally = before
                    shared.failed(error)
                    for op in rest {
                        if case .finish = op, error.isDiskError {
                            if deferred.isEmpty { nextReopen = clock.now() + settings.reopenInterval }
                            deferred.append(op)
                        } else {
                            replies.append { op.fail(error) }
                        }
                    }
                }
            }
        }
        // Only a commit that changed rows shows the disk takes writes again
        // (the dispatcher's claims commit every 100 ms, mostly changing nothing).
        if wrote, shared.clearFailure() { shared.report(.writable(requeued: 0)) }
        shared.held.withLock { $0 = tally.held }
        if tally.counts != before.counts { shared.kept.withLock { $0 = tally.counts } }
        shared.wrote(batch, at: clock.now())
        for reply in replies { reply() }
    }

    /// `ops` in one transaction; their replies, to run once it is committed.
    /// Rolled back (and `tally` left to the caller) if any of them fails.
    private func transaction(_ ops: [WriterOp], writer: Writer, now: Int64, tally: inout Tally)
        throws(StoreError) -> [() -> Void]
    {
        var replies: [() -> Void] = []
        do {
            try writer.begin.run()
            for op in ops {
                if let reply = try writer.apply(
                    op, now: now, retention: settings.retention, maxBytes: settings.maxBytes, tally: &tally)
                {
                    replies.append(reply)
                }
            }
            try writer.commit.run()
        } catch {
            try? writer.rollback.run()
            throw error
        }
        return replies
    }
}
