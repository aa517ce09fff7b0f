import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Fallback

/// Serve-stale and the fixed fallback answer: where an answer is kept and
/// how a kept or fixed one is answered.
extension Exchange {
    /// Where a GET's answer is kept and looked for (`StaleKey`): the
    /// upstream, the target as sent (after strip_prefix), the client-facing
    /// scheme and authority with the forwarding fields the client sent,
    /// and a hash of its credentials; the answer's `Vary` fields tell apart
    /// the variants under a key. HEAD is answered from the GET's.
    func staleKeys(_ staleKey: StaleKey, salt: [UInt8]) -> StaleKey.Keys {
        var reader = staleKey.reader(salt: salt)
        var scheme = "http"
        if let request = request as? HTTPRequest {
            request.forEachRawHeader { reader.field(name: $0, value: $1) }
            if request.arrivedOverTLS { scheme = "https" }
        }
        return reader.keys(upstream: upstream.name, target: command.target, scheme: scheme)
    }

    /// A held answer passed through whole (`upstream_errors: pass`): kept
    /// as a streamed one is.
    func keepAnswer(fields: [HTTPField], body: [UInt8]) { keepAnswer(fields: KeptFields(fields), body: body) }

    /// The answer streamed whole to the client: kept for later, if the
    /// rules allow (a status worth keeping, no `no-store`, `private` or
    /// `Set-Cookie`), for everyone or only for the same credentials.
    func keepAnswer(fields: consuming KeptFields, body: consuming [UInt8]) {
        guard let store = env.stale, let serveStale = route.fallback?.serveStale, let staleKey = route.staleKey,
            StaleRules.mayKeep(method: command.method, status: relay.status)
        else { return }
        let keys = staleKeys(staleKey, salt: store.salt)
        guard
            let decision = StaleRules.decide(
                method: command.method, status: relay.status, fields: fields, requestHasCredentials: keys.credentials != nil,
                serveStale: serveStale)
        else { return }
        let now = env.clock.now()
        let entry = StaleEntry(
            status: relay.status, reason: relay.reason, fields: fields, body: body, receivedAt: now,
            expiresAt: now + decision.keepFor, varyNames: decision.varyNames,
            varyValues: decision.varyNames.map { staleKey.varyValue(name: $0, value: request.header($0), salt: store.salt) },
            path: clientPath)
        store.keep(entry, key: keys.keep(shared: decision.shared))
    }

    /// The path the client asked for (for purges by prefix).
    var clientPath: String {
        guard let request = request as? HTTPRequest else { return "" }
        return Router.split(target: request.target).path
    }

    /// The kept answer, else the fixed one; false: neither (the problem is answered).
    func answerFallback(_ fallback: FallbackConfiguration, _ reason: FallbackConfiguration.Reason) -> Bool {
        let method = command.method
        if fallback.serveStale != nil, method == "GET" || method == "HEAD", let store = env.stale,
            let staleKey = route.staleKey
        {
            let now = env.clock.now()
            let keys = staleKeys(staleKey, salt: store.salt)
            let found = store.lookup(keys: keys.lookup, at: now) {
                staleKey.varyValue(name: $0, value: request.header($0), salt: store.salt)
            }
            if let entry = found {
                env.metrics.fallback(route: route, kind: "stale", reason: reason.rawValue)
                // Both terms are at most OutsideValues.maxSeconds (the time kept is
                // under serve_stale), so the sum cannot overflow; it is clamped again.
                var age = min(OutsideValues.maxSeconds, max(0, (now - entry.receivedAt).components.seconds))
                var fields = entry.fields.filter { field in
                    // The upstream's own Age is added to the time kept here (RFC 9111
                    // section 4.2.3); a malformed one counts as absent.
                    guard field.name.lowercased() == "age" else { return true }
                    age = min(OutsideValues.maxSeconds, age + (OutsideValues.deltaSeconds(field.value) ?? 0))
                    return false
                }
                fields.append(HTTPField(name: "Age", value: String(age)))
                fields.append(HTTPField(name: "X-Happypath-Fallback", value: "stale; reason=" + reason.rawValue))
                entry.body.withUnsafeBytes { answerWhole(status: entry.status, reason: entry.reason, fields: fields, body: $0) }
                result.status = entry.status
                result.code = "STALE"
                relay.answered(bytes: entry.body.count)
                return true
            }
        }
        guard let fixed = fallback.response else { return false }
        env.metrics.fallback(route: route, kind: "fixed", reason: reason.rawValue)
        let fields = [
            HTTPField(name: "Content-Type", value: fixed.contentType),
            HTTPField(name: "X-Happypath-Fallback", value: "fixed; reason=" + reason.rawValue),
        ]
        var body = fixed.body
        let count = body.utf8.count
        body.withUTF8 { answerWhole(status: fixed.status, reason: nil, fields: fields, body: UnsafeRawBufferPointer($0)) }
        result.status = fixed.status
        result.code = "FALLBACK"
        relay.answered(bytes: count)
        return true
    }
}
