import CSQLite
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// The store's reads (status URLs, admin listings, the oldest queued
/// delivery for `/metrics`) on a thread of their own, with the read-only
/// connection only that thread touches. A caller hands a read over and
/// gets the answer through its reply, on the reader thread; an event loop
/// hops back onto itself with `EventLoop.execute`, as after a write. So no
/// event loop waits for SQLite, nor for another caller's read.
///
/// Reads run one at a time, in the order they were handed over. WAL lets
/// them run beside the writer's transactions; they see what was committed.
///
/// `@unchecked Sendable`: the connection is the reader thread's only; the
/// queue of reads is behind a pthread mutex and condition.
final class StoreReader: @unchecked Sendable {
    /// A read: the open connection, or why it could not be opened.
    typealias Job = @Sendable (Result<Reader, StoreError>) -> Void

    private let path: String
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var jobs: [Job] = []
    private var running = false
    private var stopping = false
    private var thread: pthread_t?
    /// Reader-thread state: the connection, opened on first use (the file
    /// may have no table yet while the writer cannot open it) and again
    /// after a read that failed to open it.
    private var reader: Reader?

    init(path: String) {
        self.path = path
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func start() {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        guard thread == nil, !stopping else { return }
        thread = startThread("the store's reader thread") { self.run() }
        running = true
    }

    /// Answers the reads already handed over, then ends the thread. Reads
    /// handed over after this are answered at once with an error.
    func stop() {
        pthread_mutex_lock(&mutex)
        stopping = true
        let t = thread
        thread = nil
        pthread_mutex_unlock(&mutex)
        pthread_cond_signal(&condition)
        if let t { pthread_join(t, nil) }
    }

    /// Hands `job` to the reader thread; while it is not running (before
    /// `start`, after `stop`), answers it at once, on the caller's thread,
    /// with an error.
    func read(_ job: @escaping Job) {
        pthread_mutex_lock(&mutex)
        guard running, !stopping else {
            pthread_mutex_unlock(&mutex)
            return job(.failure(StoreError(SQLITE_MISUSE, "the delivery store is not open")))
        }
        jobs.append(job)
        let wake = jobs.count == 1
        pthread_mutex_unlock(&mutex)
        if wake { pthread_cond_signal(&condition) }
    }

    private func run() {
        while let batch = take() {
            for job in batch {
                if reader == nil {
                    do throws(StoreError) {
                        reader = try Reader(path: path)
                    } catch {
                        job(.failure(error))
                        continue
                    }
                }
                job(.success(reader!))
            }
        }
        reader = nil
    }

    /// What is waiting (after waiting for something); nil once stopping and empty.
    private func take() -> [Job]? {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        while jobs.isEmpty {
            if stopping {
                running = false
                return nil
            }
            pthread_cond_wait(&condition, &mutex)
        }
        defer { jobs.removeAll(keepingCapacity: true) }
        return jobs
    }
}

/// The read-only connection and its statements; used on the reader thread only.
final class Reader {
    let connection: SQLiteConnection
    let byID: Statement
    let oldestPending: Statement

    init(path: String) throws(StoreError) {
        connection = try SQLiteConnection(path: path, readOnly: true)
        byID = try connection.prepare("SELECT \(Schema.recordColumns) FROM delivery WHERE id = ?1")
        // The first entry of the upstream's range in `delivery_pending`.
        oldestPending = try connection.prepare(
            "SELECT min(created_at) FROM delivery WHERE upstream = ?1 AND state < 2")
    }

    func record(id: String) throws(StoreError) -> DeliveryRecord? {
        let s = byID
        defer { s.reset() }
        s.bind(1, id)
        return try s.step() ? Schema.record(s) : nil
    }

    func list(state: DeliveryState?, upstream: String?, after: Int64?, limit: Int) throws(StoreError) -> [DeliveryRecord] {
        var conditions: [String] = []
        if state != nil { conditions.append("state = ?1") }
        if upstream != nil { conditions.append("upstream = ?2") }
        if after != nil { conditions.append("seq < ?3") }
        let filter = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        let s = try connection.prepare(
            "SELECT \(Schema.recordColumns) FROM delivery \(filter) ORDER BY seq DESC LIMIT ?4")
        if let state { s.bind(1, state.rawValue) }
        if let upstream { s.bind(2, upstream) }
        if let after { s.bind(3, after) }
        s.bind(4, limit)
        var out: [DeliveryRecord] = []
        while try s.step() { out.append(Schema.record(s)) }
        return out
    }

    /// When the oldest delivery of `upstream` not yet delivered or dead was
    /// accepted (wall ms); nil if it has none.
    func oldestPending(upstream: String) throws(StoreError) -> Int64? {
        let s = oldestPending
        defer { s.reset() }
        s.bind(1, upstream)
        guard try s.step(), !s.isNull(0) else { return nil }
        return s.int64(0)
    }
}
