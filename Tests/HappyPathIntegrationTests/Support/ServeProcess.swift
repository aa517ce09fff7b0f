import Foundation
import HappyPathCore
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `happypath serve --config FILE` as a real process, its stdout and stderr
/// captured. Its configs listen on port 0 (proxy and admin): the process
/// binds ports of its own and the test reads them back from what it prints,
/// so no port is picked by the test and left free for another one to take.
final class ServeProcess {
    let process: Process
    let configFile: URL
    private let stdout = StreamCapture()
    private let stderr = StreamCapture()
    /// The binary runs without a sanitizer: its resident memory is its own.
    let isPlain: Bool

    /// - Parameters:
    ///   - logLevel: `--log-level` (nil: the binary's default, info).
    ///   - openFilesLimit: run under `ulimit -n` of this (soft and hard).
    ///   - plain: a test that measures the proxy's memory: under a
    ///     sanitizer pass, run the build without one when the Makefile names
    ///     it (`HAPPYPATH_PLAIN_BINARY`), so the bound is checked there too.
    init(config yaml: String, logLevel: String? = "error", openFilesLimit: Int? = nil, plain: Bool = false) throws {
        let plainBinary = plain ? ProcessInfo.processInfo.environment["HAPPYPATH_PLAIN_BINARY"] : nil
        let happypathBinary = plainBinary ?? happypathBinary
        isPlain = plainBinary != nil || !underSanitizer
        configFile = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        try yaml.write(to: configFile, atomically: true, encoding: .utf8)
        var arguments = ["serve", "--config", configFile.path]
        if let logLevel { arguments += ["--log-level", logLevel] }
        process = Process()
        if let limit = openFilesLimit {
            // The proxy raises the soft limit to the hard one at start: lower both.
            process.executableURL = URL(fileURLWithPath: "/bin/bash")
            process.arguments = [
                "-c",
                "ulimit -Sn \(limit) && ulimit -Hn \(limit) && exec '\(happypathBinary)' "
                    + arguments.map { "'\($0)'" }.joined(separator: " "),
            ]
        } else {
            process.executableURL = URL(fileURLWithPath: happypathBinary)
            process.arguments = arguments
        }
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        stdout.start(out.fileHandleForReading)
        stderr.start(err.fileHandleForReading)
    }

    deinit {
        if process.isRunning { process.terminate() }
        try? FileManager.default.removeItem(at: configFile)
    }

    var pid: Int32 { process.processIdentifier }
    var output: String { stdout.text }
    var errors: String { stderr.text }

    /// Descriptors the process holds now (`/proc/PID/fd`).
    var openDescriptors: Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? 0
    }

    /// The process's resident memory now, in bytes (`VmRSS`; see
    /// `residentMemoryIsMeaningful`).
    var residentBytes: Int {
        let status = readSmallFile("/proc/\(pid)/status") ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
    }

    /// Replaces the config file (for a SIGHUP).
    func rewriteConfig(_ yaml: String) throws { try yaml.write(to: configFile, atomically: true, encoding: .utf8) }

    func signal(_ signo: Int32) { kill(pid, signo) }

    /// The port of the first stdout line, `listening on http://HOST:PORT`
    /// (waits for it; nil if it never comes or does not say that).
    func listeningPort(sourceLocation: SourceLocation = #_sourceLocation) -> Int? {
        guard waitUntil("'listening on' on the proxy's stdout", sourceLocation: sourceLocation, { output.contains("\n") })
        else { return nil }
        let line = output.split(separator: "\n").first.map(String.init) ?? ""
        guard line.hasPrefix("listening on http://127.0.0.1:"), let port = Int(line.split(separator: ":").last ?? ""),
            port > 0
        else {
            Issue.record("the first line is '\(line)'", sourceLocation: sourceLocation)
            return nil
        }
        return port
    }

    /// The admin port, from the `proxy started` log line (JSON logs at info
    /// or below; waits for it).
    func adminPort(sourceLocation: SourceLocation = #_sourceLocation) -> Int? {
        var port: Int?
        waitUntil("the 'proxy started' log line", sourceLocation: sourceLocation) {
            for line in errors.split(separator: "\n") {
                guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                    object["msg"] as? String == "proxy started", let admin = object["admin"] as? String
                else { continue }
                port = Int(admin.split(separator: ":").last ?? "")
                return true
            }
            return false
        }
        return port
    }

    /// The process catches SIGHUP, SIGINT and SIGTERM (`SigCgt` in
    /// /proc/PID/status). It installs them before it prints `listening
    /// on`, so after `listeningPort()` this holds at once; kept as a check.
    @discardableResult
    func waitForSignalHandlers(sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        let wanted: UInt64 = (1 << UInt64(SIGHUP - 1)) | (1 << UInt64(SIGINT - 1)) | (1 << UInt64(SIGTERM - 1))
        return waitUntil("the proxy's signal handlers", sourceLocation: sourceLocation) {
            let status = readSmallFile("/proc/\(pid)/status") ?? ""
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("SigCgt:") }),
                let mask = UInt64(line.dropFirst("SigCgt:".count).trimmingCharacters(in: .whitespaces), radix: 16)
            else { return false }
            return mask & wanted == wanted
        }
    }

    /// Waits for the process to exit and for the end of both its streams
    /// (everything it wrote has been read then).
    @discardableResult
    func waitForExit(timeout: Double = 10, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        waitUntil("the proxy to exit", timeout: timeout, sourceLocation: sourceLocation) {
            !process.isRunning && stdout.ended && stderr.ended
        }
    }
}

/// Everything a stream carries, read on a thread of its own until its end.
final class StreamCapture: Sendable {
    private let buffer = Locked("")
    private let done = Atomic<Bool>(false)

    var text: String { buffer.withLock { $0 } }
    var ended: Bool { done.load(ordering: .acquiring) }

    func start(_ handle: FileHandle) {
        Thread { [self] in
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                buffer.withLock { $0 += String(decoding: data, as: UTF8.self) }
            }
            done.store(true, ordering: .releasing)
        }.start()
    }
}

/// A /proc file (whose size stat reports as 0) read to its end.
func readSmallFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var out: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n <= 0 { break }
        out += chunk[0..<n]
    }
    return String(decoding: out, as: UTF8.self)
}

/// Whether a process's resident memory measures what it keeps. Not under
/// AddressSanitizer: its quarantine holds freed blocks back (up to 256 MiB)
/// and its red zones pad every allocation, so a process that keeps nothing
/// still grows. `make sanitize-address` sets ASAN_OPTIONS for the test
/// runner and every proxy it starts; the plain and ThreadSanitizer passes
/// check the bounds on memory.
let residentMemoryIsMeaningful = ProcessInfo.processInfo.environment["ASAN_OPTIONS"] == nil

/// The tests run under a sanitizer (`make sanitize-thread`, `-address`),
/// and so does every proxy they start from their own build.
let underSanitizer = ["ASAN_OPTIONS", "TSAN_OPTIONS"].contains { ProcessInfo.processInfo.environment[$0] != nil }
