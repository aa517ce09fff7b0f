import Foundation
import HappyPathConfig
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
        // know (it answers NOT_FOUND: it answered, so it is reachable).
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
        // The service name travels; one the server does not know is
        // answered NOT_FOUND, which is an answer: the upstream stays reachable.
        waitUntil("three checks of the unknown service") { checks("no.Such") >= 3 }
        #expect(try reachable("unknown") == true)

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
        #expect(try reachable("unknown") == true)
    }

    /// A grpcio server without the health service: it prints `asked
    /// METHOD` for each call to a method it does not serve (answered
    /// UNIMPLEMENTED), and echoes `/t.S/U`.
    static let bareServer = """
        import grpc
        from concurrent import futures
        def unary(req, ctx): return b"echo:" + req
        class H(grpc.GenericRpcHandler):
            def service(self, d):
                if d.method == "/t.S/U": return grpc.unary_unary_rpc_method_handler(unary)
                print("asked", d.method, flush=True)
                return None
        s = grpc.server(futures.ThreadPoolExecutor(8))
        s.add_generic_rpc_handlers((H(),))
        port = s.add_insecure_port("127.0.0.1:0"); s.start(); print(port, flush=True)
        s.wait_for_termination()
        """

    /// Reachable means it answered (issue 45): an upstream serving gRPC
    /// routes, with no `path` or `grpc` in its health check, is checked
    /// with gRPC's health service, and a server without it (UNIMPLEMENTED)
    /// is alive; a `GET` of a path such a server resets is an answer too.
    @Test func aGRPCServerWithoutTheHealthServiceStaysReachable() throws {
        let python = try PythonGRPC.python()
        let serverLines = Locked<[String]>([])
        let (server, port) = try startPythonServer(
            python: python, Self.bareServer, arguments: [], lines: serverLines, what: "the grpcio server")
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        let yaml = """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults:
              health_check: { interval: 100ms, timeout: 1s, unhealthy_after: 2 }
            upstreams:
              bare: { endpoints: [http://127.0.0.1:\(port)], protocol: h2 }
              byPath:
                endpoints: [http://127.0.0.1:\(port)]
                protocol: h2
                health_check: { path: /healthz }
            routes:
              - { match: { path_prefix: /t.S/ }, upstream: bare, grpc: {} }
              - { match: { path_prefix: /p/ }, upstream: byPath, grpc: {} }
            """
        let config = try ConfigLoader.parse(yaml, file: "t.yaml")
        #expect(config.upstreams.map(\.grpcHealthCheckByDefault) == [true, false])
        let h = try ProxyHarness(yaml)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        func asked() -> Int { serverLines.withLock { $0.filter { $0 == "asked /grpc.health.v1.Health/Check" }.count } }
        // Three checks answered UNIMPLEMENTED (two counted down in a row would have marked it unreachable).
        waitUntil("three gRPC health checks at the server") { asked() >= 3 }
        #expect(try admin.upstream("bare")["reachable"] as? Bool == true)
        let bare = try admin.upstream("bare")["health_check"] as? [String: Any]
        #expect(bare?["healthy_endpoints"] as? Int == 1, "\(bare ?? [:])")
        // GET /healthz: grpcio resets the stream, and that is an answer.
        waitUntil("a check of byPath") { try (admin.upstream("byPath")["health_check"] as? [String: Any]) != nil }
        let byPath = try admin.upstream("byPath")["health_check"] as? [String: Any]
        #expect(byPath?["healthy_endpoints"] as? Int == 1, "\(byPath ?? [:])")
        #expect(try admin.upstream("byPath")["reachable"] as? Bool == true)
        // And calls pass.
        let r = try runProcess(python, ["-c", Self.client, "127.0.0.1:\(h.port)"], timeout: 30)
        #expect(r.out.contains("ok echo:hi"), "\(r.out) \(r.err)")
    }
}
