import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - UpstreamResponseHandler

/// The try's answer as libcurl (or an upgrade's connection) hands it over:
/// each part goes to `ResponseRelay`, which holds what the exchange must
/// look at and streams the rest to the client; the try's end goes to the
/// machine (`tryEnded`).
extension Exchange {
    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        if status == 101, upgrade != nil { return switchingStarted() }
        if route.hedge != nil { headArrived(status: status) }
        relayStatus(status, reason: reason)
    }

    func relayStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        // Held: what the exchange must look at before the client sees it.
        // With upstream_errors: pass, only what the retry rules or a token
        // refresh could act on; any other error streams as it comes.
        let hold = route.passesErrors ? failsTry(status) : status >= 400 || route.retry.configuration.statuses.contains(status)
        if !hold, coalesce != nil { coalesceStreams() }
        if sharesAnswer, let answer = coalesce?.answer { return relay.begin(status: status, reason: reason, hold: hold, to: answer) }
        relay.begin(status: status, reason: reason, hold: hold, to: request)
    }

    /// A status the retry rules, pacing or a token refresh act on: the try
    /// failed, it is not an answer (it wins no hedge race, and with
    /// `upstream_errors: pass` it is held while the exchange decides).
    func failsTry(_ status: Int) -> Bool {
        route.retry.configuration.statuses.contains(status)
            || (guardian.hasPacing && guardian.pacing?.on.contains(status) == true)
            || (tokens != nil && machine.settings.refreshOn.contains(status))
    }

    /// An upstream's 103 Early Hints (or another 1xx) goes to the client
    /// at once, as RFC 9110 section 15.2 asks of a proxy: before any final
    /// answer has started, and only to an HTTP/1.1 client.
    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {
        guard !isFinished, relay.mode == .waiting else { return }
        request.sendInformational(status: status, fields: fields)
    }

    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if switching != nil { return switchingField(name: name, value: value) }
        if route.rewritesRedirects, RedirectRewriter.applies(to: name), let rewritten = redirect(name: name, value: value) {
            var rewritten = rewritten
            return rewritten.withUTF8 { relayHeader(name: name, value: UnsafeRawBufferPointer($0)) }
        }
        relayHeader(name: name, value: value)
    }

    @inline(__always) private func relayHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if sharesAnswer, let answer = coalesce?.answer { return relay.header(name: name, value: value, to: answer) }
        relay.header(name: name, value: value, to: request)
    }

    /// A redirect to the endpoint this try went to, as a path on the proxy
    /// (`redirects: rewrite`, the default).
    private func redirect(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> String? {
        guard endpointIndex >= 0 else { return nil }
        let endpoint = upstream.endpoints[endpointIndex]
        let rewriter = RedirectRewriter(
            endpointOrigin: endpoint.origin, basePath: endpoint.basePath, stripPrefix: route.stripPrefix)
        return rewriter.rewrite(String(decoding: value, as: UTF8.self), isRefresh: name.count == 7)
    }

    func upstreamHeadersComplete() -> String? {
        if let switching, let upgrade { return switchingRefusal(switching, upgrade) }
        if guardian.adaptive != nil {
            if relay.status < 500, relay.status != 429 { measureTry() } else { dropSample() }
        }
        let verdict =
            sharesAnswer && coalesce?.answer != nil
            ? relay.headComplete(to: coalesce!.answer!, requestID: command.requestID, attempt: command.attempt, extra: rateLimitFields)
            : relay.headComplete(to: request, requestID: command.requestID, attempt: command.attempt, extra: rateLimitFields)
        switch verdict {
        case let .refused(reason):
            return reason  // a failed try: BAD_GATEWAY once the retry rules give up
        case .held:
            return nil
        case .streamed:
            perform(machine.streamingStarted(status: relay.status))
            if relay.isEventStream || isGRPC { answerStreams() }
            return nil
        }
    }

    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !isFinished else { return true }
        let taken: Bool
        if sharesAnswer, let answer = coalesce?.answer { taken = relay.body(bytes, to: answer) } else { taken = relay.body(bytes, to: request) }
        // Past the read-ahead, the answer goes at its client's pace: the
        // upstream is not what is slow (issue 44).
        if relay.waitingForDrain { answerStreams() }
        return taken
    }

    func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard !isFinished else { return }
        if sharesAnswer, let answer = coalesce?.answer {
            return relay.trailer(name: name, value: value, limit: env.maxTrailerBytes, to: answer)
        }
        relay.trailer(name: name, value: value, limit: env.maxTrailerBytes, to: request)
    }

    func upstreamFinished(_ failure: UpstreamFailure?) {
        transfer = nil
        upgradeTry = nil
        switching = nil
        // Before the slot goes: a limit the sample grew may hand it over.
        if guardian.adaptive != nil { applySample() }
        releaseSlot()
        guard !isFinished else { return }
        tryEnded(
            TryEndRules.finished(
                failure: failure?.tryFailure, headComplete: relay.headComplete, status: relay.status,
                retryAfterSeconds: relay.retryAfterSeconds, heldGRPCStatus: relay.heldForRetry,
                withToken: authToken != nil && tokens != nil))
    }
}

extension UpstreamFailure {
    var tryFailure: ExchangeStateMachine.TryFailure {
        switch self {
        case let .connectFailed(message): .init(.unreachable, message)
        case .timeout: .init(.timeout, "timeout")
        case let .reset(message), let .streamReset(message), let .other(message): .init(.reset, message)
        case let .badResponse(message): .init(.invalidResponse, message)
        case let .tls(message): .init(.tls, message)
        }
    }

    var message: String { tryFailure.message }
}
