import HappyPathCore

/// Where a route files the answers it keeps for `fallback.serve_stale`:
/// everything of the request an answer may depend on by design, so that
/// no kept answer reaches a request it was not the answer to
/// (docs/fallback.md, "The key"). Pure; made once per route.
///
/// - The upstream and the target as sent to it.
/// - The client-facing side: the listener's scheme, the `Host` (which goes
///   upstream as `X-Forwarded-Host`), and the `X-Forwarded-Host`,
///   `X-Forwarded-Proto` and `Forwarded` fields a client sent, which the
///   proxy passes on as they came. An upstream that builds links, picks a
///   tenant or a site from them answers differently for each.
/// - The credentials, as a salted SHA-256 of the credential fields'
///   values (never the values themselves): the answer to one credential
///   is filed apart from every other's and from the answers to requests
///   without any (`Keys.credentials`), unless the upstream declared it
///   shareable (`StaleRules.Decision.shared`).
public struct StaleKey: Sendable, Equatable {
    /// Fields that carry a credential on every route.
    public static let standardCredentials = ["authorization", "cookie", "proxy-authorization"]

    /// The fields, besides the target, that the proxy forwards and that an
    /// answer may depend on by design, in the order they enter the key.
    public static let forwardingFields = ["host", "x-forwarded-host", "x-forwarded-proto", "forwarded"]

    /// This route's credential fields, lower-cased, each once: the standard
    /// ones, the `rate_limit` key's header, and `fallback.private_headers`.
    public let credentialNames: [String]

    /// - Parameters:
    ///   - privateHeaders: `fallback.private_headers`.
    ///   - rateLimitHeader: the route's `rate_limit` key, when it is a header (`key: header:NAME`).
    public init(privateHeaders: [String], rateLimitHeader: String? = nil) {
        var names = Self.standardCredentials
        for name in [rateLimitHeader].compactMap({ $0 }) + privateHeaders {
            let lower = name.lowercased()
            if !lower.isEmpty, !names.contains(lower) { names.append(lower) }
        }
        credentialNames = names
    }

    /// The keys of one request.
    public struct Keys: Sendable, Equatable {
        /// Answers any request to this authority and target may get: those
        /// to requests without credentials, and those the upstream declared
        /// shareable (`Cache-Control: public` or `s-maxage`).
        public var shared: String
        /// Answers only a request with exactly these credentials may get
        /// (nil: the request carried none).
        public var credentials: String?

        /// Where an answer to this request is kept.
        public func keep(shared isShared: Bool) -> String { isShared ? shared : credentials ?? shared }

        /// Where an answer for this request is looked for: its own
        /// credentials' and the shared ones (the newest that fits wins).
        public var lookup: [String] { credentials.map { [$0, shared] } ?? [shared] }
    }

    /// Reads one request's fields (in arrival order), then makes its keys.
    public func reader(salt: [UInt8]) -> Reader { Reader(key: self, salt: salt) }

    /// A value kept for a `Vary` field: a credential field's as a salted
    /// hash, so a `Vary: Authorization` answer keeps no token in clear;
    /// others as they are.
    public func varyValue(name: String, value: String?, salt: [UInt8]) -> String? {
        guard let value, credentialNames.contains(name.lowercased()) else { return value }
        var hasher = SHA256()
        hasher.update(salt)
        hasher.update(StaleStore.trim(value))
        return "sha256:" + SHA256.hex(digest: hasher.finish())
    }

    public struct Reader {
        let key: StaleKey
        let salt: [UInt8]
        /// Each forwarding field's lines, by `forwardingFields` index.
        var forwarding: [[String]] = Array(repeating: [], count: StaleKey.forwardingFields.count)
        /// Each credential field's lines, by `credentialNames` index.
        var credentials: [[String]]
        var sawCredential = false

        init(key: StaleKey, salt: [UInt8]) {
            self.key = key
            self.salt = salt
            credentials = Array(repeating: [], count: key.credentialNames.count)
        }

        /// One request field, as bytes (only the fields of the key are copied).
        public mutating func field(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            if let i = Self.index(of: name, in: StaleKey.forwardingFields) {
                forwarding[i].append(String(decoding: value, as: UTF8.self))
            } else if let i = Self.index(of: name, in: key.credentialNames) {
                credentials[i].append(String(decoding: value, as: UTF8.self))
                sawCredential = true
            }
        }

        /// One request field, as text.
        public mutating func field(name: String, value: String) {
            var name = name
            var value = value
            name.withUTF8 { n in value.withUTF8 { v in field(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
            }
        }

        /// - Parameters:
        ///   - upstream: the route's upstream.
        ///   - target: the target as sent upstream (after `strip_prefix`).
        ///   - scheme: the listener's, `http` or `https`.
        public func keys(upstream: String, target: String, scheme: String) -> Keys {
            // Field values hold no CR, LF or NUL (the parser refuses them)
            // and a target no space: a line feed between the parts, and the
            // upstream's name prefixed by its length, make the composition
            // unambiguous.
            var shared = "\(upstream.utf8.count):\(upstream) GET \(target)\n\(scheme)"
            for (i, lines) in forwarding.enumerated() {
                for line in lines { shared += "\n\(StaleKey.forwardingFields[i]):\(line)" }
            }
            guard sawCredential else { return Keys(shared: shared, credentials: nil) }
            // Each credential field present, in the route's order, each
            // line in arrival order: the same credentials hash the same
            // whatever order the fields came in.
            var hasher = SHA256()
            hasher.update(salt)
            for (i, lines) in credentials.enumerated() {
                for line in lines { hasher.update("\(key.credentialNames[i]):\(line)\n") }
            }
            return Keys(shared: shared, credentials: shared + "\ncredentials:" + SHA256.hex(digest: hasher.finish()))
        }

        static func index(of name: UnsafeRawBufferPointer, in lowerNames: [String]) -> Int? {
            for (i, candidate) in lowerNames.enumerated() where candidate.utf8.count == name.count {
                var equal = true
                var j = 0
                for byte in candidate.utf8 {
                    if HTTPBytes.lower(name[j]) != byte {
                        equal = false
                        break
                    }
                    j += 1
                }
                if equal { return i }
            }
            return nil
        }
    }
}
