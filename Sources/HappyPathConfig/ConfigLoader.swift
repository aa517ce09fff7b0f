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

    /// The spool directory (`storage.spool_dir`, or its default) when
    /// answers are read ahead (`limits.read_ahead` above 0) or bodies may
    /// be spooled (`limits.body_in_memory` below `max_request_body`): one
    /// this process can make files in, or why not (the proxy still runs:
    /// slow clients' answers then wait in their upstream transfers, and
    /// bodies are kept in memory).
    public static func spoolProblem(_ config: Configuration) -> String? {
        guard config.limits.readAhead > 0 || config.limits.bodyInMemory < config.limits.maxRequestBody else { return nil }
        // Beside the store's file by default: the store makes that directory
        // at start, and `storageProblems` says whether it can.
        if config.storage.spoolDir == nil, config.usesStore, config.storage.url == nil { return nil }
        let dir = config.spoolDirectory
        var isDirectory: ObjCBool = false
        if !FileManager.default.fileExists(atPath: dir, isDirectory: &isDirectory) {
            return "storage.spool_dir: \(dir) does not exist; create it, or set storage.spool_dir to a directory this user can write"
        }
        if !isDirectory.boolValue { return "storage.spool_dir: \(dir) is not a directory" }
        if access(dir, W_OK | X_OK) != 0 {
            return "storage.spool_dir: \(dir) is not writable by this user (uid \(getuid())); answers read ahead of slow clients are spooled there"
        }
        return nil
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
/// The sections are in `ConfigLoader+Root` (the top level), `+Listeners`,
/// `+Upstreams`, `+Routes` and `+Policies`; here are the structure and scalars.
final class Reader {
    let file: String
    let environment: [String: String]
    var errors: [ConfigError] = []
    /// `upstreams.NAME.h2_client` as written, by upstream (`Configuration.ignoredH2Clients`).
    var ignoredH2Clients: [String: String] = [:]
    /// `cluster.redis` is set (read before the routes): `scope: cluster` needs it.
    var hasCluster = false
    /// `cluster.redis.lease` (nil: auto).
    var clusterLease: Int?
    /// The top level's `http2:` once read: what a listener's own `http2:` keys go over.
    var topHTTP2: HTTP2Configuration? = HTTP2Configuration()

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

    func size(_ node: Node?, _ path: String, allowZero: Bool = false) -> Int? {
        guard let s = text(node, path) else { return nil }
        guard let v = Units.size(s), v > 0 || (allowZero && v == 0) else {
            error(node, "\(path): '\(s)' is not a size; write e.g. 512KiB, 10MiB\(allowZero ? " (0: off)" : "")")
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
