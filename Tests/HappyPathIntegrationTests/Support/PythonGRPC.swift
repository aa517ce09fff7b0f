import Foundation
import HappyPathCore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Python with real gRPC from PyPI (`grpcio`, `grpcio-status`,
/// `grpcio-health-checking`, `googleapis-common-protos`), in a virtual
/// environment of its own made once under ~/.cache and reused: for gRPC
/// clients and servers (generic handlers, so no code generation) and for
/// decoding what the proxy writes with Google's own protobuf classes.
enum PythonGRPC {
    static let packages = ["grpcio", "grpcio-status", "grpcio-health-checking", "googleapis-common-protos"]

    /// Runs `body` with a grpcio server started from `script` (whose first
    /// line is its port; later lines go to `lines`), and kills it after.
    static func withServer<T>(
        _ script: String, lines: Locked<[String]> = Locked([]), _ body: (_ python: String, _ port: Int) throws -> T
    ) throws -> T {
        let python = try python()
        let (server, port) = try startPythonServer(python: python, script, lines: lines, what: "the grpcio server")
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        return try body(python, port)
    }

    /// A proxy in front of one gRPC upstream `g` (`protocol: h2`, on `port`,
    /// with `upstream` added to its mapping) and `routes` (YAML list items,
    /// already indented by two), with `limits` if any.
    static func proxy(port: Int, upstream: String = "", limits: String? = nil, routes: String) throws -> ProxyHarness {
        return try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            \(limits.map { "limits: \($0)\n" } ?? "")upstreams:
              g: { endpoints: [http://127.0.0.1:\(port)], protocol: h2\(upstream) }
            routes:
            \(routes)
            """)
    }


    /// The virtual environment's python, made (with `packages`) if missing.
    static func python() throws -> String {
        try pythonVenv(
            "happypath-grpc-venv", packages: packages,
            imports: "import grpc, grpc_status.rpc_status, grpc_health.v1.health_pb2, google.rpc.error_details_pb2")
    }

    /// Python that turns a `google.rpc.Status` into a dict a test reads:
    /// `rich(status)` gives `code`, `message`, `types` (the details' type
    /// URLs), and from the details `reason`, `domain`, `metadata` (an
    /// ErrorInfo) and `retry_delay` (a RetryInfo: `[seconds, nanos]`).
    /// Scripts start with it.
    static let richStatus = #"""
        from google.rpc import error_details_pb2

        def rich(status):
            result = {"code": status.code, "message": status.message, "types": [d.type_url for d in status.details]}
            for d in status.details:
                if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    d.Unpack(info)
                    result["reason"], result["domain"], result["metadata"] = info.reason, info.domain, dict(info.metadata)
                if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    d.Unpack(retry)
                    result["retry_delay"] = [retry.retry_delay.seconds, retry.retry_delay.nanos]
            return result

        """#

    /// Python a test's grpcio server starts with: `hit(ctx, name)` prints
    /// `hit NAME KEY` (KEY: the call's `k` metadata, `-` without) and
    /// returns how many such calls came before; `serve(handlers)` serves a
    /// dict of method path to handler on a free port, prints the port, and
    /// runs until killed. For `withServer(serverKit + script, …)`.
    static let serverKit = #"""
        import grpc, threading
        from concurrent import futures
        _seen, _lock = {}, threading.Lock()

        def hit(ctx, name):
            k = dict(ctx.invocation_metadata()).get("k", "-")
            with _lock:
                n = _seen.get((name, k), 0)
                _seen[(name, k)] = n + 1
            print("hit", name, k, flush=True)
            return n

        def serve(handlers):
            class Handler(grpc.GenericRpcHandler):
                def service(self, details): return handlers.get(details.method)
            server = grpc.server(futures.ThreadPoolExecutor(4))
            server.add_generic_rpc_handlers((Handler(),))
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            print(port, flush=True)
            server.wait_for_termination()

        """#

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
