import HappyPathCore
import HappyPathIO
import Synchronization

/// The admin listener: `/healthz` and `/readyz`, on its own small loop so a
/// busy proxy worker never delays a health probe. Answers only its own paths.
final class AdminServer: HTTPServerDelegate {
    private let ready: ReadyFlag
    private(set) var server: HTTPServer!
    private var ids = IdentifierGenerator()

    init(loop: EventLoop, host: String, port: Int, ready: ReadyFlag) throws(SocketError) {
        self.ready = ready
        server = try HTTPServer(
            loop: loop, host: host, port: port, reusePort: false,
            limits: HTTPServerLimits(maxHeaderBytes: 16 * 1024, maxBodyBytes: 64 * 1024, timeout: .seconds(10)),
            delegate: self)
    }

    func serve(_ request: HTTPRequest) {
        let json = [HTTPField(name: "Content-Type", value: "application/json")]
        switch Router.split(target: request.target).path {
        case "/healthz":
            request.reply(status: 200, headers: json, body: "{\"status\":\"ok\"}\n")
        case "/readyz":
            if ready.value.load(ordering: .acquiring) {
                request.reply(status: 200, headers: json, body: "{\"status\":\"ready\"}\n")
            } else {
                request.reply(status: 503, headers: json, body: "{\"status\":\"not ready\"}\n")
            }
        default:
            ProblemResponder.respond(
                request,
                Problem(
                    .noRoute, requestID: ids.requestID(),
                    detail: "The admin listener serves /healthz and /readyz."))
        }
    }

    func reject(_ request: HTTPRequest, reason: RejectedRequest) {
        ProblemResponder.respond(
            request, ProblemResponder.problem(for: reason, requestID: ids.requestID(), limits: server.limits))
    }
}

/// Atomic<Bool> is not copyable; the admin server and the proxy share one through this box.
final class ReadyFlag: Sendable {
    let value = Atomic<Bool>(false)
}
