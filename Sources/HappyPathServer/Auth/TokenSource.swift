import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Logging
import Synchronization

/// One upstream's credentials, shared by every worker: the token state
/// machine behind a lock, and what a refresh needs. Every credential here
/// (configured, rotated or obtained) is a `Secret`; it is revealed only to
/// build the token request's body and the injected header.
final class TokenSource: Sendable {
    let settings: AuthSettings
    let upstreamName: String
    private let state: Locked<TokenStateMachine>
    /// oauth2_refresh_token: the current refresh token (rotated by the server).
    private let refreshToken: Locked<Secret?>

    init(settings: AuthSettings, upstreamName: String) {
        self.settings = settings
        self.upstreamName = upstreamName
        var initial: Token?
        if settings.kind == .static, let value = settings.value {
            let header = settings.scheme.map { Secret("\($0) \(value.reveal)") } ?? value
            initial = Token(credential: header, expiresAt: nil, generation: 1)
        }
        state = Locked(TokenStateMachine(refreshAhead: settings.refreshAhead, initial: initial))
        refreshToken = Locked(settings.refreshToken)
    }

    var header: String { settings.header }
    var refreshOn: [Int] { settings.refreshOn }

    func use(at now: Instant) -> TokenStateMachine.Use { state.withLock { $0.use(at: now) } }
    /// The upstream refused the credential of `generation`. A static
    /// credential cannot be refreshed: it stays in use for later requests
    /// (the upstream may take it again), and the refused request waits for
    /// a refresh that fails at once (`TokenRefresh`), so it gets
    /// AUTH_FAILED instead of waiting out `park_for`.
    func refused(generation: Int) -> TokenStateMachine.Refusal {
        if settings.kind == .static { return .wait(start: true) }
        return state.withLock { $0.refused(generation: generation) }
    }
    func succeeded(_ response: TokenResponse, at now: Instant) {
        let scheme = settings.scheme ?? (response.tokenType.map { $0.lowercased() == "bearer" ? "Bearer" : $0 } ?? "Bearer")
        if let rotated = response.refreshToken { refreshToken.withLock { $0 = rotated } }
        let credential = Secret("\(scheme) \(response.accessToken.reveal)")
        state.withLock { _ = $0.succeeded(credential: credential, expiresIn: response.expiresIn, at: now) }
    }
    func failed() { state.withLock { $0.failed() } }
    func reserveRequest(at now: Instant) -> Duration { state.withLock { $0.reserveRequest(at: now) } }
    func expiresIn(at now: Instant) -> Duration? { state.withLock { $0.expiresIn(at: now) } }

    /// Every credential this upstream has been or may be sent, for taking
    /// them out of a problem body (`SecretScrubber`): the configured ones
    /// (static value, client secret, refresh token, login body and its
    /// fields), the rotated refresh token, the token held now and `sent`, the
    /// one the failed try carried (it may be older than the one held now).
    /// Built on the error path only.
    func scrubber(sent: Token?) -> SecretScrubber {
        let s = settings
        var secrets = [s.value, s.clientSecret, s.refreshToken, s.loginBody].compactMap { $0 }
        if let rotated = refreshToken.withLock({ $0 }) { secrets.append(rotated) }
        if let held = state.withLock({ $0.token }) { secrets.append(held.credential) }
        if let sent { secrets.append(sent.credential) }
        let pieces = s.loginBody.map { SecretScrubber.values(inBody: $0.reveal) } ?? []
        return SecretScrubber(secrets, pieces: pieces)
    }

    /// The token request for this kind: where, and the body (a secret: it
    /// carries the client secret, refresh token or password).
    func tokenRequest() -> (url: String, contentType: String, body: Secret)? {
        let s = settings
        switch s.kind {
        case .none, .static:
            return nil
        case .oauth2ClientCredentials:
            var fields = [
                ("grant_type", "client_credentials"), ("client_id", s.clientID ?? ""),
                ("client_secret", s.clientSecret?.reveal ?? ""),
            ]
            if let scope = s.scope { fields.append(("scope", scope)) }
            if let audience = s.audience { fields.append(("audience", audience)) }
            return (s.tokenURL ?? "", "application/x-www-form-urlencoded", Secret(FormEncoding.encode(fields)))
        case .oauth2RefreshToken:
            let current = refreshToken.withLock { $0 }
            var fields = [("grant_type", "refresh_token"), ("refresh_token", current?.reveal ?? "")]
            if let id = s.clientID { fields.append(("client_id", id)) }
            if let secret = s.clientSecret { fields.append(("client_secret", secret.reveal)) }
            if let scope = s.scope { fields.append(("scope", scope)) }
            return (s.tokenURL ?? "", "application/x-www-form-urlencoded", Secret(FormEncoding.encode(fields)))
        case .login:
            return (s.loginURL ?? "", s.loginContentType ?? "application/json", s.loginBody ?? Secret("{}"))
        }
    }

    func parse(_ body: [UInt8]) -> Result<TokenResponse, TokenResponse.ParseError> {
        switch settings.kind {
        case .login:
            return TokenResponse.login(
                body, tokenPointer: settings.tokenPointer ?? "/token", expiresInPointer: settings.expiresInPointer)
        default:
            return TokenResponse.oauth2(body)
        }
    }
}

/// Runs one refresh on a worker's loop through its libcurl client, retrying
/// a token endpoint that is down or failing (5xx, no connection, timeout)
/// with backoff; a 4xx or an unreadable answer ends it at once. The worker
/// owns it (its `refreshes`, `TokenRefreshes`) until it reports or the
/// worker shuts down.
final class TokenRefresh: UpstreamResponseHandler, LoopEventTarget {
    static let maxTries = 6
    let worker: ProxyWorker
    let guardian: UpstreamGuard
    let source: TokenSource
    private var tries = 0
    private var status = 0
    private var body: [UInt8] = []
    private var timer: LoopEvent?
    private var transfer: UpstreamTransfer?
    private enum Use: Int { case backoff, timeout, spacing }

    init(worker: ProxyWorker, guardian: UpstreamGuard, source: TokenSource) {
        self.worker = worker
        self.guardian = guardian
        self.source = source
    }

    func start() { send() }

    /// The worker shuts down: stop quietly (no report).
    func abandon() {
        timer?.recycle()
        timer = nil
        if let transfer { worker.client.cancel(transfer) }
        transfer = nil
    }

    /// The next try, once the upstream's token requests are spaced out
    /// (`TokenStateMachine.requestSpacing`).
    private func send() {
        tries += 1
        let wait = source.reserveRequest(at: worker.clock.now())
        guard wait > .zero else { return transmit() }
        arm(.spacing, after: wait)
    }

    private func transmit() {
        status = 0
        body.removeAll()
        guard let request = source.tokenRequest() else {
            return finish("the upstream refused the static credential (auth.kind static cannot be refreshed)")
        }
        let endpoint = Endpoint(request.url)
        transfer = worker.client.start(
            UpstreamRequest(
                origin: endpoint.origin, target: endpoint.basePath.isEmpty ? "/" : endpoint.basePath, method: "POST",
                headers: HeaderBlock([
                    HTTPField(name: "Content-Type", value: request.contentType),
                    HTTPField(name: "Accept", value: "application/json"),
                    HTTPField(name: "User-Agent", value: "happypath"),
                ]),
                body: RequestBody(Array(request.body.reveal.utf8)), sendsBody: true, connectTimeout: .seconds(2),
                idleTimeout: .seconds(5)),
            handler: self)
        arm(.timeout, after: .seconds(5))
    }

    private func arm(_ use: Use, after delay: Duration) {
        let t = timer ?? worker.loop.takeEvent(target: self)
        timer = t
        t.tag = use.rawValue
        t.arm(after: delay)
    }

    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) { self.status = status }
    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {}
    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {}
    func upstreamHeadersComplete() -> String? { nil }
    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        if body.count < 64 * 1024 { body.append(contentsOf: bytes) }
        return true
    }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        transfer = nil
        timer?.disarm()
        if failure == nil, (200..<300).contains(status) {
            switch source.parse(body) {
            case let .success(response):
                source.succeeded(response, at: worker.clock.now())
                return finish(nil)
            case let .failure(error):
                return finish("\(error)")
            }
        }
        if failure == nil, (400..<500).contains(status) {
            return finish("the token endpoint refused the credentials (HTTP \(status))")
        }
        retryOrGiveUp(failure.map { "token endpoint: \($0.message)" } ?? "the token endpoint answered \(status)")
    }

    private func retryOrGiveUp(_ reason: String) {
        guard tries < Self.maxTries else { return finish(reason) }
        worker.logger.warning(
            "token refresh failed, retrying",
            metadata: ["upstream": "\(source.upstreamName)", "try": "\(tries)", "reason": "\(reason)"])
        let delay = Duration.milliseconds(min(2000, 100 << (tries - 1)))
        arm(.backoff, after: delay)
    }

    func loopEventFired(_ event: LoopEvent) {
        switch Use(rawValue: event.tag) {
        case .backoff: send()
        case .spacing: transmit()
        case .timeout:
            if let transfer { worker.client.cancel(transfer) }
            transfer = nil
            retryOrGiveUp("the token endpoint did not answer in time")
        case nil: break
        }
    }

    /// `failure` nil: success.
    private func finish(_ failure: String?) {
        timer?.recycle()
        timer = nil
        worker.shared.metrics.tokenRefresh(upstream: source.upstreamName, success: failure == nil)
        worker.shared.events.publish(
            failure == nil ? "token_refreshed" : "token_refresh_failed", [("upstream", source.upstreamName)])
        if let failure {
            source.failed()
            worker.logger.error("token refresh failed", metadata: ["upstream": "\(source.upstreamName)", "reason": "\(failure)"])
        } else {
            worker.logger.info("token refreshed", metadata: ["upstream": "\(source.upstreamName)"])
        }
        worker.shared.tokenRefreshed(guardian, failure: failure)
        worker.refreshes.ended(self)
    }
}
