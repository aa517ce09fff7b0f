import Foundation
import HappyPathCore
import HappyPathIO
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// `happypath demo-upstream`: a small, deliberately unreliable service to try
/// the proxy against and to load-test it. Runs on its own event loop. Not
/// part of the proxy: the executable and the integration tests use it.
/// Its misbehaviour below HTTP (`/drop`, `/garbage`) is its own, on a
/// socket taken over from the HTTP server.
///
/// `@unchecked Sendable`: its `var`s are its loop's (requests arrive there,
/// and `start` sets `server` and `port` before the loop runs); tests reach
/// it from outside only through `hits` (atomic) and `throttle` (locked).
public final class DemoUpstream: HTTPServerDelegate, @unchecked Sendable {
    public static let endpoints: [(path: String, what: String)] = [
        ("/", "this index"),
        ("/healthz", "200 while running"),
        ("/ok", "200 with a small JSON body"),
        ("/status/{code}", "answers with that status, e.g. /status/503"),
        ("/flaky?fail=0.25&status=503", "fails the given fraction of requests with the given status"),
        ("/slow?ms=500&p=1", "answers after the given delay; with p below 1, only that share of answers is slow"),
        ("/drop", "closes the connection without answering"),
        ("/garbage", "answers with bytes that are not HTTP"),
        ("/echo", "JSON: method, target, headers, body length and FNV-1a hash"),
        ("/echo/raw", "the request body, byte for byte"),
        ("/bytes?n=1048576", "n bytes of body, streamed"),
        ("/_demo/stats", "requests served so far (health checks aside), as JSON"),
        ("/_demo/outage?ms=3000&status=503", "every other endpoint answers that status for that long"),
        ("/_demo/slower?factor=10&ms=5000", "/slow waits factor times its ms for that long (the whole upstream slower)"),
        ("/_demo/token?ttl=60", "POST: issues a bearer token valid for ttl seconds (OAuth2 JSON)"),
        ("/_demo/throttle?rps=200", "200 for up to rps requests per wall-clock second, 429 with Retry-After above"),
        ("/_demo/throttle/stats", "per second: throttle requests received and passed, and when the first 429 was, as JSON"),
        ("/private/...", "like the paths above, but needs a valid token from /_demo/token (else 401)"),
    ]

    fileprivate let loop: EventLoop
    private var server: HTTPServer!
    private var random = IdentifierGenerator()
    /// Loop thread only: an outage window, and the tokens issued with their expiry.
    private var outageUntil: Instant?
    private var outageStatus = 503
    /// `/_demo/slower`: /slow's delays are multiplied by `slowFactor` until then.
    private var slowerUntil: Instant?
    private var slowFactor = 1
    private var tokens: [String: Instant] = [:]
    private let clock = MonotonicClock()
    /// Requests served (health checks aside), for tests and load reports.
    public let hits = Atomic<Int>(0)
    /// `/_demo/throttle`: one counter for the process. Behind a lock rather
    /// than loop-only like the outage, so a test can read it from its own thread.
    public let throttle = Locked(DemoThrottle())
    public private(set) var port = 0

    public init(host: String = "127.0.0.1", port: Int) throws(SocketError) {
        loop = EventLoop()
        server = try HTTPServer(
            loop: loop, host: host, port: port, reusePort: false,
            limits: HTTPServerLimits(maxHeaderBytes: 64 * 1024, maxBodyBytes: 256 * 1024 * 1024, timeout: .seconds(60)),
            delegate: self)
        self.port = server.port
    }

    public func start() { loop.start(name: "demo-upstream") }

    private var stopped = false
    /// Streamed bodies in progress, owned here until they end.
    fileprivate var streamers: [ObjectIdentifier: BodyStreamer] = [:]

    /// Stops serving: bodies still streaming are cut, every connection
    /// closed, the loop ended and closed (nothing it ran is kept alive).
    public func stop() {
        guard !stopped else { return }
        stopped = true
        loop.execute { [self] in
            for streamer in Array(streamers.values) { streamer.cut() }
            server.close()
            loop.stop()
        }
        loop.join()
        loop.close()
    }

    /// Runs on the calling thread until the process ends.
    public func run() { loop.run() }

    // MARK: - Handling

    public func reject(_ request: HTTPRequest, reason: HTTP1Refusal) {
        request.reply(status: reason.status, headers: Self.json, body: "{\"error\":\"\(reason.rawValue)\"}\n")
    }

    static let json = [HTTPField(name: "Content-Type", value: "application/json")]

    public func serve(_ request: HTTPRequest) {
        var (path, query) = Router.split(target: request.target)
        let control = path.hasPrefix("/_demo/")
        if path != "/healthz" && !control { hits.wrappingAdd(1, ordering: .relaxed) }
        let params = Self.parameters(query)
        let now = clock.now()
        if !control, path != "/healthz", let until = outageUntil, now < until {
            return respond(request, status: outageStatus)
        }
        if path.hasPrefix("/private/") {
            let presented = request.header("Authorization").map { String($0.dropFirst("Bearer ".count)) } ?? ""
            guard let expiry = tokens[presented], now < expiry else {
                return request.reply(status: 401, headers: Self.json, body: "{\"error\":\"invalid_token\"}\n")
            }
            path = String(path.dropFirst("/private".count))
        }
        switch path {
        case "/_demo/outage":
            let ms = Int(params["ms"] ?? "") ?? 3000
            outageStatus = Int(params["status"] ?? "") ?? 503
            outageUntil = now + .milliseconds(ms)
            request.reply(status: 200, headers: Self.json, body: "{\"outage_ms\":\(ms),\"status\":\(outageStatus)}\n")
        case "/_demo/slower":
            // Bounded: a factor of 1 to 100, for at most an hour.
            let ms = min(3_600_000, max(0, Int(params["ms"] ?? "") ?? 5000))
            slowFactor = min(100, max(1, Int(params["factor"] ?? "") ?? 10))
            slowerUntil = now + .milliseconds(ms)
            request.reply(status: 200, headers: Self.json, body: "{\"slower_ms\":\(ms),\"factor\":\(slowFactor)}\n")
        case "/_demo/token":
            let ttl = Int(params["ttl"] ?? "") ?? 60
            let token = random.requestID() + random.requestID()
            tokens = tokens.filter { now < $0.value }
            tokens[token] = now + .seconds(ttl)
            request.reply(
                status: 200, headers: Self.json,
                body: "{\"access_token\":\"\(token)\",\"token_type\":\"Bearer\",\"expires_in\":\(ttl)}\n")
        case "/":
            let list = Self.endpoints.map { "    {\"path\": \(JSON.quote($0.path)), \"what\": \(JSON.quote($0.what))}" }
            request.reply(
                status: 200, headers: Self.json,
                body: "{\n  \"service\": \"happypath demo upstream\",\n  \"endpoints\": [\n" + list.joined(separator: ",\n")
                    + "\n  ]\n}\n")
        case "/healthz":
            request.reply(status: 200, headers: Self.json, body: "{\"status\":\"ok\"}\n")
        case "/_demo/throttle":
            let rps = max(0, Int(params["rps"] ?? "") ?? 100)
            let verdict = throttle.withLock { $0.arrived(rps: rps, nowMilliseconds: clock.wallMilliseconds()) }
            switch verdict {
            case .pass:
                request.reply(status: 200, headers: Self.json, body: "{\"ok\":true,\"rps\":\(rps)}\n")
            case let .throttled(seconds):
                request.reply(
                    status: 429, headers: Self.json + [HTTPField(name: "Retry-After", value: String(seconds))],
                    body: "{\"status\":429,\"rps\":\(rps)}\n")
            }
        case "/_demo/throttle/stats":
            request.reply(status: 200, headers: Self.json, body: throttle.withLock { $0.json })
        case "/_demo/stats":
            request.reply(status: 200, headers: Self.json, body: "{\"hits\":\(hits.load(ordering: .relaxed))}\n")
        case "/ok":
            request.reply(status: 200, headers: Self.json, body: "{\"ok\":true}\n")
        case "/flaky":
            let fail = Double(params["fail"] ?? "") ?? 0.25
            let status = Int(params["status"] ?? "") ?? 503
            if Double(random.next() % 1_000_000) / 1_000_000 < fail {
                respond(request, status: status)
            } else {
                request.reply(status: 200, headers: Self.json, body: "{\"ok\":true}\n")
            }
        case "/slow":
            var ms = Int(params["ms"] ?? "") ?? 500
            if let until = slowerUntil, now < until { ms = min(ms, 3_600_000) * slowFactor }
            // p: the chance that this answer is the slow one (a long tail); the rest answer at once.
            let p = Double(params["p"] ?? "") ?? 1
            guard p >= 1 || Double(random.next() % 1_000_000) / 1_000_000 < p else {
                return request.reply(status: 200, headers: Self.json, body: "{\"ok\":true,\"delayed_ms\":0}\n")
            }
            loop.schedule(after: .milliseconds(ms)) {
                request.reply(status: 200, headers: Self.json, body: "{\"ok\":true,\"delayed_ms\":\(ms)}\n")
            }
        case "/drop":
            Self.hangUp(request, saying: nil)
        case "/garbage":
            Self.hangUp(request, saying: "this is not HTTP at all\r\n\r\n")
        case "/echo":
            echo(request)
        case "/echo/raw":
            let body = request.takeBody()
            let type = request.header("Content-Type") ?? "application/octet-stream"
            streamBody(request, headers: [HTTPField(name: "Content-Type", value: type)], count: body.count) { offset, n, out in
                out.copyMemory(from: body.baseAddress! + offset, byteCount: n)
            }
        case "/bytes":
            let n = max(0, Int(params["n"] ?? "") ?? 1024)
            streamBody(request, headers: [HTTPField(name: "Content-Type", value: "application/octet-stream")], count: n) {
                offset, count, out in
                // Byte i of the body is i % 251: copied from a run of that
                // pattern (a byte at a time was the demo's bottleneck with
                // many large bodies at once).
                Self.bytesPattern.withUnsafeBytes { out.copyMemory(from: $0.baseAddress! + offset % 251, byteCount: count) }
            }
        default:
            if path.hasPrefix("/status/"), let code = Int(path.dropFirst("/status/".count)), (200...599).contains(code) {
                respond(request, status: code)
            } else {
                request.reply(
                    status: 404, headers: Self.json, body: "{\"error\":\"no such demo endpoint\",\"path\":\(JSON.quote(path))}\n")
            }
        }
    }

    /// Ends the connection without an HTTP answer: after writing `bytes`
    /// that are not HTTP, or (nil) nothing at all, so the client sees the
    /// connection end before any response.
    private static func hangUp(_ request: HTTPRequest, saying bytes: String?) {
        guard let socket = request.takeOverConnection() else { return }
        if var bytes {
            // A few bytes into a fresh socket's empty send buffer: one write takes them.
            _ = bytes.withUTF8 { Glibc.write(socket, $0.baseAddress, $0.count) }
        }
        shutdown(socket, Int32(SHUT_RDWR))
        Glibc.close(socket)
    }

    private func respond(_ request: HTTPRequest, status: Int) {
        if status == 204 || status == 304 {
            request.reply(status: status)
        } else {
            var headers = Self.json
            if status == 429 || status == 503 { headers.append(HTTPField(name: "Retry-After", value: "1")) }
            request.reply(status: status, headers: headers, body: "{\"status\":\(status)}\n")
        }
    }

    private func echo(_ request: HTTPRequest) {
        let body = request.takeBody()
        var headers: [String] = []
        request.forEachHeader { name, value in headers.append("[\(JSON.quote(name)),\(JSON.quote(value))]") }
        let hash = String(Self.fnv1a(UnsafeRawBufferPointer(start: body.baseAddress, count: body.count)), radix: 16)
        let json = """
            {"method":\(JSON.quote(request.method)),"target":\(JSON.quote(request.target)),\
            "headers":[\(headers.joined(separator: ","))],"body_bytes":\(body.count),"body_fnv1a64":"\(hash)"}

            """
        request.reply(status: 200, headers: Self.json, body: json)
    }

    /// Streams `count` bytes in 64 KiB pieces, each written after the
    /// previous one drained, so a huge body never sits in memory.
    private func streamBody(
        _ request: HTTPRequest, headers: [HTTPField], count: Int,
        fill: @escaping (_ offset: Int, _ count: Int, _ out: UnsafeMutableRawPointer) -> Void
    ) {
        for field in headers { request.addResponseHeader(field.name, field.value) }
        request.startReply(status: 200, contentLength: count)
        if request.method == "HEAD" { return request.endReply() }
        let streamer = BodyStreamer(demo: self, request: request, count: count, fill: fill)
        streamers[ObjectIdentifier(streamer)] = streamer
        streamer.next()
    }

    /// 0, 1, …, 250, 0, 1, … for one piece of a `/bytes` body from any offset.
    static let bytesPattern: [UInt8] = (0..<(251 + BodyStreamer.chunk)).map { UInt8($0 % 251) }

    /// FNV-1a, 64 bit: a cheap fingerprint for comparing bodies in tests.
    public static func fnv1a(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        return hash
    }

    static func parameters(_ query: String?) -> [String: String] {
        guard let query else { return [:] }
        var out: [String: String] = [:]
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            out[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
        }
        return out
    }
}

/// Writes one streamed demo body piece by piece. The demo owns it (its
/// `streamers`) until the body is written, the client leaves or the demo stops.
private final class BodyStreamer: HTTPRequestObserver, LoopEventTarget {
    static let chunk = 64 * 1024
    /// Alive: the demo's `streamers` holds this streamer until `end()`, and `stop()` cuts every
    /// streamer before it closes the server (whose delegate holds the demo until then).
    unowned let demo: DemoUpstream
    let request: HTTPRequest
    let count: Int
    let fill: (Int, Int, UnsafeMutableRawPointer) -> Void
    let scratch = UnsafeMutableRawPointer.allocate(byteCount: BodyStreamer.chunk, alignment: 16)
    var offset = 0
    var done = false
    var cleanup: LoopEvent?

    init(demo: DemoUpstream, request: HTTPRequest, count: Int, fill: @escaping (Int, Int, UnsafeMutableRawPointer) -> Void) {
        self.demo = demo
        self.request = request
        self.count = count
        self.fill = fill
        request.observer = self
    }

    deinit { scratch.deallocate() }

    /// Ends it, on the demo's loop.
    func cut() {
        cleanup?.recycle()
        cleanup = nil
        request.abort()
        end()
    }

    private func end() {
        done = true
        demo.streamers[ObjectIdentifier(self)] = nil
    }

    func next() {
        guard !done else { return }
        guard offset < count else {
            request.endReply()
            end()
            return
        }
        let n = min(Self.chunk, count - offset)
        fill(offset, n, scratch)
        offset += n
        request.send(UnsafeRawBufferPointer(start: scratch, count: n), notifyWhenDrained: true)
    }

    func requestOutputDrained(_ request: HTTPRequest) { next() }

    func requestClientClosed(_ request: HTTPRequest) {
        guard cleanup == nil else { return }
        let event = demo.loop.takeEvent(target: self)
        cleanup = event
        event.arm(after: .zero)
    }

    func loopEventFired(_ event: LoopEvent) { cut() }
}
