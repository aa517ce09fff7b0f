import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// `health_check.grpc` against a real grpcio server running gRPC's own
/// health service (`grpcio-health-checking`): the upstream turns
/// unreachable when the server says NOT_SERVING and reachable again when
/// it says SERVING, and a call parked in between is answered then.
@Suite(.serialized) struct GRPCHealthCheckTests {
    /// A grpcio server with `grpc_health.v1.health.HealthServicer` and a
    /// unary `/t.S/U` that echoes. It prints its port, then `check SERVICE`
    /// for each health check it answers. The file named by its argument is
    /// its control: a line `SERVICE STATUS` (the service "" written as `-`)
    /// sets that status; it prints `set SERVICE STATUS` once it has.
    static let server = """
        import grpc, sys, time
        from concurrent import futures
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        class Counting(health.HealthServicer):
            def Check(self, request, context):
                print("check", request.service or "-", flush=True)
                return super().Check(request, context)
        servicer = Counting()
        servicer.set("t.S", health_pb2.HealthCheckResponse.SERVING)
        def unary(req, ctx): return b"echo:" + req
        class H(grpc.GenericRpcHandler):
            def service(self, d): return grpc.unary_unary_rpc_method_handler(unary) if d.method == "/t.S/U" else None
        s = grpc.server(futures.ThreadPoolExecutor(8))
        health_pb2_grpc.add_HealthServicer_to_server(servicer, s)
        s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True)
        done = ""
        while True:
            try:
                with open(sys.argv[1]) as f: command = f.read().strip()
            except FileNotFoundError: command = ""
            if command and command != done:
                service, status = command.split()
                servicer.set("" if service == "-" else service, getattr(health_pb2.HealthCheckResponse, status))
                done = command; print("set", command, flush=True)
            time.sleep(0.02)
        """

    /// One unary call through the proxy; prints `start`, then its outcome.
    static let client = """
        import grpc, sys
        print("start", flush=True)
        try: print("ok", grpc.insecure_channel(sys.argv[1]).unary_unary("/t.S/U")(b"hi", timeout=30).decode(), flush=True)
        except grpc.RpcError as e: print("error", e.code().name, flush=True)
        """

    @Test func aGRPCHealthCheckedUpstreamGoesDownAndUp() throws {
        let python = try PythonGRPC.python()
        let control = FileManager.default.temporaryDirectory.appendingPathComponent("grpc-health-\(getpid())-\(UUID())")
        defer { try? FileManager.default.removeItem(at: control) }
        let serverLines = Locked<[String]>([])
        let (server, port) = try startPythonServer(
            python: python, Self.server, arguments: [control.path], lines: serverLines, what: "the grpcio health server")
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        func set(_ command: String) throws {
            try Data(command.utf8).write(to: control, options: .atomic)
            waitUntil("the server to apply '\(command)'") { serverLines.withLock { $0.contains("set \(command)") } }
        }
        func checks(_ service: String) -> Int { serverLines.withLock { $0.filter { $0 == "check \(service)" }.count } }
        // `g` asks about the server as a whole, `named` about t.S (SERVING
        // from the start), `unknown` about a service the server does not
        // know (it answers NOT_FOUND).
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults:
              timeout: 20s
              reachability: { park_for: 15s }
              health_check: { interval: 100ms, timeout: 1s, unhealthy_after: 2 }
            upstreams:
              g:
                endpoints: [http://127.0.0.1:\(port)]
                protocol: h2
                health_check: { grpc: { service: "" } }
              named:
                endpoints: [http://127.0.0.1:\(port)]
                protocol: h2
                health_check: { grpc: { service: t.S } }
              unknown:
                endpoints: [http://127.0.0.1:\(port)]
                protocol: h2
                health_check: { grpc: { service: no.Such } }
            routes:
              - { match: { path_prefix: /t.S/ }, upstream: g }
              - { match: { path_prefix: /named/ }, upstream: named }
              - { match: { path_prefix: /unknown/ }, upstream: unknown }
            """)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        func reachable(_ name: String) throws -> Bool? { try admin.upstream(name)["reachable"] as? Bool }

        // Up while the server says SERVING: three checks answered (two
        // failing in a row would have marked it down), and it stays reachable.
        waitUntil("three checks of the server as a whole") { checks("-") >= 3 && checks("t.S") >= 3 }
        #expect(try reachable("g") == true)
        #expect(try reachable("named") == true)
        // The service name travels: one the server does not know is down.
        waitUntil("the unknown service marked down") { try reachable("unknown") == false }
        #expect(checks("no.Such") >= 2)

        // NOT_SERVING: down after two checks; t.S, asked about by name, stays up.
        try set("- NOT_SERVING")
        guard waitUntil("the upstream marked down", { try reachable("g") == false }) else { return }
        #expect(try reachable("named") == true)

        // A call now parks (reachability) instead of reaching the server...
        let clientLines = Locked<[String]>([])
        let (client, _) = try startPythonScript(
            python: python, Self.client, arguments: ["127.0.0.1:\(h.port)"], lines: clientLines)
        defer {
            kill(client.processIdentifier, SIGKILL)
            client.waitUntilExit()
        }
        waitUntil("the call parked") { try admin.parked() == 1 }
        #expect(clientLines.withLock { $0.isEmpty })

        // ...and SERVING again brings the upstream back and answers it.
        try set("- SERVING")
        waitUntil("the upstream reachable again") { try reachable("g") == true }
        waitUntil("the parked call answered", timeout: 20) { clientLines.withLock { !$0.isEmpty } }
        #expect(clientLines.withLock { $0 } == ["ok echo:hi"])
        #expect(try reachable("unknown") == false)
    }
}
