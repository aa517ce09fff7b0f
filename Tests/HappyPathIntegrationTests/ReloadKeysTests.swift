import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathDemo
import HappyPathPolicies
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// A reload never pretends: every key either takes effect on SIGHUP or the
/// reload is refused with a message naming the key.
@Suite("reload keys") struct ReloadKeysTests {
    /// One unreachable upstream whose requests park for 300 ms at most.
    func unreachable(maxParked: Int, clientTimeout: String = "5s", port: Int) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: { max_parked: \(maxParked), client_timeout: \(clientTimeout) }
        defaults: { reachability: { park_for: 300ms } }
        upstreams: { u: { endpoints: [http://127.0.0.1:\(port)], connect_timeout: 200ms } }
        routes: [ { match: { path_prefix: / }, upstream: u } ]
        """
    }

    func maxParked(_ h: ProxyHarness) throws -> Int? {
        try HTTP.request(port: h.adminPort, "/admin/state").json["max_parked"] as? Int
    }

    @Test func aChangedMaxParkedTakesEffect() throws {
        let down = RefusingPort()
        let dead = down.port
        let h = try ProxyHarness(unreachable(maxParked: 0, port: dead), holding: [down])
        // No room to park: the request is refused at once.
        #expect(try HTTP.request(port: h.port, "/x").json["code"] as? String == "OVERLOADED")

        let next = try ConfigLoader.parse(unreachable(maxParked: 5, port: dead), file: "test.yaml")
        #expect(h.proxy.reload(next).isEmpty)
        #expect(try maxParked(h) == 5)
        // Room now: it parks, waits out park_for, and gets the parking reason's error.
        let r = try HTTP.request(port: h.port, "/x")
        #expect(r.json["code"] as? String == "UPSTREAM_UNREACHABLE")
    }

    @Test func http2AndMaxHeadersAreRefusedByName() throws {
        let base = """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams: { u: { endpoints: [http://127.0.0.1:1] } }
            routes: [ { match: { path_prefix: / }, upstream: u } ]
            """
        let h = try ProxyHarness(base)
        defer { h.stop() }
        let next = try ConfigLoader.parse(
            base + "\nhttp2: { max_concurrent_streams: 5 }\nlimits: { max_headers: 50 }", file: "test.yaml")
        #expect(
            h.proxy.reload(next).sorted() == [
                "http2 cannot change on reload (restart to apply)",
                "limits.max_headers cannot change on reload (restart to apply)",
            ])
        // The same values again (http2 on by default) reload without a word.
        #expect(h.proxy.reload(try ConfigLoader.parse(base + "\nhttp2: true", file: "test.yaml")).isEmpty)
    }

    /// A client's share and `max_memory` take effect on the reload: the
    /// next body is judged by the new share, the gauge shows the new limit.
    @Test func theMemoryLimitsApplyOnReload() throws {
        let base = """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            upstreams: { demo: { endpoints: [{{DEMO}}] } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """
        let h = try ProxyHarness(base.replacingOccurrences(of: "routes:", with: "limits: { max_buffered_per_client: 64KiB }\nroutes:"))
        defer { h.stop() }
        let body = [UInt8](repeating: 0x61, count: 100 * 1024)
        let refused = try HTTP.request(port: h.port, "POST", "/echo", body: body)
        #expect(refused.status == 503)
        #expect((refused.json["detail"] as? String)?.contains("limits.max_buffered_per_client") == true)
        let demo = h.demo.port
        let next = try ConfigLoader.parse(
            base.replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(demo)")
                .replacingOccurrences(of: "routes:", with: "limits: { max_buffered_per_client: 1MiB, max_memory: 512MiB }\nroutes:"),
            file: "next.yaml")
        #expect(h.proxy.reload(next).isEmpty)
        #expect(try HTTP.request(port: h.port, "POST", "/echo", body: body).status == 200)
        #expect(try AdminProbe(port: h.adminPort).metric("happypath_memory_limit_bytes") == Double(512 << 20))
        // The spool's budget applies at once; its directory needs a restart.
        let spool = try ConfigLoader.parse(
            base.replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(demo)")
                .replacingOccurrences(of: "routes:", with: "limits: { read_ahead: 1MiB, max_spooled_bytes: 64MiB }\nroutes:"),
            file: "spool.yaml")
        #expect(h.proxy.reload(spool).isEmpty)
        #expect(try AdminProbe(port: h.adminPort).metric("happypath_spool_limit_bytes") == Double(64 << 20))
        var moved = spool
        moved.storage.spoolDir = "/srv/elsewhere"
        #expect(h.proxy.reload(moved) == ["storage.spool_dir cannot change on reload (restart to apply)"])
    }

    @Test func aRestartOnlyKeyRefusesTheWholeReloadByName() throws {
        let down = RefusingPort()
        let dead = down.port
        let h = try ProxyHarness(unreachable(maxParked: 0, port: dead), holding: [down])
        let next = try ConfigLoader.parse(
            unreachable(maxParked: 5, clientTimeout: "9s", port: dead), file: "test.yaml")
        #expect(h.proxy.reload(next) == ["limits.client_timeout cannot change on reload (restart to apply)"])
        // Nothing of the refused file applies, not even the keys that could.
        #expect(try maxParked(h) == 0)
        #expect(try HTTP.request(port: h.port, "/x").json["code"] as? String == "OVERLOADED")
    }

    @Test func everyRestartOnlyKeyIsNamedOnItsOwn() throws {
        let old = try ConfigLoader.parse(unreachable(maxParked: 0, port: 1), file: "a.yaml")
        var new = old
        new.listen.port = 1
        new.admin.listen.port = 2
        new.workers = 3
        new.limits.maxRequestBody += 1
        new.limits.maxHeaderBytes += 1
        new.limits.clientTimeout += .seconds(1)
        new.limits.maxParked += 1
        new.limits.connectionBuffer += 1
        new.limits.maxBufferedPerClient = 1 << 20  // applied, as max_memory is
        new.limits.maxMemory += 1
        new.admin.allowRemote.toggle()
        new.drainTimeout += .seconds(1)
        let keys = RestartOnlyKeys.changes(from: old, to: new, cores: 3).map {
            String($0.prefix { $0 != " " })
        }
        #expect(
            keys == [
                "listen", "admin.listen", "limits.max_request_body", "limits.max_header_bytes",
                "limits.client_timeout", "limits.connection_buffer",
            ])  // workers: 3 is what `auto` means on 3 cores, so no change
        new.workers = 4
        #expect(
            RestartOnlyKeys.changes(from: old, to: new, cores: 3).contains("workers cannot change on reload (restart to apply)"))
    }

    /// The store of kept answers is made once, by the first configuration
    /// with a `serve_stale` route: its limits need a restart from then on.
    @Test func theKeptAnswersLimitsNeedARestartOnceAnswersAreKept() throws {
        let old = try ConfigLoader.parse(unreachable(maxParked: 0, port: 1), file: "a.yaml")
        var quiet = old
        quiet.limits.staleMaxBytes += 1
        quiet.limits.staleMaxEntry += 1
        #expect(RestartOnlyKeys.changes(from: old, to: quiet, cores: 3).isEmpty)
        var keeping = old
        keeping.routes[0].fallback = FallbackConfiguration()
        keeping.routes[0].fallback?.serveStale = .seconds(60)
        #expect(RestartOnlyKeys.changes(from: old, to: keeping, cores: 3).isEmpty)  // the store is made by this reload
        var changed = keeping
        changed.limits.staleMaxBytes += 1
        changed.limits.staleMaxEntry += 1
        let keys = RestartOnlyKeys.changes(from: keeping, to: changed, cores: 3).map { String($0.prefix { $0 != " " }) }
        #expect(keys == ["limits.stale_max_bytes", "limits.stale_max_entry"])
    }

    @Test func theStoreIsOpenedOnceSoItsKeysNeedARestart() throws {
        let old = try ConfigLoader.parse(unreachable(maxParked: 0, port: 1), file: "a.yaml")
        // No route delivers later: the storage block may change freely.
        var quiet = old
        quiet.storage.path = "/elsewhere/d.db"
        #expect(RestartOnlyKeys.changes(from: old, to: quiet, cores: 3).isEmpty)
        // A later route without a store open at start: refused, saying why.
        var later = old
        later.routes[0].delivery.mode = .later
        let added = RestartOnlyKeys.changes(from: old, to: later, cores: 3)
        #expect(added.count == 1 && added[0].contains("delivery.mode: later needs the store"))
        // With the store open, every storage key is named on its own.
        var changed = later
        changed.storage.path = "/elsewhere/d.db"
        changed.storage.sync = .normal
        changed.storage.maxBytes += 1
        changed.storage.retention += .seconds(1)
        changed.storage.statusPath = "/s"
        changed.routes[0].delivery.maxAttempts = 3  // a route's delivery settings apply on reload
        let keys = RestartOnlyKeys.changes(from: later, to: changed, cores: 3).map { String($0.prefix { $0 != " " }) }
        #expect(keys == ["storage.path", "storage.sync", "storage.max_bytes", "storage.retention", "storage.status_path"])
    }

    /// `tracing`, and the shared store's keys while a route delivers later, are named on reload.
    @Test func tracingAndTheSharedStoresKeysAreNamedOnReload() throws {
        var old = try ConfigLoader.parse(unreachable(maxParked: 0, port: 1), file: "a.yaml")
        old.routes[0].delivery.mode = .later
        old.storage.url = "postgres://db/a"
        var new = old
        new.tracing = TracingConfiguration(endpoint: "http://otel:4318/v1/traces")
        new.storage.url = "postgres://db/b"
        new.storage.pool += 1
        new.storage.lease += .seconds(1)
        new.storage.required.toggle()
        let keys = RestartOnlyKeys.changes(from: old, to: new, cores: 3).map { String($0.prefix { $0 != " " }) }
        #expect(keys == ["tracing", "storage.url", "storage.pool", "storage.lease", "storage.required"])
    }

    /// `cluster` (the Redis link, opened at start) is named on reload; a route's `cors` is applied.
    @Test func clusterIsNamedOnReloadAndCORSIsApplied() throws {
        let old = try ConfigLoader.parse(unreachable(maxParked: 0, port: 1), file: "a.yaml")
        var new = old
        new.cluster = ClusterConfiguration(redis: RedisEndpoint(host: "redis"))
        let keys = RestartOnlyKeys.changes(from: old, to: new, cores: 3).map { String($0.prefix { $0 != " " }) }
        #expect(keys == ["cluster"])
        var cors = old
        cors.routes[0].cors = CORSConfiguration(allowOrigins: ["https://app.example.com"])
        #expect(RestartOnlyKeys.changes(from: old, to: cors, cores: 3).isEmpty)
    }

    @Test(.enabled(if: nonLoopbackIPv4() != nil, "needs an address other than loopback"))
    func allowRemoteFollowsTheReload() throws {
        let remote = nonLoopbackIPv4()!
        func yaml(_ allow: Bool) -> String {
            """
            listen: 127.0.0.1:0
            admin: { listen: 0.0.0.0:0, allow_remote: \(allow) }
            upstreams: { u: { endpoints: [http://127.0.0.1:1] } }
            routes: [ { match: { path_prefix: / }, upstream: u } ]
            """
        }
        let h = try ProxyHarness(yaml(false))
        func status() -> Int? { try? HTTP.request(port: h.adminPort, "/healthz", timeout: 2, host: remote).status }
        #expect(status() == 403)
        #expect(h.proxy.reload(try ConfigLoader.parse(yaml(true), file: "test.yaml")).isEmpty)
        #expect(eventually { status() == 200 })
        #expect(h.proxy.reload(try ConfigLoader.parse(yaml(false), file: "test.yaml")).isEmpty)
        #expect(eventually { status() == 403 })
    }

    /// Through the real binary: a refused SIGHUP logs the key's name, and a
    /// drain_timeout changed by SIGHUP is the one SIGTERM waits for.
    @Test func sighupAppliesDrainTimeoutAndLogsARefusedKey() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        // Port 0 for both listeners: the process binds its own and prints
        // them; a reload that keeps `:0` changes neither.
        func yaml(drain: String, clientTimeout: String = "30s") -> String {
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            drain_timeout: \(drain)
            limits: { client_timeout: \(clientTimeout) }
            upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """
        }
        // Started with no drain time at all: SIGTERM would cut a slow request.
        let serve = try ServeProcess(config: yaml(drain: "0s"), logLevel: "info")
        let port = try #require(serve.listeningPort())
        #expect(serve.adminPort() != nil)
        serve.waitForSignalHandlers()

        try serve.rewriteConfig(yaml(drain: "5s", clientTimeout: "9s"))
        serve.signal(SIGHUP)
        waitUntil("the refused key in the log") {
            serve.errors.contains("limits.client_timeout cannot change on reload (restart to apply)")
        }

        try serve.rewriteConfig(yaml(drain: "5s"))
        serve.signal(SIGHUP)
        waitUntil("'configuration reloaded' in the log") { serve.errors.contains("configuration reloaded") }

        let client = try TestConnection(port: port)
        try client.send("GET /slow?ms=800 HTTP/1.1\r\nHost: x\r\n\r\n")
        waitUntil("the slow request at the upstream") { demo.hits.load(ordering: .relaxed) == 1 }
        serve.signal(SIGTERM)
        let r = try client.readResponse()
        #expect(r.status == 200)  // waited for: the reloaded drain_timeout is 5s
        if serve.waitForExit() { #expect(serve.process.terminationStatus == 0) }
    }
}
