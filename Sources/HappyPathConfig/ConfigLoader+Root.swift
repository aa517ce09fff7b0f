import Foundation
import HappyPathCore
import HappyPathPolicies
import Yams

/// The top level of the file: listeners' defaults, `admin`, `limits`,
/// `normalize`, then `storage`, `tracing`, and the sections of their own
/// files (upstreams, routes, policies).
extension Reader {
    func configuration(_ root: Node?) -> Configuration {
        var config = Configuration(
            source: file, listeners: [Listener(address: ListenAddress(host: "0.0.0.0", port: 8080))], workers: nil,
            admin: AdminConfiguration(), limits: Limits(), defaults: PolicySettings(), upstreams: [], routes: [])
        guard let root else {
            error(nil, "the file is empty; it needs at least 'upstreams' and 'routes'")
            return config
        }
        let f = fields(
            root, "",
            known: [
                "listen", "workers", "admin", "limits", "normalize", "drain_timeout", "defaults", "upstreams", "routes",
                "storage", "trusted_proxies", "tracing", "http2", "cluster",
            ])
        if let node = f["http2"]?.value {
            config.http2 = http2(node, "http2", base: HTTP2Configuration())
            topHTTP2 = config.http2
        }
        if let node = f["listen"]?.value, let l = listeners(node) { config.listeners = l }
        if let w = f["workers"]?.value {
            if text(w, "workers") != "auto" { config.workers = int(w, "workers", min: 1, max: 256) }
        }
        if let admin = f["admin"]?.value {
            let af = fields(admin, "admin", known: ["listen", "allow_remote", "allowed_hosts"])
            if let a = address(af["listen"]?.value, "admin.listen") { config.admin.listen = a }
            if let b = bool(af["allow_remote"]?.value, "admin.allow_remote") { config.admin.allowRemote = b }
            if let node = af["allowed_hosts"]?.value { config.admin.allowedHosts = allowedHosts(node) }
        }
        if let limits = f["limits"]?.value {
            let lf = fields(
                limits, "limits",
                known: [
                    "max_request_body", "max_header_bytes", "client_timeout", "max_parked", "max_buffered_bytes", "max_connections",
                    "encoded_slashes", "stale_max_bytes", "stale_max_entry", "max_headers", "connection_buffer",
                    "max_buffered_per_client", "max_memory", "read_ahead", "max_spooled_bytes", "body_in_memory",
                ])
            if let v = size(lf["max_request_body"]?.value, "limits.max_request_body") { config.limits.maxRequestBody = v }
            if let v = size(lf["max_header_bytes"]?.value, "limits.max_header_bytes") {
                if v < 1024 {
                    error(lf["max_header_bytes"]?.value, "limits.max_header_bytes must be at least 1KiB")
                } else {
                    config.limits.maxHeaderBytes = v
                }
            }
            if let v = int(lf["max_headers"]?.value, "limits.max_headers", min: 1, max: 10_000) { config.limits.maxHeaders = v }
            if let v = duration(lf["client_timeout"]?.value, "limits.client_timeout") { config.limits.clientTimeout = v }
            if let v = int(lf["max_parked"]?.value, "limits.max_parked", min: 0) { config.limits.maxParked = v }
            if let v = int(lf["max_connections"]?.value, "limits.max_connections", min: 1) { config.limits.maxClientConnections = v }
            if let v = size(lf["max_buffered_bytes"]?.value, "limits.max_buffered_bytes") {
                config.limits.maxBufferedBytes = v
            }
            if let v = size(lf["max_buffered_per_client"]?.value, "limits.max_buffered_per_client") {
                if v > config.limits.maxBufferedBytes {
                    error(
                        lf["max_buffered_per_client"]?.value,
                        "limits.max_buffered_per_client (\(Units.sizeText(v))) must not be above limits.max_buffered_bytes"
                            + " (\(Units.sizeText(config.limits.maxBufferedBytes))): it is one client's share of it")
                } else {
                    config.limits.maxBufferedPerClient = v
                }
            }
            if let v = size(lf["max_memory"]?.value, "limits.max_memory") {
                if v < 1024 * 1024 {
                    error(lf["max_memory"]?.value, "limits.max_memory must be at least 1MiB (what the process holds for clients in all)")
                } else {
                    config.limits.maxMemory = v
                }
            }
            if let v = size(lf["connection_buffer"]?.value, "limits.connection_buffer") {
                if v < 16 * 1024 || v > 64 * 1024 * 1024 {
                    error(
                        lf["connection_buffer"]?.value,
                        "limits.connection_buffer must be between 16KiB and 64MiB (answer bytes staged per client connection)")
                } else {
                    config.limits.connectionBuffer = v
                }
            }
            if let v = size(lf["max_spooled_bytes"]?.value, "limits.max_spooled_bytes") { config.limits.maxSpooledBytes = v }
            if let v = size(lf["body_in_memory"]?.value, "limits.body_in_memory") { config.limits.bodyInMemory = v }
            if let v = size(lf["read_ahead"]?.value, "limits.read_ahead", allowZero: true) {
                if v > config.limits.maxSpooledBytes {
                    error(
                        lf["read_ahead"]?.value,
                        "limits.read_ahead (\(Units.sizeText(v))) must not be above limits.max_spooled_bytes"
                            + " (\(Units.sizeText(config.limits.maxSpooledBytes))): one answer's spool counts in it")
                } else {
                    config.limits.readAhead = v
                }
            }
            if let v = choice(lf["encoded_slashes"]?.value, "limits.encoded_slashes", PathNormalization.EncodedSlashes.self) {
                config.limits.encodedSlashes = v
            }
            if let v = size(lf["stale_max_bytes"]?.value, "limits.stale_max_bytes") { config.limits.staleMaxBytes = v }
            if let v = size(lf["stale_max_entry"]?.value, "limits.stale_max_entry") { config.limits.staleMaxEntry = v }
        }
        if let tp = f["trusted_proxies"]?.value, let list = sequence(tp, "trusted_proxies") {
            for (i, item) in list.enumerated() {
                guard let text = string(item, "trusted_proxies[\(i)]") else { continue }
                if let range = IPRange(text) {
                    config.trustedProxies.append(range)
                } else {
                    error(item, "trusted_proxies[\(i)]: '\(text)' is not an address or a network (10.0.0.0/8, fd00::/8, 192.0.2.7)")
                }
            }
        }
        if let normalize = f["normalize"]?.value {
            let nf = fields(normalize, "normalize", known: ["merge_slashes"])
            if let b = bool(nf["merge_slashes"]?.value, "normalize.merge_slashes") { config.mergeSlashes = b }
        }
        if let d = duration(f["drain_timeout"]?.value, "drain_timeout", allowZero: true) { config.drainTimeout = d }
        if let storage = f["storage"]?.value { config.storage = self.storage(storage) }
        if let tracing = f["tracing"]?.value { config.tracing = self.tracing(tracing) }
        if let cluster = f["cluster"]?.value {
            config.cluster = self.cluster(cluster)
            hasCluster = config.cluster != nil
            clusterLease = config.cluster?.lease
        }
        if let defaults = f["defaults"] {
            config.defaults = policies(fields(defaults.value, "defaults", known: Self.policyKeys), "defaults")
        }
        if let ups = f["upstreams"] {
            let uf = fields(ups.value, "upstreams", known: mappingKeys(ups.value))
            let ordered = uf.sorted { ($0.value.key.mark?.line ?? 0) < ($1.value.key.mark?.line ?? 0) }
            for (name, entry) in ordered {
                guard let u = upstream(name: name, entry.value) else { continue }
                config.upstreams.append(u)
                if u.protocol != .h2, u.policies.healthCheck.merged(over: config.defaults.healthCheck).resolved().grpc != nil {
                    let own = u.policies.healthCheck.isSet(\.grpc)
                    error(
                        entry.value,
                        "upstreams.\(name): a grpc health check (\(own ? "its" : "defaults'") health_check.grpc) needs"
                            + " protocol: h2, as gRPC runs over HTTP/2; set protocol: h2 on the upstream")
                }
            }
            config.ignoredH2Clients = ignoredH2Clients
            if config.upstreams.isEmpty && errors.isEmpty { error(ups.value, "upstreams: define at least one upstream") }
        } else {
            error(root, "missing 'upstreams': define at least one upstream service")
        }
        if let routes = f["routes"] {
            for (i, node) in (sequence(routes.value, "routes") ?? []).enumerated() {
                if let r = route(node, "routes[\(i)]", upstreams: config.upstreams, earlier: config.routes) {
                    config.routes.append(r)
                }
            }
        } else {
            error(root, "missing 'routes': add at least one route such as '- match: { path_prefix: / }'")
        }
        Self.defaultGRPCHealthChecks(&config)
        for (i, r) in config.routes.enumerated() where r.match.pathPrefix.hasPrefix(config.storage.statusPath + "/") {
            error(
                f["routes"]?.value,
                "routes[\(i)] (path_prefix \(r.match.pathPrefix)) is inside storage.status_path \(config.storage.statusPath), which the proxy answers itself"
            )
        }
        return config
    }

    func mappingKeys(_ node: Node) -> [String] {
        guard case let .mapping(m) = node else { return [] }
        return m.keys.compactMap(\.string)
    }

    /// `admin.allowed_hosts`: host names or IP literals as a `Host` header
    /// carries them, without a port (the port plays no part in the check).
    func allowedHosts(_ node: Node) -> [String] {
        guard let items = sequence(node, "admin.allowed_hosts") else { return [] }
        var out: [String] = []
        for (i, item) in items.enumerated() {
            let path = "admin.allowed_hosts[\(i)]"
            guard let name = text(item, path) else { continue }
            let host = name.lowercased()
            let bracketed = host.hasPrefix("[") && host.hasSuffix("]") && host.count > 2
            let allowed = host.unicodeScalars.allSatisfy {
                ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "-" || $0 == "." || $0 == "_"
                    || (bracketed && ($0 == ":" || $0 == "[" || $0 == "]"))
            }
            if host.isEmpty || !allowed {
                error(
                    item,
                    "\(path): '\(name)' is not a host name (write it as a Host header carries it, without scheme, port or path: admin.example.com, 10.0.0.5, [fd00::5])"
                )
                continue
            }
            out.append(host)
        }
        return out
    }

    /// `tracing`: OpenTelemetry spans over OTLP/HTTP (docs/operations.md, "Tracing").
    func tracing(_ node: Node) -> TracingConfiguration? {
        let f = fields(node, "tracing", known: ["otlp_endpoint", "sample_ratio", "service_name"])
        var t = TracingConfiguration(endpoint: "")
        guard let e = string(f["otlp_endpoint"]?.value, "tracing.otlp_endpoint") else {
            if f["otlp_endpoint"] == nil {
                error(node, "tracing needs otlp_endpoint, the collector's OTLP/HTTP traces URL (http://otel-collector:4318/v1/traces)")
            }
            return nil
        }
        guard e.hasPrefix("http://") || e.hasPrefix("https://"), e.count > 8 else {
            error(f["otlp_endpoint"]?.value, "tracing.otlp_endpoint must be an http:// or https:// URL, such as http://otel-collector:4318/v1/traces")
            return nil
        }
        t.endpoint = e
        if let r = double(f["sample_ratio"]?.value, "tracing.sample_ratio", min: 0, max: 1) { t.sampleRatio = r }
        if let n = string(f["service_name"]?.value, "tracing.service_name") {
            if n.isEmpty { error(f["service_name"]?.value, "tracing.service_name must not be empty") } else { t.serviceName = n }
        }
        return t
    }

    /// `cluster: { redis: { url, timeout, lease, heartbeat, tls } }`.
    func cluster(_ node: Node) -> ClusterConfiguration? {
        let f = fields(node, "cluster", known: ["redis"])
        guard let redis = f["redis"]?.value else {
            error(node, "cluster needs redis: { url: redis://redis:6379/0 }")
            return nil
        }
        let rf = fields(redis, "cluster.redis", known: ["url", "timeout", "lease", "heartbeat", "tls"])
        guard let urlNode = rf["url"]?.value else {
            error(redis, "cluster.redis needs url, such as redis://redis:6379/0 (rediss:// for TLS; a password as redis://:${REDIS_PASSWORD}@redis:6379/0)")
            return nil
        }
        guard let url = string(urlNode, "cluster.redis.url") else { return nil }
        let endpoint: RedisEndpoint
        switch RedisEndpoint.parse(url) {
        case let .success(e): endpoint = e
        case let .failure(why):
            // The URL may carry a password: the message names the problem, not the URL.
            error(urlNode, "cluster.redis.url \(why.description), such as redis://:${REDIS_PASSWORD}@redis:6379/0")
            return nil
        }
        var c = ClusterConfiguration(redis: endpoint)
        if let v = duration(rf["timeout"]?.value, "cluster.redis.timeout") {
            if v > .seconds(1) {
                error(rf["timeout"]?.value, "cluster.redis.timeout must be at most 1s: a request waits this long for Redis before its replica decides alone")
            } else {
                c.timeout = v
            }
        }
        if let v = duration(rf["heartbeat"]?.value, "cluster.redis.heartbeat") {
            if v < .milliseconds(100) || v > .seconds(60) {
                error(rf["heartbeat"]?.value, "cluster.redis.heartbeat must be between 100ms and 60s")
            } else {
                c.heartbeat = v
            }
        }
        if let node = rf["lease"]?.value, text(node, "cluster.redis.lease") != "auto" {
            c.lease = int(node, "cluster.redis.lease", min: 1, max: 1000)
        }
        if let t = rf["tls"]?.value {
            let tf = fields(t, "cluster.redis.tls", known: ["ca", "verify"])
            var s = UpstreamTLSSettings()
            if let ca = string(tf["ca"]?.value, "cluster.redis.tls.ca") { s.ca = ca }
            if let v = bool(tf["verify"]?.value, "cluster.redis.tls.verify") { s.verify = v }
            if !endpoint.tls { error(t, "cluster.redis.tls applies to rediss:// URLs only") }
            c.tls = s
        }
        return c
    }

    func storage(_ node: Node) -> StorageConfiguration {
        var s = StorageConfiguration()
        let f = fields(
            node, "storage",
            known: ["path", "sync", "max_bytes", "retention", "status_path", "url", "pool", "lease", "required", "spool_dir"])
        if let d = string(f["spool_dir"]?.value, "storage.spool_dir") {
            if d.isEmpty || !d.hasPrefix("/") {
                error(f["spool_dir"]?.value, "storage.spool_dir must be an absolute directory path, such as /var/lib/happypath/spool")
            } else {
                s.spoolDir = d
            }
        }
        if let u = string(f["url"]?.value, "storage.url") {
            if !(u.hasPrefix("postgres://") || u.hasPrefix("postgresql://") || u.contains("=")) {
                error(
                    f["url"]?.value,
                    "storage.url must be a PostgreSQL URL such as postgres://user:password@host:5432/db?sslmode=require "
                        + "(or libpq's key=value form); for a file on this machine, set storage.path instead")
            } else if f["path"] != nil {
                error(f["url"]?.value, "storage.url and storage.path both set: a store is either a file (path) or PostgreSQL (url); keep one")
            } else if f["sync"] != nil {
                error(f["sync"]?.value, "storage.sync is SQLite's; with storage.url the durability of a commit is the server's synchronous_commit")
            } else {
                s.url = u
            }
        }
        if let v = int(f["pool"]?.value, "storage.pool", min: 2, max: 64) { s.pool = v }
        if let v = duration(f["lease"]?.value, "storage.lease") {
            if v < .seconds(1) { error(f["lease"]?.value, "storage.lease must be at least 1s") } else { s.lease = v }
        }
        if let v = bool(f["required"]?.value, "storage.required") { s.required = v }
        if s.url == nil {
            for key in ["pool", "lease", "required"] where f[key] != nil {
                error(f[key]?.value, "storage.\(key) applies to a PostgreSQL store only: set storage.url, or remove it")
            }
        }
        if let p = string(f["path"]?.value, "storage.path") {
            if p.isEmpty || p.hasSuffix("/") {
                error(f["path"]?.value, "storage.path must name a file, such as /var/lib/happypath/deliveries.db")
            } else {
                s.path = p
                if let mark = f["path"]?.value.mark {
                    s.pathLine = mark.line
                    s.pathColumn = mark.column
                }
            }
        }
        if let v = choice(f["sync"]?.value, "storage.sync", StorageSync.self) { s.sync = v }
        if let v = size(f["max_bytes"]?.value, "storage.max_bytes") {
            if v < 1 << 20 {
                error(f["max_bytes"]?.value, "storage.max_bytes must be at least 1MiB")
            } else {
                s.maxBytes = v
            }
        }
        if let v = duration(f["retention"]?.value, "storage.retention") { s.retention = v }
        if let p = string(f["status_path"]?.value, "storage.status_path") {
            if !p.hasPrefix("/") || p.hasSuffix("/") || p.count < 2 || p.contains("?") {
                error(f["status_path"]?.value, "storage.status_path must be a path such as /_happypath/deliveries (no trailing /)")
            } else {
                s.statusPath = p
            }
        }
        return s
    }
}
