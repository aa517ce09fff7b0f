import HappyPathCore

// MARK: - Reads

/// The reads, on a reader thread's connection. Before the writer has
/// created the table (a replica's first seconds on a new database), there
/// is nothing to read, which is no error.
enum PostgresReads {
    static let undefinedTable = "42P01"

    static func record(_ c: PostgresConnection, id: String) throws(StoreError) -> DeliveryRecord? {
        let rows: PostgresRows
        do {
            rows = try c.execute("SELECT \(PostgresWriter.columns) FROM happypath_delivery WHERE id = $1", [.text(id)])
        } catch where error.sqlState == undefinedTable {
            return nil
        }
        return rows.count > 0 ? record(rows, 0) : nil
    }

    static func list(_ c: PostgresConnection, state: DeliveryState?, upstream: String?, after: Int64?, limit: Int)
        throws(StoreError) -> [DeliveryRecord]
    {
        var conditions: [String] = []
        var parameters: [PostgresValue] = []
        if let state {
            parameters.append(.int(Int64(state.rawValue)))
            conditions.append("state = $\(parameters.count)")
        }
        if let upstream {
            parameters.append(.text(upstream))
            conditions.append("upstream = $\(parameters.count)")
        }
        if let after {
            parameters.append(.int(after))
            conditions.append("seq < $\(parameters.count)")
        }
        parameters.append(.int(Int64(limit)))
        let filter = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        let rows: PostgresRows
        do {
            rows = try c.execute(
                "SELECT \(PostgresWriter.columns) FROM happypath_delivery \(filter) ORDER BY seq DESC LIMIT $\(parameters.count)",
                parameters)
        } catch where error.sqlState == undefinedTable {
            return []
        }
        return (0..<rows.count).map { record(rows, $0) }
    }

    static func oldestPending(_ c: PostgresConnection, upstream: String) throws(StoreError) -> Int64? {
        try c.execute("SELECT min(created_at) FROM happypath_delivery WHERE upstream = $1 AND state < 2", [.text(upstream)])
            .int(0, 0)
    }

    static func record(_ rows: PostgresRows, _ i: Int) -> DeliveryRecord {
        DeliveryRecord(
            cursor: rows.int(i, 0) ?? 0, id: rows.text(i, 1) ?? "",
            state: DeliveryState(rawValue: Int(rows.int(i, 2) ?? 0)) ?? .queued, attempts: Int(rows.int(i, 3) ?? 0),
            maxAttempts: Int(rows.int(i, 4) ?? 0), upstream: rows.text(i, 5) ?? "", route: rows.text(i, 6) ?? "",
            requestID: rows.text(i, 7) ?? "", method: rows.text(i, 8) ?? "", target: rows.text(i, 9) ?? "",
            createdAt: rows.int(i, 10) ?? 0, updatedAt: rows.int(i, 11) ?? 0, nextAttemptAt: rows.int(i, 12) ?? 0,
            expiresAt: rows.int(i, 13) ?? 0, lastStatus: rows.int(i, 14).map { Int($0) }, lastProblem: rows.text(i, 15))
    }
}

/// Reader threads, each with a connection of its own (made on first use,
/// and again after one is lost), taking reads from one queue in order.
/// Each connection is a local of its thread's loop: no other thread sees it.
final class PostgresReadPool: Sendable {
    typealias Job = @Sendable (Result<PostgresConnection, StoreError>) -> Void

    private let url: String
    private let count: Int
    private let queue: JobQueue<Job> = StoreReadQueue.make(name: "pg-reader")

    init(url: String, threads: Int) {
        self.url = url
        count = threads
    }

    func start() {
        queue.start(threads: count) { [url] reads in
            serveReads(
                reads, max: 1, open: { () throws(StoreError) in try PostgresConnection(url: url) }, usable: { $0.isUsable })
        }
    }

    /// Answers the reads already handed over, then ends the threads.
    func stop() { queue.stop() }

    /// Hands `job` to a reader thread; once stopped, or while
    /// `StoreReadQueue.capacity` reads wait, answers it at once, on the
    /// caller's thread, with an error.
    func read(_ job: @escaping Job) {
        StoreReadQueue.read(job, on: queue, notOpen: StoreError(PostgresConnection.connectFailed, "the delivery store is not open"))
    }
}
