/// What a route accepts: a path prefix and, optionally, a set of methods.
public struct RouteMatch: Sendable, Equatable {
    public var pathPrefix: String
    /// Upper-case method names; `nil` accepts every method.
    public var methods: Set<String>?

    public init(pathPrefix: String, methods: Set<String>? = nil) {
        self.pathPrefix = pathPrefix
        self.methods = methods
    }

    public func accepts(path: String, method: String) -> Bool {
        guard path.hasPrefix(pathPrefix) else { return false }
        guard let methods else { return true }
        return methods.contains(method)
    }

    /// True when every request this match accepts is already accepted by `earlier`,
    /// so a route with this match placed after `earlier` can never be chosen.
    public func isShadowed(by earlier: RouteMatch) -> Bool {
        guard pathPrefix.hasPrefix(earlier.pathPrefix) else { return false }
        guard let earlierMethods = earlier.methods else { return true }
        guard let methods else { return false }
        return methods.isSubset(of: earlierMethods)
    }
}

/// First match wins, in configuration order (docs/contract.md, "Request lifecycle").
public struct Router: Sendable {
    public let matches: [RouteMatch]

    public init(_ matches: [RouteMatch]) { self.matches = matches }

    /// The index of the first route that accepts the request, or nil (NO_ROUTE).
    public func route(path: String, method: String) -> Int? {
        matches.firstIndex { $0.accepts(path: path, method: method) }
    }

    /// The target sent upstream: the path with `stripPrefix` removed (keeping a
    /// leading slash), and the query unchanged. Nil when removing the prefix
    /// would leave a dot-segment (`strip_prefix: /pub` and `/pub../x`): the
    /// path was normalized before the prefix came off, so only a prefix that
    /// ends inside a segment can do that, and such a request is refused
    /// rather than sent as `/../x`.
    public static func upstreamTarget(path: String, query: String?, stripPrefix: String?) -> String? {
        var outPath = Substring(path)
        var out = ""
        if let stripPrefix, !stripPrefix.isEmpty, outPath.hasPrefix(stripPrefix) {
            outPath = outPath.dropFirst(stripPrefix.count)
            if !outPath.hasPrefix("/") {
                let firstSegment = outPath.prefix { $0 != "/" }
                if PathNormalizer.isDotLike(firstSegment) { return nil }
                out = "/"
            }
        }
        if out.isEmpty, query == nil { return String(outPath) }
        out += outPath
        if let query {
            out += "?"
            out += query
        }
        return out
    }

    /// Splits an origin-form request target into path and query.
    public static func split(target: String) -> (path: String, query: String?) {
        // The search reads the string's bytes in place (the generic search
        // over `utf8` costs a few hundred instructions a request more).
        var bytes = target
        guard let q = bytes.withUTF8({ $0.firstIndex(of: UInt8(ascii: "?")) }) else { return (target, nil) }
        let mark = target.utf8.index(target.utf8.startIndex, offsetBy: q)
        return (String(target[..<mark]), String(target[target.index(after: mark)...]))
    }
}
