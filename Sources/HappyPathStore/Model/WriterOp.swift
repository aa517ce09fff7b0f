import HappyPathCore

/// An operation for a store's writer thread (SQLite or PostgreSQL), handed
/// over through a `JobQueue`; the writer takes them in batches, each batch
/// one transaction.
enum WriterOp: Sendable {
    case submit(NewDelivery, enqueued: Instant, reply: @Sendable (SubmitResult) -> Void)
    case claim(
        limit: Int, skipping: [String],
        reply: @Sendable ([ClaimedDelivery], [SetAside]) -> Void)
    case finish(id: String, outcome: DeliveryOutcome, reply: (@Sendable () -> Void)?)
    case replay(id: String, expiresAt: Int64, reply: @Sendable (ReplayResult) -> Void)
    case purge(reply: @Sendable (Int) -> Void)
    case wake(upstream: String)
    /// Tests: a statement on the writer's connection, in the batch's transaction.
    case execute(sql: String, reply: @Sendable () -> Void)

    /// The most operations waiting for a store's writer thread (either
    /// store). Past it a submit is answered 503 STORE_UNAVAILABLE at once
    /// (`StoreError.writerBusy`), a claim finds nothing this time, a
    /// replay is not done, a purge or a wake waits for its next turn (a
    /// woken upstream's rows are still due at their own time).
    static let queueCapacity = 4096
    /// Places only a round's end or an operator's replay or purge may take
    /// beyond `queueCapacity`, so neither is refused because submits fill
    /// the queue: the rounds in flight are at most the dispatcher's
    /// `Deliveries.maxInFlight` (64) a process, each ending once, and an
    /// operator's actions are few.
    static let reserve = 1024

    /// What is pushed into `reserve` if need be: a round's end (its answer
    /// must reach the row), an operator's replay or purge (an admin call
    /// is not to be told "no such delivery" because clients are busy).
    var usesReserve: Bool {
        switch self {
        case .finish, .replay, .purge: true
        default: false
        }
    }

    /// Answers the operation as not done: a submit refused with `error`,
    /// nothing claimed, no replay, nothing purged.
    func fail(_ error: StoreError) {
        switch self {
        case let .submit(_, _, reply): reply(.failed(error))
        case let .claim(_, _, reply): reply([], [])
        case let .finish(_, _, reply): reply?()
        case let .replay(_, _, reply): reply(.unknown)
        case let .purge(reply): reply(0)
        case .wake: break
        case let .execute(_, reply): reply()
        }
    }

    /// A batch whose transaction failed: its submits are refused with
    /// `error` (their replies, to run), the rest is to be tried on its own.
    static func refusingSubmits(_ batch: [WriterOp], _ error: StoreError) -> (rest: [WriterOp], replies: [() -> Void]) {
        var rest: [WriterOp] = []
        var replies: [() -> Void] = []
        for op in batch {
            guard case let .submit(_, _, reply) = op else {
                rest.append(op)
                continue
            }
            replies.append { reply(.failed(error)) }
        }
        return (rest, replies)
    }

    /// What stored deliveries a key is found with: the delivery, its state,
    /// its request's fingerprint.
    typealias KeyLookUp = (_ scope: String?, _ key: String) throws(StoreError) -> (
        id: String, state: DeliveryState, fingerprint: String?
    )?

    /// A submit answered before its insert: its `Idempotency-Key` is
    /// already stored in its scope (`storedWith`), or it does not fit in
    /// `maxBytes` with `held` bytes held. Nil: to be inserted.
    static func answerBeforeInsert(
        _ d: NewDelivery, held: Int, maxBytes: Int, storedWith: KeyLookUp,
        _ reply: @escaping @Sendable (SubmitResult) -> Void
    ) throws(StoreError) -> (() -> Void)? {
        if let key = d.idempotencyKey, let existing = try storedWith(d.idempotencyScope, key) {
            return repeated(existing, d, reply)
        }
        guard held + d.payloadBytes > maxBytes else { return nil }
        return { reply(.full(heldBytes: held, maxBytes: maxBytes)) }
    }

    /// A submit whose `Idempotency-Key` is already stored in its scope: the
    /// same request gets the stored delivery; another request with that
    /// key is refused, and learns nothing of the first.
    static func repeated(
        _ existing: (id: String, state: DeliveryState, fingerprint: String?), _ d: NewDelivery,
        _ reply: @escaping @Sendable (SubmitResult) -> Void
    ) -> () -> Void {
        if existing.fingerprint != d.fingerprint { return { reply(.keyReused) } }
        let (id, state) = (existing.id, existing.state)
        return { reply(.existing(id: id, state: state)) }
    }
}

/// What a batch changes besides rows: the bytes held and the counts, kept
/// aside until its commit (a rollback leaves them as they were).
struct Tally: Equatable {
    var held: Int
    var counts: DeliveryCounts
}

extension JobQueue where Item == WriterOp {
    /// A store's writer queue, bounded (`WriterOp.queueCapacity`, and its
    /// `reserve`), taking nothing until `release`.
    static func writer(name: String) -> JobQueue<WriterOp> {
        JobQueue(name: name, capacity: WriterOp.queueCapacity, reserve: WriterOp.reserve, held: true)
    }

    /// Hands `op` to the writer thread; a full queue answers it at once, on
    /// the caller's thread, as not done (`WriterOp.fail`). Once the store
    /// is closed, `op` is dropped unanswered, as before there was a bound.
    func hand(_ op: WriterOp) {
        if offer(op, reserved: op.usesReserve) == .full {
            op.fail(StoreError(StoreError.writerBusy, "the store's writer has \(WriterOp.queueCapacity) operations waiting"))
        }
    }
}

/// The reads waiting for a store's reader threads (either store): status
/// URLs clients poll, the admin API's listings, `/metrics`' oldest pending
/// delivery. At most `capacity` wait; past it a read is answered at once
/// with `StoreError.readersBusy`, as a read the store could not make.
enum StoreReadQueue {
    static let capacity = 1024

    static func make<Job>(name: String) -> JobQueue<Job> { JobQueue(name: name, capacity: capacity) }

    static var busy: StoreError {
        StoreError(StoreError.readersBusy, "the store's readers have \(capacity) reads waiting: try again shortly")
    }

    /// Hands `job` to the readers; answers it at once, on the caller's
    /// thread, with `busy` while `capacity` reads wait, or with `notOpen`
    /// once the store is closed.
    static func read<Connection>(
        _ job: @escaping @Sendable (Result<Connection, StoreError>) -> Void,
        on queue: JobQueue<@Sendable (Result<Connection, StoreError>) -> Void>, notOpen: @autoclosure () -> StoreError
    ) {
        switch queue.offer(job) {
        case .kept: break
        case .full: job(.failure(busy))
        case .stopped: job(.failure(notOpen()))
        }
    }
}

extension StoreError {
    /// A store's writer or readers refused the operation because they are
    /// full: not a failed write; the caller may try again shortly.
    public var isBusy: Bool { code == Self.writerBusy || code == Self.readersBusy }
}
