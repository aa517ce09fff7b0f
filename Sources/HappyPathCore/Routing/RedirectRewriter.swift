/// Points an upstream's redirect back at the proxy (as nginx's
/// `proxy_redirect default`): a `Location`, `Content-Location` or `Refresh`
/// URL whose origin is the endpoint the request went to becomes a path on
/// the proxy, mapped back through the endpoint's base path and the route's
/// `strip_prefix`. Any other URL is left alone.
///
/// The result is a path-only reference (`/api/items/1`), which RFC 9110
/// section 10.2.2 allows and every client resolves against the URL it
/// asked for: the proxy never writes a host or scheme taken from the
/// request (a `Host` header, or an absolute-form target, is the client's to
/// choose), and a proxy behind TLS offload never downgrades it to http.
public struct RedirectRewriter: Sendable {
    /// `http://host:port` of the endpoint, lower-cased, without a trailing slash.
    let endpointOrigin: String
    /// The endpoint's base path (`/base`, or empty).
    let basePath: String
    /// The route's `strip_prefix` (what the client's path had in front).
    let stripPrefix: String

    /// - Parameter endpointOrigin: `scheme://host[:port]` (a trailing `/` is ignored).
    public init(endpointOrigin: String, basePath: String, stripPrefix: String?) {
        var origin = endpointOrigin.lowercased()
        if origin.hasSuffix("/") { origin.removeLast() }
        self.endpointOrigin = Self.withoutDefaultPort(origin)
        self.basePath = basePath.hasSuffix("/") ? String(basePath.dropLast()) : basePath
        self.stripPrefix = stripPrefix.map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 } ?? ""
    }

    /// Whether a field of this name (lower-case compared) is one this rewrites.
    public static func applies(to name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 7: HTTPBytes.equals(name, "refresh")
        case 8: HTTPBytes.equals(name, "location")
        case 16: HTTPBytes.equals(name, "content-location")
        default: false
        }
    }

    /// The value to send instead, or nil to send it as it came.
    /// - Parameter isRefresh: the value is `Refresh`'s `N; url=URL`.
    public func rewrite(_ value: String, isRefresh: Bool) -> String? {
        // URLs in these fields are ASCII (RFC 3986); anything else is left as it came.
        guard value.utf8.allSatisfy({ $0 < 0x80 }) else { return nil }
        if isRefresh {
            // `5; url=http://…` (RFC-less but universal; spaces around `=`
            // allowed): only the URL part moves. ASCII lower-casing keeps
            // every byte where it was, so offsets are the same in `value`.
            let lower = Array(value.lowercased().utf8)
            guard let u = lower.firstRange(of: Array("url".utf8)) else { return nil }
            var at = u.upperBound
            while at < lower.count, lower[at] == 0x20 || lower[at] == 0x09 { at += 1 }
            guard at < lower.count, lower[at] == UInt8(ascii: "=") else { return nil }
            at += 1
            while at < lower.count, lower[at] == 0x20 || lower[at] == 0x09 { at += 1 }
            let urlRange = value.startIndex..<value.utf8.index(value.startIndex, offsetBy: at)
            var url = Substring(value[urlRange.upperBound...])
            var quote: Character?
            if let q = url.first, q == "'" || q == "\"" {
                quote = q
                url = url.dropFirst()
                if url.last == q { url = url.dropLast() }
            }
            guard let rewritten = rewriteURL(String(url)) else { return nil }
            let q = quote.map(String.init) ?? ""
            return String(value[..<urlRange.upperBound]) + q + rewritten + q
        }
        return rewriteURL(value)
    }

    private func rewriteURL(_ url: String) -> String? {
        guard let schemeEnd = url.firstRange(of: "://") else { return nil }
        let authorityEnd = url[schemeEnd.upperBound...].firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? url.endIndex
        let origin = Self.withoutDefaultPort(url[..<authorityEnd].lowercased())
        guard origin == endpointOrigin else { return nil }
        var path = Substring(url[authorityEnd...])
        if !path.hasPrefix("/") { path = "/" + path }
        // Only a path under the endpoint's base path maps back to the route.
        if !basePath.isEmpty {
            guard path.hasPrefix(basePath) else { return nil }
            let rest = path.dropFirst(basePath.count)
            guard rest.isEmpty || rest.first == "/" || rest.first == "?" || rest.first == "#" else { return nil }
            path = rest.first == "/" ? rest : "/" + rest
        }
        let mapped = stripPrefix + path
        return mapped.hasPrefix("/") ? mapped : "/" + mapped
    }

    /// `http://h:80` is `http://h`, `https://h:443` is `https://h`.
    private static func withoutDefaultPort(_ origin: String) -> String {
        if origin.hasPrefix("http://"), origin.hasSuffix(":80") { return String(origin.dropLast(3)) }
        if origin.hasPrefix("https://"), origin.hasSuffix(":443") { return String(origin.dropLast(4)) }
        return origin
    }
}
