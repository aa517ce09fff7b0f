import Foundation
import HappyPathCore
import HappyPathDemo
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Clients that ask for large answers and do not read them, with raw HTTP/2
/// frames against `happypath serve` (a process of its own, so its resident
/// memory is the proxy's alone): what they pin is bounded by
/// `limits.connection_buffer` per connection, whatever their stream count,
/// and a trickle of 1-byte WINDOW_UPDATEs does not keep a stalled stream
/// alive past `client_timeout` (docs/http2.md, "Memory").
@Suite(.serialized) struct HTTP2MemoryTests {
    /// 10 connections × 100 streams with every stream window shut
    /// (SETTINGS_INITIAL_WINDOW_SIZE 0), each asking for 1 MiB: every head
    /// is answered, and the proxy's resident memory grows by less than
    /// 96 MiB: each connection's `limits.connection_buffer` (256 KiB) and
    /// output queue, and for each stream its upstream transfer in flight
    /// (about 50 KiB: libcurl's 16 KiB read buffer, one read staged, the
    /// exchange). Measured 66 MiB (docs/http2.md, "Memory"). Before the
    /// connection-wide bound each stream staged up to 1 MiB, and libcurl read
    /// 64 KiB at a time: about 1.1 GiB here. (1 MiB, not more: what the
    /// proxy does not read waits in the kernel's socket buffers, about an
    /// answer's worth per stream.)
    @Test func stalledStreamsPinOnlyTheConnectionsBound() throws {
        let (demo, serve, port) = try Self.serve(clientTimeout: "60s", plain: true)
        defer { demo.stop() }
        try Self.stallStreams("stalled_streams", of: serve, port: port, bound: 96 << 20)
    }

    /// The same stalled streams, 10 connections × 100 of them, each asking
    /// for 10 MiB, towards an HTTP/2 upstream (nginx, h2c): every head is
    /// answered, and the proxy's resident memory stays within the same
    /// bound: what it reads of each answer goes to memory up to the
    /// connection's bound and then to the client's share of spool files
    /// (128 MiB on disk here), and past both the upstream's stream windows
    /// hold the rest. On the proxy's own HTTP/2 client the 1,000 streams
    /// share a few connections (nginx takes 128 streams on one), and past
    /// what the proxy reads ahead each stream holds at most its 64 KiB
    /// window (84 MiB measured; libcurl's h2c, a connection per call, took
    /// 118 MiB); the bar is 160 MiB. Another client is served meanwhile.
    /// (Not in the thread sanitizer's pass: it cannot check the bound there.)
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "the bound is checked by the address sanitizer's pass"))
    func stalledStreamsTowardsAnHTTP2UpstreamPinOnlyTheBounds() throws {
        let certificates = try TestCertificates()
        let nginx = try NginxUpstream(certificate: try certificates.make("nginx-upstream", names: ["localhost"]))
        defer { nginx.stop() }
        let serve = try ServeProcess(
            config: Self.yaml(demo: nginx.plainPort, clientTimeout: "60s").replacingOccurrences(
                of: "max_connections: 1100,", with: "protocol: h2, max_connections: 1100,"),
            plain: true)
        let port = try #require(serve.listeningPort())
        #expect(try HTTP.request(port: port, "/bytes").body.count == 10 << 20)
        try Self.stallStreams("stalled_streams_10mib", of: serve, port: port, bound: 160 << 20)
    }

    /// Runs `attack` (10 connections × 100 stalled streams) against `serve`:
    /// every head answered 200, the resident memory's growth once it stops
    /// moving (one second without 1 MiB more) under `bound`, another client
    /// served meanwhile. ThreadSanitizer's shadow memory multiplies what
    /// the process touches (239 MiB measured for 66 MiB), and
    /// AddressSanitizer's quarantine keeps what it frees: under either, the
    /// proxy is the build without one (`plain:`), or the bound is not checked.
    static func stallStreams(
        _ attack: String, of serve: ServeProcess, port: Int, bound: Int, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        #expect(try HTTP.request(port: port, "/ok").status == 200, sourceLocation: sourceLocation)
        let before = serve.residentBytes
        let attacker = try H2Attacker(attack, port: port, rounds: 1)
        defer { attacker.stop() }
        attacker.waitForReports(1, timeout: 90)
        let holding = attacker.reports.first ?? [:]
        #expect(holding["statuses"] as? [String: Int] == ["200": 1000], "\(holding)", sourceLocation: sourceLocation)
        var last = serve.residentBytes
        _ = eventually(30) {
            usleep(1_000_000)
            let now = serve.residentBytes
            defer { last = now }
            return now - last < 1 << 20
        }
        let grown = serve.residentBytes - before
        if serve.isPlain {
            #expect(
                grown < bound, "resident memory grew by \(grown >> 20) MiB for 1,000 stalled streams",
                sourceLocation: sourceLocation)
        }
        print("\(attack): resident memory grew by \(grown >> 10) KiB for 10 connections x 100 streams")
        #expect(try HTTP.request(port: port, "/ok").status == 200, sourceLocation: sourceLocation)
    }

    /// A 64 MiB answer from an HTTP/2 upstream to a client that stops
    /// reading after its head (nothing read ahead): the proxy's own HTTP/2
    /// client holds at most the stream's 64 KiB window of it
    /// (`happypath_memory_bytes{pool="upstream_h2"}`), the resident memory
    /// grows by far less than the answer (the bar: 16 MiB), and the answer
    /// arrives whole once the client reads.
    @Test(.disabled(if: OverloadAttackTests.plainOnce, "the bound is checked by the address sanitizer's pass"))
    func a64MiBStreamToAStalledClientStaysWithinItsWindow() throws {
        let (up, _, certificates) = try UpstreamHTTP2Tests.upstream()
        let serve = try ServeProcess(
            config: """
                listen: 127.0.0.1:0
                admin: { listen: 127.0.0.1:0 }
                workers: 1
                limits: { client_timeout: 60s, read_ahead: 0 }
                upstreams:
                  u: { endpoints: [http://127.0.0.1:\(up.plainPort)], protocol: h2 }
                routes:
                  - { match: { path_prefix: / }, upstream: u, timeout: 60s }
                """, logLevel: "info", plain: true)
        let port = try #require(serve.listeningPort())
        let admin = AdminProbe(port: try #require(serve.adminPort()))
        #expect(try HTTP.request(port: port, "/warm?size=100000").body.count == 100_000)
        let before = serve.residentBytes
        let size = 64 << 20
        let c = try TestConnection(port: port, timeout: 60, receiveBuffer: 16 * 1024)
        try c.send("GET /big?size=\(size) HTTP/1.1\r\nHost: x\r\n\r\n")
        let pool = #"happypath_memory_bytes{pool="upstream_h2"}"#
        #expect(waitUntil("the stream to hold bytes for the stalled client") { try admin.metric(pool) > 0 })
        var last = serve.residentBytes
        _ = eventually(10) {
            usleep(500_000)
            let now = serve.residentBytes
            defer { last = now }
            return now - last < 256 << 10
        }
        let grown = serve.residentBytes - before
        if serve.isPlain { #expect(grown < 16 << 20, "resident memory grew by \(grown >> 10) KiB for a stalled 64 MiB answer") }
        #expect(try admin.metric(pool) <= 64 * 1024)
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.body.count == size)
        print("a stalled 64 MiB answer: resident memory grew by \(grown >> 10) KiB")
        withExtendedLifetime(certificates) {}
    }

    /// 50 stalled streams kept "moving" by a 1-byte WINDOW_UPDATE every
    /// second to each that has bytes coming: progress counts only in whole
    /// KiB, so all are reset CANCEL within two `client_timeout`s (2 s here),
    /// not kept forever.
    @Test func aOneByteWindowTrickleDoesNotKeepAStreamAlive() throws {
        let (demo, serve, port) = try Self.serve(clientTimeout: "2s")
        defer { withExtendedLifetime(serve) { demo.stop() } }  // the process ends with its object
        let r = try H2Attacker.once("window_trickle", port: port)
        #expect(r["trickled_resets"] as? Int == 50, "\(r)")
        let last = r["last_reset_seconds"] as? Double ?? 99
        #expect(last >= 1.5 && last < 10, "\(r)")
        #expect(try HTTP.request(port: port, "/ok").status == 200)
    }

    /// What the process holds is on `/metrics` by pool: one connection's
    /// 20 stalled streams stage at most the connection's bound plus one read
    /// per stream, and once the client is gone every pool is back
    /// to zero: staged answers, queued output, request bodies.
    @Test func thePoolsShowWhatIsHeldAndComeBackToZero() throws {
        let h = try ProxyHarness(
            HTTP2EdgeTests.yaml(limits: "{ client_timeout: 30s }").replacingOccurrences(
                of: "demo: { endpoints: [{{DEMO}}] }", with: "demo: { endpoints: [{{DEMO}}], max_connections: 64 }"),
            workers: 1)
        defer { h.stop() }
        let admin = AdminProbe(port: h.adminPort)
        let attacker = try H2Attacker("stalled_one", port: h.port, rounds: 1)
        defer { attacker.stop() }
        attacker.waitForReports(1, timeout: 30)
        #expect(attacker.reports.first?["statuses"] as? [String: Int] == ["200": 20], "\(attacker.reports)")
        let staged = #"happypath_memory_bytes{pool="staged_answers"}"#
        #expect(waitUntil("the connection's bound filled") { try admin.metric(staged) >= 256 * 1024 })
        // The bound, and at most one read (16 KiB) more per stream.
        let held = try admin.metric(staged)
        #expect(held <= Double(256 * 1024 + 20 * 16 * 1024), "\(held) staged for one connection")
        attacker.stop()
        #expect(waitUntil("every pool back to zero") {
            let m = try admin.metrics()
            return ["staged_answers", "client_output", "request_bodies"].allSatisfy {
                m[#"happypath_memory_bytes{pool="\#($0)"}"#] == 0
            }
        })
        let state = try HTTP.request(port: h.adminPort, "/admin/state").json
        #expect((state["memory"] as? [String: Int])?["staged_answers"] == 0, "\(state["memory"] ?? "none")")
    }

    /// `limits.max_memory`'s overload action: 20 stalled streams fill a
    /// connection's 1 MiB `connection_buffer`, past 90 % of a 1 MiB
    /// `max_memory`. Then a new stream is refused (REFUSED_STREAM, never
    /// processed), a new client waits in the backlog instead of being
    /// served, the change is counted; once the stalled client leaves, it
    /// ends and the waiting client is answered.
    @Test func overMaxMemoryNewStreamsAreRefusedAndNewClientsWait() throws {
        let (h, admin, attacker, r) = try Self.underPressure("pressure")
        defer { h.stop(); attacker.stop() }
        #expect(try admin.metric(#"happypath_memory_pressure_changes_total{change="began"}"#) == 1)
        #expect(r["extra_reset"] as? Int == Int(HTTP2ErrorCode.refusedStream.rawValue), "\(r)")
        // A new client now waits in the backlog; served once the stalled one left.
        let waiting = Locked<Int?>(nil)
        let port = h.port
        let bystander = Thread {
            let status = (try? HTTP.request(port: port, "/ok", timeout: 30))?.status ?? -1
            waiting.withLock { $0 = status }
        }
        bystander.start()
        #expect(waiting.withLock { $0 } == nil, "answered while the action was on")
        attacker.stop()
        #expect(waitUntil("the overload action off") { try admin.metric("happypath_memory_pressure") == 0 })
        #expect(waitUntil("the waiting client answered") { waiting.withLock { $0 } != nil })
        #expect(waiting.withLock { $0 } == 200)
        #expect(try admin.metric(#"happypath_memory_pressure_changes_total{change="ended"}"#) == 1)
    }

    /// The same overload action shrinks the stream windows of a connection
    /// it sees at work: SETTINGS_INITIAL_WINDOW_SIZE 16 KiB while it is on
    /// (request bodies then hold less), the configured 64 KiB again once the
    /// client's reset streams bring the budget back under its low mark.
    @Test func overMaxMemoryStreamWindowsShrinkAndComeBack() throws {
        let (h, admin, attacker, r) = try Self.underPressure("pressure_windows")
        defer { h.stop(); attacker.stop() }
        #expect(r["extra_reset"] as? Int == Int(HTTP2ErrorCode.refusedStream.rawValue), "\(r)")
        // The first is the connection's own SETTINGS; then shrunk, then back.
        #expect(r["windows"] as? [Int] == [65536, 16384, 65536], "\(r)")
        #expect(waitUntil("the overload action off") { try admin.metric("happypath_memory_pressure") == 0 })
    }

    /// A proxy with a 1 MiB `max_memory` and `connection_buffer`, and
    /// `attack` (one of the `pressure` attacks) against it: once its 20
    /// stalled streams turned the overload action on (each scrape checks
    /// it too), the attack is told to go on; its report.
    static func underPressure(_ attack: String) throws -> (ProxyHarness, AdminProbe, H2Attacker, [String: Any]) {
        let h = try ProxyHarness(
            HTTP2EdgeTests.yaml(limits: "{ client_timeout: 30s, max_memory: 1MiB, connection_buffer: 1MiB }"), workers: 1)
        let admin = AdminProbe(port: h.adminPort)
        let attacker: H2Attacker
        do { attacker = try H2Attacker(attack, port: h.port, rounds: 1) } catch {
            h.stop()
            throw error
        }
        #expect(waitUntil("the overload action on") { try admin.metric("happypath_memory_pressure") == 1 })
        attacker.more()
        attacker.waitForReports(1, timeout: 30)
        return (h, admin, attacker, attacker.reports.first ?? [:])
    }

    /// `happypath serve` (a process of its own, one worker) in front of a
    /// demo upstream of the test's (stop it when done), and its port.
    static func serve(clientTimeout: String, plain: Bool = false) throws -> (
        demo: DemoUpstream, serve: ServeProcess, port: Int
    ) {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        do {
            let serve = try ServeProcess(config: yaml(demo: demo.port, clientTimeout: clientTimeout), plain: plain)
            return (demo, serve, try #require(serve.listeningPort()))
        } catch {
            demo.stop()
            throw error
        }
    }

    static func yaml(demo: Int, clientTimeout: String) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        workers: 1
        limits: { client_timeout: \(clientTimeout) }
        upstreams:
          demo: { endpoints: [http://127.0.0.1:\(demo)], max_connections: 1100, connect_timeout: 20s }
        routes:
          - match: { path_prefix: / }
            upstream: demo
            timeout: 120s
            retry: { attempts: 1, per_try_timeout: 60s }
        """
    }
}

extension H2Attacker {
    /// Tells an attack that waits for it (`pressure`) to go on.
    func more() { FileManager.default.createFile(atPath: stopFile.path + ".more", contents: nil) }

    /// The attacks of `HTTP2MemoryTests`, added to the script's `ATTACKS`.
    static let memoryAttacks = #"""
def stalled_connections(count, streams, size):
    """`count` connections, each with `streams` streams whose windows are shut, asking for `size` bytes each."""
    flags = ["END_HEADERS", "END_STREAM"]
    conns = []
    for _ in range(count):
        c = Conn(settings={4: 0, 3: streams})
        path = b"/bytes?n=%d" % size
        c.send([HeadersFrame(1 + 2 * i, data=request(path=path), flags=flags) for i in range(streams)])
        conns.append(c)
    for c in conns:
        c.wait(lambda c: len(c.status) >= streams, timeout=30)
    return conns

def statuses_of(conns):
    out = {}
    for c in conns:
        with c.lock:
            for status in c.status.values():
                out[str(status)] = out.get(str(status), 0) + 1
    return out

def hold(conns):
    """Keeps the connections open until stopped."""
    while not stop.is_set():
        time.sleep(0.05)
    for c in conns:
        c.close()

def held_streams(count, streams, size):
    """`count` connections x `streams` stalled streams of `size`-byte answers, held until stopped."""
    conns = stalled_connections(count, streams, size)
    say(attack=attack, statuses=statuses_of(conns), resets=sum(len(c.resets) for c in conns))
    hold(conns)

def window_trickle():
    """One connection, 50 stalled streams given 1 byte of window each, then every second 1 byte more
    to each stream that has answer bytes coming (within the WINDOW_UPDATE budget those DATA frames earn)."""
    (c,) = stalled_connections(1, 50, 1 << 20)
    began = time.monotonic()
    ids = [1 + 2 * i for i in range(50)]
    first = True
    while not stop.is_set() and time.monotonic() - began < 30:
        with c.lock:
            if all(i in c.resets for i in ids) or c.eof:
                break
            live = [i for i in ids if i not in c.resets and (first or c.data.get(i, 0) > 0)]
        c.send([WindowUpdateFrame(i, window_increment=1) for i in live])
        first = False
        time.sleep(1)
    with c.lock:
        times = [c.resets[i][1] - began for i in ids if i in c.resets]
        data = sum(c.data.get(i, 0) for i in ids)
        ended = c.goaway[2] - began if c.goaway else None
    c.report(trickled_resets=len(times), last_reset_seconds=round(max(times), 3) if times else None, data=data,
             ended_seconds=ended and round(ended, 3))
    c.close()

def pressed():
    """20 stalled streams of 1 MiB answers; once told (the file argv[4] + ".more"), one stream more (41)."""
    (c,) = stalled_connections(1, 20, 1 << 20)
    while not os.path.exists(sys.argv[4] + ".more") and not stop.is_set():
        time.sleep(0.01)
    c.send([HeadersFrame(41, data=request(), flags=["END_HEADERS", "END_STREAM"])])
    return c

def pressure():
    """`pressed`, then the extra stream's reset reported."""
    c = pressed()
    c.wait(lambda c: 41 in c.resets or 41 in c.status, timeout=10)
    with c.lock:
        extra = c.resets[41][0] if 41 in c.resets else None
    c.report(extra_reset=extra, extra_status=c.status.get(41))
    hold([c])

def pressure_windows():
    """`pressed`, then the 20 reset: the stream windows (SETTINGS_INITIAL_WINDOW_SIZE) the server
    offered along the way are reported."""
    c = pressed()
    shrunk = c.wait(lambda c: any(s.get(4) == 16384 for s in c.settings_seen), timeout=10)
    c.send([RstStreamFrame(1 + 2 * i, error_code=8) for i in range(20)])
    # A ping makes a turn after the resets were taken (the end is seen at a turn).
    c.send([PingFrame(0, opaque_data=b"12345678")])
    back = c.wait(lambda c: shrunk and c.settings_seen[-1].get(4) == 65536, timeout=10)
    with c.lock:
        windows = [s[4] for s in c.settings_seen if 4 in s]
    c.report(extra_reset=c.resets.get(41, (None,))[0], windows=windows, shrunk=shrunk, back=back)
    hold([c])

ATTACKS.update({
    "stalled_streams": lambda: held_streams(10, 100, 1 << 20),
    "stalled_streams_10mib": lambda: held_streams(10, 100, 10 << 20),
    "stalled_one": lambda: held_streams(1, 20, 1 << 20),
    "window_trickle": window_trickle, "pressure": pressure, "pressure_windows": pressure_windows,
})
"""#
}
