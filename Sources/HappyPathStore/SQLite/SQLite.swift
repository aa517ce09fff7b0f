import CSQLite

#if canImport(Glibc)
    import Glibc
#endif

/// What went wrong in SQLite, with its own message (which names the file,
/// the table or the constraint).
public struct StoreError: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public let message: String
    /// The system call's errno behind an I/O failure (0 if none or unknown).
    public let systemErrno: Int32
    /// PostgreSQL's SQLSTATE of a refused statement ("" otherwise).
    public let sqlState: String
    public var description: String { message }

    /// Not SQLite's nor libpq's: a store's writer refused an operation
    /// because `WriterOp.queueCapacity` operations already wait for it
    /// (its kind is `other`; the answer's detail says which).
    public static let writerBusy: Int32 = -100
    /// Not SQLite's nor libpq's: a store's readers refused a read because
    /// `StoreReadQueue.capacity` reads already wait for them.
    public static let readersBusy: Int32 = -101

    init(_ code: Int32, _ message: String, systemErrno: Int32 = 0, sqlState: String = "") {
        self.code = code
        self.message = message
        self.systemErrno = systemErrno
        self.sqlState = sqlState
    }

    /// What kind of failure it is, for `happypath_delivery_store_errors_total{kind}`.
    /// SQLite reports ENOSPC as SQLITE_FULL from a write, but as an
    /// SQLITE_IOERR from some other calls (growing the -shm file, a
    /// truncate): the errno decides then.
    public var kind: StoreErrorKind {
        if code == PostgresConnection.connectFailed { return .unreachable }
        if code == PostgresConnection.statementFailed { return .database }
        let noSpace = systemErrno == ENOSPC || systemErrno == EDQUOT
        switch code & 0xFF {
        case SQLITE_FULL: return .full
        case SQLITE_IOERR: return noSpace ? .full : .io
        case SQLITE_CANTOPEN: return noSpace ? .full : .other
        default: return .other
        }
    }

    /// The disk refused a write (full, or an I/O error), or the database
    /// cannot be reached: the store keeps running and tries again, rather
    /// than stopping the proxy.
    public var isDiskError: Bool { kind != .other && kind != .database }
}

/// Why a write to the store failed, as the metric's `kind` label says it.
public enum StoreErrorKind: String, Sendable, CaseIterable {
    /// SQLITE_FULL: the filesystem has no space left (ENOSPC), or the file
    /// reached the store's own page limit (about twice `storage.max_bytes`).
    case full
    /// SQLITE_IOERR: the filesystem failed a read, write or fsync (EIO).
    case io
    /// Anything else SQLite reports (a locked or corrupt file, ...).
    case other
    /// PostgreSQL (`storage.url`) cannot be reached, or the connection was lost.
    case unreachable
    /// PostgreSQL refused a statement (see its SQLSTATE in the message).
    case database
}

/// One SQLite connection, used by one thread at a time (opened with
/// SQLITE_OPEN_NOMUTEX; the store gives each thread its own). A thin layer:
/// statements are prepared once and reused, values bound by position.
final class SQLiteConnection {
    let handle: OpaquePointer

    init(path: String, readOnly: Bool) throws(StoreError) {
        var db: OpaquePointer?
        let flags =
            (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            let systemErrno = db.map { sqlite3_system_errno($0) } ?? 0
            sqlite3_close_v2(db)
            throw StoreError(rc, "cannot open \(path): \(message)", systemErrno: systemErrno)
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        // A reader may meet a checkpoint in progress; wait rather than fail.
        sqlite3_busy_timeout(db, 5000)
    }

    deinit { sqlite3_close_v2(handle) }

    var errorMessage: String { String(cString: sqlite3_errmsg(handle)) }

    /// The error `rc` with SQLite's message and the errno of the failed system call.
    func error(_ rc: Int32, _ message: String? = nil) -> StoreError {
        StoreError(rc, message ?? errorMessage, systemErrno: sqlite3_system_errno(handle))
    }

    func execute(_ sql: String) throws(StoreError) {
        var error: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &error)
        if rc != SQLITE_OK {
            let message = error.map { String(cString: $0) } ?? errorMessage
            sqlite3_free(error)
            throw self.error(rc, message)
        }
    }

    func prepare(_ sql: String) throws(StoreError) -> Statement {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw error(rc, "\(errorMessage) in: \(sql)") }
        return Statement(statement, connection: self)
    }

    /// The first column of the first row of `sql`, as an integer.
    func integer(_ sql: String) throws(StoreError) -> Int64 {
        let s = try prepare(sql)
        guard try s.step() else { return 0 }
        return s.int64(0)
    }

    var changes: Int { Int(sqlite3_changes(handle)) }

    /// Rows changed since the connection opened: a commit that changed some
    /// proves the disk took a write (an empty transaction writes nothing).
    var totalChanges: Int64 { Int64(sqlite3_total_changes(handle)) }
}

/// A prepared statement, reset after each use.
final class Statement {
    let handle: OpaquePointer
    /// Alive: a statement is kept beside its connection (Writer, Reader, or a local of a function
    /// that has the connection), so it never outlives it; sqlite3_close_v2 waits for the last finalize.
    unowned let connection: SQLiteConnection

    init(_ handle: OpaquePointer, connection: SQLiteConnection) {
        self.handle = handle
        self.connection = connection
    }

    deinit { sqlite3_finalize(handle) }

    func reset() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    func bind(_ index: Int32, _ value: Int64) { sqlite3_bind_int64(handle, index, value) }
    func bind(_ index: Int32, _ value: Int) { sqlite3_bind_int64(handle, index, Int64(value)) }
    /// NULL for nil.
    func bind(_ index: Int32, _ value: Int?) {
        guard let value else { sqlite3_bind_null(handle, index); return }
        sqlite3_bind_int64(handle, index, Int64(value))
    }
    func bind(_ index: Int32, _ value: Double) { sqlite3_bind_double(handle, index, value) }
    func bind(_ index: Int32, _ value: String?) {
        guard let value else { sqlite3_bind_null(handle, index); return }
        sqlite3_bind_text(handle, index, value, -1, csqlite_transient())
    }
    /// The bytes are copied by SQLite (they need not outlive the call).
    func bind(_ index: Int32, bytes: UnsafeRawBufferPointer) {
        sqlite3_bind_blob64(handle, index, bytes.baseAddress ?? UnsafeRawPointer(bitPattern: 1), UInt64(bytes.count),
            csqlite_transient())
    }

    /// True while there is a row; false when done.
    func step() throws(StoreError) -> Bool {
        let rc = sqlite3_step(handle)
        switch rc {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default: throw connection.error(rc)
        }
    }

    /// Runs a statement that returns no rows, then resets it.
    func run() throws(StoreError) {
        defer { reset() }
        while try step() {}
    }

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }
    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }
    func int(_ column: Int32) -> Int { Int(sqlite3_column_int64(handle, column)) }
    func double(_ column: Int32) -> Double { sqlite3_column_double(handle, column) }
    func string(_ column: Int32) -> String? {
        guard let text = sqlite3_column_text(handle, column) else { return nil }
        return String(cString: text)
    }
    func bytes(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(handle, column))
        guard count > 0, let blob = sqlite3_column_blob(handle, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: blob, count: count))
    }
}
