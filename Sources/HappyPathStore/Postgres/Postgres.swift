internal import CPostgres
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A thin layer over libpq for the shared delivery store: one connection,
/// used by one thread at a time (the store's own threads; no event loop
/// ever waits on the database). Statements take their values as
/// parameters (never spliced into the SQL), bytes go as binary parameters,
/// and results come back as text.
final class PostgresConnection {
    private var connection: OpaquePointer?

    /// Connects to `url` (`postgres://user:password@host:port/db?sslmode=…`,
    /// or libpq's `key=value` form). The password is never part of an error.
    /// Unless the URL says otherwise, a connection attempt gives up after
    /// `connectTimeout` seconds (libpq's own default is to wait forever), a
    /// server that vanished without closing the connection is noticed
    /// within about 30 s (TCP keepalives, `tcp_user_timeout`), and a
    /// statement stuck behind a lock fails after 30 s (`statement_timeout`):
    /// no store thread waits forever.
    init(url: String, connectTimeout: Int = 5) throws(StoreError) {
        // Later entries win: the URL (expanded from `dbname`) over the defaults before it.
        let keys = [
            "connect_timeout", "application_name", "keepalives", "keepalives_idle", "keepalives_interval",
            "keepalives_count", "tcp_user_timeout", "options", "dbname",
        ]
        let values = [String(connectTimeout), "happypath", "1", "10", "5", "3", "30000", "-c statement_timeout=30000", url]
        connection = Self.withCStrings(keys) { k in Self.withCStrings(values) { v in PQconnectdbParams(k, v, 1) } }
        guard let connection, PQstatus(connection) == CONNECTION_OK else {
            let message = connection.map { Self.message(of: $0) } ?? "out of memory"
            if let connection { PQfinish(connection) }
            self.connection = nil
            throw StoreError(Self.connectFailed, "cannot connect to PostgreSQL: \(message)")
        }
        // Notices (a table that already exists, ...) are not the caller's output.
        PQsetNoticeProcessor(connection, { _, _ in }, nil)
    }

    deinit { if let connection { PQfinish(connection) } }

    /// A NULL-terminated array of C strings, valid inside `body`.
    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { for c in copies { free(c) } }
        let pointers: [UnsafePointer<CChar>?] = copies.map { UnsafePointer($0) } + [nil]
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }

    /// The connection still works (it may have been cut by the server or the network).
    var isUsable: Bool { connection.map { PQstatus($0) == CONNECTION_OK } ?? false }

    /// Runs one statement with `parameters` (`$1`, `$2`, …).
    @discardableResult
    func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(StoreError) -> PostgresRows {
        guard let connection else { throw StoreError(Self.connectFailed, "the PostgreSQL connection is closed") }
        var storage: [[UInt8]] = []
        var types: [Oid] = []
        var formats: [Int32] = []
        var present: [Bool] = []
        for value in parameters {
            switch value {
            case let .text(s):
                storage.append(Array(s.utf8) + [0])
                types.append(0)
                formats.append(0)
                present.append(true)
            case let .int(n):
                storage.append(Array(String(n).utf8) + [0])
                types.append(20)  // int8
                formats.append(0)
                present.append(true)
            case let .bytes(b):
                storage.append(b)
                types.append(17)  // bytea, binary
                formats.append(1)
                present.append(true)
            case .null:
                storage.append([])
                types.append(0)
                formats.append(0)
                present.append(false)
            }
        }
        let lengths = storage.map { Int32($0.count) }
        // Without parameters, the simple protocol: it takes several
        // statements at once (a schema step).
        let result =
            parameters.isEmpty
            ? PQexec(connection, sql)
            : withPointers(storage, present) { values in
                PQexecParams(connection, sql, Int32(parameters.count), types, values, lengths, formats, 0)
            }
        guard let result else { throw StoreError(Self.connectFailed, "PostgreSQL: \(Self.message(of: connection))") }
        let status = PQresultStatus(result)
        guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
            let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
            let message = PQresultErrorMessage(result).map { String(cString: $0) } ?? "unknown error"
            PQclear(result)
            let lost = PQstatus(connection) != CONNECTION_OK
            throw StoreError(
                lost ? Self.connectFailed : Self.statementFailed,
                "PostgreSQL\(state.isEmpty ? "" : " (\(state))"): \(trimmed(message))",
                sqlState: state)
        }
        return PostgresRows(result)
    }

    /// Runs `body` in a transaction: committed if it returns, rolled back if it throws.
    @discardableResult
    func transaction<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try execute("BEGIN")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
    }

    private func withPointers<R>(
        _ storage: [[UInt8]], _ present: [Bool], _ body: ([UnsafePointer<CChar>?]) -> R
    ) -> R {
        // Each value's bytes stay put while libpq reads them: one contiguous copy.
        var flat: [UInt8] = []
        var offsets: [Int] = []
        for bytes in storage {
            offsets.append(flat.count)
            flat += bytes
        }
        if flat.isEmpty { flat = [0] }
        return flat.withUnsafeBufferPointer { buffer in
            let base = UnsafeRawPointer(buffer.baseAddress!).assumingMemoryBound(to: CChar.self)
            let values: [UnsafePointer<CChar>?] = offsets.indices.map { present[$0] ? base + offsets[$0] : nil }
            return body(values)
        }
    }

    private static func message(of connection: OpaquePointer) -> String {
        PQerrorMessage(connection).map { trimmed(String(cString: $0)) } ?? "unknown error"
    }

    /// `StoreError.code` of a connection that failed or was lost.
    static let connectFailed: Int32 = -1001
    /// `StoreError.code` of a statement the server refused.
    static let statementFailed: Int32 = -1002
}

/// libpq's messages end with a line break (and may hold several lines).
private func trimmed(_ s: String) -> String {
    var out = Substring(s)
    while let c = out.last, c == "\n" || c == " " || c == "\r" { out.removeLast() }
    return out.split(separator: "\n").map { $0.trimmingPrefix(" ") }.joined(separator: "; ")
}

/// A statement's parameter.
enum PostgresValue {
    case text(String)
    case int(Int64)
    case bytes([UInt8])
    case null
}

extension PostgresValue {
    /// A `text[]` parameter (write `$n::text[]`): each element quoted, so
    /// no element can end the array or add one.
    static func textArray(_ elements: [String]) -> PostgresValue {
        let quoted = elements.map { e -> String in
            var out = "\""
            for c in e.unicodeScalars {
                if c == "\"" || c == "\\" { out.unicodeScalars.append("\\") }
                out.unicodeScalars.append(c)
            }
            return out + "\""
        }
        return .text("{" + quoted.joined(separator: ",") + "}")
    }

    static func optional(_ s: String?) -> PostgresValue { s.map { .text($0) } ?? .null }
    static func optional(_ n: Int?) -> PostgresValue { n.map { .int(Int64($0)) } ?? .null }
}

/// A statement's result, as text (libpq's text format); freed with it.
final class PostgresRows {
    private let result: OpaquePointer

    fileprivate init(_ result: OpaquePointer) { self.result = result }
    deinit { PQclear(result) }

    var count: Int { Int(PQntuples(result)) }
    /// Rows a command changed (`UPDATE`, `DELETE`, `INSERT`).
    var changed: Int { Int(String(cString: PQcmdTuples(result))) ?? 0 }

    func isNull(_ row: Int, _ column: Int) -> Bool { PQgetisnull(result, Int32(row), Int32(column)) == 1 }

    func text(_ row: Int, _ column: Int) -> String? {
        isNull(row, column) ? nil : String(cString: PQgetvalue(result, Int32(row), Int32(column)))
    }

    func int(_ row: Int, _ column: Int) -> Int64? { text(row, column).flatMap { Int64($0) } }

    /// A `bytea` column: text format is `\x` and hex digits.
    func bytes(_ row: Int, _ column: Int) -> [UInt8]? {
        guard !isNull(row, column), let value = PQgetvalue(result, Int32(row), Int32(column)) else { return nil }
        let length = Int(PQgetlength(result, Int32(row), Int32(column)))
        guard length >= 2, value[0] == 0x5C, value[1] == 0x78 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity((length - 2) / 2)
        var i = 2
        while i + 1 < length {
            guard let high = Self.hex(UInt8(bitPattern: value[i])), let low = Self.hex(UInt8(bitPattern: value[i + 1])) else {
                return nil
            }
            out.append(high << 4 | low)
            i += 2
        }
        return out
    }

    private static func hex(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x61...0x66: c - 0x61 + 10
        case 0x41...0x46: c - 0x41 + 10
        default: nil
        }
    }
}
