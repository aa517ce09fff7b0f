import Foundation
import HappyPathCore
import HappyPathPolicies
import Yams

extension ConfigLoader {
    /// What `happypath check` warns about in the upstreams: a valid file
    /// that will not do what it seems to. `h2_client` (which chose between
    /// libcurl and the proxy's own HTTP/2 client while the latter was being
    /// built) is read and ignored: `protocol: h2` is always the proxy's own.
    public static func upstreamWarnings(_ config: Configuration) -> [String] {
        config.upstreams.compactMap { u in
            guard let given = config.ignoredH2Clients[u.name] else { return nil }
            return "upstreams.\(u.name).h2_client: \(given) is ignored: protocol: h2 always uses the proxy's own"
                + " HTTP/2 client now (libcurl carries HTTP/1.1 only); delete the key"
        }
    }
}

extension Reader {
    /// An upstream serving gRPC routes is checked with gRPC's health service
    /// unless its own `health_check` names a `path`, or its own or
    /// `defaults'` names `grpc`: a gRPC server has no `/healthz`, and
    /// resets the stream of a `GET` (docs/reachability.md). A `path` in
    /// `defaults` is for the HTTP upstreams (the example config sets one).
    static func defaultGRPCHealthChecks(_ config: inout Configuration) {
        for i in config.upstreams.indices {
            let name = config.upstreams[i].name
            guard config.routes.contains(where: { $0.grpc != nil && $0.upstream == name }) else { continue }
            let own = config.upstreams[i].policies.healthCheck
            guard !own.isSet(\.path), !own.merged(over: config.defaults.healthCheck).isSet(\.grpc) else { continue }
            config.upstreams[i].policies.healthCheck.set(\.grpc, HealthCheckConfiguration.GRPC())
            config.upstreams[i].grpcHealthCheckByDefault = true
        }
    }
}

extension ConfigLoader {
    /// What `happypath check` prints for each upstream: which active health
    /// check it gets, and what counts as alive.
    public static func healthCheckSummary(_ config: Configuration) -> [String] {
        config.upstreams.map { u in
            let check = config.resolvedPolicies(forUpstream: u).healthCheck
            let every = "every \(check.interval.configText), timeout \(check.timeout.configText)"
            if let grpc = check.grpc {
                let why = u.grpcHealthCheckByDefault ? " (the default for an upstream serving gRPC routes)" : ""
                return "upstreams.\(u.name): gRPC health check grpc.health.v1.Health/Check, service \"\(grpc.service)\", \(every)\(why);"
                    + " up unless NOT_SERVING, UNAVAILABLE, a 5xx, a timeout or no connection (UNIMPLEMENTED counts as alive)"
            }
            return "upstreams.\(u.name): health check GET \(check.path) \(every);"
                + " up on any answer below 500 or a stream reset, down on a 5xx, a timeout or no connection"
        }
    }
}

/// `upstreams.NAME`: endpoints, connections, credentials, pacing and TLS.
extension Reader {
    func upstream(name: String, _ node: Node) -> Upstream? {
        let path = "upstreams.\(name)"
        let f = fields(
            node, path,
            known: [
                "endpoints", "connect_timeout", "max_connections", "auth", "errors", "upstream_errors", "pacing", "tls",
                "protocol", "h2_client", "adaptive_concurrency",
            ]
                + Self.policyKeys)
        var u = Upstream(name: name, endpoints: [])
        if let e = f["endpoints"] {
            for (i, item) in (sequence(e.value, "\(path).endpoints") ?? []).enumerated() {
                guard let s = text(item, "\(path).endpoints[\(i)]") else { continue }
                if Self.hasUserinfo(s) {
                    error(item, Self.userinfoRefusal(s, upstream: name, index: i))
                } else if let url = endpoint(s) {
                    // The base path is put in front of every (normalized)
                    // target: it must be a normalized path itself, with no
                    // query or fragment, or it would undo that normalization.
                    let afterScheme = url[url.range(of: "://")!.upperBound...]
                    let base = afterScheme.firstIndex(of: "/").map { String(afterScheme[$0...]) } ?? ""
                    if base.contains("?") || base.contains("#") || afterScheme.contains("?") || afterScheme.contains("#") {
                        error(
                            item,
                            "\(path).endpoints[\(i)]: '\(Self.shown(s))' has a query or fragment; "
                                + "an endpoint is an origin and a base path only")
                    } else if !base.isEmpty, case let .success(normal) = PathNormalizer.normalize(base), normal != base {
                        error(item, "\(path).endpoints[\(i)]: the base path '\(base)' is not normalized; write it as '\(normal)'")
                    } else if !base.isEmpty, case let .failure(refusal) = PathNormalizer.normalize(base) {
                        error(item, "\(path).endpoints[\(i)]: the base path '\(base)' is not a valid path: \(refusal.detail)")
                    }
                    u.endpoints.append(url)
                } else {
                    error(item, "\(path).endpoints[\(i)]: '\(Self.shown(s))' is not an http:// or https:// URL with a host")
                }
            }
            if u.endpoints.isEmpty && errors.isEmpty { error(e.value, "\(path).endpoints must list at least one URL") }
        } else {
            error(node, "\(path) needs 'endpoints', e.g. [http://127.0.0.1:9000]")
        }
        if let v = duration(f["connect_timeout"]?.value, "\(path).connect_timeout") { u.connectTimeout = v }
        if let v = int(f["max_connections"]?.value, "\(path).max_connections", min: 1) { u.maxConnectionsPerEndpoint = v }
        if let a = f["auth"]?.value { u.auth = auth(a, "\(path).auth") }
        u.policies = policies(f, path)
        if let e = f["errors"]?.value { u.policies.errors = errorMappings(e, "\(path).errors") }
        if let m = choice(f["upstream_errors"]?.value, "\(path).upstream_errors", UpstreamErrorsMode.self) {
            u.upstreamErrors = m
        }
        if let p = f["pacing"]?.value { u.pacing = pacing(p, "\(path).pacing") }
        if let t = f["tls"] {
            u.tls = upstreamTLS(t.value, "\(path).tls")
            if !u.endpoints.isEmpty, !u.endpoints.allSatisfy({ $0.hasPrefix("https://") }) {
                error(t.key, "\(path).tls applies to https:// endpoints; every endpoint of the upstream must be one")
            }
        }
        if let p = choice(f["protocol"]?.value, "\(path).protocol", UpstreamProtocol.self) { u.protocol = p }
        // Read and ignored (`upstreamWarnings`): a file written for the transition still loads.
        if let c = f["h2_client"]?.value { ignoredH2Clients[name] = string(c, "\(path).h2_client") }
        if let a = f["adaptive_concurrency"]?.value {
            u.adaptiveConcurrency = adaptiveConcurrency(a, "\(path).adaptive_concurrency")
            if let limit = u.adaptiveConcurrency?.limit, !u.endpoints.isEmpty,
                limit.minLimit > u.maxConnectionsPerEndpoint * u.endpoints.count
            {
                error(
                    a,
                    "\(path).adaptive_concurrency.min_limit (\(limit.minLimit)) is above max_connections × endpoints (\(u.maxConnectionsPerEndpoint * u.endpoints.count)); lower min_limit or raise max_connections"
                )
            }
        }
        return u
    }

    /// `adaptive_concurrency: { min_limit, max_limit, initial_limit, tolerance,
    /// smoothing, latency_floor, max_streams, queue: { interval, target } }` (docs/overload.md).
    func adaptiveConcurrency(_ node: Node, _ path: String) -> AdaptiveConcurrencySettings {
        let f = fields(node, path, known: ["min_limit", "max_limit", "initial_limit", "tolerance", "smoothing", "queue", "max_streams", "latency_floor"])
        var a = AdaptiveConcurrencySettings()
        if let v = int(f["min_limit"]?.value, "\(path).min_limit", min: 1, max: 100_000) {
            a.limit.minLimit = v
            a.minLimitGiven = true
        }
        if let v = int(f["max_limit"]?.value, "\(path).max_limit", min: 1, max: 100_000) { a.limit.maxLimit = v }
        if let v = int(f["initial_limit"]?.value, "\(path).initial_limit", min: 1, max: 100_000) {
            a.limit.initialLimit = v
        } else {
            // Not at min_limit: a limit that starts at 2 is held by the
            // first slow requests, and nothing else gets a slot (or a
            // sample) until they end (issue 44). Tries that start above the
            // upstream's capacity find a queue there, and it falls.
            a.limit.initialLimit = min(max(AdaptiveLimit.Configuration.defaultInitialLimit, a.limit.minLimit), a.limit.maxLimit)
        }
        if let v = double(f["tolerance"]?.value, "\(path).tolerance", min: 1, max: 10) { a.limit.tolerance = v }
        if let v = double(f["smoothing"]?.value, "\(path).smoothing", min: 0.01, max: 1) { a.limit.smoothing = v }
        if let v = int(f["max_streams"]?.value, "\(path).max_streams", min: 0, max: 100_000) { a.maxStreams = v }
        if let d = duration(f["latency_floor"]?.value, "\(path).latency_floor", allowZero: true) {
            a.limit.latencyFloor = Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
        }
        if let q = f["queue"]?.value {
            let qf = fields(q, "\(path).queue", known: ["interval", "target"])
            if let d = duration(qf["interval"]?.value, "\(path).queue.interval") { a.queue.interval = d }
            if let d = duration(qf["target"]?.value, "\(path).queue.target") { a.queue.target = d }
        }
        for problem in a.limit.validate() { error(node, "\(path): \(problem)") }
        return a
    }

    /// Whether `url` carries a userinfo (`user:password@`, `user@`): an `@`
    /// in its authority, which ends at the first `/`, `?` or `#` after the
    /// scheme (RFC 3986 section 3.2). A password with a raw `/` in it ends
    /// the authority early; such a URL fails as one without a host, its
    /// message redacted all the same (`shown`).
    static func hasUserinfo(_ url: String) -> Bool {
        guard let scheme = url.range(of: "://") else { return false }
        let rest = url[scheme.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        return rest[..<end].contains("@")
    }

    /// An endpoint as a message may quote it: a password, or a user alone, as `***`.
    static func shown(_ url: String) -> String { StorageConfiguration.redact(url, hidingLoneUser: true) }

    /// Credentials in an endpoint's URL would be shown wherever the endpoint
    /// is: `/admin/state`, `/status`, the events and logs that name it. The
    /// upstream's `auth` keeps them as secrets (docs/auth.md), and libcurl
    /// sends a URL's userinfo as `Basic` anyway, which `kind: static,
    /// scheme: Basic` does the same.
    static func userinfoRefusal(_ url: String, upstream: String, index: Int) -> String {
        "upstreams.\(upstream).endpoints[\(index)]: '\(shown(url))' carries credentials before the host, which "
            + "/admin/state, /status and the logs would show; remove them from the URL and set them in "
            + "upstreams.\(upstream).auth instead, e.g. auth: { kind: static, scheme: Basic, value: \"${BASIC_CREDENTIALS}\" } "
            + "with BASIC_CREDENTIALS in the environment holding the base64 of user:password (docs/auth.md)"
    }

    func endpoint(_ s: String) -> String? {
        var url = s
        while url.hasSuffix("/") { url.removeLast() }
        for scheme in ["http://", "https://"] where url.lowercased().hasPrefix(scheme) {
            let rest = url.dropFirst(scheme.count)
            guard let host = rest.split(separator: "/", maxSplits: 1).first, !host.isEmpty else { return nil }
            if let colon = host.lastIndex(of: ":"), !host.hasSuffix("]") {
                guard let port = Int(host[host.index(after: colon)...]), (1...65535).contains(port) else { return nil }
            }
            return url
        }
        return nil
    }

    /// `upstreams.NAME.tls`: how the proxy's connections to the upstream verify it.
    func upstreamTLS(_ node: Node, _ path: String) -> UpstreamTLSSettings {
        let f = fields(node, path, known: ["ca", "verify", "client_cert", "client_key", "server_name"])
        var t = UpstreamTLSSettings()
        t.ca = string(f["ca"]?.value, "\(path).ca")
        if let v = bool(f["verify"]?.value, "\(path).verify") { t.verify = v }
        t.clientCert = string(f["client_cert"]?.value, "\(path).client_cert")
        t.clientKey = string(f["client_key"]?.value, "\(path).client_key")
        if (t.clientCert == nil) != (t.clientKey == nil) {
            error(node, "\(path): client_cert and client_key go together (a client certificate and its key)")
        }
        if let n = f["server_name"]?.value, let name = string(n, "\(path).server_name") {
            let allowed = !name.isEmpty && name.unicodeScalars.allSatisfy {
                ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "-" || $0 == "."
            }
            if allowed { t.serverName = name.lowercased() } else { error(n, "\(path).server_name: '\(name)' is not a host name") }
        }
        return t
    }

    func auth(_ node: Node, _ path: String) -> AuthSettings {
        let f = fields(
            node, path,
            known: [
                "kind", "header", "scheme", "value", "token_url", "client_id", "client_secret", "refresh_token",
                "scope", "audience", "login_url", "login_body", "login_content_type", "token_pointer",
                "expires_in_pointer", "refresh_on", "refresh_ahead",
            ])
        var a = AuthSettings()
        guard let kind = choice(f["kind"]?.value, "\(path).kind", AuthKind.self) else {
            if f["kind"] == nil {
                error(node, "\(path) needs 'kind' (none, static, oauth2_client_credentials, oauth2_refresh_token, login)")
            }
            return a
        }
        a.kind = kind
        if let v = string(f["header"]?.value, "\(path).header") { a.header = v }
        a.scheme = string(f["scheme"]?.value, "\(path).scheme")
        a.value = secret(f["value"]?.value, "\(path).value")
        a.tokenURL = string(f["token_url"]?.value, "\(path).token_url")
        a.clientID = string(f["client_id"]?.value, "\(path).client_id")
        a.clientSecret = secret(f["client_secret"]?.value, "\(path).client_secret")
        a.refreshToken = secret(f["refresh_token"]?.value, "\(path).refresh_token")
        a.scope = string(f["scope"]?.value, "\(path).scope")
        a.audience = string(f["audience"]?.value, "\(path).audience")
        a.loginURL = string(f["login_url"]?.value, "\(path).login_url")
        a.loginBody = secret(f["login_body"]?.value, "\(path).login_body")
        a.loginContentType = string(f["login_content_type"]?.value, "\(path).login_content_type")
        a.tokenPointer = string(f["token_pointer"]?.value, "\(path).token_pointer")
        a.expiresInPointer = string(f["expires_in_pointer"]?.value, "\(path).expires_in_pointer")
        if let r = f["refresh_on"]?.value, let list = strings(r, "\(path).refresh_on") {
            a.refreshOn = list.compactMap { item in
                guard let code = Int(item), (400...599).contains(code) else {
                    error(r, "\(path).refresh_on: '\(item)' is not a 4xx or 5xx status")
                    return nil
                }
                return code
            }
        }
        if let d = duration(f["refresh_ahead"]?.value, "\(path).refresh_ahead", allowZero: true) { a.refreshAhead = d }
        let required: [String]
        switch kind {
        case .none: required = []
        case .static: required = ["value"]
        case .oauth2ClientCredentials: required = ["token_url", "client_id", "client_secret"]
        case .oauth2RefreshToken: required = ["token_url", "refresh_token"]
        case .login: required = ["login_url", "token_pointer"]
        }
        for key in required where f[key] == nil {
            error(node, "\(path): kind \(kind.rawValue) needs '\(key)'")
        }
        for key in ["token_url", "login_url"] {
            if let n = f[key]?.value, let url = text(n, "\(path).\(key)"), endpoint(url) == nil {
                error(n, "\(path).\(key): '\(Self.shown(url))' is not an http:// or https:// URL")
            }
        }
        if let p = a.tokenPointer, !p.hasPrefix("/") {
            error(f["token_pointer"]?.value, "\(path).token_pointer must start with /")
        }
        return a
    }

    /// `pacing: { on: [429, 503, resource-exhausted], max_pause: 60s, while_paused: wait, scope_429: client, max_clients: 10000 }`.
    func pacing(_ node: Node, _ path: String) -> PacingConfiguration {
        let f = fields(node, path, known: ["on", "max_pause", "while_paused", "scope_429", "max_clients"])
        var p = PacingConfiguration()
        if let on = f["on"]?.value, let list = strings(on, "\(path).on") {
            var statuses = Set<Int>()
            for item in list {
                if let s = Int(item), (400...599).contains(s) {
                    statuses.insert(s)
                } else if item == GRPCStatus.resourceExhausted.configName {
                    p.onResourceExhausted = true  // a gRPC call's RESOURCE_EXHAUSTED with RetryInfo (docs/grpc.md)
                } else {
                    error(
                        on,
                        "\(path).on lists statuses from 400 to 599 (such as 429, 503) and the gRPC status "
                            + "resource-exhausted, got '\(item)'")
                }
            }
            p.on = statuses
        }
        if let v = duration(f["max_pause"]?.value, "\(path).max_pause") { p.maxPause = v }
        if let v = choice(f["while_paused"]?.value, "\(path).while_paused", PacingConfiguration.WhilePaused.self) {
            p.whilePaused = v
        }
        if let v = choice(f["scope_429"]?.value, "\(path).scope_429", PacingConfiguration.Scope.self) { p.scope429 = v }
        if let v = int(f["max_clients"]?.value, "\(path).max_clients", min: 1, max: 10_000_000) { p.maxClients = v }
        return p
    }
}
