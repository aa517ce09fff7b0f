import Foundation
import HappyPathCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A real OTLP/HTTP traces receiver: a small Python server that decodes
/// each `ExportTraceServiceRequest` with the `opentelemetry-proto` package
/// (from PyPI, in a virtual environment of its own made once under
/// ~/.cache) and prints every span as a JSON line. What it prints is
/// collected here.
final class OTLPReceiver: @unchecked Sendable {
    let process: Process
    let port: Int
    private let lines = Locked<[String]>([])

    static let script = #"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    print(json.dumps({
                        "content_type": self.headers["Content-Type"], "service": resource.get("service.name"),
                        "scope": ss.scope.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex(), "name": s.name, "kind": s.kind,
                        "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                        "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                        "status": s.status.code, "links": [[l.trace_id.hex(), l.span_id.hex()] for l in s.links],
                    }), flush=True)
        out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *args): pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""#

    /// The virtual environment's python, made (with opentelemetry-proto) if missing.
    static func python() throws -> String {
        try pythonVenv(
            "happypath-otlp-venv", packages: ["opentelemetry-proto"],
            imports: "import opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    }

    init() throws {
        let (process, first) = try startPythonScript(python: try Self.python(), Self.script, lines: lines)
        guard let port = Int(first) else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw TestError("the OTLP receiver did not start")
        }
        self.process = process
        self.port = port
    }

    deinit {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    var url: String { "http://127.0.0.1:\(port)/v1/traces" }

    /// Every span received so far, decoded.
    var spans: [[String: Any]] {
        lines.withLock { $0 }.compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
    }
}
