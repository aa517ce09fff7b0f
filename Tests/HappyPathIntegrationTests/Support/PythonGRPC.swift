import Foundation
import HappyPathCore
import Testing

/// Python with real gRPC from PyPI (`grpcio`, `grpcio-status`,
/// `grpcio-health-checking`, `googleapis-common-protos`), in a virtual
/// environment of its own made once under ~/.cache and reused: for gRPC
/// clients and servers (generic handlers, so no code generation) and for
/// decoding what the proxy writes with Google's own protobuf classes.
enum PythonGRPC {
    static let packages = ["grpcio", "grpcio-status", "grpcio-health-checking", "googleapis-common-protos"]

    /// The virtual environment's python, made (with `packages`) if missing.
    static func python() throws -> String {
        let venv = (ProcessInfo.processInfo.environment["HOME"] ?? "/root") + "/.cache/happypath-grpc-venv"
        let python = venv + "/bin/python"
        func ready() throws -> Bool {
            guard FileManager.default.isExecutableFile(atPath: python) else { return false }
            let imports =
                "import grpc, grpc_status.rpc_status, grpc_health.v1.health_pb2, google.rpc.status_pb2, google.rpc.error_details_pb2"
            let check = try runProcess(python, ["-c", imports], timeout: 30)
            return check.status == 0
        }
        if try ready() { return python }
        let made = try runProcess("/usr/bin/python3", ["-m", "venv", venv], timeout: 120)
        guard made.status == 0 else { throw TestError("python3 -m venv failed: \(made.err)") }
        let pip = try runProcess(venv + "/bin/pip", ["install", "-q"] + packages, timeout: 600)
        guard pip.status == 0 else { throw TestError("pip install \(packages) failed: \(pip.err)") }
        return python
    }

    /// Runs `script` to its end under the venv's python and returns the JSON
    /// object it prints last (a script prints what the test checks).
    static func run(_ script: String, arguments: [String] = [], timeout: Double = 30) throws -> [String: Any] {
        let result = try runProcess(try python(), ["-c", script] + arguments, timeout: timeout)
        guard result.status == 0 else { throw TestError("the gRPC Python script failed: \(result.err)") }
        let last = result.out.split(separator: "\n").last.map(String.init) ?? ""
        guard let object = (try? JSONSerialization.jsonObject(with: Data(last.utf8))) as? [String: Any] else {
            throw TestError("the gRPC Python script printed no JSON object: '\(result.out)'")
        }
        return object
    }
}
