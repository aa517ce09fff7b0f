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
    /// The same as bytes, for reading a request's fields without strings.
    let credentialBytes: [[UInt8]]
    static let forwardingBytes = forwardingFields.map { Array($0.utf8) }

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
        credentialBytes = names.map { Array($0.utf8) }
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
        /// The key's fields as they came, raw: each its index (the
        /// `forwardingFields` first, then the `credentialNames`) and its
        /// value's length as two `UInt32`s, then the value's bytes. One
        /// array, so reading a request makes no strings.
        var seen: [UInt8] = []
        var sawCredential = false

        init(key: StaleKey, salt: [UInt8]) {
            self.key = key
            self.salt = salt
        }

        /// One request field, as bytes (only the fields of the key are copied).
        public mutating func field(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            let index: Int
            if let i = Self.index(of: name, in: StaleKey.forwardingBytes) {
                index = i
            } else if let i = Self.index(of: name, in: key.credentialBytes) {
                index = StaleKey.forwardingFields.count + i
                sawCredential = true
            } else {
                return
            }
            // A request's fields are bounded by `limits.max_header_bytes`; a
            // value that does not fit a `UInt32` cannot come from one.
            guard value.count <= Int(Int32.max) else { return }
            // Room at once for the usual few fields (Host and little else).
            if seen.capacity == 0 { seen.reserveCapacity(128 + value.count) }
            seen.appendPacked(UInt32(truncatingIfNeeded: index), UInt32(truncatingIfNeeded: value.count), value)
        }

        /// One request field, as text.
        public mutating func field(name: String, value: String) {
            var name = name
            var value = value
            name.withUTF8 { n in value.withUTF8 { v in field(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) }
            }
        }

        /// The values seen of the field at `index`, in arrival order.
        private func forEachValue(of index: Int, _ body: (UnsafeRawBufferPointer) -> Void) {
            seen.withUnsafeBytes { raw in
                var at = 0
                while at < raw.count {
                    let i = Int(raw.loadUnaligned(fromByteOffset: at, as: UInt32.self))
                    let count = Int(raw.loadUnaligned(fromByteOffset: at + 4, as: UInt32.self))
                    if i == index { body(UnsafeRawBufferPointer(rebasing: raw[(at + 8)..<(at + 8 + count)])) }
                    at += 8 + count
                }
            }
        }

        /// - Parameters:
        ///   - upstream: the route's upstream.
        ///   - target: the target as sent upstream (after `strip_prefix`).
        ///   - scheme: the listener's, `http` or `https`.
        /// - Parameter suffix: written at the end of the shared key, in the
        ///   same allocation (a coalescing key's parts: `CoalesceRules`);
        ///   empty for serve-stale's keys.
        public func keys(upstream: String, target: String, scheme: String, suffix: String = "") -> Keys {
            // Field values hold no CR, LF or NUL (the parser refuses them)
            // and a target no space: a line feed between the parts, and the
            // upstream's name prefixed by its length, make the composition
            // unambiguous.
            let length = upstream.utf8.count
            var parts = Writer.digits(length) + upstream.utf8.count + target.utf8.count + scheme.utf8.count + 7 + suffix.utf8.count
            for (i, name) in StaleKey.forwardingFields.enumerated() {
                forEachValue(of: i) { parts += 2 + name.utf8.count + $0.count }
            }
            // Written in place into the string's own storage: one allocation.
            let sharedKey = String(unsafeUninitializedCapacity: parts) { buffer in
                var writer = Writer(buffer)
                writer.put(decimal: length)
                writer.put(":")
                writer.put(text: upstream)
                writer.put(" GET ")
                writer.put(text: target)
                writer.put("\n")
                writer.put(text: scheme)
                for (i, name) in StaleKey.forwardingBytes.enumerated() {
                    forEachValue(of: i) { value in
                        writer.put("\n")
                        name.withUnsafeBytes { writer.put($0) }
                        writer.put(":")
                        writer.put(value)
                    }
                }
                if !suffix.isEmpty { writer.put(text: suffix) }
                return writer.at
            }
            guard sawCredential else { return Keys(shared: sharedKey, credentials: nil) }
            // Each credential field present, in the route's order, each
            // line in arrival order: the same credentials hash the same
            // whatever order the fields came in.
            var hasher = SHA256()
            hasher.update(salt)
            for (i, name) in key.credentialNames.enumerated() {
                forEachValue(of: StaleKey.forwardingFields.count + i) { value in
                    hasher.update(name.utf8)
                    hasher.update(CollectionOfOne(UInt8(ascii: ":")))
                    hasher.update(value)
                    hasher.update(CollectionOfOne(UInt8(ascii: "\n")))
                }
            }
            return Keys(shared: sharedKey, credentials: sharedKey + "\ncredentials:" + SHA256.hex(digest: hasher.finish()))
        }

        /// Copies parts into a buffer sized for them.
        struct Writer {
            let buffer: UnsafeMutableBufferPointer<UInt8>
            var at = 0

            init(_ buffer: UnsafeMutableBufferPointer<UInt8>) { self.buffer = buffer }

            mutating func put(_ bytes: UnsafeRawBufferPointer) {
                guard let base = buffer.baseAddress, !bytes.isEmpty else { return }
                UnsafeMutableRawPointer(base + at).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
                at += bytes.count
            }

            mutating func put(_ text: StaticString) {
                put(UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
            }

            /// A count's decimal digits (no string made for it).
            mutating func put(decimal n: Int) {
                var rest = n
                var at = self.at + Self.digits(n)
                self.at = at
                repeat {
                    at -= 1
                    buffer[at] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: rest % 10)
                    rest /= 10
                } while rest > 0
            }

            /// How many decimal digits `put(decimal:)` writes for `n` (≥ 0).
            static func digits(_ n: Int) -> Int {
                var count = 1
                var rest = n
                while rest >= 10 {
                    rest /= 10
                    count += 1
                }
                return count
            }

            mutating func put(text: String) {
                // Read in place (no copy of the string to make it contiguous);
                // a string that is not contiguous is copied byte by byte.
                let done: Void? = text.utf8.withContiguousStorageIfAvailable { put(UnsafeRawBufferPointer($0)) }
                if done == nil { for byte in text.utf8 { put(byte: byte) } }
            }

            mutating func put(byte: UInt8) {
                buffer[at] = byte
                at += 1
            }
        }

        /// Where `name` is among `lowerNames` (lower-cased), compared without case.
        static func index(of name: UnsafeRawBufferPointer, in lowerNames: [[UInt8]]) -> Int? {
            // Most fields are none of these: the length and the first byte
            // tell so before any bytes are compared.
            guard let first = name.first.map(HTTPBytes.lower) else { return nil }
            return lowerNames.withUnsafeBufferPointer { names in
                for i in names.indices where names[i].count == name.count && names[i].first == first {
                    if names[i].withUnsafeBytes({ HTTPBytes.equalsIgnoringCase(name, $0) }) { return i }
                }
                return nil
            }
        }
    }
}
