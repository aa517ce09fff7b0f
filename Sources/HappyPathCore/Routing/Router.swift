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
        // Read in place from the string's bytes (the generic search and
        // slicing over `utf8` cost a few hundred instructions a request).
        var bytes = target
        let parts: (path: String, query: String?)? = bytes.withUTF8 { utf8 in
            guard let q = utf8.firstIndex(of: UInt8(ascii: "?")) else { return (target, nil) }
            // After `?` comes a new character unless a non-ASCII byte (a
            // combining mark) joins it: then the string's own rule decides, below.
            guard q + 1 == utf8.count || utf8[q + 1] < 0x80 else { return nil }
            return (
                String(decoding: UnsafeBufferPointer(rebasing: utf8[..<q]), as: UTF8.self),
                String(decoding: UnsafeBufferPointer(rebasing: utf8[(q + 1)...]), as: UTF8.self)
            )
        }
        if let parts { return parts }
        let q = target.utf8.firstIndex(of: UInt8(ascii: "?"))!
        return (String(target[..<q]), String(target[target.index(after: q)...]))
    }
}
