import Foundation
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

// Python peers for the integration tests: each kind (HTTP/2, gRPC, OTLP)
// in a virtual environment of its own under ~/.cache, made on first use
// and reused.

/// Held while a virtual environment is checked or made: suites run in
/// parallel, and two making one environment at once on a fresh machine
/// found it half made (`bin/pip` missing while the other's `venv` ran).
private let venvMaking = Locked(())

/// The python of the virtual environment ~/.cache/`name`, made with
/// `packages` from PyPI when it is missing or `imports` fails in it.
func pythonVenv(_ name: String, packages: [String], imports: String) throws -> String {
    try venvMaking.withLock { _ in try makeVenv(name, packages: packages, imports: imports) }
}

private func makeVenv(_ name: String, packages: [String], imports: String) throws -> String {
    let venv = (ProcessInfo.processInfo.environment["HOME"] ?? "/root") + "/.cache/" + name
    let python = venv + "/bin/python"
    if FileManager.default.isExecutableFile(atPath: python), try runProcess(python, ["-c", imports], timeout: 30).status == 0 {
        return python
    }
    let made = try runProcess("/usr/bin/python3", ["-m", "venv", venv], timeout: 120)
    guard made.status == 0 else { throw TestError("python3 -m venv \(name) failed: \(made.err)") }
    let pip = try runProcess(venv + "/bin/pip", ["install", "-q"] + packages, timeout: 600)
    guard pip.status == 0 else { throw TestError("pip install \(packages) failed: \(pip.err)") }
    return python
}

/// `startPythonScript` for a server whose first line is its port; the
/// process is ended if it prints anything else.
func startPythonServer(
    python: String, _ script: String, arguments: [String] = [], lines: Locked<[String]>, what: String
) throws -> (process: Process, port: Int) {
    let (process, first) = try startPythonScript(python: python, script, arguments: arguments, lines: lines)
    guard let port = Int(first) else {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        throw TestError("\(what) did not start: '\(first)'")
    }
    return (process, port)
}
