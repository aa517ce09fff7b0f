import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A PostgreSQL server of the test's own (Debian's `postgresql`): a
/// cluster made by `initdb` in a temporary folder, `postgres` listening on
/// a private socket folder and a free loopback port, run as an
/// unprivileged user (`postgres` when the tests run as root: the server
/// refuses root). Stopped, and its folder removed, with the object.
public final class PostgresServer: @unchecked Sendable {
    public let folder: URL
    public private(set) var port: Int
    private var process: Process?
    private let user: String?
    private let bin: String

    /// `postgres://` for the test database, trust authentication on loopback.
    public var url: String { "postgres://happypath@127.0.0.1:\(port)/happypath?sslmode=disable&connect_timeout=5" }

    public init() throws {
        guard let bin = Self.binaries() else { throw PostgresServerError("no PostgreSQL server here (Debian: apt-get install postgresql)") }
        self.bin = bin
        user = getuid() == 0 ? "postgres" : nil
        folder = URL(fileURLWithPath: "/tmp").appendingPathComponent("hp-pg-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        if let user { _ = try Self.run("/bin/chown", [user, folder.path]) }
        port = 0
        let initdb = try Self.run(
            "\(bin)/initdb",
            ["-D", folder.appendingPathComponent("data").path, "-U", "happypath", "--auth=trust", "-E", "UTF8", "--no-sync"],
            as: user)
        guard initdb.status == 0 else { throw PostgresServerError("initdb failed: \(initdb.err)") }
        try start()
        try createDatabase("happypath")
    }

    deinit { stop(remove: true) }

    /// Starts the server (again, after `stop`) and waits until it takes connections.
    public func start() throws {
        if port == 0 { port = Self.freePort() }
        let arguments = [
            "\(bin)/postgres", "-D", folder.appendingPathComponent("data").path, "-k", folder.path, "-p", "\(port)",
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200",
        ]
        let p = try Self.launch(arguments, as: user)
        process = p
        // pg_isready answers at once (no response until the server listens): asked until it says yes.
        let deadline = Date().addingTimeInterval(30)
        while true {
            let ready = try Self.run("\(bin)/pg_isready", ["-h", "127.0.0.1", "-p", "\(port)", "-t", "1"])
            if ready.status == 0 { break }
            guard Date() < deadline, p.isRunning else { throw PostgresServerError("PostgreSQL did not start: \(ready.out)") }
            Thread.sleep(forTimeInterval: 0.05)  // the polling interval, not a wait for anything
        }
    }

    /// Starts `arguments` (a program and its arguments) in the background,
    /// as `user` through runuser when given, its output thrown away.
    public static func launch(_ arguments: [String], as user: String?) throws -> Process {
        let p = Process()
        if let user {
            p.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
            p.arguments = ["-u", user, "--"] + arguments
        } else {
            p.executableURL = URL(fileURLWithPath: arguments[0])
            p.arguments = Array(arguments.dropFirst())
        }
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        return p
    }

    /// Stops the server (a fast shutdown: open sessions are ended).
    public func stop(remove: Bool = false) {
        if let process {
            // pg_ctl signals the server itself (runuser would not pass a signal on).
            _ = try? Self.run(
                "\(bin)/pg_ctl", ["stop", "-D", folder.appendingPathComponent("data").path, "-m", "fast", "-w", "-t", "30"],
                as: user)
            process.waitUntilExit()
            self.process = nil
        }
        if remove { try? FileManager.default.removeItem(at: folder) }
    }

    /// Debian's newest server binaries.
    public static func binaries() -> String? {
        let root = "/usr/lib/postgresql"
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []
        for version in versions.compactMap({ Int($0) }).sorted().reversed() {
            let bin = "\(root)/\(version)/bin"
            if access("\(bin)/postgres", X_OK) == 0 { return bin }
        }
        return nil
    }

    public static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    @discardableResult
    public static func run(_ path: String, _ arguments: [String], as user: String? = nil) throws -> (status: Int32, out: String, err: String) {
        let p = Process()
        if let user {
            p.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
            p.arguments = ["-u", user, "--", path] + arguments
        } else {
            p.executableURL = URL(fileURLWithPath: path)
            p.arguments = arguments
        }
        let out = Pipe()
        let err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
    }
}

public struct PostgresServerError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

extension PostgresServer {
    /// One server for the whole test process, started on first use and
    /// stopped (its folder removed) when the process exits; each test takes
    /// a database of its own on it (`freshDatabase`).
    nonisolated(unsafe) private static var running: PostgresServer?
    nonisolated(unsafe) private static let shared: Result<PostgresServer, PostgresServerError> = {
        do {
            let server = try PostgresServer()
            running = server
            atexit { PostgresServer.running?.stop(remove: true) }
            return .success(server)
        } catch {
            return .failure(PostgresServerError("\(error)"))
        }
    }()

    /// The URL of a new, empty database on the shared server.
    public static func freshDatabase() throws -> String {
        let server = try shared.get()
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        try server.createDatabase(name)
        return server.url.replacingOccurrences(of: "/happypath?", with: "/\(name)?")
    }

    /// The first column of `sql`'s rows in the database at `url`, as text (`psql`).
    public static func query(_ url: String, _ sql: String) throws -> [String] {
        guard let bin = binaries() else { throw PostgresServerError("no PostgreSQL client here") }
        let r = try run("\(bin)/psql", [url, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        guard r.status == 0 else { throw PostgresServerError("psql: \(r.err)") }
        return r.out.split(separator: "\n", omittingEmptySubsequences: true).map(String.init)
    }

    /// `createdb` (Debian's `postgresql-client`, which the server package brings).
    public func createDatabase(_ name: String) throws {
        let made = try Self.run("\(bin)/createdb", ["-h", "127.0.0.1", "-p", "\(port)", "-U", "happypath", name])
        guard made.status == 0 else { throw PostgresServerError("createdb \(name) failed: \(made.err)") }
    }
}

// MARK: - Skipped when there is no server

/// A plain `swift test` skips what needs a PostgreSQL server of its own
/// when this machine has no `initdb` (one line says why); `make test`
/// installs the server and sets `HAPPYPATH_TEST_SERVICES=required`, so
/// there every such test runs, and a missing server fails it. The test
/// targets turn this into a trait (`.needsPostgreSQL`, in each target's
/// `NeedsPostgreSQL.swift`): this target is a plain library and imports
/// no test framework, so no build of the package's products needs one.
extension PostgresServer {
    public static let skipReason: String? = {
        if ProcessInfo.processInfo.environment["HAPPYPATH_TEST_SERVICES"] == "required" { return nil }
        guard let bin = binaries(), access("\(bin)/initdb", X_OK) == 0 else {
            return "no PostgreSQL initdb here (Debian's postgresql: make test installs it and runs these)"
        }
        return nil
    }()
}
