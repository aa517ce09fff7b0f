import HappyPathCore

/// A `HOST:PORT` listen address.
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `HOST:PORT`, `[v6]:PORT` or `:PORT` (all interfaces).
    public static func parse(_ text: String) -> ListenAddress? {
        var host: Substring
        var portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { return nil }
            portText = rest.dropFirst()
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            if host.contains(":") { return nil }
        }
        if host.isEmpty { host = "0.0.0.0" }
        guard let port = Int(portText), (0...65535).contains(port) else { return nil }
        return ListenAddress(host: String(host), port: port)
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Durations (`250ms`, `2s`, `1m`, `1h`, combinations like `1m30s`) and sizes
/// (`512KiB`, `10MiB`, `1GiB`, `100KB`, plain bytes).
public enum Units {
    /// The longest duration a setting may have: ten years.
    public static let maxDurationSeconds: Double = 10 * 365 * 24 * 3600

    /// A size as the config writes it (`256MiB`, `1.5KiB`): `byteSizeText`.
    public static func sizeText(_ bytes: Int) -> String { byteSizeText(bytes) }

    public static func duration(_ text: String) -> Duration? {
        var rest = Substring(text.trimmingCharacters(in: " "))
        guard !rest.isEmpty else { return nil }
        var total: Double = 0
        while !rest.isEmpty {
            let number = rest.prefix { $0.isNumber || $0 == "." }
            guard !number.isEmpty, let value = Double(number) else { return nil }
            rest = rest.dropFirst(number.count)
            let unit = rest.prefix { $0.isLetter }
            rest = rest.dropFirst(unit.count)
            let scale: Double
            switch unit {
            case "ns": scale = 1e-9
            case "us", "µs": scale = 1e-6
            case "ms": scale = 1e-3
            case "s": scale = 1
            case "m": scale = 60
            case "h": scale = 3600
            case "": if value == 0 && rest.isEmpty { scale = 0 } else { return nil }
            default: return nil
            }
            total += value * scale
        }
        // Past what any setting needs, and past what nanoseconds in 64 bits hold.
        guard total.isFinite, total <= maxDurationSeconds else { return nil }
        return .nanoseconds(Int64((total * 1e9).rounded()))
    }

    public static func size(_ text: String) -> Int? {
        let trimmed = text.trimmingCharacters(in: " ")
        let number = trimmed.prefix { $0.isNumber || $0 == "." }
        guard !number.isEmpty, let value = Double(number) else { return nil }
        let unit = trimmed.dropFirst(number.count).trimmingCharacters(in: " ")
        let scale: Double
        switch unit.lowercased() {
        case "", "b": scale = 1
        case "kib", "k": scale = 1024
        case "mib", "m": scale = 1024 * 1024
        case "gib", "g": scale = 1024 * 1024 * 1024
        case "kb": scale = 1000
        case "mb": scale = 1_000_000
        case "gb": scale = 1_000_000_000
        default: return nil
        }
        let bytes = value * scale
        guard bytes >= 0, bytes < Double(Int.max / 2), bytes.rounded() == bytes else { return nil }
        return Int(bytes)
    }
}

extension StringProtocol {
    func trimmingCharacters(in set: Character) -> String {
        var s = Substring(self)
        while s.first == set { s.removeFirst() }
        while s.last == set { s.removeLast() }
        return String(s)
    }
}

/// `${VAR}` and `${VAR:-default}` from the environment.
public enum EnvironmentSubstitution {
    public enum Failure: Error, Equatable {
        case unset(String)
        case malformed
    }

    public static func apply(_ text: String, environment: [String: String]) -> Result<String, Failure> {
        guard text.contains("${") else { return .success(text) }
        var out = ""
        var rest = Substring(text)
        while let start = rest.range(of: "${") {
            out += rest[..<start.lowerBound]
            let afterOpen = rest[start.upperBound...]
            guard let close = afterOpen.firstIndex(of: "}") else { return .failure(.malformed) }
            let body = afterOpen[..<close]
            let name: Substring
            let fallback: Substring?
            if let sep = body.range(of: ":-") {
                name = body[..<sep.lowerBound]
                fallback = body[sep.upperBound...]
            } else {
                name = body
                fallback = nil
            }
            guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else {
                return .failure(.malformed)
            }
            if let value = environment[String(name)], !(value.isEmpty && fallback != nil) {
                out += value
            } else if let fallback {
                out += fallback
            } else {
                return .failure(.unset(String(name)))
            }
            rest = afterOpen[afterOpen.index(after: close)...]
        }
        out += rest
        return .success(out)
    }
}

extension String {
    fileprivate func range(of needle: String) -> Range<String.Index>? { Substring(self).range(of: needle) }
}

extension Substring {
    func range(of needle: String) -> Range<String.Index>? {
        guard let first = needle.first else { return nil }
        var i = startIndex
        while let candidate = self[i...].firstIndex(of: first) {
            if self[candidate...].hasPrefix(needle) {
                return candidate..<index(candidate, offsetBy: needle.count)
            }
            i = index(after: candidate)
        }
        return nil
    }
}
