import Foundation
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging

/// One client request from arrival to answer: the seed pattern's command in
/// flight. It sends the command upstream, classifies each try's outcome and
/// hands failures to their listener — retry (server errors, timeouts,
/// resets), reachability (unreachable, or circuit open with `while_open:
/// park`) — until it can stream a response back or render one problem.
final class Exchange: UpstreamResponseHandler, HTTPRequestObserver, LoopEventTarget {
    /// Pause reading from upstream while this much is queued for a slow client.
    static let highWater = 1 << 20

    /// The worker retains every exchange in flight (`active`), so this can be unowned(unsafe).
    unowned(unsafe) let worker: ProxyWorker
    let request: HTTPRequest
    let route: RuntimeRoute
    let upstream: RuntimeUpstream
    let guardian: UpstreamGuard
    private(set) var command: Command
    private let hasIdempotencyKey: Bool
    private var transfer: UpstreamTransfer?
    /// One pooled timer, used for one thing at a time (see `TimerUse`).
    private var timer: LoopEvent?
    private enum TimerUse: Int {
        /// The try's limit: per_try_timeout, or the deadline if sooner.
        case tryLimit
        /// Waiting out a backoff before the next try.
        case backoff
        /// Parked: park_for (or the deadline) ran out.
        case parkExpiry
        /// The client hung up: clean up on the next loop pass.
        case clientGone
        /// Waiting in the upstream's queue for a connection slot (bounded by the deadline).
        case queued
    }
    private var holdsSlot = false
    private var isQueued = false
    private var pendingProbe = false
    /// The response head went to the client: from here on only a broken
    /// connection can signal a failure.
    private var replyStarted = false
    /// The upstream's response head arrived whole (libcurl may report a
    /// response whose head was cut short by a close as complete).
    private var headComplete = false
    /// The client hung up; set at once, acted on at the next step (see `clientGoneCheck`).
    private var clientClosed = false
    /// Tries actually sent: the command's attempt number follows it.
    private var triesSent = 0
    private var status = 0
    private var mode = Mode.waiting
    private enum Mode {
        case waiting
        /// The response goes to the client as it arrives.
        case streaming
        /// An error answer (4xx, 5xx): held back while the listeners decide;
        /// its first 16 KiB are kept for `upstream_body` and mappings.
        case holding
    }
    /// The try's response head as checked so far: its framing is rewritten
    /// by the proxy, never forwarded as it came (see `ResponseFraming`).
    private var framing = ResponseFraming()
    /// The upstream's `Connection` values: the fields they name are its own
    /// hop-by-hop fields and are dropped.
    private var upstreamConnection: [UInt8] = []
    private var heldBody: [UInt8] = []
    private var heldBodyComplete = true
    private var retryAfter: String?
    private var endpointIndex = -1
    private var isProbe = false
    private var history: [String] = []
    private var lastFailure: UpstreamFailure?
    private var waitingForDrain = false
    private(set) var parked: ParkReason?
    /// For the access log and metrics.
    let startedAt: Instant
    private(set) var finalStatus = 0
    private(set) var finalCode = "OK"
    private(set) var bytesOut = 0
    private var parkDeadline: Instant?
    private var done = false

    enum ParkReason: String, CaseIterable { case unreachable, circuitOpen = "circuit_open", auth }
    /// The token this try carries, and whether the command already waited for a refresh.
    private var authToken: Token?
    private var refreshedOnce = false
    private var tokens: TokenSource? { guardian.tokens }

    init(
        worker: ProxyWorker, request: HTTPRequest, route: RuntimeRoute, upstream: RuntimeUpstream,
        guardian: UpstreamGuard, command: Command
    ) {
        self.worker = worker
        self.request = request
        self.route = route
        self.upstream = upstream
        self.guardian = guardian
        self.command = command
        startedAt = worker.clock.now()
        hasIdempotencyKey = command.headers.contains("idempotency-key")
    }

    func start() {
        request.observer = self
        guardian.recordRequest(at: worker.clock.now())
        admitAndSend()
    }

    // MARK: - Trying

    /// Deadline → reachability → circuit breaker → upstream try.
    private func admitAndSend() {
        if clientClosed { return clientWentAway() }
        let now = worker.clock.now()
        let remaining = command.remaining(at: now)
        guard remaining > .zero else { return fail(timeoutProblem()) }
        if !guardian.reachable.load(ordering: .relaxed) {
            return park(.unreachable)
        }
        // Auth listener: a token to inject, or wait for the single refresh.
        if let tokens {
            switch tokens.use(at: now) {
            case let .use(token):
                authToken = token
            case let .useAndRefresh(token):
                authToken = token
                worker.startRefresh(guardian: guardian)
            case let .wait(start):
                if start { worker.startRefresh(guardian: guardian) }
                return park(.auth)
            }
        }
        let (admission, transition) = guardian.admit(at: now)
        if transition != nil { worker.circuitChanged(guardian: guardian) }
        switch admission {
        case .allow, .probe:
            // Concurrency limit: a slot, a place in the bounded queue, or OVERLOADED.
            let probe = admission == .probe
            switch worker.acquireSlot(self, guardian: guardian) {
            case .acquired:
                holdsSlot = true
                send(probe: probe, remaining: remaining)
            case .queued:
                isQueued = true
                pendingProbe = probe
                arm(.queued, after: remaining)
            case .full:
                if probe { abandonProbe() }
                var p = problem(
                    .overloaded, detail: "'\(upstream.name)' has max_connections tries in flight and as many waiting.")
                p.retryAfterSeconds = 1
                fail(p)
            }
        case let .reject(retryAfter):
            if upstream.whileOpen == .park, route.parkFor > .zero {
                worker.scheduleProbe(guardian: guardian, after: retryAfter)
                return park(.circuitOpen)
            }
            var p = problem(.circuitOpen, detail: "The circuit breaker for '\(upstream.name)' is open after repeated failures.")
            p.retryAfterSeconds = Int((retryAfter.nanoseconds + 999_999_999) / 1_000_000_000)
            fail(p)
        }
    }

    /// The worker hands over a freed connection slot.
    func slotGranted() {
        guard isQueued, !done else { return worker.releaseSlot(guardian: guardian) }
        isQueued = false
        holdsSlot = true
        timer?.disarm()
        if clientClosed {
            if pendingProbe { abandonProbe() }
            return clientWentAway()
        }
        let remaining = command.remaining(at: worker.clock.now())
        guard remaining > .zero else {
            if pendingProbe { abandonProbe() }
            return fail(timeoutProblem())
        }
        send(probe: pendingProbe, remaining: remaining)
    }

    private func releaseSlot() {
        if holdsSlot {
            holdsSlot = false
            worker.releaseSlot(guardian: guardian)
        }
        if isQueued {
            isQueued = false
            worker.leaveQueue(self, guardian: guardian)
        }
    }

    private func send(probe: Bool, remaining: Duration) {
        if triesSent > 0 { command = command.nextAttempt() }
        triesSent += 1
        isProbe = probe
        headComplete = false
        status = 0
        mode = .waiting
        retryAfter = nil
        framing = ResponseFraming()
        upstreamConnection.removeAll(keepingCapacity: true)
        arm(.tryLimit, after: min(route.retry.configuration.perTryTimeout, remaining))
        // A retry prefers another endpoint than the one that just failed;
        // ejected endpoints are skipped.
        let count = upstream.endpoints.count
        let preferred = endpointIndex < 0 ? worker.nextEndpointIndex(for: guardian, count: count) : (endpointIndex + 1) % count
        endpointIndex = count > 1 ? guardian.pickEndpoint(preferred: preferred, at: worker.clock.now()) : preferred
        let endpoint = upstream.endpoints[endpointIndex]
        let method = command.method
        let sendsBody = command.body.count > 0 || method == "POST" || method == "PUT" || method == "PATCH"
        var credentials: HTTPField?
        if let authToken, let tokens { credentials = HTTPField(name: tokens.header, value: authToken.headerValue) }
        transfer = worker.client.start(
            UpstreamRequest(
                origin: endpoint.origin, target: endpoint.basePath + command.target, method: method,
                headers: command.headers, replacing: credentials, body: command.body, sendsBody: sendsBody,
                connectTimeout: min(upstream.connectTimeout, remaining), idleTimeout: worker.idleTimeout),
            handler: self)
    }

    // MARK: - UpstreamResponseHandler

    func upstreamStatus(_ status: Int) {
        self.status = status
        if status >= 400 || route.retry.configuration.statuses.contains(status) {
            mode = .holding
            heldBody.removeAll(keepingCapacity: true)
            heldBodyComplete = true
        } else {
            mode = .streaming
            request.clearResponseHeaders()
        }
    }

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        // Content-Length and Transfer-Encoding are the proxy's to write, and
        // a malformed field fails the head (reported when it is complete).
        guard framing.add(name: name, value: value) else { return }
        if HopByHop.isHopByHop(name) {
            if HTTPBytes.equals(name, "connection") {
                // Kept only if it names fields: `keep-alive` and `close`
                // (the usual values) name none.
                var namesFields = false
                forEachListElement(value) { token in
                    if !HTTPBytes.equals(token, "keep-alive"), !HTTPBytes.equals(token, "close") { namesFields = true }
                }
                guard namesFields else { return }
                if !upstreamConnection.isEmpty { upstreamConnection.append(UInt8(ascii: ",")) }
                upstreamConnection.append(contentsOf: value)
            }
            return
        }
        switch mode {
        case .streaming:
            request.addResponseHeader(name: name, value: value)
        case .holding:
            if HTTPBytes.equals(name, "retry-after") {
                retryAfter = String(decoding: value, as: UTF8.self)
            }
        case .waiting: break
        }
    }

    func upstreamHeadersComplete() -> String? {
        let length: Int?
        switch framing.verdict() {
        case let .failure(error): return error.message  // a failed try: BAD_GATEWAY once the retry rules give up
        case let .success(announced): length = announced
        }
        headComplete = true
        guard mode == .streaming else { return nil }
        if !upstreamConnection.isEmpty {
            upstreamConnection.withUnsafeBytes { request.removeResponseHeaders(nominatedBy: $0) }
        }
        replyStarted = true
        timer?.disarm()  // a body already streaming is bounded by stalls, not the deadline
        request.addResponseHeader("X-Request-Id", command.requestID)
        request.addResponseHeader("X-Happypath-Attempts", String(command.attempt))
        request.startReply(status: status, contentLength: length)
        return nil
    }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        if mode == .holding {
            let room = ErrorMapper.maxBody - heldBody.count
            if bytes.count > room { heldBodyComplete = false }
            if room > 0 { heldBody.append(contentsOf: bytes.prefix(room)) }
            return true
        }
        if done || mode != .streaming { return true }  // client gone
        if waitingForDrain { return false }
        bytesOut += bytes.count
        if request.pendingOutput + bytes.count > Self.highWater {
            waitingForDrain = true
            request.send(bytes, notifyWhenDrained: true)
        } else {
            request.send(bytes)
        }
        return true
    }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        var failure = failure
        if failure == nil, !headComplete { failure = .reset("the connection closed inside the response head") }
        transfer = nil
        releaseSlot()
        guard !done else { return }
        let now = worker.clock.now()
        if replyStarted {
            let outcome: Outcome = failure == nil ? .success(status: status) : .reset
            report(outcome, at: now)
            finalStatus = status
            finalCode = failure == nil ? "OK" : "TRUNCATED"
            if failure == nil {
                request.endReply()
            } else {
                // Part of the response is already with the client: the only
                // honest signal left is a broken connection.
                worker.logger.warning(
                    "upstream failed mid-response",
                    metadata: ["request_id": "\(command.requestID)", "upstream": "\(upstream.name)", "error": "\(failure!)"])
                request.abort()
            }
            return finish()
        }
        let outcome: Outcome
        if let failure {
            lastFailure = failure
            switch failure {
            case .connectFailed: outcome = .unreachable
            case .timeout: outcome = .timeout
            case .reset, .badResponse, .other: outcome = .reset
            }
        } else if let authToken, let tokens, tokens.refreshOn.contains(status) {
            // Auth listener: the upstream refused the token.
            report(.clientError(status: status), at: now)
            history.append(String(status))
            if refreshedOnce {
                return fail(authProblem("The upstream refused a freshly refreshed token (HTTP \(status))."))
            }
            refreshedOnce = true
            switch tokens.refused(generation: authToken.generation) {
            case .retryWith:
                return admitAndSend()
            case let .wait(start):
                if start { worker.startRefresh(guardian: guardian) }
                return park(.auth)
            }
        } else if status < 500 && !route.retry.configuration.statuses.contains(status) {
            // A 4xx: the upstream is healthy and answered; normalize it.
            report(.clientError(status: status), at: now)
            history.append(String(status))
            return fail(upstreamProblem())
        } else {
            lastFailure = nil
            outcome = .serverError(status: status)
        }
        tryFailed(outcome, at: now)
    }

    /// The upstream's own error answer as a problem (route and upstream
    /// `errors:` mappings first, then the built-in code for its status).
    private func upstreamProblem() -> Problem {
        var base = problem(.upstreamUnavailable, detail: "")
        base.retryAfterSeconds = retryAfterSeconds
        var p = ErrorMapper.problem(
            status: status, body: heldBody, complete: heldBodyComplete, mappings: route.errors, base: base)
        if p.detail?.isEmpty ?? true {
            p.detail = history.count > 1 ? attemptsSummary : "The upstream answered \(status)."
        }
        return p
    }

    // MARK: - Listeners

    /// Broadcasts the failed try's outcome to the listener for its kind.
    /// One try's result to everything that counts it: metrics, the breaker,
    /// the endpoint's ejection count. A probe's result also decides what the
    /// lot does next: replay everything (closed) or probe again later (open).
    private func report(_ outcome: Outcome, at now: Instant) {
        worker.metrics.upstreamTry(upstream: upstream.name, outcome: outcome.metricLabel)
        let transition = guardian.record(outcome, probe: isProbe, at: now)
        guardian.recordEndpoint(endpointIndex, failure: outcome.isFailure, at: now)
        if transition != nil || isProbe {
            switch guardian.breakerState {
            case .closed: worker.circuitChanged(guardian: guardian)
            case let .open(until) where upstream.whileOpen == .park:
                worker.scheduleProbe(guardian: guardian, after: until - now)
            default: break
            }
        }
        isProbe = false  // reported once
    }

    /// A probe admitted by the breaker will not be sent: free its place and
    /// let the lot send another.
    private func abandonProbe() {
        guardian.probeAbandoned()
        isProbe = false
        pendingProbe = false
        if upstream.whileOpen == .park { worker.scheduleProbe(guardian: guardian, after: .zero) }
    }

    private func tryFailed(_ outcome: Outcome, at now: Instant) {
        timer?.disarm()
        let wasProbe = isProbe
        if case .badResponse? = lastFailure { history.append("invalid response") } else { history.append(outcome.summary) }
        report(outcome, at: now)
        let remaining = command.remaining(at: now)
        // A failed half-open probe re-opened the breaker: with `while_open:
        // park` the probe waits with the others instead of spending its
        // retries against an upstream that is known to be down.
        if wasProbe, upstream.whileOpen == .park, route.parkFor > .zero, case .open = guardian.breakerState {
            return park(.circuitOpen)
        }
        if outcome == .unreachable {
            // Reachability listener: another endpoint first, then park.
            if upstream.endpoints.count > 1, command.attempt < min(route.retry.configuration.attempts, upstream.endpoints.count) {
                return admitAndSend()
            }
            if route.parkFor > .zero {
                guardian.suspect.store(true, ordering: .relaxed)
                return park(.unreachable)
            }
            return fail(finalProblem(outcome))
        }
        // Retry listener.
        let decision = route.retry.decide(
            RetryPolicy.Failure(
                outcome: outcome, attempt: command.attempt, method: command.method, hasIdempotencyKey: hasIdempotencyKey,
                neverSent: false,
                retryAfter: retryAfter.flatMap { RetryAfter.parse($0, nowUnixSeconds: Int64(Date().timeIntervalSince1970)) }),
            remaining: remaining, random: Double(worker.ids.next() % 1_000_000) / 1_000_000,
            budget: { guardian.withdrawRetry(at: now) })
        switch decision {
        case let .retry(after: delay):
            worker.metrics.retry(upstream: upstream.name)
            arm(.backoff, after: delay)
        case .giveUp:
            fail(finalProblem(outcome))
        }
    }

    /// Parks the command until the upstream is reachable again (or its
    /// circuit closes); every parked command is replayed then.
    private func park(_ reason: ParkReason) {
        let now = worker.clock.now()
        if parkDeadline == nil { parkDeadline = min(now + route.parkFor, command.deadline) }
        let wait = parkDeadline! - now
        guard wait > .zero else { return fail(parkExpiredProblem(reason)) }
        guard worker.park(self, reason: reason) else {
            return fail(
                problem(.overloaded, detail: "Too many requests are waiting for unavailable upstreams (limits.max_parked)."))
        }
        parked = reason
        arm(.parkExpiry, after: wait)
    }

    /// The token refresh this command waited for failed.
    func authFailed(_ reason: String) {
        guard parked == .auth, !done else { return }
        worker.unpark(self)
        parked = nil
        fail(authProblem("The token refresh failed: \(reason)."))
    }

    private func authProblem(_ detail: String) -> Problem {
        problem(.authFailed, detail: detail)
    }

    /// Called by the worker when the upstream recovered.
    func replay() {
        guard parked != nil, !done else { return }
        parked = nil
        timer?.disarm()
        admitAndSend()
    }

    // MARK: - Timers

    private func arm(_ use: TimerUse, after delay: Duration) {
        let event = timer ?? worker.loop.takeEvent(target: self)
        timer = event
        event.tag = use.rawValue
        event.arm(after: delay)
    }

    func loopEventFired(_ event: LoopEvent) {
        switch TimerUse(rawValue: event.tag) {
        case .tryLimit:
            guard !done, !replyStarted, let transfer else { return }
            worker.client.cancel(transfer)
            self.transfer = nil
            releaseSlot()
            let now = worker.clock.now()
            if command.remaining(at: now) <= .zero {
                history.append("timeout")
                report(.timeout, at: now)
                return fail(timeoutProblem())
            }
            lastFailure = .timeout
            tryFailed(.timeout, at: now)
        case .backoff:
            if !done { admitAndSend() }
        case .parkExpiry:
            guard let reason = parked, !done else { return }
            worker.unpark(self)
            parked = nil
            // Past park_for or the deadline: the cause was reachability, so say that.
            fail(parkExpiredProblem(reason))
        case .clientGone:
            clientWentAway()
        case .queued:
            guard isQueued, !done else { return }
            releaseSlot()
            if pendingProbe { abandonProbe() }
            fail(timeoutProblem())
        case nil:
            break
        }
    }

    // MARK: - HTTPRequestObserver

    func requestClientClosed(_ request: HTTPRequest) {
        // Inside libevent's connection teardown: finish on the next pass.
        clientClosed = true
        if !done { arm(.clientGone, after: .zero) }
    }

    func requestOutputDrained(_ request: HTTPRequest) {
        waitingForDrain = false
        transfer?.resume()
    }

    // MARK: - Answers

    private func problem(_ code: ProblemCode, detail: String) -> Problem {
        Problem(code, requestID: command.requestID, detail: detail, attempts: command.attempt, upstream: upstream.name)
    }

    private func timeoutProblem() -> Problem {
        let tries = history.isEmpty ? "" : " (" + attemptsSummary + ")"
        return problem(.upstreamTimeout, detail: "No response within the route's timeout of \(route.timeout.configText)\(tries).")
    }

    private var attemptsSummary: String {
        "\(history.count) attempt\(history.count == 1 ? "" : "s") failed: " + history.joined(separator: ", ")
    }

    private func parkExpiredProblem(_ reason: ParkReason) -> Problem {
        switch reason {
        case .unreachable:
            var p = problem(
                .upstreamUnreachable,
                detail: "'\(upstream.name)' could not be reached within \(route.parkFor.configText)"
                    + (lastFailure.map { ": \($0.message)" } ?? "."))
            p.retryAfterSeconds = 5
            return p
        case .auth:
            return authProblem("No valid token within \(route.parkFor.configText): the token endpoint did not answer in time.")
        case .circuitOpen:
            var p = problem(
                .circuitOpen, detail: "The circuit breaker for '\(upstream.name)' stayed open for \(route.parkFor.configText).")
            p.retryAfterSeconds = 5
            return p
        }
    }

    /// The error after the retry listener gave up on `outcome`.
    private func finalProblem(_ outcome: Outcome) -> Problem {
        switch outcome {
        case .unreachable:
            return problem(.upstreamUnreachable, detail: lastFailure?.message ?? "The upstream could not be reached.")
        case .timeout:
            return timeoutProblem()
        case .serverError:
            return upstreamProblem()
        case .reset:
            if case let .badResponse(message)? = lastFailure {
                return problem(.badGateway, detail: history.count == 1 ? message : attemptsSummary + " (\(message))")
            }
            fallthrough
        default:
            var p = problem(.upstreamUnavailable, detail: attemptsSummary)
            p.retryAfterSeconds = retryAfterSeconds
            return p
        }
    }

    private var retryAfterSeconds: Int? {
        guard let retryAfter, let d = RetryAfter.parse(retryAfter, nowUnixSeconds: Int64(Date().timeIntervalSince1970)) else {
            return nil
        }
        return Int((d.nanoseconds + 999_999_999) / 1_000_000_000)
    }

    private func fail(_ problem: Problem) {
        worker.logger.debug(
            "request failed",
            metadata: ["request_id": "\(problem.requestID)", "code": "\(problem.code)", "upstream": "\(upstream.name)"])
        finalStatus = problem.status
        finalCode = problem.code
        bytesOut = ProblemResponder.respond(request, problem)
        finish()
    }

    private func finish() {
        done = true
        releaseSlot()
        if parked != nil {
            worker.unpark(self)
            parked = nil
        }
        timer?.recycle()
        timer = nil
        worker.finished(self)
    }

    private func clientWentAway() {
        guard !done else { return }
        if let transfer {
            worker.client.cancel(transfer)
            if isProbe { abandonProbe() }
        } else if isQueued, pendingProbe {
            abandonProbe()
        }
        transfer = nil
        releaseSlot()
        finalStatus = 499  // nginx's "client closed request"
        finalCode = "CLIENT_CLOSED"
        request.abort()
        finish()
    }

    /// Drain timed out: answer now. A response already streaming is cut;
    /// anything else gets a retryable error (another instance can serve it).
    func answerNow() {
        guard !done else { return }
        if replyStarted {
            if let transfer { worker.client.cancel(transfer) }
            transfer = nil
            releaseSlot()
            finalCode = "TRUNCATED"
            request.abort()
            return finish()
        }
        if let transfer { worker.client.cancel(transfer) }
        transfer = nil
        releaseSlot()
        if parked != nil {
            worker.unpark(self)
            parked = nil
        }
        var p = problem(.upstreamUnavailable, detail: "The proxy is shutting down; try again.")
        p.retryAfterSeconds = 1
        fail(p)
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
}

extension UpstreamFailure {
    var message: String {
        switch self {
        case let .connectFailed(m), let .reset(m), let .badResponse(m), let .other(m): m
        case .timeout: "timeout"
        }
    }
}
