import Foundation
import HappyPathCore
import HappyPathPolicies
import Yams

/// `routes[i]`: match, upstream, and what a route alone sets (errors,
/// delivery, rate limit, hedging, fallback, upgrades).
extension Reader {
    func route(_ node: Node, _ path: String, upstreams: [Upstream], earlier: [Route]) -> Route? {
        // The breaker, health checks and outlier ejection belong to an
        // upstream: a route may not set them (it would be silently ignored
        // otherwise).
        if case let .mapping(m) = node {
            for key in m.keys where Self.upstreamOnlyPolicyKeys.contains(key.string ?? "") {
                error(key, "\(path).\(key.string!) belongs to the upstream (or defaults), not to a route")
            }
            // So does the retry budget: it counts the upstream's requests.
            for (key, value) in m where key.string == "retry" {
                guard case let .mapping(retry) = value else { continue }
                for inner in retry.keys where inner.string == "budget" {
                    error(inner, "\(path).retry.budget belongs to the upstream (or defaults), not to a route")
                }
            }
        }
        let f = fields(
            node, path,
            known: [
                "match", "upstream", "strip_prefix", "errors", "timeout", "retry", "reachability", "delivery", "allow_trace",
                "redirects", "upstream_errors", "rate_limit", "hedge", "fallback", "upgrades", "upgrades_idle_timeout",
                "grpc", "priority", "priority_header", "cors", "coalesce",
            ]
                + Self.upstreamOnlyPolicyKeys)
        var match = RouteMatch(pathPrefix: "/")
        if let m = f["match"]?.value {
            let mf = fields(m, "\(path).match", known: ["path_prefix", "methods"])
            if let p = string(mf["path_prefix"]?.value, "\(path).match.path_prefix") {
                if p.hasPrefix("/") {
                    match.pathPrefix = p
                    // Routes match the normalized path, so a prefix that is
                    // not normalized could never match anything.
                    switch PathNormalizer.normalize(p) {
                    case let .success(normal) where normal != p:
                        error(
                            mf["path_prefix"]?.value,
                            "\(path).match.path_prefix '\(p)' is matched against normalized paths and would never match; write it as '\(normal)'"
                        )
                    case let .failure(refusal):
                        error(mf["path_prefix"]?.value, "\(path).match.path_prefix '\(p)' is not a valid path: \(refusal.detail)")
                    default: break
                    }
                } else {
                    error(mf["path_prefix"]?.value, "\(path).match.path_prefix must start with /, got '\(p)'")
                }
            }
            if let ms = mf["methods"]?.value, let list = methods(ms, "\(path).match.methods") { match.methods = Set(list) }
        }
        guard let upstreamNode = f["upstream"]?.value else {
            error(node, "\(path) needs 'upstream' (one of: \(upstreams.map(\.name).joined(separator: ", ")))")
            return nil
        }
        guard let upstreamName = string(upstreamNode, "\(path).upstream") else { return nil }
        if !upstreams.contains(where: { $0.name == upstreamName }) {
            error(
                upstreamNode,
                "\(path).upstream: no upstream named '\(upstreamName)' (defined: \(upstreams.map(\.name).joined(separator: ", ")))"
            )
        }
        var r = Route(match: match, upstream: upstreamName)
        if let s = f["strip_prefix"]?.value, let strip = string(s, "\(path).strip_prefix") {
            if !match.pathPrefix.hasPrefix(strip) {
                error(s, "\(path).strip_prefix '\(strip)' is not a prefix of path_prefix '\(match.pathPrefix)'")
            }
            r.stripPrefix = strip
        }
        r.policies = policies(f, path)
        if let e = f["errors"]?.value { r.errors = errorMappings(e, "\(path).errors") }
        if let d = f["delivery"]?.value { r.delivery = delivery(d, "\(path).delivery") }
        if let b = bool(f["allow_trace"]?.value, "\(path).allow_trace") { r.allowTrace = b }
        if let m = choice(f["redirects"]?.value, "\(path).redirects", RedirectMode.self) { r.redirects = m }
        if let m = choice(f["upstream_errors"]?.value, "\(path).upstream_errors", UpstreamErrorsMode.self) {
            r.upstreamErrors = m
        }
        if let rl = f["rate_limit"]?.value { r.rateLimit = rateLimit(rl, "\(path).rate_limit") }
        if let c = f["cors"]?.value { r.cors = cors(c, "\(path).cors") }
        if let h = f["hedge"]?.value { r.hedge = hedge(h, "\(path).hedge") }
        if let fb = f["fallback"]?.value {
            r.fallback = fallback(fb, "\(path).fallback")
            if r.delivery.mode == .later {
                error(f["fallback"]?.key, "\(path).fallback applies to routes that deliver now (delivery.mode: now), not later")
            }
        }
        if let u = f["upgrades"]?.value, let list = strings(u, "\(path).upgrades") {
            for token in list where token.isEmpty || !token.utf8.allSatisfy({ HTTPBytes.isToken($0) }) {
                error(u, "\(path).upgrades: '\(token)' is not a protocol name (an Upgrade token such as websocket)")
            }
            r.upgrades = list.map { $0.lowercased() }
            if r.delivery.mode == .later, !list.isEmpty {
                error(f["upgrades"]?.key, "\(path).upgrades applies to routes that deliver now (delivery.mode: now), not later")
            }
            if let methods = match.methods, !methods.contains("GET"), !list.isEmpty {
                error(f["upgrades"]?.key, "\(path).upgrades needs GET among match.methods: an upgrade is a GET request")
            }
        }
        if let t = f["upgrades_idle_timeout"]?.value, let d = duration(t, "\(path).upgrades_idle_timeout") {
            r.upgradesIdleTimeout = d
            if r.upgrades.isEmpty {
                error(f["upgrades_idle_timeout"]?.key, "\(path).upgrades_idle_timeout is set but the route has no upgrades")
            }
        }
        if let g = f["grpc"] {
            r.grpc = grpc(g.value, "\(path).grpc")
            if let upstream = upstreams.first(where: { $0.name == upstreamName }), upstream.protocol != .h2 {
                error(
                    g.key,
                    "\(path).grpc: the route carries gRPC, which needs HTTP/2 to the upstream, but upstreams.\(upstreamName) has protocol: \(upstream.protocol.rawValue); set protocol: h2 on it"
                )
            }
            if r.delivery.mode == .later {
                error(
                    g.key,
                    "\(path).grpc: a gRPC route cannot deliver later (delivery.mode: later): a gRPC client waits for the call's status, and a 202 is not one"
                )
            }
        }
        if let p = choice(f["priority"]?.value, "\(path).priority", RequestPriority.self) { r.priority = p }
        if let h = f["priority_header"], let name = string(h.value, "\(path).priority_header") {
            if !name.isEmpty, name.utf8.allSatisfy({ HTTPBytes.isToken($0) }) {
                r.priorityHeader = name.lowercased()
            } else {
                error(h.value, "\(path).priority_header: '\(name)' is not a header name")
            }
        }
        if let c = f["coalesce"] {
            r.coalesce = coalesce(c.value, "\(path).coalesce")
            if r.coalesce != nil, r.delivery.mode == .later {
                error(c.key, "\(path).coalesce applies only to routes that deliver now (delivery.mode: now), not later")
            }
            if r.coalesce != nil, let methods = match.methods, !methods.contains("GET"), !methods.contains("HEAD") {
                error(c.key, "\(path).coalesce shares GET and HEAD answers, but match.methods lists neither")
            }
        }
        if let i = earlier.firstIndex(where: { match.isShadowed(by: $0.match) }) {
            error(
                node,
                "\(path) can never match: routes[\(i)] (path_prefix \(earlier[i].match.pathPrefix)) is earlier and matches everything it does"
            )
        }
        return r
    }

    /// `coalesce: true`, `false`, or `{ max_followers: 1000, private_headers: [X-Api-Key] }`.
    func coalesce(_ node: Node, _ path: String) -> CoalesceConfiguration? {
        var c = CoalesceConfiguration()
        guard case .mapping = node else { return bool(node, path) == true ? c : nil }
        let f = fields(node, path, known: ["max_followers", "private_headers"])
        let range = CoalesceConfiguration.maxFollowersRange
        if let n = int(f["max_followers"]?.value, "\(path).max_followers", min: range.lowerBound, max: range.upperBound) {
            c.maxFollowers = n
        }
        if let list = f["private_headers"]?.value, let names = headerNames(list, "\(path).private_headers") {
            c.privateHeaders = names
        }
        return c
    }

    /// A list of request field names that carry a credential (`private_headers`):
    /// each a token, each once, at most 32.
    func headerNames(_ list: Node, _ path: String) -> [String]? {
        guard let names = strings(list, path) else { return nil }
        var seen = Set<String>()
        var out: [String] = []
        for name in names {
            if name.isEmpty || !name.utf8.allSatisfy({ HTTPBytes.isToken($0) }) {
                error(list, "\(path) lists header names (such as X-Api-Key), got '\(name)'")
            } else if !seen.insert(name.lowercased()).inserted {
                error(list, "\(path) lists '\(name)' twice")
            } else {
                out.append(name)
            }
        }
        if out.count > 32 { error(list, "\(path) lists at most 32 names, got \(out.count)") }
        return out
    }

    /// `grpc: { idempotent: true }`, or `grpc: {}`: the route carries gRPC calls.
    func grpc(_ node: Node, _ path: String) -> GRPCRouteConfiguration {
        var g = GRPCRouteConfiguration()
        let f = fields(node, path, known: ["idempotent"])
        if let b = bool(f["idempotent"]?.value, "\(path).idempotent") { g.idempotent = b }
        return g
    }

    func methods(_ node: Node, _ path: String) -> [String]? {
        guard let list = strings(node, path) else { return nil }
        var out: [String] = []
        for m in list {
            let upper = m.uppercased()
            if upper.isEmpty || !upper.allSatisfy({ $0.isLetter || $0 == "-" || $0 == "_" }) {
                error(node, "\(path): '\(m)' is not an HTTP method")
            } else {
                out.append(upper)
            }
        }
        return out
    }

    func errorMappings(_ node: Node, _ path: String) -> [ErrorMapping] {
        var out: [ErrorMapping] = []
        for (i, item) in (sequence(node, path) ?? []).enumerated() {
            let p = "\(path)[\(i)]"
            let f = fields(
                item, p,
                known: ["when", "code", "title", "detail", "recovery_suggestion", "recovery_options", "retryable"])
            var conditions: [ErrorMapping.Condition] = []
            if let w = f["when"]?.value {
                let wf = fields(w, "\(p).when", known: ["status", "json_pointer", "equals"])
                if let s = wf["status"]?.value, let text = text(s, "\(p).when.status") {
                    if let code = Int(text), (400...599).contains(code) {
                        conditions.append(.status(code))
                    } else if text.count == 3, text.hasSuffix("xx"), let c = Int(text.prefix(1)), c == 4 || c == 5 {
                        conditions.append(.statusClass(c))
                    } else {
                        error(s, "\(p).when.status: '\(text)' is not a 4xx/5xx status or a class like 4xx")
                    }
                }
                if let ptr = string(wf["json_pointer"]?.value, "\(p).when.json_pointer") {
                    if !ptr.hasPrefix("/") { error(wf["json_pointer"]?.value, "\(p).when.json_pointer must start with /") }
                    guard let eq = string(wf["equals"]?.value, "\(p).when.equals") else {
                        error(w, "\(p).when: json_pointer needs 'equals'")
                        continue
                    }
                    conditions.append(.jsonPointer(ptr, equals: eq))
                }
                if conditions.isEmpty && wf.isEmpty { error(w, "\(p).when needs 'status' or 'json_pointer'") }
            } else {
                error(item, "\(p) needs 'when'")
            }
            guard let code = string(f["code"]?.value, "\(p).code") else {
                if f["code"] == nil { error(item, "\(p) needs 'code', e.g. ITEM_NOT_FOUND") }
                continue
            }
            if code.isEmpty || !code.allSatisfy({ $0.isUppercase || $0.isNumber || $0 == "_" }) {
                error(f["code"]?.value, "\(p).code must be UPPER_SNAKE_CASE, got '\(code)'")
            }
            out.append(
                ErrorMapping(
                    when: conditions, code: code, title: string(f["title"]?.value, "\(p).title"),
                    detail: string(f["detail"]?.value, "\(p).detail"),
                    recoverySuggestion: string(f["recovery_suggestion"]?.value, "\(p).recovery_suggestion"),
                    recoveryOptions: strings(f["recovery_options"]?.value, "\(p).recovery_options"),
                    retryable: bool(f["retryable"]?.value, "\(p).retryable")))
        }
        return out
    }

    func delivery(_ node: Node, _ path: String) -> DeliveryPolicy.Configuration {
        var d = DeliveryPolicy.Configuration()
        let f = fields(node, path, known: ["mode", "max_age", "max_attempts", "backoff", "idempotency"])
        if let m = choice(f["mode"]?.value, "\(path).mode", DeliveryPolicy.Mode.self) { d.mode = m }
        if let v = duration(f["max_age"]?.value, "\(path).max_age") { d.maxAge = v }
        if let v = int(f["max_attempts"]?.value, "\(path).max_attempts", min: 1, max: 1_000_000) { d.maxAttempts = v }
        if let b = f["backoff"]?.value {
            let bf = fields(b, "\(path).backoff", known: ["base", "max"])
            if let v = duration(bf["base"]?.value, "\(path).backoff.base") { d.backoffBase = v }
            if let v = duration(bf["max"]?.value, "\(path).backoff.max") { d.backoffMax = v }
            if d.backoffMax < d.backoffBase {
                error(b, "\(path).backoff.max (\(d.backoffMax.configText)) is below backoff.base (\(d.backoffBase.configText))")
            }
        }
        if let i = f["idempotency"]?.value {
            let idf = fields(i, "\(path).idempotency", known: ["client_header"])
            let node = idf["client_header"]?.value
            if let name = string(node, "\(path).idempotency.client_header") {
                // A field name (RFC 9110 token); Authorization is always
                // the first choice already, and Idempotency-Key is the key.
                let token =
                    !name.isEmpty
                    && name.utf8.allSatisfy { c in
                        (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
                            || "!#$%&'*+-.^_`|~".utf8.contains(c)
                    }
                if !token {
                    error(node, "\(path).idempotency.client_header must be a header name such as X-Api-Key, got '\(name)'")
                } else if ["authorization", "idempotency-key"].contains(name.lowercased()) {
                    error(
                        node,
                        "\(path).idempotency.client_header cannot be \(name): Authorization is used first anyway, "
                            + "and Idempotency-Key is the key itself")
                } else {
                    d.idempotencyClientHeader = name
                }
            }
        }
        return d
    }

    /// `rate_limit: { rate: 100/s, burst: 50, key: client_ip, over_limit: queue, max_wait: 2s, max_queue: 1000, max_keys: 100000 }`.
    func rateLimit(_ node: Node, _ path: String) -> RateLimitConfiguration? {
        let f = fields(
            node, path, known: ["rate", "burst", "key", "over_limit", "max_wait", "max_queue", "max_keys", "scope"])
        guard let rateNode = f["rate"]?.value else {
            error(node, "\(path) needs 'rate', such as 'rate: 100/s' (also /m, /h)")
            return nil
        }
        guard let text = string(rateNode, "\(path).rate") else { return nil }
        let parts = text.split(separator: "/")
        let periods: [String: Duration] = ["s": .seconds(1), "m": .seconds(60), "h": .seconds(3600)]
        guard parts.count == 2, let count = Int(parts[0].trimmingCharacters(in: .whitespaces)), count >= 1,
            count <= 1_000_000_000, let period = periods[parts[1].trimmingCharacters(in: .whitespaces)]
        else {
            error(rateNode, "\(path).rate must be COUNT/s, COUNT/m or COUNT/h with a COUNT of at least 1, got '\(text)'")
            return nil
        }
        // The default burst is one second's worth (at least 1).
        let perSecond = max(1, Int((Double(count) / period.seconds).rounded(.up)))
        var c = RateLimitConfiguration(
            count: count, period: period,
            burst: int(f["burst"]?.value, "\(path).burst", min: 1, max: 1_000_000_000) ?? perSecond)
        if let k = f["key"]?.value, let key = string(k, "\(path).key") {
            switch key {
            case "client_ip": c.key = .clientIP
            case "route": c.key = .route
            default:
                let name = key.hasPrefix("header:") ? String(key.dropFirst(7)).trimmingCharacters(in: .whitespaces) : ""
                if !name.isEmpty, name.utf8.allSatisfy({ HTTPBytes.isToken($0) }) {
                    c.key = .header(name)
                } else {
                    error(k, "\(path).key must be client_ip, route or header:NAME (a header name), got '\(key)'")
                }
            }
        }
        if let v = choice(f["over_limit"]?.value, "\(path).over_limit", RateLimitConfiguration.OverLimit.self) {
            c.overLimit = v
        }
        if let v = duration(f["max_wait"]?.value, "\(path).max_wait") { c.maxWait = v }
        if let v = int(f["max_queue"]?.value, "\(path).max_queue", min: 1, max: 10_000_000) { c.maxQueue = v }
        if let v = int(f["max_keys"]?.value, "\(path).max_keys", min: 1, max: 100_000_000) { c.maxKeys = v }
        if let v = choice(f["scope"]?.value, "\(path).scope", RateLimitConfiguration.Scope.self) {
            c.scope = v
            if v == .cluster { c.lease = clusterLease ?? ClusterLeases.auto(interval: c.interval) }
            if v == .cluster, !hasCluster {
                error(
                    f["scope"]?.value,
                    "\(path).scope: cluster counts in Redis, which needs cluster.redis at the top level"
                        + " (cluster: { redis: { url: redis://redis:6379/0 } }); or set scope: process")
            }
        }
        if c.overLimit == .reject {
            for key in ["max_wait", "max_queue"] where f[key] != nil {
                error(f[key]?.key, "\(path).\(key) applies only to over_limit: queue")
            }
        }
        return c
    }

    /// `cors: { allow_origins: [https://app.example.com], allow_headers, expose_headers, max_age, allow_credentials }`.
    func cors(_ node: Node, _ path: String) -> CORSConfiguration? {
        let f = fields(node, path, known: ["allow_origins", "allow_headers", "expose_headers", "max_age", "allow_credentials"])
        guard let originsNode = f["allow_origins"]?.value, let origins = strings(originsNode, "\(path).allow_origins"),
            !origins.isEmpty
        else {
            error(node, "\(path) needs allow_origins: the origins browsers may call it from, such as [https://app.example.com], or [\"*\"]")
            return nil
        }
        for origin in origins where origin != "*" && !Self.isOrigin(origin) {
            error(
                originsNode,
                "\(path).allow_origins: '\(origin)' is not an origin: a scheme and a host, with a port if not the scheme's,"
                    + " and nothing after it (https://app.example.com, http://localhost:3000)")
        }
        var c = CORSConfiguration(allowOrigins: origins)
        for key in ["allow_headers", "expose_headers"] {
            guard let n = f[key]?.value, let names = strings(n, "\(path).\(key)") else { continue }
            for name in names where name.isEmpty || !name.utf8.allSatisfy({ HTTPBytes.isToken($0) }) {
                error(n, "\(path).\(key): '\(name)' is not a header name")
            }
            if key == "allow_headers" { c.allowHeaders = names.map { $0.lowercased() } } else { c.exposeHeaders = names.map { $0.lowercased() } }
        }
        if let d = duration(f["max_age"]?.value, "\(path).max_age", allowZero: true) {
            if d > .seconds(86_400) { error(f["max_age"]?.value, "\(path).max_age must be at most 24h (browsers cap it lower anyway)") } else { c.maxAge = d }
        }
        if let b = bool(f["allow_credentials"]?.value, "\(path).allow_credentials") { c.allowCredentials = b }
        if c.allowCredentials, origins.contains("*") {
            error(
                f["allow_credentials"]?.value,
                "\(path): allow_credentials with allow_origins [\"*\"] would let any site call it as the user; list the origins instead")
        }
        return c
    }

    /// `scheme://host[:port]`, nothing after (how a browser writes `Origin`).
    static func isOrigin(_ text: String) -> Bool {
        guard let sep = text.range(of: "://") else { return false }
        let scheme = text[..<sep.lowerBound]
        let rest = text[sep.upperBound...]
        guard !scheme.isEmpty, scheme.allSatisfy({ $0.isLetter || $0 == "+" || $0 == "-" || $0 == "." }), !rest.isEmpty else {
            return false
        }
        return !rest.contains("/") && !rest.contains("?") && !rest.contains("#") && !rest.contains("@") && !rest.contains(" ")
    }

    /// `hedge: { after: 50ms | p95, min: 10ms, max: 1s, max_extra: 1 }`.
    func hedge(_ node: Node, _ path: String) -> HedgeConfiguration? {
        let f = fields(node, path, known: ["after", "min", "max", "max_extra"])
        guard let afterNode = f["after"]?.value else {
            error(node, "\(path) needs 'after': a duration such as 50ms, or p95 (the route's observed 95th percentile)")
            return nil
        }
        guard let after = string(afterNode, "\(path).after") else { return nil }
        var h: HedgeConfiguration
        if after == "p95" {
            h = HedgeConfiguration(after: .p95)
        } else if let d = Units.duration(after), d > .zero {
            h = HedgeConfiguration(after: .fixed(d))
        } else {
            error(afterNode, "\(path).after must be a duration above zero (such as 50ms) or p95, got '\(after)'")
            return nil
        }
        if let v = duration(f["min"]?.value, "\(path).min") { h.min = v }
        if let v = duration(f["max"]?.value, "\(path).max") { h.max = v }
        if let v = int(f["max_extra"]?.value, "\(path).max_extra", min: 1, max: 8) { h.maxExtra = v }
        if h.min > h.max { error(f["min"]?.value ?? node, "\(path).min must not be above max (\(h.max))") }
        if case .fixed = h.after {
            for key in ["min", "max"] where f[key] != nil { error(f[key]?.key, "\(path).\(key) applies only to after: p95") }
        }
        return h
    }

    /// `fallback: { serve_stale: 10m, on: [timeout, …], response: { status, content_type, body }, private_headers: [X-Api-Key] }`.
    func fallback(_ node: Node, _ path: String) -> FallbackConfiguration? {
        let f = fields(node, path, known: ["serve_stale", "on", "response", "private_headers"])
        var c = FallbackConfiguration()
        if let v = duration(f["serve_stale"]?.value, "\(path).serve_stale") { c.serveStale = v }
        if let on = f["on"]?.value, let list = strings(on, "\(path).on") {
            var reasons = Set<FallbackConfiguration.Reason>()
            for item in list {
                if let reason = FallbackConfiguration.Reason(rawValue: item) {
                    reasons.insert(reason)
                } else {
                    let names = FallbackConfiguration.Reason.allCases.map(\.rawValue).joined(separator: ", ")
                    error(on, "\(path).on lists ways of failing (\(names)), got '\(item)'")
                }
            }
            c.on = reasons
        }
        if let r = f["response"]?.value {
            let rf = fields(r, "\(path).response", known: ["status", "content_type", "body"])
            let status = int(rf["status"]?.value, "\(path).response.status", min: 200, max: 599) ?? 200
            let type = string(rf["content_type"]?.value, "\(path).response.content_type") ?? "application/json"
            if !type.utf8.allSatisfy({ HTTPBytes.isFieldValue($0) && $0 != 0x7F }) || type.isEmpty {
                error(rf["content_type"]?.value, "\(path).response.content_type must be a media type such as application/json")
            }
            let body = string(rf["body"]?.value, "\(path).response.body") ?? ""
            c.response = .init(status: status, contentType: type, body: body)
        }
        if let list = f["private_headers"]?.value, let names = headerNames(list, "\(path).private_headers") {
            c.privateHeaders = names
            if c.serveStale == nil { error(f["private_headers"]?.key, "\(path).private_headers applies only with serve_stale") }
        }
        if c.serveStale == nil, c.response == nil {
            error(node, "\(path) needs serve_stale (how long to keep the last good answer), response (a fixed answer), or both")
            return nil
        }
        return c
    }
}
