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
final class StoreReader: Sendable {
    /// A read: the open connection, or why it could not be opened.
    typealias Job = @Sendable (Result<Reader, StoreError>) -> Void

    private let path: String
    private let queue: JobQueue<Job> = StoreReadQueue.make(name: "store-reader")

    init(path: String) {
        self.path = path
    }

    func start() {
        // The connection is opened on first use (the file may have no table
        // yet while the writer cannot open it) and again after a read that
        // failed to open it.
        queue.start { [path] reads in
            serveReads(reads, max: .max, open: { () throws(StoreError) in try Reader(path: path) })
        }
    }

    /// Answers the reads already handed over, then ends the thread. Reads
    /// handed over after this are answered at once with an error.
    func stop() { queue.stop() }

    /// Hands `job` to the reader thread; once it is stopped, or while
    /// `StoreReadQueue.capacity` reads wait, answers it at once, on the
    /// caller's thread, with an error.
    func read(_ job: @escaping Job) {
        StoreReadQueue.read(job, on: queue, notOpen: StoreError(SQLITE_MISUSE, "the delivery store is not open"))
    }
}

/// A reader thread's loop, until `reads` stops: each read gets the
/// thread's connection (a local here: no other thread sees it), opened on
/// first use and again once `usable` says it was lost; a read that finds
/// none gets why. Takes up to `max` reads at a time.
func serveReads<Connection>(
    _ reads: JobQueue<@Sendable (Result<Connection, StoreError>) -> Void>, max: Int,
    open: () throws(StoreError) -> Connection, usable: (Connection) -> Bool = { _ in true }
) {
    var connection: Connection?
    while let batch = reads.take(max: max) {
        for job in batch {
            if connection.map(usable) != true {
                do throws(StoreError) {
                    connection = try open()
                } catch {
                    connection = nil
                    job(.failure(error))
                    continue
                }
            }
            job(.success(connection!))
        }
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
