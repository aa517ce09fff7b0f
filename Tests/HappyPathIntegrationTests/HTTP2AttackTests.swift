import Foundation
import HappyPathCore
import HappyPathDemo
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The attacks of docs/http2.md's Defences, each with raw frames (Python
/// `hyperframe` and a hand-made HPACK, so a frame says exactly what the
/// attack needs) over a real socket to the real proxy. Each test checks
/// what the proxy did (the GOAWAY code the client read, the reset, the
/// answer, the close), and that another client on the same worker is
/// served in normal time while the attack goes on.
@Suite(.serialized) struct HTTP2AttackTests {
    static let enhanceYourCalm = Int(HTTP2ErrorCode.enhanceYourCalm.rawValue)

    /// One worker, so the attacker and the bystander share its loop.
    static func proxy(limits: String = "{ max_header_bytes: 8KiB, client_timeout: 5s }", http2: String = "") throws -> ProxyHarness {
        try ProxyHarness(HTTP2EdgeTests.yaml(http2: http2, limits: limits), workers: 1)
    }

    /// While `attacker` floods (it reported a first round and goes on), an
    /// HTTP/1.1 client and an HTTP/2 client (curl) are each answered within
    /// 2 s. `/_demo/stats` is not counted in the demo's hits.
    func bystanderIsServed(port: Int, during attacker: H2Attacker, sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(attacker.running, "the attack is still going on", sourceLocation: sourceLocation)
        var start = ContinuousClock.now
        let h1 = try HTTP.request(port: port, "/_demo/stats", timeout: 10)
        let h1Seconds = seconds(since: start)
        #expect(h1.status == 200, sourceLocation: sourceLocation)
        #expect(h1Seconds < 2, "HTTP/1.1 bystander took \(h1Seconds) s", sourceLocation: sourceLocation)
        start = ContinuousClock.now
        let h2 = try runProcess(
            "/usr/bin/curl",
            ["-sS", "--max-time", "10", "--http2-prior-knowledge", "-w", " %{http_version} %{http_code}",
             "http://127.0.0.1:\(port)/_demo/stats"], timeout: 15)
        let h2Seconds = seconds(since: start)
        #expect(h2.out.hasSuffix(" 2 200"), "\(h2.out) \(h2.err)", sourceLocation: sourceLocation)
        #expect(h2Seconds < 2, "HTTP/2 bystander took \(h2Seconds) s", sourceLocation: sourceLocation)
    }

    /// Runs `attack` (a round is one connection, repeated until stopped),
    /// waits for `rounds` rounds, checks the bystander, stops the attack;
    /// every round's report.
    func flood(_ attack: String, port: Int, rounds: Int = 2) throws -> [[String: Any]] {
        let attacker = try H2Attacker(attack, port: port)
        defer { attacker.stop() }
        attacker.waitForReports(rounds)
        try bystanderIsServed(port: port, during: attacker)
        attacker.stop()
        return attacker.reports
    }

    // MARK: - Rapid Reset

    /// CVE-2023-44487: HEADERS and RST_STREAM at once, stream after stream,
    /// 50 pairs a write. Envoy's rule ends each connection soon after 500
    /// streams closed, with GOAWAY ENHANCE_YOUR_CALM, well before
    /// nghttp2's own bucket behind it (1,000 resets) would; a
    /// stream opened and reset in one read never reaches an exchange, so
    /// the upstream sees few of the streams.
    @Test func rapidResetEndsTheConnectionAndFewStreamsReachTheUpstream() throws {
        let h = try Self.proxy()
        defer { h.stop() }
        let before = h.demo.hits.load(ordering: .relaxed)
        let reports = try flood("rapid_reset", port: h.port)
        let streams = reports.reduce(0) { $0 + (($1["last_stream"] as? Int ?? 0) + 1) / 2 }
        for r in reports {
            #expect(r["goaway"] as? Int == Self.enhanceYourCalm, "\(r)")
            let last = r["last_stream"] as? Int ?? .max
            #expect(last >= 2 * 500 && last < 2 * 1000, "\(r)")
        }
        let hits = h.demo.hits.load(ordering: .relaxed) - before
        #expect(streams >= 1000)
        #expect(hits * 10 < streams, "\(hits) of \(streams) streams reached the upstream")
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("the rapid_reset GOAWAYs counted") {
            try admin.metrics().contains { series, value in
                series.hasPrefix("happypath_http2_goaways_total{") && series.contains(#"reason="rapid_reset""#)
                    && value >= Double(reports.count)
            }
        }
    }

    // MARK: - CONTINUATION flood

    /// CVE-2024-27316, CVE-2024-28182: a header block that never ends. The
    /// ninth CONTINUATION is fatal to the session and the socket closes.
    @Test func continuationFloodEndsTheConnection() throws {
        let h = try Self.proxy()
        defer { h.stop() }
        for r in try flood("continuation", port: h.port) {
            #expect(r["eof"] as? Bool == true, "\(r)")
            #expect(r["goaway"] is NSNull, "\(r)")
        }
    }

    /// The same on a stream the proxy refuses (past
    /// max_concurrent_streams): its header block is still capped.
    @Test func continuationFloodOnARefusedStreamEndsTheConnection() throws {
        let h = try Self.proxy(http2: "http2: { max_concurrent_streams: 1 }")
        defer { h.stop() }
        let r = try H2Attacker.once("continuation_refused", port: h.port)
        #expect(r["eof"] as? Bool == true, "\(r)")
        #expect((r["resets"] as? [String: Int])?["7"] == 1, "stream 3 refused: \(r)")
    }

    /// Many CONTINUATION floods, each of 4 KiB frames: the proxy's resident
    /// memory stays where it was.
    @Test func continuationFloodsLeaveMemoryBounded() throws {
        let reports = try residentGrowth("continuation", warmUp: 5, rounds: 40)
        #expect(reports.allSatisfy { $0["eof"] as? Bool == true })
    }

    /// `happypath serve` in front of the demo upstream: `warmUp` rounds of
    /// `attack`, then `rounds` more, after which its resident memory has
    /// grown by less than 16 MiB, and it still answers. Their reports.
    func residentGrowth(
        _ attack: String, warmUp: Int, rounds: Int, sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> [[String: Any]] {
        let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
        demo.start()
        defer { demo.stop() }
        let serve = try ServeProcess(
            config: HTTP2EdgeTests.yaml().replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(demo.port)"))
        let port = try #require(serve.listeningPort(), sourceLocation: sourceLocation)
        _ = try H2Attacker.run(attack, port: port, rounds: warmUp)
        let before = serve.residentBytes
        let reports = try H2Attacker.run(attack, port: port, rounds: rounds)
        let grown = serve.residentBytes - before
        #expect(reports.count == rounds, sourceLocation: sourceLocation)
        if residentMemoryIsMeaningful {
            #expect(grown < 16 << 20, "resident memory grew by \(grown / 1024) KiB", sourceLocation: sourceLocation)
        }
        #expect(try HTTP.request(port: port, "/ok").status == 200, sourceLocation: sourceLocation)
        return reports
    }

    // MARK: - HPACK bomb

    /// One 4,000-byte field put in the decoder's table, then referenced by
    /// one byte each: 12 KB decoded → 431; 64 MB decoded (16,000
    /// references) → the stream is reset; 200 small fields → 431 (over
    /// max_headers). The connection serves the next request.
    @Test func hpackBombIsRefusedOrResetAndTheConnectionGoesOn() throws {
        let h = try Self.proxy()
        defer { h.stop() }
        let attacker = try H2Attacker("hpack_bomb_repeat", port: h.port)
        defer { attacker.stop() }
        attacker.waitForReports(1)
        try bystanderIsServed(port: h.port, during: attacker)
        attacker.stop()
        for r in attacker.reports { #expect(r["streams"] as? Int == 20, "each bomb reset or answered: \(r)") }

        let r = try H2Attacker.once("hpack_bomb", port: h.port)
        let streams = r["streams"] as? [String: [String: Any]] ?? [:]
        #expect(streams["1"]?["status"] as? Int == 431, "\(r)")
        #expect(streams["3"]?["reset"] is Int, "\(r)")
        #expect(streams["5"]?["status"] as? Int == 431, "\(r)")
        #expect(streams["7"]?["status"] as? Int == 200, "\(r)")
        #expect(r["goaway"] is NSNull, "\(r)")
    }

    /// Fields with an empty name and value (CVE-2019-9516): nghttp2 resets
    /// the stream; the connection goes on.
    @Test func zeroLengthFieldsResetTheStreamOnly() throws {
        let h = try Self.proxy()
        defer { h.stop() }
        let r = try H2Attacker.once("zero_length_fields", port: h.port)
        let streams = r["streams"] as? [String: [String: Any]] ?? [:]
        #expect(streams["1"]?["reset"] is Int || streams["1"]?["status"] as? Int == 431, "\(r)")
        #expect(streams["3"]?["status"] as? Int == 200, "\(r)")
    }

    /// Bombs over many connections: resident memory stays where it was.
    @Test func hpackBombsLeaveMemoryBounded() throws {
        let reports = try residentGrowth("hpack_bomb_repeat", warmUp: 2, rounds: 10)
        #expect(reports.allSatisfy { $0["streams"] as? Int == 20 }, "\(reports)")
    }

    // MARK: - Control-frame floods

    /// CVE-2019-9515, 9512, 9517 (the client's WINDOW_UPDATEs), 9518, and
    /// PRIORITY: each budget passed ends the connection with GOAWAY
    /// ENHANCE_YOUR_CALM (SETTINGS: or nghttp2's end at 1,000 unsent ACKs,
    /// when one read holds more, without a GOAWAY).
    @Test(arguments: ["settings", "ping", "window_update", "priority", "empty_data", "empty_headers", "reset_flood"])
    func controlFrameFloodEndsTheConnectionWithEnhanceYourCalm(_ attack: String) throws {
        let h = try Self.proxy()
        defer { h.stop() }
        for r in try flood(attack, port: h.port) {
            if attack == "settings", r["goaway"] is NSNull {
                #expect(r["eof"] as? Bool == true, "\(r)")
                continue
            }
            #expect(r["goaway"] as? Int == Self.enhanceYourCalm, "\(r)")
            #expect(r["sent"] as? Int ?? .max < 100_000, "\(r)")
        }
        // The proxy counts why it ended the connections.
        let reasons: [String: [String]] = [
            "settings": ["flood_settings", "session_error"], "ping": ["flood_ping"], "window_update": ["flood_window_update"],
            "priority": ["flood_priority"], "empty_data": ["flood_empty_frames"],
            "empty_headers": ["flood_resets_sent", "flood_empty_frames"], "reset_flood": ["flood_resets_sent"],
        ]
        let admin = AdminProbe(port: h.adminPort)
        waitUntil("a GOAWAY counted for \(attack)") {
            try admin.metrics().contains { series, value in
                series.hasPrefix("happypath_http2_goaways_total{") && series.contains(#"side="sent""#) && value >= 1
                    && reasons[attack, default: []].contains { series.contains(#"reason="\#($0)""#) }
            }
        }
    }

    /// A client that asks for 10 MB of answers (its windows opened wide),
    /// never reads them, and floods PINGs once its socket is full: reading
    /// stops, the PING budget ends the session, the GOAWAY cannot be
    /// written, so the socket closes after the linger (2 s).
    @Test func aClientThatNeverReadsIsClosedAfterTheLinger() throws {
        let h = try Self.proxy()
        defer { h.stop() }
        let attacker = try H2Attacker("noread_flood", port: h.port)
        defer { attacker.stop() }
        try bystanderIsServed(port: h.port, during: attacker)
        attacker.waitForReports(1)
        let r = attacker.reports.first ?? [:]
        // Without the PING budget, the streams' and then the connection's
        // idle timeouts (5 s each) and the linger would end it after 12 s.
        // Closed at once when the GOAWAY could still be written, or when
        // nghttp2 itself gave up on the unsent ACKs (a slow proxy, as under
        // a sanitizer, reads more PINGs before its answers fill the socket);
        // after the 2 s linger otherwise.
        let closed = r["closed_seconds"] as? Double ?? 0
        #expect(closed > 0 && closed < 9, "\(r)")
    }

    // MARK: - Slow read

    /// A stream whose client never gives window back (CVE-2019-9517): its
    /// 64 KiB arrive, then nothing; another stream on the same connection
    /// is answered meanwhile; the stalled one is reset CANCEL once
    /// client_timeout (1 s here) passed without progress; the connection
    /// serves a later stream. With a zero window from the start, the same.
    @Test func aStreamThatIsNeverReadIdlesOutAndOthersFlow() throws {
        let h = try Self.proxy(limits: "{ max_header_bytes: 8KiB, client_timeout: 1s }")
        defer { h.stop() }
        let attacker = try H2Attacker("slow_read", port: h.port)
        defer { attacker.stop() }
        attacker.waitForReports(1)
        try bystanderIsServed(port: h.port, during: attacker)
        attacker.waitForReports(2)
        let reports = attacker.reports
        guard reports.count == 2 else { return }
        let stalled = reports[0]
        let streams = stalled["streams"] as? [String: [String: Any]] ?? [:]
        #expect(streams["1"]?["data"] as? Int == 65535, "\(stalled)")
        #expect(streams["1"]?["reset"] as? Int == Int(HTTP2ErrorCode.cancel.rawValue), "\(stalled)")
        let idle = stalled["idle_seconds"] as? Double ?? 0
        #expect(idle >= 0.9 && idle < 4, "\(stalled)")
        #expect(streams["3"]?["status"] as? Int == 200, "\(stalled)")
        #expect(stalled["other_seconds"] as? Double ?? 9 < 2, "\(stalled)")
        #expect(streams["5"]?["status"] as? Int == 200, "\(stalled)")
        let zero = reports[1]
        let one = (zero["streams"] as? [String: [String: Any]])?["1"]
        #expect(one?["status"] as? Int == 200, "\(zero)")
        #expect(one?["data"] as? Int == 0, "\(zero)")
        #expect(one?["reset"] as? Int == Int(HTTP2ErrorCode.cancel.rawValue), "\(zero)")
    }
}

/// The attacking client: `script` under the HTTP/2 venv's python, one
/// attack, repeated (one connection a round) until `stop()` makes its stop
/// file (or `rounds`). Each round prints one JSON report.
final class H2Attacker: @unchecked Sendable {
    let process: Process
    private let lines = Locked<[String]>([])
    private var stopped = false
    /// Made by `stop()`: the script watches for it (a signal would not do:
    /// the test runner's children inherit its blocked signals).
    let stopFile = FileManager.default.temporaryDirectory.appendingPathComponent("h2-attack-stop-\(UUID())")

    /// - Parameter rounds: at most this many rounds.
    init(_ attack: String, port: Int, rounds: Int = 1000) throws {
        process = try startPythonScript(
            python: PythonH2.python(), Self.script, arguments: [attack, String(port), String(rounds), stopFile.path],
            lines: lines
        ).process
    }

    deinit { stop() }

    var running: Bool { process.isRunning }

    /// The rounds' reports so far.
    var reports: [[String: Any]] {
        lines.withLock { $0 }.compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
            .filter { $0["attack"] != nil }
    }

    @discardableResult
    func waitForReports(_ n: Int, timeout: Double = 30, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        waitUntil("\(n) attack report(s)", timeout: timeout, sourceLocation: sourceLocation) { reports.count >= n || !running }
            && reports.count >= n
    }

    /// The round under way ends without a report; waits for the end.
    func stop() {
        guard !stopped else { return }
        stopped = true
        FileManager.default.createFile(atPath: stopFile.path, contents: nil)
        defer {
            try? FileManager.default.removeItem(at: stopFile)
            try? FileManager.default.removeItem(atPath: stopFile.path + ".more")
        }
        if !eventually(20, { !process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    /// `rounds` rounds to their end; their reports.
    static func run(_ attack: String, port: Int, rounds: Int) throws -> [[String: Any]] {
        let attacker = try H2Attacker(attack, port: port, rounds: rounds)
        attacker.waitForReports(rounds, timeout: 60)
        attacker.stop()
        return attacker.reports
    }

    /// One round; its report.
    static func once(_ attack: String, port: Int) throws -> [String: Any] {
        try run(attack, port: port, rounds: 1).first ?? [:]
    }

    static let attacks = #"""
import json, os, socket, sys, threading, time
from hyperframe.frame import (
    ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame, PriorityFrame, RstStreamFrame,
    SettingsFrame, WindowUpdateFrame)
from hyperframe.exceptions import UnknownFrameError
from hpack import Decoder

attack, port = sys.argv[1], int(sys.argv[2])
stop = threading.Event()

def watch_stop_file():
    while not os.path.exists(sys.argv[4]):
        time.sleep(0.01)
    stop.set()

threading.Thread(target=watch_stop_file, daemon=True).start()

def say(**fields):
    print(json.dumps(fields), flush=True)

def hpint(value, prefix, first=0):
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)

def literal(name, value, first=0x00):
    """A literal field with a new name, not indexed (0x00), or indexed (0x40)."""
    prefix = 6 if first == 0x40 else 4
    return hpint(0, prefix, first) + hpint(len(name), 7) + name + hpint(len(value), 7) + value

def literal_indexed_name(index, value):
    """A literal field without indexing, its name from the static table."""
    return hpint(index, 4) + hpint(len(value), 7) + value

def request(method=b"GET", path=b"/ok", extra=b""):
    """A request head that leaves the decoder's dynamic table as it was."""
    m = {b"GET": b"\x82", b"POST": b"\x83"}[method]
    return m + b"\x86" + literal_indexed_name(4, path) + literal_indexed_name(1, b"127.0.0.1:%d" % port) + extra

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

class Conn:
    """One client connection: frames out as given, frames in read by a thread of its own."""

    def __init__(self, settings=None, window=0, rcvbuf=None):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.connect(("127.0.0.1", port))
        self.lock = threading.Condition()
        self.goaway = None
        self.eof = False
        self.resets = {}
        self.status = {}
        self.data = {}
        self.ended = set()
        self.last_data = {}
        self.pings = 0
        self.settings_acks = 0
        self.settings_seen = []
        self.decoder = Decoder()
        self.decoder.max_header_list_size = 1 << 20
        self.sent_frames = 0
        self.sent_bytes = 0
        self.began = time.monotonic()
        first = PREFACE + SettingsFrame(0, settings=settings or {}).serialize()
        if window:
            first += WindowUpdateFrame(0, window_increment=window).serialize()
        self.s.sendall(first)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def send(self, frames):
        """Sends the frames (bytes or frames); False once the socket is gone."""
        data = b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames)
        try:
            self.s.sendall(data)
        except OSError:
            return False
        self.sent_frames += len(frames)
        self.sent_bytes += len(data)
        return True

    def read(self):
        buf = b""
        try:
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 9:
                    length = int.from_bytes(buf[0:3], "big")
                    if len(buf) < 9 + length:
                        break
                    head, body, buf = buf[:9], buf[9:9 + length], buf[9 + length:]
                    try:
                        frame, _ = Frame.parse_frame_header(memoryview(head))
                    except UnknownFrameError:
                        continue
                    frame.parse_body(memoryview(body))
                    self.frame(frame)
        except OSError:
            pass
        with self.lock:
            self.eof = True
            self.lock.notify_all()

    def frame(self, f):
        with self.lock:
            if isinstance(f, GoAwayFrame):
                if self.goaway is None:
                    self.goaway = (f.error_code, f.last_stream_id, time.monotonic())
            elif isinstance(f, RstStreamFrame):
                self.resets[f.stream_id] = (f.error_code, time.monotonic())
            elif isinstance(f, HeadersFrame):
                for name, value in self.decoder.decode(f.data):
                    if name in (b":status", ":status"):
                        self.status.setdefault(f.stream_id, int(value))
                if "END_STREAM" in f.flags:
                    self.ended.add(f.stream_id)
            elif isinstance(f, DataFrame):
                self.data[f.stream_id] = self.data.get(f.stream_id, 0) + len(f.data)
                self.last_data[f.stream_id] = time.monotonic()
                if "END_STREAM" in f.flags:
                    self.ended.add(f.stream_id)
            elif isinstance(f, PingFrame) and "ACK" in f.flags:
                self.pings += 1
            elif isinstance(f, SettingsFrame) and "ACK" in f.flags:
                self.settings_acks += 1
            elif isinstance(f, SettingsFrame):
                self.settings_seen.append(dict(f.settings))
            self.lock.notify_all()

    def wait(self, condition, timeout=10):
        with self.lock:
            return self.lock.wait_for(lambda: condition(self) or self.eof, timeout)

    @property
    def done(self):
        return self.goaway is not None or self.eof

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass

    def report(self, **extra):
        with self.lock:
            resets = {}
            for code, _ in self.resets.values():
                resets[str(code)] = resets.get(str(code), 0) + 1
            statuses = {}
            for status in self.status.values():
                statuses[str(status)] = statuses.get(str(status), 0) + 1
            say(attack=attack, goaway=self.goaway[0] if self.goaway else None,
                last_stream=self.goaway[1] if self.goaway else None, eof=self.eof, frames=self.sent_frames,
                bytes=self.sent_bytes, seconds=round(time.monotonic() - self.began, 3), resets=resets,
                statuses=statuses, **extra)

def flood(make, batch, limit, opening=(), **conn):
    """Sends `opening`, then `make(i)` frames in batches until the proxy answers with GOAWAY or closes, or `limit`
    are sent."""
    c = Conn(**conn)
    c.send(list(opening))
    i = 0
    while not c.done and i < limit and not stop.is_set():
        frames = [make(i + k) for k in range(batch)]
        i += batch
        if not c.send(frames):
            break
    if stop.is_set() and not c.done:
        c.close()  # cut short by the test: no report
        return
    c.wait(lambda c: c.done, timeout=5)
    c.report(sent=i)
    c.close()

def rapid_reset():
    """HEADERS then RST_STREAM at once, stream after stream."""
    block = request(path=b"/ok")
    def pair(i):
        sid = 1 + 2 * i
        return HeadersFrame(sid, data=block, flags=["END_HEADERS", "END_STREAM"]).serialize() + \
            RstStreamFrame(sid, error_code=8).serialize()
    flood(pair, 50, 20000)

def continuation():
    """A header block that never ends: CONTINUATION after CONTINUATION, 4 KiB of fields each."""
    filler = literal(b"x-filler", b"a" * 4000)
    flood(lambda i: ContinuationFrame(1, data=filler), 8, 5000,
          opening=[HeadersFrame(1, data=request(), flags=["END_STREAM"])])

def settings():
    flood(lambda i: SettingsFrame(0), 50, 100000)

def ping():
    flood(lambda i: PingFrame(0, opaque_data=i.to_bytes(8, "big")), 50, 100000)

def window_update():
    flood(lambda i: WindowUpdateFrame(0, window_increment=1), 50, 100000)

def priority():
    flood(lambda i: PriorityFrame(1 + 2 * (i % 1000), depends_on=0, stream_weight=16), 50, 100000)

def empty_data():
    flood(lambda i: DataFrame(1, data=b""), 20, 100000,
          opening=[HeadersFrame(1, data=request(b"POST", b"/echo"), flags=["END_HEADERS"])])

def empty_headers():
    """HEADERS frames with an empty block on new streams."""
    flood(lambda i: HeadersFrame(1 + 2 * i, data=b"", flags=["END_HEADERS", "END_STREAM"]), 50, 100000)

def reset_flood():
    """Requests nghttp2 resets (a connection-specific field): each makes the proxy send RST_STREAM."""
    block = request(extra=literal(b"connection", b"close"))
    flood(lambda i: HeadersFrame(1 + 2 * i, data=block, flags=["END_HEADERS", "END_STREAM"]), 50, 100000)

def streams_of(c, ids):
    with c.lock:
        return {str(i): {"status": c.status.get(i), "reset": c.resets.get(i, (None,))[0], "data": c.data.get(i, 0),
                         "ended": i in c.ended} for i in ids}

def hpack_bomb():
    """Fields that decode to far more than they cost on the wire, then a plain request on the same connection."""
    c = Conn()
    insert = literal(b"x-bomb", b"b" * 4000, first=0x40)  # into the proxy's decoder table: index 62
    flags = ["END_HEADERS", "END_STREAM"]
    frames = [
        # 3 copies of 4 KB: 12 KB decoded, over the 8 KiB limit.
        HeadersFrame(1, data=request() + insert + b"\xbe" * 2, flags=flags),
        # 16,000 one-byte references: 64 MB decoded.
        HeadersFrame(3, data=request() + b"\xbe" * 16000, flags=flags),
        # 200 small fields: 7 KB, but over 100 fields.
        HeadersFrame(5, data=request() + literal(b"x-c", b"d", first=0x40) + b"\xbe" * 199, flags=flags),
    ]
    c.send(frames)
    c.wait(lambda c: all(i in c.ended or i in c.resets for i in (1, 3, 5)))
    c.send([HeadersFrame(7, data=request(), flags=flags)])
    c.wait(lambda c: 7 in c.ended or 7 in c.resets)
    c.report(streams=streams_of(c, (1, 3, 5, 7)))
    c.close()

def hpack_bomb_repeat():
    """Bombs of 64 MB decoded each, 20 a connection."""
    c = Conn()
    flags = ["END_HEADERS", "END_STREAM"]
    c.send([HeadersFrame(1, data=request() + literal(b"x-bomb", b"b" * 4000, first=0x40) + b"\xbe" * 12000, flags=flags)])
    c.send([HeadersFrame(3 + 2 * i, data=request() + b"\xbe" * 16000, flags=flags) for i in range(19)])
    c.wait(lambda c: len(c.resets) + len(c.ended) >= 20)
    c.report(streams=len(c.resets) + len(c.ended))
    c.close()

def continuation_refused():
    """A CONTINUATION flood on a stream the proxy refuses (max_concurrent_streams 1, stream 1 still open)."""
    c = Conn()
    c.send([HeadersFrame(1, data=request(path=b"/slow?ms=3000"), flags=["END_HEADERS", "END_STREAM"])])
    c.send([HeadersFrame(3, data=request(), flags=["END_STREAM"])])
    filler = literal(b"x-filler", b"a" * 4000)
    frames = 0
    while not c.done and frames < 200:
        if not c.send([ContinuationFrame(3, data=filler) for _ in range(4)]):
            break
        frames += 4
    c.wait(lambda c: c.eof, timeout=5)
    c.report(continuations=frames)
    c.close()

def zero_length_fields():
    """Fields with an empty name and value (CVE-2019-9516): 3 bytes each on the wire, 32 counted."""
    c = Conn()
    flags = ["END_HEADERS", "END_STREAM"]
    c.send([HeadersFrame(1, data=request() + b"\x00\x00\x00" * 5000, flags=flags)])
    c.wait(lambda c: 1 in c.ended or 1 in c.resets)
    c.send([HeadersFrame(3, data=request(), flags=flags)])
    c.wait(lambda c: 3 in c.ended or 3 in c.resets)
    c.report(streams=streams_of(c, (1, 3)))
    c.close()

def slow_read():
    """A stream whose reader never gives window back; another stream and a later one on the same connection."""
    c = Conn(window=16 << 20)
    flags = ["END_HEADERS", "END_STREAM"]
    c.send([HeadersFrame(1, data=request(path=b"/bytes?n=4000000"), flags=flags)])
    c.wait(lambda c: c.data.get(1, 0) >= 65535)
    began = time.monotonic()
    c.send([HeadersFrame(3, data=request(), flags=flags)])
    c.wait(lambda c: 3 in c.ended)
    other = time.monotonic() - began
    c.wait(lambda c: 1 in c.resets, timeout=20)
    with c.lock:
        idle = c.resets[1][1] - c.last_data[1] if 1 in c.resets else None
    c.send([HeadersFrame(5, data=request(), flags=flags)])
    c.wait(lambda c: 5 in c.ended)
    c.report(streams=streams_of(c, (1, 3, 5)), other_seconds=round(other, 3), idle_seconds=idle and round(idle, 3))
    c.close()
    # A zero window from the start: the head, no byte of the body.
    z = Conn(settings={4: 0})
    began = time.monotonic()
    z.send([HeadersFrame(1, data=request(path=b"/bytes?n=100000"), flags=flags)])
    z.wait(lambda z: 1 in z.resets, timeout=20)
    with z.lock:
        idle = z.resets[1][1] - began if 1 in z.resets else None
    z.report(streams=streams_of(z, (1,)), idle_seconds=idle and round(idle, 3), zero_window=True)
    z.close()

def noread_flood():
    """Answers asked for and never read, then a PING flood: the proxy must still end the connection."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    flags = ["END_HEADERS", "END_STREAM"]
    frames = [PREFACE, SettingsFrame(0, settings={4: 16 << 20}).serialize(),
              WindowUpdateFrame(0, window_increment=16 << 20).serialize()]
    frames += [HeadersFrame(1 + 2 * i, data=request(path=b"/bytes?n=1000000"), flags=flags).serialize() for i in range(10)]
    s.sendall(b"".join(frames))
    # The answers fill the socket (peeked at, never read) before the flood begins.
    s.settimeout(10)
    while len(s.recv(65536, socket.MSG_PEEK)) < 2048:
        time.sleep(0.01)
    s.settimeout(0.2)
    began = time.monotonic()
    sent = 0
    closed = None
    while time.monotonic() - began < 20 and not stop.is_set():
        try:
            s.send(b"".join(PingFrame(0, opaque_data=(sent + k).to_bytes(8, "big")).serialize() for k in range(50)))
            sent += 50
        except socket.timeout:
            pass
        except OSError:
            closed = time.monotonic() - began
            break
        if sent >= 500:
            time.sleep(0.05)
    say(attack=attack, closed_seconds=closed and round(closed, 3), pings=sent)
    s.close()

ATTACKS = {
    "hpack_bomb": hpack_bomb, "hpack_bomb_repeat": hpack_bomb_repeat, "continuation_refused": continuation_refused,
    "zero_length_fields": zero_length_fields, "slow_read": slow_read, "noread_flood": noread_flood,
    "rapid_reset": rapid_reset, "continuation": continuation, "settings": settings, "ping": ping,
    "window_update": window_update, "priority": priority, "empty_data": empty_data, "empty_headers": empty_headers,
    "reset_flood": reset_flood,
}
"""#

    /// The script: the attacks above, those of other suites (each adds to
    /// `ATTACKS`), then the loop that runs one, round after round.
    static var script: String { attacks + "\n" + memoryAttacks + "\n" + runner }

    static let runner = #"""
say(started=attack)
run = ATTACKS[attack]
rounds = 0
while not stop.is_set() and rounds < int(sys.argv[3]):
    run()
    rounds += 1
"""#
}
