import Foundation
import HappyPathCore

/// Whether an answer may be kept for `fallback.serve_stale`, and for how
/// long: RFC 9111's rules for a shared cache, stricter where in doubt
/// (docs/fallback.md). Pure; linear in the size of the fields.
public enum StaleRules {
    /// Statuses kept (RFC 9111 section 3, heuristically cacheable ones
    /// that say something about the resource itself).
    public static let keptStatuses = Set((100...599).filter { mayKeep(method: "GET", status: $0) })

    public struct Decision: Sendable, Equatable {
        /// Kept this long from when it was received.
        public var keepFor: Duration
        /// The request fields the answer varies on (`Vary`), lower-cased, in order.
        public var varyNames: [String]
        /// Kept for every request to the same authority and target
        /// (`StaleKey.Keys.shared`); false: only for a request with the
        /// same credentials (`StaleKey.Keys.credentials`).
        public var shared: Bool

        public init(keepFor: Duration, varyNames: [String], shared: Bool = true) {
            self.keepFor = keepFor
            self.varyNames = varyNames
            self.shared = shared
        }
    }

    /// - Parameters:
    ///   - fields: the answer's end-to-end fields, as relayed.
    ///   - requestHasCredentials: the request carried one of the route's
    ///     credential fields (`StaleKey.credentialNames`).
    ///   - serveStale: the route's `fallback.serve_stale`.
    /// - Returns: nil when the answer must not be kept.
    public static func decide(
        method: String, status: Int, fields: KeptFields, requestHasCredentials: Bool, serveStale: Duration
    ) -> Decision? {
        guard mayKeep(method: method, status: status), serveStale > .zero else { return nil }
        var directives = CacheControl()
        var vary: [String] = []
        var forbidden = false
        fields.forEachField { name, value in
            guard !forbidden else { return }
            if name.count == 10, HTTPBytes.equals(name, "set-cookie") { forbidden = true }
            if name.count == 13, HTTPBytes.equals(name, "cache-control") { directives.read(value) }
            if name.count == 4, HTTPBytes.equals(name, "vary") {
                // Rare, and read as text as it always was: a token is trimmed of any white space.
                for element in String(decoding: value, as: UTF8.self).split(separator: ",") {
                    let token = element.trimmingCharacters(in: .whitespaces).lowercased()
                    if token == "*" { forbidden = true }
                    if !token.isEmpty, !vary.contains(token) { vary.append(token) }
                }
            }
        }
        if forbidden || directives.noStore || directives.isPrivate || directives.noCache { return nil }
        // One user's answer is never kept for another: only the upstream
        // can say an answer to a request with credentials is everyone's
        // (RFC 9111 section 3.5). Otherwise it is kept for those very
        // credentials alone, which makes that part of the store a private
        // cache of theirs.
        let shared = !requestHasCredentials || directives.isPublic || directives.sharedMaxAge
        var keepFor = serveStale
        if let seconds = directives.staleIfError {
            guard seconds > 0 else { return nil }
            keepFor = min(keepFor, .seconds(seconds))
        }
        return Decision(keepFor: keepFor, varyNames: vary, shared: shared)
    }

    /// The same for fields as text (the tests and the fuzz targets).
    public static func decide(
        method: String, status: Int, fields: [HTTPField], requestHasCredentials: Bool, serveStale: Duration
    ) -> Decision? {
        decide(
            method: method, status: status, fields: KeptFields(fields), requestHasCredentials: requestHasCredentials,
            serveStale: serveStale)
    }

    /// Whether an answer with this method and status may be kept at all:
    /// checked before anything is built for it (its keys, its entry).
    public static func mayKeep(method: String, status: Int) -> Bool {
        // A switch, not the set: no hashing for every answer.
        switch status {
        case 200, 203, 204, 300, 301, 404, 410: method == "GET"
        default: false
        }
    }

    /// The directives of every `Cache-Control` field that matter here.
    struct CacheControl {
        var noStore = false
        var noCache = false
        var isPrivate = false
        var isPublic = false
        var sharedMaxAge = false
        var staleIfError: Int64?

        /// One field's value: `name[=token|"quoted"]` directives separated
        /// by commas; names compare without case. A malformed
        /// `stale-if-error` is ignored (the route's time applies).
        mutating func read(_ bytes: UnsafeRawBufferPointer) {
            var i = 0
            while i < bytes.count {
                while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 || bytes[i] == 0x2C { i += 1 }
                let nameStart = i
                while i < bytes.count, bytes[i] != 0x3D, bytes[i] != 0x2C, bytes[i] != 0x20, bytes[i] != 0x09 { i += 1 }
                let name = UnsafeRawBufferPointer(rebasing: bytes[nameStart..<i])
                while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 { i += 1 }
                var argument: [UInt8]?
                if i < bytes.count, bytes[i] == 0x3D {
                    i += 1
                    while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 { i += 1 }
                    if i < bytes.count, bytes[i] == 0x22 {
                        // A quoted-string: up to the closing quote (a backslash escapes one byte).
                        i += 1
                        var text: [UInt8] = []
                        while i < bytes.count, bytes[i] != 0x22 {
                            if bytes[i] == 0x5C, i + 1 < bytes.count { i += 1 }
                            text.append(bytes[i])
                            i += 1
                        }
                        i += 1
                        argument = text
                    } else {
                        let start = i
                        while i < bytes.count, bytes[i] != 0x2C, bytes[i] != 0x20, bytes[i] != 0x09 { i += 1 }
                        argument = Array(bytes[start..<i])
                    }
                }
                // Anything else up to the next comma belongs to a malformed directive.
                while i < bytes.count, bytes[i] != 0x2C { i += 1 }
                // Names compare as ASCII without case (none of these has a
                // letter that another script lower-cases to).
                if HTTPBytes.equals(name, "no-store") {
                    noStore = true
                } else if HTTPBytes.equals(name, "no-cache") {
                    noCache = true
                } else if HTTPBytes.equals(name, "private") {
                    isPrivate = true
                } else if HTTPBytes.equals(name, "public") {
                    isPublic = true
                } else if HTTPBytes.equals(name, "s-maxage") {
                    sharedMaxAge = true
                } else if HTTPBytes.equals(name, "stale-if-error") {
                    // Delta-seconds past ten years read as ten years ("a very long time", RFC 9111 section 1.2.2).
                    if let argument, let seconds = OutsideValues.deltaSeconds(argument) {
                        staleIfError = min(staleIfError ?? seconds, seconds)
                    }
                }
            }
        }
    }
}
