import Foundation
import PostgresTestServer

#if canImport(Glibc)
    import Glibc
#endif

/// A `redis-server` of the test's own (Debian's `redis-server`): a free
/// loopback port, no persistence, `DEBUG` allowed from loopback (for
/// `DEBUG SLEEP`), run as the unprivileged `redis` user when the tests run
/// as root. `kill()` ends it with SIGKILL (a crash: nothing is saved),
/// `start()` brings it back on the same port, empty. Stopped, and its
/// folder removed, with the object.
public final class RedisServer: @unchecked Sendable {
    public let folder: URL
    public let port: Int
    /// The TLS port, when started with a certificate (`rediss://`); `port` stays plain.
    public let tlsPort: Int?
    private let password: String?
    private var process: Process?
    private let user: String?

    public var url: String {
        if let password { return "redis://:\(password)@127.0.0.1:\(port)/0" }
        return "redis://127.0.0.1:\(port)/0"
    }

    /// `tls`: a certificate and key (PEM) to serve TLS with on `tlsPort`,
    /// beside the plain `port` (client certificates are not asked for).
    public init(password: String? = nil, tls: (cert: String, key: String)? = nil) throws {
        guard access(Self.binary, X_OK) == 0 else {
            throw PostgresServerError("no redis-server here (Debian: apt-get install redis-server)")
        }
        self.password = password
        user = getuid() == 0 ? Self.unprivilegedUser() : nil
        folder = URL(fileURLWithPath: "/tmp").appendingPathComponent("hp-redis-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        if let user { _ = try PostgresServer.run("/bin/chown", [user, folder.path]) }
        port = PostgresServer.freePort()
        if let tls {
            // Copies the server's user can read.
            for (from, name) in [(tls.cert, "tls.crt"), (tls.key, "tls.key")] {
                let to = folder.appendingPathComponent(name)
                try FileManager.default.copyItem(atPath: from, toPath: to.path)
                if let user { _ = try PostgresServer.run("/bin/chown", [user, to.path]) }
            }
            tlsPort = PostgresServer.freePort()
        } else {
            tlsPort = nil
        }
        try start()
    }

    deinit { stop(remove: true) }

    static let binary = "/usr/bin/redis-server"

    /// `redis` (Debian's package makes it), else `nobody`.
    private static func unprivilegedUser() -> String {
        getpwnam("redis") != nil ? "redis" : "nobody"
    }

    /// Every server started and not stopped, killed when the test process
    /// exits (a test that ends while a thread still holds its server would
    /// otherwise leave it running).
    nonisolated(unsafe) private static var live: Set<pid_t> = []
    private static let liveLock = NSLock()
    private static let exitHook: Void = { atexit { RedisServer.killAll() } }()
    private var pid: pid_t = 0

    private static func killAll() {
        liveLock.lock()
        defer { liveLock.unlock() }
        for pid in live { Glibc.kill(pid, SIGKILL) }
        live.removeAll()
    }

    private func track(_ pid: pid_t, alive: Bool) {
        Self.liveLock.lock()
        defer { Self.liveLock.unlock() }
        if alive { Self.live.insert(pid) } else { Self.live.remove(pid) }
    }

    /// Starts the server (again, after `kill` or `stop`, empty) and waits until it answers PING.
    public func start() throws {
        _ = Self.exitHook
        var arguments = [
            Self.binary, "--port", "\(port)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", folder.path, "--enable-debug-command", "local", "--loglevel", "warning", "--daemonize", "no",
        ]
        if let password { arguments += ["--requirepass", password] }
        if let tlsPort {
            arguments += [
                "--tls-port", "\(tlsPort)", "--tls-cert-file", folder.appendingPathComponent("tls.crt").path,
                "--tls-key-file", folder.appendingPathComponent("tls.key").path, "--tls-auth-clients", "no",
            ]
        }
        let p = try PostgresServer.launch(arguments, as: user)
        process = p
        let deadline = Date().addingTimeInterval(20)
        while true {
            if let reply = try? command(["PING"]), reply.hasPrefix("+PONG") || reply.hasPrefix("-NOAUTH") { break }
            guard Date() < deadline, p.isRunning else { throw PostgresServerError("redis-server did not start on port \(port)") }
            Thread.sleep(forTimeInterval: 0.02)  // the polling interval, not a wait for anything
        }
        pid = (try? serverPID()) ?? 0
        if pid > 0 { track(pid, alive: true) }
    }

    /// The server's own process id (runuser's child), from `INFO server`.
    public func serverPID() throws -> pid_t {
        let info = try command(["INFO", "server"])
        guard let line = info.split(separator: "\r\n").first(where: { $0.hasPrefix("process_id:") }),
            let pid = pid_t(line.dropFirst("process_id:".count))
        else { throw PostgresServerError("no process_id in INFO: \(info.prefix(200))") }
        return pid
    }

    /// Ends the server with SIGKILL: connections drop, everything it held is lost.
    public func kill() throws {
        guard pid > 0 else { throw PostgresServerError("redis-server is not running") }
        Glibc.kill(pid, SIGKILL)
        track(pid, alive: false)
        pid = 0
        process?.waitUntilExit()
        process = nil
    }

    public func stop(remove: Bool = false) {
        if let process {
            if pid > 0 {
                Glibc.kill(pid, SIGKILL)
                track(pid, alive: false)
                pid = 0
            }
            process.waitUntilExit()
            self.process = nil
        }
        if remove { try? FileManager.default.removeItem(at: folder) }
    }

    /// Sends one command (authenticated first when the server has a
    /// password) and returns the last reply's raw RESP text. Blocking, with
    /// a 10 s limit: for tests only.
    public func command(_ arguments: [String]) throws -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw PostgresServerError("socket: \(errno)") }
        defer { close(fd) }
        var tv = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { throw PostgresServerError("connect: \(errno)") }
        var commands: [[String]] = []
        if let password { commands.append(["AUTH", password]) }
        commands.append(arguments)
        var out = ""
        for c in commands {
            out += "*\(c.count)\r\n"
            for a in c { out += "$\(a.utf8.count)\r\n\(a)\r\n" }
        }
        let bytes = Array(out.utf8)
        guard bytes.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == bytes.count else {
            throw PostgresServerError("send failed")
        }
        // Reads until every reply is complete (one per command).
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw PostgresServerError("redis closed or timed out after \(received.count) bytes") }
            received += buffer[0..<n]
            if let replies = Self.split(received), replies.count == commands.count { return replies.last! }
        }
    }

    /// The complete replies in `bytes`, each as text (nil: one is incomplete).
    static func split(_ bytes: [UInt8]) -> [String]? {
        var replies: [String] = []
        var i = 0
        func line() -> String? {
            var j = i
            while j + 1 < bytes.count {
                if bytes[j] == 13, bytes[j + 1] == 10 {
                    let text = String(decoding: bytes[i..<j], as: UTF8.self)
                    i = j + 2
                    return text
                }
                j += 1
            }
            return nil
        }
        func one() -> Bool {
            guard let l = line(), let kind = l.first else { return false }
            switch kind {
            case "$":
                guard let n = Int(l.dropFirst()) else { return false }
                if n < 0 { return true }
                guard i + n + 2 <= bytes.count else { return false }
                i += n + 2
                return true
            case "*":
                guard let n = Int(l.dropFirst()) else { return false }
                for _ in 0..<max(0, n) where !one() { return false }
                return true
            default:
                return true
            }
        }
        while i < bytes.count {
            let start = i
            guard one() else { return nil }
            replies.append(String(decoding: bytes[start..<i], as: UTF8.self))
        }
        return replies
    }
}

extension RedisServer {
    /// Skipped in a plain `swift test` on a machine without redis-server;
    /// `make test` installs it and sets `HAPPYPATH_TEST_SERVICES=required`,
    /// so there a missing server fails the test.
    public static let skipReason: String? = {
        if ProcessInfo.processInfo.environment["HAPPYPATH_TEST_SERVICES"] == "required" { return nil }
        guard access(binary, X_OK) == 0 else {
            return "no redis-server here (Debian's redis-server: make test installs it and runs these)"
        }
        return nil
    }()
}
