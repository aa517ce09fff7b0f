import Foundation
import HappyPathCore
import HappyPathIO
import Logging
import Synchronization

/// A token endpoint and a protected resource on one real libevent server:
/// `/token` issues `tok-N` (or fails on demand); `/data` wants the latest
/// token and echoes the request body.
final class AuthTestServer: HTTPServerDelegate, @unchecked Sendable {
    struct State {
        var valid: String?
        var issued = 0
        var tokenStatus = 200
        var tokenBodies: [String] = []
        var refuseEverything = false
        /// The next this many token calls answer 503.
        var failNext = 0
        /// Issued tokens are this followed by a count.
        var tokenPrefix = "tok-"
        /// Token calls arrive (and are counted) but wait for
        /// `releaseTokenCalls()` before they are answered.
        var holdTokens = false
        /// Resource requests are answered with this status and a JSON dump
        /// of the request (every header, the body, a `Basic` credential
        /// decoded), the way a debugging upstream echoes what it got.
        var echoStatus: Int?
        /// Failed token calls answer with a JSON dump of the form they got.
        var echoTokenErrors = false
        /// Token answers carry a rotated refresh token: this followed by a count.
        var refreshPrefix: String?
        /// Token answers say this JSON text as `expires_in` (instead of 3600):
        /// `1e16`, `"Infinity"`, `0.0001`, as a misbehaving endpoint would.
        var expiresInJSON: String?
    }

    private let loop = EventLoop()
    private var server: HTTPServer!
    /// Token calls held unanswered (loop thread only).
    private var heldTokenCalls: [HTTPRequest] = []
    let state = Locked(State())
    var port: Int { server.port }

    init() throws {
        server = try HTTPServer(
            loop: loop, host: "127.0.0.1", port: 0, reusePort: false,
            limits: HTTPServerLimits(maxHeaderBytes: 65536, maxBodyBytes: 16 << 20, timeout: .seconds(30)), delegate: self)
        loop.start(name: "auth-test")
    }

    func stop() {
        loop.execute { [self] in
            server.close()
            loop.stop()
        }
        loop.join()
        loop.close()
    }

    var tokenCalls: Int { state.withLock { $0.tokenBodies.count } }
    func invalidate() { state.withLock { $0.valid = nil } }

    /// Answers the token calls held so far (as the state says now) and stops holding them.
    func releaseTokenCalls() {
        state.withLock { $0.holdTokens = false }
        loop.execute { [self] in
            let waiting = heldTokenCalls
            heldTokenCalls = []
            for request in waiting { answerToken(request) }
        }
    }

    /// JSON (as Foundation writes it: `/` comes out as `\/`) of `object`.
    static func json(_ object: Any) -> String {
        String(decoding: (try? JSONSerialization.data(withJSONObject: object)) ?? Data("{}".utf8), as: UTF8.self)
    }

    private func answerToken(_ request: HTTPRequest, form: String = "") {
        let json = [HTTPField(name: "Content-Type", value: "application/json")]
        let echo = state.withLock { $0.echoTokenErrors }
        let (status, token, refresh) = state.withLock { s -> (Int, String?, String?) in
            if s.failNext > 0 {
                s.failNext -= 1
                return (503, nil, nil)
            }
            guard s.tokenStatus == 200 else { return (s.tokenStatus, nil, nil) }
            s.issued += 1
            s.valid = "\(s.tokenPrefix)\(s.issued)"
            return (200, s.valid, s.refreshPrefix.map { "\($0)\(s.issued)" })
        }
        if let token, let raw = state.withLock({ $0.expiresInJSON }) {
            request.reply(
                status: 200, headers: json,
                body: #"{"access_token":"\#(token)","token_type":"Bearer","expires_in":\#(raw)}"#)
        } else if let token {
            var answer: [String: Any] = ["access_token": token, "token_type": "Bearer", "expires_in": 3600]
            if let refresh { answer["refresh_token"] = refresh }
            request.reply(status: 200, headers: json, body: Self.json(answer))
        } else if echo {
            // A token endpoint that says what it got, client secret and all.
            request.reply(
                status: status, headers: json,
                body: Self.json(["error": "invalid_grant", "error_description": "refused: \(form)", "received": form]))
        } else {
            request.reply(status: status, headers: json, body: #"{"error":"unavailable"}"#)
        }
    }

    func serve(_ request: HTTPRequest) {
        let path = Router.split(target: request.target).path
        let body = request.takeBody()
        let json = [HTTPField(name: "Content-Type", value: "application/json")]
        switch path {
        case "/token":
            let hold = state.withLock { s -> Bool in
                s.tokenBodies.append(String(decoding: body.bytes, as: UTF8.self))
                return s.holdTokens
            }
            if hold { heldTokenCalls.append(request) } else { answerToken(request, form: String(decoding: body.bytes, as: UTF8.self)) }
        case "/healthz":
            request.reply(status: 200)
        default:
            if let status = state.withLock({ $0.echoStatus }) {
                var headers: [String: String] = [:]
                request.forEachHeader { name, value in headers[name] = value }
                var dump: [String: Any] = ["headers": headers, "body": String(decoding: body.bytes, as: UTF8.self)]
                if let auth = request.header("Authorization"), auth.hasPrefix("Basic "),
                    let data = Data(base64Encoded: String(auth.dropFirst(6)))
                {
                    dump["basic"] = String(decoding: data, as: UTF8.self)
                }
                return request.reply(status: status, headers: json, body: Self.json(dump))
            }
            let ok = state.withLock { s in
                !s.refuseEverything && s.valid != nil && request.header("Authorization") == "Bearer \(s.valid!)"
            }
            if ok {
                request.reply(status: 200, headers: json, body: String(decoding: body.bytes, as: UTF8.self))
            } else {
                request.reply(status: 401, headers: json, body: #"{"error":"invalid_token"}"#)
            }
        }
    }

    func reject(_ request: HTTPRequest, reason: HTTP1Refusal) { request.reply(status: reason.status) }
}

/// Collects every log line (message and metadata), to check what never appears in logs.
final class CapturedLog: @unchecked Sendable {
    let lines = Locked<[String]>([])
    var text: String { lines.withLock { $0.joined(separator: "\n") } }

    var logger: Logger {
        Logger(label: "test") { _ in CapturingHandler(sink: self) }
    }

    struct CapturingHandler: LogHandler {
        let sink: CapturedLog
        var logLevel: Logger.Level = .trace
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let meta = (event.metadata ?? [:]).map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            sink.lines.withLock { $0.append("\(event.level) \(event.message) \(meta)") }
        }
    }
}
