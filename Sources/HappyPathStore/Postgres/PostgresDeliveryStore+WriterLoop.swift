import HappyPathCore

/// The PostgreSQL store's writer thread: its connection, its leases and
/// what only it touches, handed to the thread when the store is made
/// (`JobQueue.start` takes it as `sending`), so no other thread can reach
/// it. What callers read, it publishes in `StoreShared`.
final class PostgresWriterLoop {
    let settings: PostgresStoreSettings
    private let clock: Clock
    private let shared: StoreShared

    private var writer: PostgresWriter?
    private var nextConnect: Instant
    private var backoff: Duration
    private var nextRenew: Instant
    private var nextRecount: Instant
    /// Round ends written while the database was unreachable: written again once it is back.
    private var deferred: [WriterOp] = []
    /// This replica's rounds in flight: the round (`attempts`) each lease is for, and its payload bytes.
    private var claims: [String: PostgresWriter.Claim] = [:]

    init(settings: PostgresStoreSettings, clock: Clock, shared: StoreShared) {
        self.settings = settings
        self.clock = clock
        self.shared = shared
        let now = clock.now()
        nextConnect = now
        backoff = settings.reconnectMin
        nextRenew = now
        nextRecount = now
    }

    /// The thread's loop, until the queue stops; then, unless crashed, puts
    /// this replica's rounds in flight back in the queue.
    func run(_ queue: JobQueue<WriterOp>) {
        while true {
            let now = clock.now()
            var wake = writer == nil ? nextConnect : nextRecount
            if writer != nil, !claims.isEmpty { wake = min(wake, nextRenew) }
            let wait = max(0, (wake - now).nanoseconds)
            guard var batch = queue.take(max: DeliveryStore.maxBatch, .linger(DeliveryStore.lingerNanoseconds, idle: wait))
            else { break }
            if writer == nil, clock.now() >= nextConnect { connect() }
            if writer != nil, !deferred.isEmpty {
                batch = deferred + batch
                deferred = []
            }
            // Leases first: a claim in this batch must not take back this
            // replica's own rounds for want of a renewal.
            if writer != nil { maintain() }
            if !batch.isEmpty { commit(batch) }
            if writer != nil { maintain() }
        }
        // Stopping: this replica's rounds in flight go back to the queue now
        // rather than when their leases end.
        if let writer, !claims.isEmpty, !shared.crashed.withLock({ $0 }) {
            _ = try? writer.release(Array(claims.keys), now: clock.wallMilliseconds())
            claims = [:]
        }
        writer = nil
    }

    private func connect() {
        do {
            let w = try PostgresWriter(settings: settings)
            // Rounds that ran on through the outage keep their leases, if
            // no other replica took them back meanwhile.
            if !claims.isEmpty { try w.renew(Array(claims.keys), until: clock.wallMilliseconds() + w.leaseMilliseconds) }
            let returned = try w.takeBackExpiredLeases(now: clock.wallMilliseconds()).requeued.count
            let (counts, bytes) = try w.count()
            writer = w
            shared.connected.withLock { $0 = true }
            backoff = settings.reconnectMin
            shared.held.withLock { $0 = bytes }
            shared.kept.withLock { $0 = counts }
            nextRecount = clock.now() + settings.recountEvery
            nextRenew = clock.now()
            shared.recovered.withLock { $0 += returned }
            let wasFailing = shared.clearFailure()
            if wasFailing || returned > 0 { shared.report(.writable(requeued: returned)) }
        } catch {
            lost(error)
        }
    }

    /// The connection failed or could not be made: no writer until the next try.
    private func lost(_ error: StoreError) {
        writer = nil
        shared.connected.withLock { $0 = false }
        nextConnect = clock.now() + backoff
        backoff = min(backoff * 2, settings.reconnectMax)
        shared.failed(error)
    }

    /// Renews this replica's leases and counts the table again, when due.
    private func maintain() {
        guard let writer else { return }
        let now = clock.now()
        do {
            if !claims.isEmpty, now >= nextRenew {
                try writer.renew(Array(claims.keys), until: clock.wallMilliseconds() + writer.leaseMilliseconds)
                nextRenew = now + settings.lease / 3
            }
            if now >= nextRecount {
                let (counts, bytes) = try writer.count()
                shared.held.withLock { $0 = bytes }
                shared.kept.withLock { $0 = counts }
                nextRecount = now + settings.recountEvery
            }
        } catch where error.kind == .unreachable {
            lost(error)
        } catch {
            shared.failed(error)
        }
    }

    private func commit(_ batch: [WriterOp]) {
        guard let writer else {
            return refuse(batch, shared.failure.withLock { $0 } ?? PostgresDeliveryStore.notConnected)
        }
        let now = clock.wallMilliseconds()
        var work = PostgresWriter.Work(tally: Tally(held: shared.held.withLock { $0 }, counts: shared.kept.withLock { $0 }), claims: claims)
        var replies: [() -> Void] = []
        do {
            replies = try writer.transaction(batch, now: now, settings: settings, work: &work)
            published(work)
        } catch {
            if error.kind == .unreachable {
                lost(error)
                return refuse(batch, error)
            }
            shared.failed(error)
            // A statement refused: the submits in the batch are refused;
            // the rest (round ends, claims, replays) is tried on its own.
            let (rest, refused) = WriterOp.refusingSubmits(batch, error)
            replies += refused
            if !rest.isEmpty {
                work = PostgresWriter.Work(tally: Tally(held: shared.held.withLock { $0 }, counts: shared.kept.withLock { $0 }), claims: claims)
                do {
                    replies += try writer.transaction(rest, now: now, settings: settings, work: &work)
                    published(work)
                } catch {
                    if error.kind == .unreachable { lost(error) } else { shared.failed(error) }
                    refuse(rest, error)
                }
            }
        }
        shared.wrote(batch, at: clock.now())
        for reply in replies { reply() }
    }

    /// A batch committed: its counts, bytes and claims become the store's.
    private func published(_ work: PostgresWriter.Work) {
        claims = work.claims
        shared.held.withLock { $0 = work.tally.held }
        shared.kept.withLock { $0 = work.tally.counts }
        if shared.clearFailure() { shared.report(.writable(requeued: 0)) }
    }

    /// Ops that could not be written. A round's end waits for the database
    /// (its lease is renewed meanwhile, if it comes back in time); the rest
    /// are answered as failed.
    private func refuse(_ ops: [WriterOp], _ error: StoreError) {
        for op in ops {
            if case .finish = op, error.kind == .unreachable {
                deferred.append(op)
                continue
            }
            op.fail(error)
        }
    }
}
