import Foundation
import HappyPathCore
import HappyPathDemo
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 30, section 3: what an outsider can hold on the admin listener is
/// bounded. Its connections are capped and a silent one is closed after a
/// few seconds, so an idle flood on the admin port never takes the
/// descriptors the proxy port needs.
@Suite("admin listener bounds") struct AdminBoundsTests {
    /// Under a limit of 256 open files, more idle admin connections than
    /// descriptors used to take every one of them (each was kept an hour),
    /// and the proxy port could accept nothing.
    @Test func anIdleFloodOnTheAdminPortNeverStopsTheProxyPort() throws {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let limit = 256
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                workers: 1
                admin: { listen: 127.0.0.1:0 }
                upstreams: { demo: { endpoints: [http://127.0.0.1:\(demo.port)] } }
                routes: [ { match: { path_prefix: / }, upstream: demo } ]
                """, logLevel: nil, openFilesLimit: limit)
        let port = try #require(serve.listeningPort())
        let admin = try #require(serve.adminPort())
        func get(_ path: String, on port: Int) -> TestResponse? { try? HTTP.request(port: port, path, timeout: 5) }
        #expect(waitUntil("the first answer") { get("/ok", on: port)?.status == 200 })
        let before = serve.openDescriptors

        // One admin client says nothing, one starts a head and stops.
        let opened = ContinuousClock.now
        let silent = try TestConnection(port: admin, timeout: 30)
        let partial = try TestConnection(port: admin, timeout: 30)
        try partial.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        // Then more idle admin clients than the process has descriptors.
        var flood: [TestConnection] = []
        for _ in 0..<(limit + 20) { flood.append(try TestConnection(port: admin, timeout: 2)) }
        // The admin listener takes what its cap allows (the rest wait in the backlog).
        #expect(waitUntil("the admin listener to hold its cap of connections") {
            serve.openDescriptors >= before + AdminServer.maxConnections
        })
        #expect(get("/ok", on: port)?.status == 200, "the proxy port answers during the flood")

        // The silent client is closed without a word: at the head deadline,
        // or sooner, as the oldest silent connection when the cap makes
        // room for a client waiting in the backlog (docs/http1.md).
        #expect(Edge.readToEnd(silent) == [], "closed with nothing written")
        #expect(seconds(since: opened) < 20, "the silent client held on past the deadline")
        // The one whose head stalled gets its 408 at the head deadline.
        #expect(try partial.readResponse().status == 408)
        let waited = seconds(since: opened)
        // Not exact, it depends on time: closed at the deadline, not an hour later.
        #expect(waited >= AdminServer.headDeadline.seconds * 0.9 && waited < 20, "408 after \(waited) s")

        flood.removeAll()
        #expect(waitUntil("the admin listener to answer again") { get("/healthz", on: admin)?.status == 200 })
        #expect(get("/ok", on: port)?.status == 200)
    }
}
