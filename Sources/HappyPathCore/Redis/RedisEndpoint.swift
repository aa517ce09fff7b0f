/// `cluster.redis.url`, read: `redis://[[user]:password@]host[:port][/db]`
/// or `rediss://` for TLS. The password is kept out of `description`.
public struct RedisEndpoint: Sendable, Equatable, CustomStringConvertible {
    public var tls: Bool
    public var host: String
    public var port: Int
    public var user: String?
    public var password: Secret?
    public var database: Int

    public init(tls: Bool = false, host: String, port: Int = 6379, user: String? = nil, password: Secret? = nil, database: Int = 0) {
        self.tls = tls
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.database = database
    }

    /// The highest database number accepted (Redis's default has 16; a
    /// server configured with more takes higher numbers).
    public static let maxDatabase = 1_000_000

    /// Reads a URL, or says what is wrong with it (never repeating the password).
    public static func parse(_ text: String) -> Result<RedisEndpoint, RedisEndpointError> {
        var rest = Substring(text)
        let tls: Bool
        if rest.hasPrefix("redis://") {
            tls = false
            rest = rest.dropFirst(8)
        } else if rest.hasPrefix("rediss://") {
            tls = true
            rest = rest.dropFirst(9)
        } else {
            return .failure(RedisEndpointError("must start with redis:// or rediss:// (TLS)"))
        }
        var database = 0
        if let slash = rest.firstIndex(of: "/") {
            let db = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
            if !db.isEmpty {
                guard db.count <= 7, let n = Int(db), (0...maxDatabase).contains(n) else {
                    return .failure(RedisEndpointError("the database after / must be a number from 0 (got \"\(db.prefix(20))\")"))
                }
                database = n
            }
        }
        var user: String?
        var password: Secret?
        if let at = rest.lastIndex(of: "@") {
            let credentials = rest[..<at]
            rest = rest[rest.index(after: at)...]
            // As in any URL, a reserved character in them is written %XX (a `/` as %2F).
            let (u, p): (Substring, Substring) =
                if let colon = credentials.firstIndex(of: ":") {
                    (credentials[..<colon], credentials[credentials.index(after: colon)...])
                } else {
                    ("", credentials)
                }
            guard let name = percentDecoded(u), let secret = percentDecoded(p) else {
                return .failure(RedisEndpointError("has a % in its user or password that is not %XX (two hex digits)"))
            }
            user = name.isEmpty ? nil : name
            password = secret.isEmpty ? nil : Secret(secret)
        }
        guard let (host, port) = hostAndPort(rest) else {
            return .failure(RedisEndpointError("needs host[:port] with a port from 1 to 65535 (got \"\(rest.prefix(80))\")"))
        }
        return .success(RedisEndpoint(tls: tls, host: host, port: port, user: user, password: password, database: database))
    }

    /// `%XX` decoded (nil: a `%` not followed by two hex digits).
    static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var i = text.utf8.startIndex
        let utf8 = text.utf8
        while i < utf8.endIndex {
            let b = utf8[i]
            guard b == UInt8(ascii: "%") else {
                bytes.append(b)
                i = utf8.index(after: i)
                continue
            }
            let h = utf8.index(after: i)
            guard h < utf8.endIndex, utf8.index(after: h) < utf8.endIndex,
                let hi = hex(utf8[h]), let lo = hex(utf8[utf8.index(after: h)])
            else { return nil }
            bytes.append(hi << 4 | lo)
            i = utf8.index(h, offsetBy: 2)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func hex(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): b - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    private static func hostAndPort(_ text: Substring) -> (String, Int)? {
        var host = text
        var port = 6379
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let after = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if after.hasPrefix(":") {
                guard after.count <= 6, let p = Int(after.dropFirst()) else { return nil }
                port = p
            } else if !after.isEmpty {
                return nil
            }
        } else if let colon = host.lastIndex(of: ":") {
            let p = host[host.index(after: colon)...]
            guard p.count <= 5, let n = Int(p) else { return nil }
            port = n
            host = host[..<colon]
        }
        guard (1...65535).contains(port), !host.isEmpty, host.utf8.count <= 253 else { return nil }
        return (String(host), port)
    }

    /// `host:port` (and the scheme), without credentials: for logs and errors.
    public var description: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return "\(tls ? "rediss" : "redis")://\(h):\(port)/\(database)"
    }

    /// `host:port`, as errors name the server.
    public var address: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

public struct RedisEndpointError: Error, Equatable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
