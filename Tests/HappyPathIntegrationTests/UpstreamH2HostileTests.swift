import Foundation
import HappyPathConfig
import HappyPathCore
import Testing

@testable import HappyPathServer

/// A hostile HTTP/2 upstream (raw frames, Python `hyperframe`): each flood
/// or storm the proxy's own HTTP/2 client bounds (`HTTP2FloodGuard`, the
/// 1xx bound, nghttp2's window checks, the pool's backoff) is met by the
/// real proxy over loopback: the try ends with a clear 502, the connection
/// is ended (GOAWAY ENHANCE_YOUR_CALM for a flood), and the proxy goes on.
@Suite("hostile HTTP/2 upstreams", .serialized) struct UpstreamH2HostileTests {
    /// Prints `conn N` for each connection, `goaway N CODE` for a GOAWAY the
    /// proxy sends on it, `closed N` when the proxy closes it. Its mode
    /// (argv[1]) is what it does at a request's HEADERS.
    static let server = #"""
        import socket, sys, threading
        import hpack
        from hyperframe.frame import (Frame, SettingsFrame, HeadersFrame, DataFrame, RstStreamFrame, PingFrame,
                                      GoAwayFrame, WindowUpdateFrame, PriorityFrame)
        mode = sys.argv[1]
        lock = threading.Lock()
        def say(*a):
            with lock: print(*a, flush=True)
        def heads(enc, sid, fields, end=False):
            f = HeadersFrame(sid); f.data = enc.encode(fields); f.flags.add("END_HEADERS")
            if end: f.flags.add("END_STREAM")
            return f.serialize()
        def serve(s, n):
            enc = hpack.Encoder(); buf = b""; s.settimeout(20)
            try:
                s.sendall(SettingsFrame(0).serialize())
                if mode == "goaway":
                    s.sendall(GoAwayFrame(0, last_stream_id=0, error_code=0).serialize()); s.close(); say("closed", n); return
                pre = b""
                while len(pre) < 24:
                    c = s.recv(24 - len(pre))
                    if not c: raise ConnectionError
                    pre += c
                while True:
                    while len(buf) >= 9:
                        f, length = Frame.parse_frame_header(memoryview(buf[:9]))
                        if len(buf) < 9 + length: break
                        f.parse_body(memoryview(buf[9:9 + length])); buf = buf[9 + length:]
                        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                            s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                        if isinstance(f, GoAwayFrame): say("goaway", n, f.error_code)
                        if isinstance(f, HeadersFrame): act(s, enc, f.stream_id)
                    c = s.recv(65536)
                    if not c: break
                    buf += c
            except (ConnectionError, OSError):
                pass
            say("closed", n)
        def act(s, enc, sid):
            if mode == "settings": s.sendall(SettingsFrame(0, settings={4: 65535}).serialize() * 5000)
            elif mode == "ping": s.sendall(PingFrame(0, opaque_data=b"12345678").serialize() * 5000)
            elif mode == "reset":
                s.sendall(heads(enc, sid, [(":status", "200")], end=True))
                s.sendall(RstStreamFrame(sid, error_code=0).serialize() * 5000)
            elif mode == "empty":
                s.sendall(heads(enc, sid, [(":status", "200")]) + DataFrame(sid).serialize() * 5000)
            elif mode == "priority":
                s.sendall(PriorityFrame(sid, depends_on=0, stream_weight=16).serialize() * 5000)
            elif mode == "info":
                s.sendall(b"".join(heads(enc, sid, [(":status", "103"), ("link", "</a>; rel=preload")]) for _ in range(100)))
            elif mode == "window":
                s.sendall(WindowUpdateFrame(0, window_increment=2**31 - 1).serialize() * 2)
            elif mode == "headers":
                s.sendall(heads(enc, sid, [(":status", "200")] + [("x-h%d" % i, "v" * 10) for i in range(200)], end=True))
            elif mode == "fine":
                s.sendall(heads(enc, sid, [(":status", "200"), ("content-length", "2")]) + (lambda d: (d.flags.add("END_STREAM"), d)[1])(DataFrame(sid, data=b"ok")).serialize())
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0)); srv.listen(64)
        print(srv.getsockname()[1], flush=True)
        n = 0
        while True:
            c, _ = srv.accept(); n += 1; say("conn", n)
            threading.Thread(target=serve, args=(c, n), daemon=True).start()
        """#

    /// The hostile server in `mode`, a proxy in front of it (one worker,
    /// no retry: each request is one try), and its printed lines.
    static func withServer(_ mode: String, _ body: (ProxyHarness, Locked<[String]>) throws -> Void) throws {
        let lines = Locked<[String]>([])
        let (server, first) = try startPythonScript(python: try PythonH2.python(), Self.server, arguments: [mode], lines: lines)
        defer {
            kill(server.processIdentifier, SIGKILL)
            server.waitUntilExit()
        }
        let port = try #require(Int(first), "the hostile server did not start: \(first)")
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { client_timeout: 5s }
            defaults: { reachability: { park_for: 0s } }
            upstreams:
              u: { endpoints: [http://127.0.0.1:\(port)], protocol: h2, connect_timeout: 1s }
            routes:
              - { match: { path_prefix: / }, upstream: u, timeout: 5s, retry: { attempts: 1 } }
            """, workers: 1)
        defer { h.stop() }
        try body(h, lines)
    }

    /// SETTINGS, PING, stray RST_STREAM, empty DATA and PRIORITY floods:
    /// 5,000 frames each, past their bounds: the connection ends with
    /// GOAWAY ENHANCE_YOUR_CALM (11) and the try with a 502 that says so.
    @Test(arguments: [
        ("settings", "SETTINGS frames"), ("ping", "PING frames"), ("reset", "RST_STREAM frames"),
        ("empty", "empty DATA frames"), ("priority", "PRIORITY frames"),
    ])
    func aFloodEndsItsConnection(mode: String, words: String) throws {
        try Self.withServer(mode) { h, lines in
            let r = try HTTP.request(port: h.port, "/flood")
            if mode == "reset" {
                // The answer came whole before the flood; the flood ends the connection after it.
                #expect(r.status == 200)
            } else {
                #expect(r.status == 502, "\(r.text)")
                #expect((r.json["detail"] as? String)?.contains(words) == true, "\(r.text)")
            }
            #expect(waitUntil("the proxy to end the flooded connection") {
                lines.withLock { $0.contains("goaway 1 11") && $0.contains("closed 1") }
            }, "\(lines.withLock { $0 })")
            // The proxy goes on: the next try opens a new connection.
            _ = try HTTP.request(port: h.port, "/again")
            #expect(waitUntil("a second connection") { lines.withLock { $0.contains("conn 2") } })
        }
    }

    /// 100 informational heads on one stream: past 32 the stream is reset
    /// and the try ends as a bad response; the connection stays.
    @Test func endlessInformationalHeadsEndTheTry() throws {
        try Self.withServer("info") { h, lines in
            let r = try HTTP.request(port: h.port, "/info")
            #expect(r.status == 502, "\(r.text)")
            #expect((r.json["detail"] as? String)?.contains("informational (1xx)") == true, "\(r.text)")
            #expect(!lines.withLock { $0.contains("closed 1") })
        }
    }

    /// A WINDOW_UPDATE past 2^31-1 is a flow-control error (nghttp2): the
    /// connection ends, the try fails, and the next opens a new connection.
    @Test func aWindowOverflowEndsTheConnection() throws {
        try Self.withServer("window") { h, lines in
            let r = try HTTP.request(port: h.port, "/window")
            #expect(r.status == 502, "\(r.text)")
            #expect((r.json["detail"] as? String)?.contains("FLOW_CONTROL_ERROR") == true, "\(r.text)")
            #expect(waitUntil("the proxy to end the connection") { lines.withLock { $0.contains("closed 1") } })
            _ = try HTTP.request(port: h.port, "/again")
            #expect(waitUntil("a second connection") { lines.withLock { $0.contains("conn 2") } })
        }
    }

    /// A head with 200 fields (past `limits.max_headers`, 100) ends the try
    /// as a bad response; the connection stays.
    @Test func aHeadPastTheLimitsEndsTheTry() throws {
        try Self.withServer("headers") { h, lines in
            let r = try HTTP.request(port: h.port, "/headers")
            #expect(r.status == 502, "\(r.text)")
            #expect((r.json["detail"] as? String)?.contains("limits.max_headers") == true, "\(r.text)")
            #expect(!lines.withLock { $0.contains("closed 1") })
        }
    }

    /// A GOAWAY storm (every connection answered by GOAWAY at once): 40
    /// requests fail fast, and the backoff keeps the connections opened to
    /// a handful rather than one or three per request.
    @Test func aGoawayStormOpensAHandfulOfConnections() throws {
        try Self.withServer("goaway") { h, lines in
            var statuses: [Int] = []
            for i in 0..<40 { statuses.append(try HTTP.request(port: h.port, "/storm/\(i)").status) }
            #expect(statuses.allSatisfy { $0 >= 502 }, "\(statuses)")
            let opened = lines.withLock { $0.filter { $0.hasPrefix("conn ") }.count }
            #expect(opened >= 3 && opened <= 12, "\(opened) connections for 40 requests")
        }
    }
}
