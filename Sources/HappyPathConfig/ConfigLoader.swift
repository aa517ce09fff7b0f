import Foundation
import HappyPathCore
import HappyPathPolicies
import Yams

/// Reads a YAML file into a `Configuration`, reporting every problem at once
/// as `FILE:LINE:COL: message`. Nothing is silently ignored: unknown keys are
/// errors, and so is a route that can never match.
public enum ConfigLoader {
    /// Where a config is looked for without `--config`, in order (docs/contract.md, "Commands").
    public static let defaultPaths = ["config/happypath.yaml", "/etc/happypath/happypath.yaml"]

    public static func defaultPath() -> String {
        defaultPaths.first { FileManager.default.fileExists(atPath: $0) } ?? defaultPaths[0]
    }

    public static func load(
        path: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigErrors) -> Configuration {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigErrors([ConfigError(file: path, line: 1, column: 1, message: "cannot read the file (does it exist?)")])
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw ConfigErrors([ConfigError(file: path, line: 1, column: 1, message: "the file is not UTF-8 text")])
        }
        return try parse(text, file: path, environment: environment)
    }

    public static func parse(
        _ text: String, file: String, environment: [String: String] = [:]
    ) throws(ConfigErrors) -> Configuration {
        let node: Node?
        do {
            node = try Yams.compose(yaml: text)
        } catch let error as YamlError {
            throw ConfigErrors([yamlError(error, file: file)])
        } catch {
            throw ConfigErrors([ConfigError(file: file, line: 1, column: 1, message: "\(error)")])
        }
        let reader = Reader(file: file, environment: environment)
        let config = reader.configuration(node)
        if !reader.errors.isEmpty { throw ConfigErrors(reader.errors) }
        return config
    }

    /// What `happypath check` adds to the file's own validity: a store
    /// (needed when a route delivers later) whose directory this process
    /// cannot write is reported before `serve` would fail on it.
    public static func storageProblems(_ config: Configuration) -> [ConfigError] {
        guard config.usesStore, config.storage.url == nil else { return [] }
        let path = config.storage.path
        let directory = (path as NSString).deletingLastPathComponent.isEmpty
            ? "." : (path as NSString).deletingLastPathComponent
        // The nearest directory that exists: the store makes the rest.
        var existing = directory
        while !FileManager.default.fileExists(atPath: existing), existing != "/", existing != "." {
            existing = (existing as NSString).deletingLastPathComponent
            if existing.isEmpty { existing = "." }
        }
        let problem: String?
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: existing, isDirectory: &isDirectory), !isDirectory.boolValue {
            problem = "storage.path: \(existing) is a file, not a directory; set storage.path to a file in a directory"
        } else if access(existing, W_OK | X_OK) != 0 {
            problem =
                existing == directory
                ? "storage.path: the directory \(directory) is not writable by this user (uid \(getuid())); the store needs to create its file and journal there"
                : "storage.path: the directory \(directory) does not exist and cannot be created here: \(existing) is not writable by this user (uid \(getuid())); create it, or set storage.path"
        } else if FileManager.default.fileExists(atPath: path), access(path, R_OK | W_OK) != 0 {
            problem = "storage.path: \(path) exists but is not readable and writable by this user (uid \(getuid()))"
        } else {
            problem = nil
        }
        return problem.map {
            [ConfigError(file: config.source, line: config.storage.pathLine, column: config.storage.pathColumn, message: $0)]
        } ?? []
    }

    static func yamlError(_ error: YamlError, file: String) -> ConfigError {
        switch error {
        case let .scanner(_, problem, mark, _), let .parser(_, problem, mark, _), let .composer(_, problem, mark, _):
            return ConfigError(file: file, line: mark.line, column: mark.column, message: "YAML syntax: \(problem)")
        case let .reader(problem, offset, value, yaml):
            // The reader reports a byte offset: turn it into the line and column.
            let (line, column) = position(ofByte: offset ?? 0, in: yaml)
            let byte = value >= 0 ? String(format: " (byte 0x%02X)", value) : ""
            return ConfigError(file: file, line: line, column: column, message: "YAML: \(problem)\(byte)")
        default:
            let text = "\(error)".split(separator: "\n").first.map(String.init) ?? "unreadable YAML"
            return ConfigError(file: file, line: 1, column: 1, message: "YAML: \(text)")
        }
    }

    /// Line and column (from 1, columns in characters) of the byte at `offset`.
    static func position(ofByte offset: Int, in text: String) -> (Int, Int) {
        var line = 1
        var column = 1
        for (i, byte) in text.utf8.enumerated() {
            if i >= offset { break }
            if byte == 0x0A {
                line += 1
                column = 1
            } else if byte & 0xC0 != 0x80 {
                column += 1
            }
        }
        return (line, column)
    }
}

/// Walks the YAML tree. Each section names the keys it knows; what remains is
/// reported. Conversions record an error and return nil, so one pass finds all.
final class Reader {
    let file: String
    let environment: [String: String]
    var errors: [ConfigError] = []

    init(file: String, environment: [String: String]) {
        self.file = file
        self.environment = environment
    }

    func error(_ node: Node?, _ message: String) {
        let mark = node?.mark
        errors.append(
            ConfigError(file: file, line: mark?.line ?? 1, column: mark?.column ?? 1, message: Self.oneLine(message)))
    }

    /// A message stays one line whatever it quotes from the file (a key
    /// folded over several lines, a value with an escaped line break):
    /// line breaks and other control characters are written as escapes.
    static func oneLine(_ message: String) -> String {
        guard message.unicodeScalars.contains(where: { isControl($0) }) else { return message }
        var out = ""
        for scalar in message.unicodeScalars {
            switch scalar {
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where isControl(scalar): out += "\\u{" + String(scalar.value, radix: 16) + "}"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028 || scalar.value == 0x2029
    }

    // MARK: - Structure

    /// The entries of a mapping keyed by name, after reporting unknown and duplicate keys.
    func fields(_ node: Node?, _ path: String, known: [String]) -> [String: (key: Node, value: Node)] {
        guard let node else { return [:] }
        guard case let .mapping(mapping) = node else {
            error(node, "\(path) must be a mapping of keys to values")
            return [:]
        }
        var out: [String: (key: Node, value: Node)] = [:]
        for (key, value) in mapping {
            guard let name = key.string else {
                error(key, "\(path): keys must be plain strings")
                continue
            }
            let qualified = path.isEmpty ? name : "\(path).\(name)"
            if out[name] != nil {
                error(key, "duplicate key '\(qualified)'")
            } else if !known.contains(name) {
                error(key, "unknown key '\(qualified)'" + suggestion(for: name, in: known))
            } else {
                out[name] = (key, value)
            }
        }
        return out
    }

    private func suggestion(for name: String, in known: [String]) -> String {
        let close = known.filter { editDistance($0, name) <= 2 }
        if let best = close.first { return " (did you mean '\(best)'?)" }
        return "; expected one of: " + known.joined(separator: ", ")
    }

    func sequence(_ node: Node?, _ path: String) -> [Node]? {
        guard let node else { return nil }
        guard case let .sequence(seq) = node else {
            error(node, "\(path) must be a list")
            return nil
        }
        return Array(seq)
    }

    // MARK: - Scalars

    /// The scalar's text with `${VAR}` substituted.
    func text(_ node: Node?, _ path: String) -> String? {
        guard let node else { return nil }
        guard case let .scalar(scalar) = node else {
            error(node, "\(path) must be a single value, not a list or mapping")
            return nil
        }
        switch EnvironmentSubstitution.apply(scalar.string, environment: environment) {
        case let .success(value): return value
        case let .failure(.unset(name)):
            error(node, "\(path): environment variable \(name) is not set (export it, or write ${\(name):-default})")
            return nil
        case .failure(.malformed):
            error(node, "\(path): malformed ${...} reference; write ${NAME} or ${NAME:-default}")
            return nil
        }
    }

    func string(_ node: Node?, _ path: String) -> String? { text(node, path) }

    /// A credential: wrapped as soon as it is read, so no later message can
    /// print it. (`text` never puts a value into its own messages.)
    func secret(_ node: Node?, _ path: String) -> Secret? { text(node, path).map(Secret.init) }

    func int(_ node: Node?, _ path: String, min: Int = 0, max: Int = Int.max) -> Int? {
        guard let s = text(node, path) else { return nil }
        guard let v = Int(s) else {
            error(node, "\(path) must be a whole number, got '\(s)'")
            return nil
        }
        guard v >= min, v <= max else {
            error(
                node,
                max == Int.max
                    ? "\(path) must be at least \(min), got \(v)" : "\(path) must be between \(min) and \(max), got \(v)")
            return nil
        }
        return v
    }

    func double(_ node: Node?, _ path: String, min: Double, max: Double) -> Double? {
        guard let s = text(node, path) else { return nil }
        guard let v = Double(s), v >= min, v <= max else {
            error(node, "\(path) must be a number from \(min) to \(max), got '\(s)'")
            return nil
        }
        return v
    }

    func bool(_ node: Node?, _ path: String) -> Bool? {
        guard let s = text(node, path) else { return nil }
        switch s.lowercased() {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default:
            error(node, "\(path) must be true or false, got '\(s)'")
            return nil
        }
    }

    func duration(_ node: Node?, _ path: String, allowZero: Bool = false) -> Duration? {
        guard let s = text(node, path) else { return nil }
        guard let d = Units.duration(s) else {
            error(node, "\(path): '\(s)' is not a duration; write e.g. 250ms, 2s, 1m")
            return nil
        }
        if !allowZero && d <= .zero {
            error(node, "\(path) must be longer than zero")
            return nil
        }
        return d
    }

    func size(_ node: Node?, _ path: String) -> Int? {
        guard let s = text(node, path) else { return nil }
        guard let v = Units.size(s), v > 0 else {
            error(node, "\(path): '\(s)' is not a size; write e.g. 512KiB, 10MiB")
            return nil
        }
        return v
    }

    func choice<E: RawRepresentable & CaseIterable>(_ node: Node?, _ path: String, _: E.Type) -> E?
    where E.RawValue == String {
        guard let s = text(node, path) else { return nil }
        guard let v = E(rawValue: s) else {
            error(node, "\(path) must be one of \(E.allCases.map(\.rawValue).joined(separator: ", ")), got '\(s)'")
            return nil
        }
        return v
    }

    func strings(_ node: Node?, _ path: String) -> [String]? {
        guard let node else { return nil }
        if case .scalar = node, let one = text(node, path) { return [one] }
        guard let items = sequence(node, path) else { return nil }
        return items.enumerated().compactMap { text($1, "\(path)[\($0)]") }
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

    func address(_ node: Node?, _ path: String) -> ListenAddress? {
        guard let s = text(node, path) else { return nil }
        guard let a = ListenAddress.parse(s) else {
            error(node, "\(path): '\(s)' is not HOST:PORT (e.g. 127.0.0.1:8080 or [::1]:8080)")
            return nil
        }
        return a
    }

    /// `listen`: `HOST:PORT`, or a list of listeners, each `HOST:PORT` or
    /// `{ address, tls }`.
    func listeners(_ node: Node) -> [Listener]? {
        if case .scalar = node { return address(node, "listen").map { [Listener(address: $0)] } }
        guard let items = sequence(node, "listen") else { return nil }
        guard !items.isEmpty else {
            error(node, "listen must name at least one address (HOST:PORT)")
            return nil
        }
        var out: [Listener] = []
        for (i, item) in items.enumerated() {
            let path = "listen[\(i)]"
            // The same address twice could never bind (port 0, a port of
            // its own for each, aside).
            func listedTwice(_ a: ListenAddress, _ node: Node, _ what: String) -> Bool {
                guard a.port != 0, let earlier = out.first(where: { $0.address == a }) else { return false }
                error(node, "\(what): \(a) is listed twice (also as \(earlier.address))")
                return true
            }
            if case .scalar = item {
                if let a = address(item, path), !listedTwice(a, item, path) { out.append(Listener(address: a)) }
                continue
            }
            let lf = fields(item, path, known: ["address", "tls"])
            guard let addressNode = lf["address"]?.value else {
                error(item, "\(path) needs an address (HOST:PORT)")
                continue
            }
            guard let a = address(addressNode, "\(path).address") else { continue }
            var listener = Listener(address: a)
            if let tlsNode = lf["tls"]?.value { listener.tls = tlsSettings(tlsNode, "\(path).tls") }
            if listedTwice(a, addressNode, "\(path).address") { continue }
            out.append(listener)
        }
        return out.isEmpty ? nil : out
    }

    func tlsSettings(_ node: Node, _ path: String) -> TLSListenerSettings? {
        let tf = fields(node, path, known: ["certificates", "min_version", "alpn"])
        var pairs: [CertificatePair] = []
        if let list = tf["certificates"]?.value, let items = sequence(list, "\(path).certificates") {
            for (i, item) in items.enumerated() {
                let p = "\(path).certificates[\(i)]"
                let cf = fields(item, p, known: ["cert", "key"])
                guard let cert = string(cf["cert"]?.value, "\(p).cert"), let key = string(cf["key"]?.value, "\(p).key") else {
                    if cf["cert"] == nil || cf["key"] == nil { error(item, "\(p) needs both cert and key (PEM files)") }
                    continue
                }
                pairs.append(CertificatePair(cert: cert, key: key))
            }
        }
        guard !pairs.isEmpty else {
            error(node, "\(path).certificates must list at least one { cert, key } pair")
            return nil
        }
        var settings = TLSListenerSettings(certificates: pairs)
        if let v = tf["min_version"]?.value {
            let text = self.text(v, "\(path).min_version")
            if let text, let version = TLSMinimumVersion(rawValue: text) {
                settings.minVersion = version
            } else if let text {
                error(v, "\(path).min_version must be \"1.2\" or \"1.3\", got '\(text)'")
            }
        }
        if let a = tf["alpn"]?.value, let protocols = strings(a, "\(path).alpn") {
            if protocols != ["http/1.1"] {
                error(a, "\(path).alpn: the proxy speaks http/1.1 only; write [http/1.1] or leave alpn out")
            }
            settings.alpn = protocols
        }
        return settings
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

    // MARK: - Sections

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
                "storage", "trusted_proxies", "tracing",
            ])
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
                    "encoded_slashes", "stale_max_bytes", "stale_max_entry",
                ])
            if let v = size(lf["max_request_body"]?.value, "limits.max_request_body") { config.limits.maxRequestBody = v }
            if let v = size(lf["max_header_bytes"]?.value, "limits.max_header_bytes") {
                if v < 1024 {
                    error(lf["max_header_bytes"]?.value, "limits.max_header_bytes must be at least 1KiB")
                } else {
                    config.limits.maxHeaderBytes = v
                }
            }
            if let v = duration(lf["client_timeout"]?.value, "limits.client_timeout") { config.limits.clientTimeout = v }
            if let v = int(lf["max_parked"]?.value, "limits.max_parked", min: 0) { config.limits.maxParked = v }
            if let v = int(lf["max_connections"]?.value, "limits.max_connections", min: 1) { config.limits.maxConnections = v }
            if let v = size(lf["max_buffered_bytes"]?.value, "limits.max_buffered_bytes") {
                config.limits.maxBufferedBytes = v
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
        if let defaults = f["defaults"] {
            config.defaults = policies(fields(defaults.value, "defaults", known: Self.policyKeys), "defaults")
        }
        if let ups = f["upstreams"] {
            let uf = fields(ups.value, "upstreams", known: mappingKeys(ups.value))
            let ordered = uf.sorted { ($0.value.key.mark?.line ?? 0) < ($1.value.key.mark?.line ?? 0) }
            for (name, entry) in ordered {
                if let u = upstream(name: name, entry.value) { config.upstreams.append(u) }
            }
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
        for (i, r) in config.routes.enumerated() where r.match.pathPrefix.hasPrefix(config.storage.statusPath + "/") {
            error(
                f["routes"]?.value,
                "routes[\(i)] (path_prefix \(r.match.pathPrefix)) is inside storage.status_path \(config.storage.statusPath), which the proxy answers itself"
            )
        }
        return config
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

    func storage(_ node: Node) -> StorageConfiguration {
        var s = StorageConfiguration()
        let f = fields(
            node, "storage",
            known: ["path", "sync", "max_bytes", "retention", "status_path", "url", "pool", "lease", "required"])
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

    /// `rate_limit: { rate: 100/s, burst: 50, key: client_ip, over_limit: queue, max_wait: 2s, max_queue: 1000, max_keys: 100000 }`.
    func rateLimit(_ node: Node, _ path: String) -> RateLimitConfiguration? {
        let f = fields(
            node, path, known: ["rate", "burst", "key", "over_limit", "max_wait", "max_queue", "max_keys"])
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
        if c.overLimit == .reject {
            for key in ["max_wait", "max_queue"] where f[key] != nil {
                error(f[key]?.key, "\(path).\(key) applies only to over_limit: queue")
            }
        }
        return c
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
        if let list = f["private_headers"]?.value, let names = strings(list, "\(path).private_headers") {
            var seen = Set<String>()
            c.privateHeaders = []
            for name in names {
                if name.isEmpty || !name.utf8.allSatisfy({ HTTPBytes.isToken($0) }) {
                    error(list, "\(path).private_headers lists header names (such as X-Api-Key), got '\(name)'")
                } else if !seen.insert(name.lowercased()).inserted {
                    error(list, "\(path).private_headers lists '\(name)' twice")
                } else {
                    c.privateHeaders.append(name)
                }
            }
            if c.privateHeaders.count > 32 {
                error(list, "\(path).private_headers lists at most 32 names, got \(c.privateHeaders.count)")
            }
            if c.serveStale == nil { error(f["private_headers"]?.key, "\(path).private_headers applies only with serve_stale") }
        }
        if c.serveStale == nil, c.response == nil {
            error(node, "\(path) needs serve_stale (how long to keep the last good answer), response (a fixed answer), or both")
            return nil
        }
        return c
    }

    /// `pacing: { on: [429, 503], max_pause: 60s, while_paused: wait, scope_429: client, max_clients: 10000 }`.
    func pacing(_ node: Node, _ path: String) -> PacingConfiguration {
        let f = fields(node, path, known: ["on", "max_pause", "while_paused", "scope_429", "max_clients"])
        var p = PacingConfiguration()
        if let on = f["on"]?.value, let list = strings(on, "\(path).on") {
            var statuses = Set<Int>()
            for item in list {
                if let s = Int(item), (400...599).contains(s) {
                    statuses.insert(s)
                } else {
                    error(on, "\(path).on lists statuses from 400 to 599 (such as 429, 503), got '\(item)'")
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

    func delivery(_ node: Node, _ path: String) -> DeliverySettings {
        var d = DeliverySettings()
        let f = fields(node, path, known: ["mode", "max_age", "max_attempts", "backoff", "idempotency"])
        if let m = choice(f["mode"]?.value, "\(path).mode", DeliveryMode.self) { d.mode = m }
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

    private func mappingKeys(_ node: Node) -> [String] {
        guard case let .mapping(m) = node else { return [] }
        return m.keys.compactMap(\.string)
    }

    static let policyKeys = ["timeout", "retry", "circuit_breaker", "reachability", "health_check", "outlier_detection"]

    /// Policy keys of an upstream (or `defaults`) that a route may not set.
    static let upstreamOnlyPolicyKeys = ["circuit_breaker", "health_check", "outlier_detection"]

    func policies(_ f: [String: (key: Node, value: Node)], _ path: String) -> PolicySettings {
        var p = PolicySettings()
        p.timeout.set(\.timeout, duration(f["timeout"]?.value, "\(path).timeout"))
        if let r = f["retry"]?.value {
            let rp = "\(path).retry"
            let rf = fields(
                r, rp,
                known: [
                    "attempts", "per_try_timeout", "on", "backoff", "honor_retry_after", "max_retry_after", "budget",
                    "methods",
                ])
            p.retry.set(\.attempts, int(rf["attempts"]?.value, "\(rp).attempts", min: 1, max: 100))
            p.retry.set(\.perTryTimeout, duration(rf["per_try_timeout"]?.value, "\(rp).per_try_timeout"))
            if let on = rf["on"]?.value, let list = strings(on, "\(rp).on") {
                for item in list where !["connect-failure", "reset", "timeout"].contains(item) {
                    if let code = Int(item), (500...599).contains(code) || code == 429 || code == 408 { continue }
                    error(on, "\(rp).on: '\(item)' is not connect-failure, reset, timeout or a 5xx/408/429 status")
                }
                p.retry.set(\.on, Set(list))
            }
            if let b = rf["backoff"]?.value {
                let bf = fields(b, "\(rp).backoff", known: ["base", "max", "jitter"])
                let base = duration(bf["base"]?.value, "\(rp).backoff.base")
                let max = duration(bf["max"]?.value, "\(rp).backoff.max")
                p.retry.set(\.backoffBase, base)
                p.retry.set(\.backoffMax, max)
                p.retry.set(\.jitter, choice(bf["jitter"]?.value, "\(rp).backoff.jitter", Jitter.self).map { $0 == .full })
                if let base, let max, max < base {
                    error(bf["max"]?.value, "\(rp).backoff.max must not be shorter than backoff.base")
                }
            }
            p.retry.set(\.honorRetryAfter, bool(rf["honor_retry_after"]?.value, "\(rp).honor_retry_after"))
            let cap = duration(rf["max_retry_after"]?.value, "\(rp).max_retry_after")
            p.retry.set(\.maxRetryAfter, cap)
            if let cap, cap < .seconds(1) {
                error(rf["max_retry_after"]?.value, "\(rp).max_retry_after must be at least 1s")
            }
            if let b = rf["budget"]?.value {
                let bf = fields(b, "\(rp).budget", known: ["ratio", "min_per_second"])
                p.retryBudget.set(\.ratio, double(bf["ratio"]?.value, "\(rp).budget.ratio", min: 0, max: 1))
                p.retryBudget.set(\.minPerSecond, int(bf["min_per_second"]?.value, "\(rp).budget.min_per_second"))
            }
            if let m = rf["methods"]?.value { p.retry.set(\.methods, methods(m, "\(rp).methods").map(Set.init)) }
        }
        if let c = f["circuit_breaker"]?.value {
            let cp = "\(path).circuit_breaker"
            let cf = fields(
                c, cp,
                known: [
                    "consecutive_failures", "failure_rate", "minimum_requests", "window", "open_for",
                    "half_open_probes", "while_open",
                ])
            p.circuitBreaker.set(
                \.consecutiveFailures, int(cf["consecutive_failures"]?.value, "\(cp).consecutive_failures", min: 1))
            p.circuitBreaker.set(\.failureRate, double(cf["failure_rate"]?.value, "\(cp).failure_rate", min: 0, max: 1))
            p.circuitBreaker.set(\.minimumRequests, int(cf["minimum_requests"]?.value, "\(cp).minimum_requests", min: 1))
            p.circuitBreaker.set(\.window, duration(cf["window"]?.value, "\(cp).window"))
            p.circuitBreaker.set(\.openFor, duration(cf["open_for"]?.value, "\(cp).open_for"))
            p.circuitBreaker.set(\.halfOpenProbes, int(cf["half_open_probes"]?.value, "\(cp).half_open_probes", min: 1))
            p.circuitBreaker.set(
                \.whileOpen,
                choice(cf["while_open"]?.value, "\(cp).while_open", CircuitBreakerStateMachine.WhileOpen.self))
        }
        if let r = f["reachability"]?.value {
            let rf = fields(r, "\(path).reachability", known: ["park_for"])
            p.reachability.set(
                \.parkFor, duration(rf["park_for"]?.value, "\(path).reachability.park_for", allowZero: true))
        }
        if let o = f["outlier_detection"]?.value {
            let op = "\(path).outlier_detection"
            let of = fields(o, op, known: ["consecutive_failures", "base_ejection", "max_ejected_percent"])
            p.outlierDetection.set(
                \.consecutiveFailures, int(of["consecutive_failures"]?.value, "\(op).consecutive_failures", min: 1))
            p.outlierDetection.set(\.baseEjection, duration(of["base_ejection"]?.value, "\(op).base_ejection"))
            p.outlierDetection.set(
                \.maxEjectedPercent, int(of["max_ejected_percent"]?.value, "\(op).max_ejected_percent", min: 0, max: 100))
        }
        if let h = f["health_check"]?.value {
            let hp = "\(path).health_check"
            let hf = fields(h, hp, known: ["path", "interval", "timeout", "unhealthy_after", "healthy_after"])
            if let s = string(hf["path"]?.value, "\(hp).path") {
                if s.hasPrefix("/") { p.healthCheck.set(\.path, s) } else { error(hf["path"]?.value, "\(hp).path must start with /") }
            }
            p.healthCheck.set(\.interval, duration(hf["interval"]?.value, "\(hp).interval"))
            p.healthCheck.set(\.timeout, duration(hf["timeout"]?.value, "\(hp).timeout"))
            p.healthCheck.set(\.unhealthyAfter, int(hf["unhealthy_after"]?.value, "\(hp).unhealthy_after", min: 1))
            p.healthCheck.set(\.healthyAfter, int(hf["healthy_after"]?.value, "\(hp).healthy_after", min: 1))
        }
        return p
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

    func upstream(name: String, _ node: Node) -> Upstream? {
        let path = "upstreams.\(name)"
        let f = fields(
            node, path,
            known: ["endpoints", "connect_timeout", "max_connections", "auth", "errors", "upstream_errors", "pacing", "tls"]
                + Self.policyKeys)
        var u = Upstream(name: name, endpoints: [])
        if let e = f["endpoints"] {
            for (i, item) in (sequence(e.value, "\(path).endpoints") ?? []).enumerated() {
                guard let s = text(item, "\(path).endpoints[\(i)]") else { continue }
                if let url = endpoint(s) {
                    // The base path is put in front of every (normalized)
                    // target: it must be a normalized path itself, with no
                    // query or fragment, or it would undo that normalization.
                    let afterScheme = url[url.range(of: "://")!.upperBound...]
                    let base = afterScheme.firstIndex(of: "/").map { String(afterScheme[$0...]) } ?? ""
                    if base.contains("?") || base.contains("#") || afterScheme.contains("?") || afterScheme.contains("#") {
                        error(item, "\(path).endpoints[\(i)]: '\(s)' has a query or fragment; an endpoint is an origin and a base path only")
                    } else if !base.isEmpty, case let .success(normal) = PathNormalizer.normalize(base), normal != base {
                        error(item, "\(path).endpoints[\(i)]: the base path '\(base)' is not normalized; write it as '\(normal)'")
                    } else if !base.isEmpty, case let .failure(refusal) = PathNormalizer.normalize(base) {
                        error(item, "\(path).endpoints[\(i)]: the base path '\(base)' is not a valid path: \(refusal.detail)")
                    }
                    u.endpoints.append(url)
                } else {
                    error(item, "\(path).endpoints[\(i)]: '\(s)' is not an http:// or https:// URL with a host")
                }
            }
            if u.endpoints.isEmpty && errors.isEmpty { error(e.value, "\(path).endpoints must list at least one URL") }
        } else {
            error(node, "\(path) needs 'endpoints', e.g. [http://127.0.0.1:9000]")
        }
        if let v = duration(f["connect_timeout"]?.value, "\(path).connect_timeout") { u.connectTimeout = v }
        if let v = int(f["max_connections"]?.value, "\(path).max_connections", min: 1) { u.maxConnections = v }
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
        return u
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
                error(n, "\(path).\(key): '\(url)' is not an http:// or https:// URL")
            }
        }
        if let p = a.tokenPointer, !p.hasPrefix("/") {
            error(f["token_pointer"]?.value, "\(path).token_pointer must start with /")
        }
        return a
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
        if let i = earlier.firstIndex(where: { match.isShadowed(by: $0.match) }) {
            error(
                node,
                "\(path) can never match: routes[\(i)] (path_prefix \(earlier[i].match.pathPrefix)) is earlier and matches everything it does"
            )
        }
        return r
    }
}

func editDistance(_ a: String, _ b: String) -> Int {
    let a = Array(a), b = Array(b)
    if a.isEmpty { return b.count }
    if b.isEmpty { return a.count }
    var prev = Array(0...b.count)
    for i in 1...a.count {
        var cur = [i] + Array(repeating: 0, count: b.count)
        for j in 1...b.count {
            cur[j] = Swift.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
        }
        prev = cur
    }
    return prev[b.count]
}
