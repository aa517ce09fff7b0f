import Foundation
import HappyPathCore
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Nothing reaches the upstream before it is known well-formed (issue 45):
/// raw frames (hyperframe, hpack) against the real proxy in front of a
/// recording HTTP/1.1 upstream (`HTTP2StreamingBodyTests.upstream`: `req
/// KEY` at a head, `first KEY` at the first body bytes, `done KEY N` at a
/// whole request, `eof KEY` at a cut one).
///
/// - A request whose `content-length` is met is served only at END_STREAM:
///   a DATA frame after it makes it malformed (RST_STREAM PROTOCOL_ERROR),
///   and the upstream never hears of it.
/// - A body that streams keeps its last byte until END_STREAM confirms the
///   length: a length that turns out wrong, or a bad trailer, cuts the
///   upstream's request before it is whole (`eof`, never `done`).
/// - Trailers are checked as a head's fields: a pseudo-header, a framing
///   field or a CR/LF makes the request malformed, never silently shortened.
@Suite(.serialized) struct HTTP2MalformedRequestTests {
    /// `PORT DIR`: each case on a connection of its own, one line each:
    /// `CASE status NNN` or `CASE reset CODE` (or `CASE none`).
    static let client = #"""
        import socket, sys, os, time
        import hpack
        from hyperframe.frame import (Frame, SettingsFrame, HeadersFrame, DataFrame, RstStreamFrame, PingFrame,
            GoAwayFrame, WindowUpdateFrame)
        port, d = int(sys.argv[1]), sys.argv[2]

        def wait_file(name, timeout=10):
            end = time.time() + timeout
            while time.time() < end:
                if os.path.exists(os.path.join(d, name)): return True
                time.sleep(0.01)
            return False

        class Conn:
            def __init__(self):
                self.s = socket.create_connection(("127.0.0.1", port)); self.s.settimeout(10)
                self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.enc, self.dec = hpack.Encoder(), hpack.Decoder()
                self.buf = b""
                self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
            def headers(self, fields, end=False, sid=1):
                f = HeadersFrame(sid); f.data = self.enc.encode(fields); f.flags.add("END_HEADERS")
                if end: f.flags.add("END_STREAM")
                return f.serialize()
            def data(self, payload, end=False, sid=1):
                f = DataFrame(sid); f.data = payload
                if end: f.flags.add("END_STREAM")
                return f.serialize()
            def send(self, *frames): self.s.sendall(b"".join(frames))
            def frames(self):
                while True:
                    while len(self.buf) >= 9:
                        f, n = Frame.parse_frame_header(memoryview(self.buf[:9]))
                        if len(self.buf) < 9 + n: break
                        f.parse_body(memoryview(self.buf[9:9 + n])); self.buf = self.buf[9 + n:]
                        yield f
                    try: data = self.s.recv(65536)
                    except (socket.timeout, ConnectionError): return
                    if not data: return
                    self.buf += data
            def ping(self):
                # The PING's ACK: every frame sent before it was read.
                self.s.sendall(PingFrame(0, opaque_data=b"happy123").serialize())
                for f in self.frames():
                    if isinstance(f, SettingsFrame) and "ACK" not in f.flags: self.s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                    if isinstance(f, PingFrame) and "ACK" in f.flags: return
            def outcome(self, sid=1):
                for f in self.frames():
                    if isinstance(f, SettingsFrame) and "ACK" not in f.flags: self.s.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                    elif isinstance(f, HeadersFrame) and f.stream_id == sid:
                        status = dict(self.dec.decode(f.data)).get(":status")
                        if status and not status.startswith("1"): return "status " + status
                    elif isinstance(f, RstStreamFrame) and f.stream_id == sid: return "reset %d" % f.error_code
                    elif isinstance(f, GoAwayFrame): return "goaway %d" % f.error_code
                return "none"

        def head(key, method="POST", length=None):
            fields = [(":method", method), (":scheme", "http"), (":authority", "t"), (":path", "/up?key=" + key)]
            if length is not None: fields.append(("content-length", str(length)))
            return fields

        def run(name, steps):
            c = Conn()
            for step in steps: step(c)
            print(name, c.outcome(), flush=True)
            c.s.close()

        # The head alone first (a PING's ACK says it was read, so a body
        # would be streaming by now), then what makes it malformed.
        for key, method in (("cl0post", "POST"), ("cl0get", "GET")):
            run(key, [lambda c, k=key, m=method: c.send(c.headers(head(k, m, 0))), lambda c: c.ping(),
                      lambda c: c.send(c.data(b"x", end=True))])
        # The upstream has the head and the first bytes, then the length turns out wrong.
        run("short", [lambda c: c.send(c.headers(head("short", length=10))), lambda c: wait_file("short.req"),
                      lambda c: c.send(c.data(b"12345")), lambda c: wait_file("short.first"),
                      lambda c: c.send(c.data(b"", end=True))])
        run("long", [lambda c: c.send(c.headers(head("long", length=5))), lambda c: wait_file("long.req"),
                     lambda c: c.send(c.data(b"1234")), lambda c: wait_file("long.first"),
                     lambda c: c.send(c.data(b"56", end=True))])
        # Every byte of the length, then bad trailers.
        bad = {"tcl": [("content-length", "5")], "tpseudo": [(":path", "/other")],
               "tcrlf": [("x-t", "a\r\nb")], "tte": [("transfer-encoding", "chunked")]}
        for key, trailers in bad.items():
            run(key, [lambda c, k=key: c.send(c.headers(head(k, length=5))), lambda c, k=key: wait_file(k + ".req"),
                      lambda c: c.send(c.data(b"12345")), lambda c, k=key: wait_file(k + ".first"),
                      lambda c, t=trailers: c.send(c.headers(t, end=True))])
        # No length (chunked upstream), then a trailer with CR/LF.
        run("open", [lambda c: c.send(c.headers(head("open"))), lambda c: wait_file("open.req"),
                     lambda c: c.send(c.data(b"12345")), lambda c: wait_file("open.first"),
                     lambda c: c.send(c.headers([("x-t", "a\nb")], end=True))])
        # Head, body and a bad trailer in one write: the body is stored, never sent.
        run("stored", [lambda c: c.send(c.headers(head("stored", length=3)), c.data(b"abc"),
                                        c.headers([("x-t", "bad\x00")], end=True))])
        # Good trailers: served, whole.
        run("fine", [lambda c: c.send(c.headers(head("fine", length=5))), lambda c: wait_file("fine.req"),
                     lambda c: c.send(c.data(b"12345")), lambda c: wait_file("fine.first"),
                     lambda c: c.send(c.headers([("x-checksum", "c0ffee")], end=True))])
        """#

    @Test func malformedRequestsNeverReachTheUpstreamWhole() throws {
        let run = try HTTP2StreamingBodyTests.Run(kind: "h1")
        defer { run.stop() }
        let h = try HTTP2StreamingBodyTests.proxy(run.port)
        defer { h.stop() }
        let r = try runProcess(try PythonH2.python(), ["-c", Self.client, "\(h.port)", run.dir.path], timeout: 120)
        #expect(r.status == 0, "\(r.err)")
        let out = Dictionary(
            r.out.split(separator: "\n").map { line in
                let words = line.split(separator: " ", maxSplits: 1).map(String.init)
                return (words[0], words.count > 1 ? words[1] : "")
            }, uniquingKeysWith: { a, _ in a })
        // RST_STREAM PROTOCOL_ERROR (1) for each malformed request; the stream only, the connection goes on.
        for key in ["cl0post", "cl0get", "short", "long", "tcl", "tpseudo", "tcrlf", "tte", "open", "stored"] {
            #expect(out[key] == "reset 1", "\(key): \(r.out)")
        }
        #expect(out["fine"] == "status 200", "\(r.out)")
        #expect(waitUntil("the good request at the upstream") { run.upstreamSaid("done fine 5") == 1 })
        // Never sent: not even a head.
        for key in ["cl0post", "cl0get", "stored"] { #expect(run.upstreamSaid("req \(key)") == 0, "\(key)") }
        // Streamed: the upstream had the head and the first bytes, then a cut request, never a whole one.
        for key in ["short", "long", "tcl", "tpseudo", "tcrlf", "tte", "open"] {
            #expect(waitUntil("\(key) cut at the upstream") { run.upstreamSaid("eof \(key)") == 1 }, "\(key)")
            #expect(!run.lines.withLock { $0 }.contains { $0.hasPrefix("done \(key) ") }, "\(key)")
        }
    }
}
