import HappyPathCore

/// What the admin listener refuses because a browser could have been
/// tricked into sending it (docs/operations.md, "What a browser cannot make
/// the admin listener do"). Pure: the admin server passes in what the
/// request carries and gets a verdict back.
///
/// - **DNS rebinding.** A page on `evil.example` whose name the attacker
///   then points at 127.0.0.1 can read the admin API in the victim's
///   browser: the browser thinks it is talking to `evil.example`, and says
///   so in `Host`. So `Host` must name this listener: its own address (an
///   IP literal cannot be rebound), `localhost`, the loopback literals, or
///   a name the operator listed in `admin.allowed_hosts`.
/// - **Cross-site request forgery.** Any page can make a browser send a
///   POST to `http://127.0.0.1:9901/...` without reading the answer: a
///   form (`application/x-www-form-urlencoded`, `multipart/form-data`,
///   `text/plain` are the types a form or a `fetch` without a preflight can
///   send) or a `fetch` with `mode: no-cors`. Browsers mark such requests
///   with `Origin` and `Sec-Fetch-Site`; scripts and curl send neither. A
///   request that changes state (anything but GET and HEAD) with either
///   mark of another site, or with a form's content type, is refused.
public struct AdminAccessPolicy: Sendable, Equatable {
    public enum Verdict: Sendable, Equatable {
        case allow
        /// 403, with this detail.
        case refuse(String)
    }

    /// `admin.allowed_hosts`, lowercased, without ports.
    public var allowedHosts: [String]
    /// `admin.listen`'s host (accepted as a Host unless it is a wildcard).
    public var listenHost: String

    /// - Parameters:
    ///   - allowedHosts: `admin.allowed_hosts` (compared case-insensitively).
    ///   - listenHost: the host of `admin.listen`.
    public init(allowedHosts: [String] = [], listenHost: String = "127.0.0.1") {
        self.allowedHosts = allowedHosts.map { $0.lowercased() }
        self.listenHost = listenHost
    }

    /// The request carries `host` (nil: no Host header, which only HTTP/1.0
    /// allows) and arrived at `localAddress` (an IP literal as `inet_ntop`
    /// writes it).
    ///
    /// A request without `Host` is let through: every browser sends one,
    /// so its absence is a script or a probe, never a rebinding page.
    public func checkHost(_ host: String?, localAddress: String) -> Verdict {
        guard let host, !host.isEmpty else { return .allow }
        guard let name = Self.hostName(host) else {
            return .refuse("Host '\(host)' is not a host[:port].")
        }
        if accepted(name, localAddress: localAddress) { return .allow }
        return .refuse(
            "Host '\(host)' is not an address of this admin listener (DNS rebinding protection). "
                + "If you reach the admin listener by that name, add \(name) to admin.allowed_hosts.")
    }

    /// The cross-site checks, for a request that changes state (not GET or
    /// HEAD). `host` is the request's Host (already accepted by `checkHost`).
    public func checkCrossSite(
        method: String, host: String?, origin: String?, fetchSite: String?, contentType: String?
    ) -> Verdict {
        guard method != "GET", method != "HEAD" else { return .allow }
        if let site = fetchSite?.trimmed.lowercased(), site == "cross-site" {
            return .refuse(
                "A cross-site \(method) from a browser is refused (Sec-Fetch-Site: cross-site): "
                    + "call the admin API from a script or curl.")
        }
        if let origin = origin?.trimmed {
            let own = host.map { "http://" + $0.trimmed.lowercased() }
            if origin.lowercased() != own {
                return .refuse(
                    "A \(method) from a web page (Origin: \(origin)) is refused, as cross-site request forgery: "
                        + "call the admin API from a script or curl, which send no Origin.")
            }
        }
        if let contentType {
            let media = contentType.split(separator: ";", maxSplits: 1).first.map { String($0).trimmed.lowercased() } ?? ""
            if Self.formTypes.contains(media) {
                return .refuse(
                    "A \(method) with Content-Type \(media) is refused: any web page can send one with a form. "
                        + "Send no body, or application/json.")
            }
        }
        return .allow
    }

    /// The fields the rules read (and `Content-Type`, which says how a
    /// body is read). Each may come once at most: of two values, a rule
    /// reads one (the first) where another reader (a proxy in front that
    /// keeps the last, a later check) could take the other, and that gap
    /// is all a forger needs. No browser sends any of them twice.
    public static let singleFields = ["Host", "Origin", "Sec-Fetch-Site", "Content-Type"]

    /// `counts[i]`: how many times `singleFields[i]` came in the request.
    /// Nil when none came more than once; else the detail of the 400, which
    /// names the first that did.
    public static func checkSingleFields(_ counts: [Int]) -> String? {
        guard let i = zip(singleFields.indices, counts).first(where: { $0.1 > 1 })?.0 else { return nil }
        let name = singleFields[i]
        return "The request carries \(name) \(counts[i]) times; the admin listener reads it once, so send \(name) once."
    }

    /// The content types a page can send cross-site without a CORS preflight.
    public static let formTypes: Set<String> = ["application/x-www-form-urlencoded", "multipart/form-data", "text/plain"]

    private func accepted(_ name: String, localAddress: String) -> Bool {
        if name == "localhost" || name == "127.0.0.1" || name == "[::1]" { return true }
        if allowedHosts.contains(name) { return true }
        for own in [localAddress, listenHost] where !own.isEmpty && !Self.isWildcard(own) {
            let literal = own.contains(":") ? "[" + own.lowercased() + "]" : own
            if name == literal { return true }
            // An IPv4 client on a dual-stack socket: ::ffff:10.0.0.5 is 10.0.0.5.
            if own.lowercased().hasPrefix("::ffff:"), own.contains("."), name == String(own.dropFirst(7)) { return true }
        }
        return false
    }

    static func isWildcard(_ host: String) -> Bool { host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*" }

    /// The host part of a Host header, lowercased, without its port or a
    /// final dot (`LocalHost.:9901` → `localhost`); nil if malformed.
    static func hostName(_ host: String) -> String? {
        let value = host.trimmed.lowercased()
        var name: Substring
        var rest: Substring
        if value.hasPrefix("[") {
            guard let close = value.firstIndex(of: "]") else { return nil }
            name = value[...close]
            rest = value[value.index(after: close)...]
        } else if let colon = value.firstIndex(of: ":") {
            name = value[..<colon]
            rest = value[colon...]
        } else {
            name = value[...]
            rest = ""
        }
        if !rest.isEmpty {
            let port = rest.dropFirst()
            guard rest.first == ":", port.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        }
        if name.hasSuffix("."), name.count > 1 { name = name.dropLast() }
        return name.isEmpty ? nil : String(name)
    }
}

extension String {
    fileprivate var trimmed: String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return String(s)
    }
}
