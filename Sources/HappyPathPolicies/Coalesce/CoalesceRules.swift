import HappyPathCore

/// Who may coalesce, under which key, and whether a leader's answer or
/// failure serves its followers (docs/coalescing.md). Pure; each reads a
/// message's fields once, in time linear in their size.
public enum CoalesceRules {
    /// Why a request on a coalescing route went on its own try
    /// (`happypath_coalesce_alone_total{reason}`). A closed set.
    public enum AloneReason: String, Sendable, CaseIterable {
        /// Not a read that may share: a body, `Range`, `no-cache`, an upgrade, gRPC-Web.
        case ineligible
        /// Its group had `max_followers` already.
        case full
        /// The leader's answer said `Cache-Control: no-store` (or one did within the last 10 s).
        case noStore = "no_store"
        /// The leader's answer set a cookie: it was one client's.
        case setCookie = "set_cookie"
        /// `Vary: *`, or an event stream (a subscription, not a read).
        case unshareable
        /// Its length is above `limits.read_ahead`: each client reads it at its own pace.
        case large
    }

    /// Reads a request's fields in one pass: whether it may coalesce, and
    /// the parts of its key beside the target (`StaleKey.Reader`'s
    /// forwarding and credential fields, and its validators).
    public struct RequestReader {
        var stale: StaleKey.Reader
        /// A field rules the request out (a body, `Range`, `no-cache`, …).
        public private(set) var ineligible = false
        /// `If-None-Match`, `If-Modified-Since` and the other preconditions as
        /// sent: a follower without them must never get a leader's 304.
        var validators: [UInt8] = []

        public init(key: StaleKey, salt: [UInt8]) { stale = key.reader(salt: salt) }

        public mutating func field(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
            stale.field(name: name, value: value)
            switch name.count {
            case 5 where HTTPBytes.equals(name, "range"):
                ineligible = true
            case 6 where HTTPBytes.equals(name, "pragma"):
                if Self.names(value, "no-cache") { ineligible = true }
            case 7 where HTTPBytes.equals(name, "upgrade"):
                ineligible = true
            case 8 where HTTPBytes.equals(name, "if-match"), 8 where HTTPBytes.equals(name, "if-range"),
                13 where HTTPBytes.equals(name, "if-none-match"),
                17 where HTTPBytes.equals(name, "if-modified-since"),
                19 where HTTPBytes.equals(name, "if-unmodified-since"):
                // A field's value is bounded by `limits.max_header_bytes`.
                validators.append(0x0A)
                validators.append(contentsOf: name.lazy.map(HTTPBytes.lower))
                validators.append(0x3A)
                validators.append(contentsOf: value)
            case 13 where HTTPBytes.equals(name, "cache-control"):
                var directives = StaleRules.CacheControl()
                directives.read(value)
                if directives.noCache || directives.noStore { ineligible = true }
            case 14 where HTTPBytes.equals(name, "content-length"):
                if !(value.count == 1 && value[0] == UInt8(ascii: "0")) { ineligible = true }
            case 17 where HTTPBytes.equals(name, "transfer-encoding"):
                ineligible = true
            default:
                break
            }
        }

        /// The same for fields as text (the tests).
        public mutating func field(name: String, value: String) {
            var name = name
            var value = value
            name.withUTF8 { n in value.withUTF8 { v in field(name: UnsafeRawBufferPointer(n), value: UnsafeRawBufferPointer(v)) } }
        }

        /// The request's key (nil: it may not coalesce): the method, the
        /// route (its credential fields and redirects are its own), the
        /// stale key's parts (the upstream, the target, the scheme, the
        /// forwarding fields, the credentials by salted hash), the
        /// validators, and whom a pause of the upstream's is about.
        /// - Parameters:
        ///   - pacingKey: the client a `pacing.scope_429: client` pause
        ///     concerns (nil: the upstream pauses for everyone).
        /// - Parameters:
        ///   - route: the route's tag (`CoalesceRules.routeTag`), made once per route.
        public func key(
            method: String, route: String, upstream: String, target: String, scheme: String, pacingKey: String?
        ) -> String? {
            guard !ineligible, method == "GET" || method == "HEAD" else { return nil }
            // Written into the key's one allocation; the usual GET adds the route's tag alone.
            var suffix = route
            if method == "HEAD" { suffix += "\nHEAD" }
            if !validators.isEmpty { suffix += String(decoding: validators, as: UTF8.self) }
            if let pacingKey { suffix += "\npacing:" + pacingKey }
            let keys = stale.keys(upstream: upstream, target: target, scheme: scheme, suffix: suffix)
            return keys.credentials ?? keys.shared
        }

        /// A list field names `token` (one of its comma-separated elements, without case).
        static func names(_ value: UnsafeRawBufferPointer, _ token: StaticString) -> Bool {
            var found = false
            forEachListElement(value) { if HTTPBytes.equals($0, token) { found = true } }
            return found
        }
    }

    /// A route's part of its requests' keys: two routes to the same
    /// upstream and target never share (their credential fields and
    /// redirects are their own).
    public static func routeTag(_ index: Int) -> String { "\n#" + String(index) }

    /// What the leader's answer head says about sharing it.
    public enum HeadVerdict: Sendable, Equatable {
        /// Every follower whose values of these request fields (lower-cased,
        /// `Vary`'s names; empty: none) equal the leader's takes it.
        case share(varyNames: [String])
        /// Nobody else takes it: each follower goes on its own try.
        case release(AloneReason)
    }

    /// - Parameters:
    ///   - fields: the answer's end-to-end fields.
    ///   - contentLength: its announced length (nil: chunked or to the close).
    ///   - largeAbove: `limits.read_ahead`.
    public static func head(fields: KeptFields, contentLength: Int?, largeAbove: Int) -> HeadVerdict {
        var directives = StaleRules.CacheControl()
        var vary: [String] = []
        var verdict: AloneReason?
        fields.forEachField { name, value in
            switch name.count {
            case 4 where HTTPBytes.equals(name, "vary"):
                forEachListElement(value) { token in
                    if token.count == 1, token[0] == UInt8(ascii: "*") { verdict = verdict ?? .unshareable }
                    let lower = String(decoding: token.lazy.map(HTTPBytes.lower), as: UTF8.self)
                    if !lower.isEmpty, !vary.contains(lower) { vary.append(lower) }
                }
            case 10 where HTTPBytes.equals(name, "set-cookie"):
                verdict = verdict ?? .setCookie
            case 12 where HTTPBytes.equals(name, "content-type"):
                if value.count >= 17, HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: value[0..<17]), "text/event-stream") {
                    verdict = verdict ?? .unshareable
                }
            case 13 where HTTPBytes.equals(name, "cache-control"):
                directives.read(value)
            default:
                break
            }
        }
        // no-store ends sharing for the key whatever else the answer says.
        if directives.noStore { return .release(.noStore) }
        if let verdict { return .release(verdict) }
        if let contentLength, contentLength > largeAbove { return .release(.large) }
        return .share(varyNames: vary)
    }

    /// What the leader's failure (it ended without an answer to stream)
    /// means for its followers.
    public enum AfterLeader: Sendable, Equatable {
        /// The same failure is each follower's: the route's retries ran in
        /// full for this key a moment ago, or a new try would meet the same
        /// gate (an open breaker, a pause, a full queue).
        case share
        /// It was the leader's own (its deadline, its priority, its client
        /// left): the next follower leads a new try at once.
        case handOver
    }

    /// - Parameters:
    ///   - deadlinePassed: the leader's own deadline had passed when it ended.
    public static func afterLeader(_ failure: ExchangeStateMachine.Failure, deadlinePassed: Bool) -> AfterLeader {
        switch failure {
        case .timeout:
            // Out of its own time: the verdict was not reached. Out of
            // per-try timeouts with time left: the retries ran in full.
            return deadlinePassed ? .handOver : .share
        case .parkExpired(_, _, byDeadline: true), .shed, .requestBodyTooLarge:
            return .handOver
        case .upstreamAnswer, .badGateway, .upstreamTLS, .unavailable, .unreachable, .circuitOpen, .paused,
            .overloaded, .tokenRefusedAfterRefresh, .tokenRefreshFailed, .parkExpired(_, _, byDeadline: false),
            .shuttingDown:
            return .share
        }
    }
}
