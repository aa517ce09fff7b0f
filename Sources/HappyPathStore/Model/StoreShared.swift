import HappyPathCore

/// What a store's writer thread tells everyone else, each behind its own
/// lock: the bytes held and the counts as of the last commit, the last
/// write's failure, the rounds taken back at open, and who hears about
/// the store's health. Callers read these without waiting for the writer.
final class StoreShared: Sendable {
    /// Told each stored request's write latency (seconds), on the writer thread.
    private let onWrite: @Sendable (Double) -> Void
    /// Payload bytes held.
    let held = Locked(0)
    /// Rows by upstream and state.
    let kept = Locked(DeliveryCounts())
    /// The last write's failure, cleared once a write succeeds.
    let failure = Locked<StoreError?>(nil)
    /// Rounds put back in the queue when the store opened (SQLite) or
    /// taken back from replicas gone (PostgreSQL).
    let recovered = Locked(0)
    /// PostgreSQL: the writer is connected.
    let connected = Locked(false)
    /// Tests only (`crash`): the writer thread ends as `kill -9` would leave it.
    let crashed = Locked(false)
    /// Told when writes start failing or work again.
    private let observer = Locked<@Sendable (StoreHealth) -> Void>({ _ in })

    init(onWrite: @escaping @Sendable (Double) -> Void) {
        self.onWrite = onWrite
    }

    /// A batch was committed (or refused) at `committed`: each submit's
    /// time from its hand-over, for the write-latency histogram.
    func wrote(_ batch: [WriterOp], at committed: Instant) {
        for op in batch {
            if case let .submit(_, enqueued, _) = op { onWrite(Double((committed - enqueued).nanoseconds) / 1e9) }
        }
    }

    func observe(_ handler: @escaping @Sendable (StoreHealth) -> Void) {
        observer.withLock { $0 = handler }
    }

    /// Tells the observer (on the caller's thread: the writer's).
    func report(_ health: StoreHealth) {
        observer.withLock { $0 }(health)
    }

    /// Lets go of the observer: it is usually the store's owner (Deliveries
    /// holds the store, the handler holds Deliveries), and the two would
    /// keep each other alive after the proxy stopped (LeakSanitizer saw the cycle).
    func forgetObserver() {
        observer.withLock { $0 = { _ in } }
    }

    /// A write failed (every failure is reported).
    func failed(_ error: StoreError) {
        failure.withLock { $0 = error }
        report(.failed(error))
    }

    /// Clears the failure; true if there was one.
    func clearFailure() -> Bool {
        failure.withLock { f in
            defer { f = nil }
            return f != nil
        }
    }
}
