import HappyPathCore
import HappyPathIO
import Logging

/// One client request from arrival to answer: it sends the command upstream,
/// streams the response back, or renders the failure as a problem.
final class Exchange: UpstreamResponseHandler, HTTPRequestObserver, LoopEventTarget {
    /// Pause reading from upstream while this much is queued for a slow client.
    static let highWater = 1 << 20

    /// The worker retains every exchange in flight (`active`), so this can be unowned(unsafe).
    unowned(unsafe) let worker: ProxyWorker
    let request: HTTPRequest
    let route: RuntimeRoute
    let upstream: RuntimeUpstream
    var command: Command
    private var transfer: UpstreamTransfer?
    /// One pooled timer: the deadline for the response head, or (re-armed
    /// at zero) the deferred cleanup after the client hung up.
    private var timer: LoopEvent?
    private enum TimerUse: Int { case deadline, clientGone }
    private var status = 0
    private var responseStarted = false
    private var waitingForDrain = false
    private var done = false

    init(worker: ProxyWorker, request: HTTPRequest, route: RuntimeRoute, upstream: RuntimeUpstream, command: Command) {
        self.worker = worker
        self.request = request
        self.route = route
        self.upstream = upstream
        self.command = command
    }

    func start() {
        request.observer = self
        request.watchClientClose()
        sendTry()
    }

    private func sendTry() {
        let remaining = command.remaining(at: worker.clock.now())
        guard remaining > .zero else {
            return fail(Problem(.upstreamTimeout, requestID: command.requestID, detail: "The deadline passed before a try could start."))
        }
        // The deadline bounds the wait for the response head; a body that is
        // streaming may take longer (it is bounded by stalls, not by size).
        arm(.deadline, after: remaining)
        let endpoint = worker.endpoint(for: route.upstreamIndex)
        let method = command.method
        let sendsBody = command.body.count > 0 || method == "POST" || method == "PUT" || method == "PATCH"
        transfer = worker.client.start(
            UpstreamRequest(
                origin: endpoint.origin, target: endpoint.basePath + command.target, method: method,
                headers: command.headers, body: command.body, sendsBody: sendsBody,
                connectTimeout: min(upstream.connectTimeout, remaining), idleTimeout: worker.idleTimeout),
            handler: self)
    }

    // MARK: - UpstreamResponseHandler

    func upstreamStatus(_ status: Int) {
        self.status = status
        request.clearResponseHeaders()
    }

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if Self.isHopByHop(name) { return }
        request.addResponseHeader(name: name, value: value)
    }

    private func arm(_ use: TimerUse, after delay: Duration) {
        let event = timer ?? worker.loop.takeEvent(target: self)
        timer = event
        event.tag = use.rawValue
        event.arm(after: delay)
    }

    func loopEventFired(_ event: LoopEvent) {
        switch TimerUse(rawValue: event.tag) {
        case .deadline: deadlinePassed()
        case .clientGone: clientWentAway()
        case nil: break
        }
    }

    private func deadlinePassed() {
        guard !done, !responseStarted, let transfer else { return }
        worker.client.cancel(transfer)
        self.transfer = nil
        fail(problem(for: .timeout))
    }

    // MARK: - HTTPRequestObserver

    func requestClientClosed(_ request: HTTPRequest) {
        // Inside libevent's connection teardown: finish on the next pass.
        if !done { arm(.clientGone, after: .zero) }
    }

    func requestOutputDrained(_ request: HTTPRequest) {
        waitingForDrain = false
        transfer?.resume()
    }

    func upstreamHeadersComplete() {
        timer?.disarm()
        request.addResponseHeader("X-Request-Id", command.requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(command.attempt))
        request.startReply(status: status)
        responseStarted = true
    }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        if done { return true }  // client gone: discard
        if waitingForDrain { return false }
        if request.pendingOutput + bytes.count > Self.highWater {
            waitingForDrain = true
            request.send(bytes, notifyWhenDrained: true)
        } else {
            request.send(bytes)
        }
        return true
    }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        transfer = nil
        guard !done else { return }
        guard let failure else {
            request.endReply()
            return finish()
        }
        if responseStarted {
            // Part of the response is already with the client: the only honest
            // signal left is a broken connection.
            worker.logger.warning(
                "upstream failed mid-response",
                metadata: ["request_id": "\(command.requestID)", "upstream": "\(upstream.name)", "error": "\(failure)"])
            request.abort()
            return finish()
        }
        fail(problem(for: failure))
    }

    private func problem(for failure: UpstreamFailure) -> Problem {
        let id = command.requestID
        let attempts = command.attempt
        switch failure {
        case let .connectFailed(message):
            return Problem(.upstreamUnreachable, requestID: id, detail: message, attempts: attempts, upstream: upstream.name)
        case .timeout:
            return Problem(
                .upstreamTimeout, requestID: id,
                detail: "No response within the route's timeout of \(route.timeout.configText).", attempts: attempts,
                upstream: upstream.name)
        case let .reset(message):
            return Problem(
                .badGateway, requestID: id, detail: "The connection closed before a complete response: \(message)",
                attempts: attempts, upstream: upstream.name)
        case let .badResponse(message), let .other(message):
            return Problem(.badGateway, requestID: id, detail: message, attempts: attempts, upstream: upstream.name)
        }
    }

    private func fail(_ problem: Problem) {
        worker.logger.debug(
            "request failed",
            metadata: ["request_id": "\(problem.requestID)", "code": "\(problem.code)", "upstream": "\(upstream.name)"])
        ProblemResponder.respond(request, problem)
        finish()
    }

    private func finish() {
        done = true
        timer?.recycle()
        timer = nil
        worker.finished(self)
    }

    private func clientWentAway() {
        guard !done else { return }
        if let transfer { worker.client.cancel(transfer) }
        transfer = nil
        request.abort()
        finish()
    }

    /// The worker is shutting down: stop the try and drop the client.
    func abandon() {
        guard !done else { return }
        done = true
        timer?.recycle()
        timer = nil
        if let transfer { worker.client.cancel(transfer) }
        transfer = nil
        request.abort()
    }

    /// Hop-by-hop response headers, compared on raw bytes.
    static func isHopByHop(_ name: UnsafeRawBufferPointer) -> Bool {
        func equals(_ literal: StaticString) -> Bool {
            guard name.count == literal.utf8CodeUnitCount else { return false }
            let l = literal.utf8Start
            for i in 0..<name.count where name[i] | 0x20 != l[i] | 0x20 { return false }
            return true
        }
        switch name.count {
        case 2: return equals("te")
        case 7: return equals("trailer") || equals("upgrade")
        case 10: return equals("connection") || equals("keep-alive")
        case 17: return equals("transfer-encoding")
        default:
            guard name.count > 6 else { return false }
            return equals6(name, "proxy-")
        }
    }

    private static func equals6(_ name: UnsafeRawBufferPointer, _ prefix: StaticString) -> Bool {
        let p = prefix.utf8Start
        for i in 0..<prefix.utf8CodeUnitCount where name[i] | 0x20 != p[i] | 0x20 { return false }
        return true
    }
}
