import HappyPathCore

/// A rate-limit key as `RateLimiter` keeps it: the key itself when it is
/// at most `maxPlainBytes` long (a client address, a short API key), else
/// its SHA-256, held inline. A client chooses a `header:` key's value, up
/// to `limits.max_header_bytes`; kept whole, 6,000 distinct 32 KiB API keys
/// took about 210 MB. Kept this way a bucket's key costs at most 64 bytes
/// of its own (and a digest none), so a route's keys take at most
/// `max_keys` × a small fixed size.
///
/// The two forms never meet: a digest is its own case, so no short key can
/// take a long key's bucket. Two long keys share a bucket only if their
/// SHA-256 digests are equal.
public enum RateLimitBucketKey: Hashable, Sendable {
    case plain(String)
    case digest(UInt64, UInt64, UInt64, UInt64)

    /// The longest key kept as it is, in UTF-8 bytes.
    public static let maxPlainBytes = 64

    /// Hashes a long key: call it before taking the limiter's lock (a
    /// 64 KiB key takes about 0.3 ms).
    public init(_ key: String) {
        var key = key
        guard key.utf8.count > Self.maxPlainBytes else {
            self = .plain(key)
            return
        }
        var hasher = SHA256()
        key.withUTF8 { hasher.update(UnsafeRawBufferPointer($0)) }
        let d = hasher.finish()
        func word(_ i: Int) -> UInt64 {
            var w: UInt64 = 0
            for b in d[(8 * i)..<(8 * i + 8)] { w = w << 8 | UInt64(b) }
            return w
        }
        self = .digest(word(0), word(1), word(2), word(3))
    }

    /// The key as text of bounded length: itself (at most `maxPlainBytes`,
    /// 64 bytes), or `sha256:` and the digest's first 128 bits in hex (39
    /// bytes). What pacing keeps
    /// as the client key (`pacing.scope_429: client`).
    public var text: String {
        switch self {
        case let .plain(key): key
        case let .digest(a, b, _, _): "sha256:" + IdentifierGenerator.hex(a) + IdentifierGenerator.hex(b)
        }
    }

    /// Bytes the key holds outside the bucket's own slot (a plain key's
    /// characters; a digest is inline).
    public var heldBytes: Int {
        switch self {
        case let .plain(key): key.utf8.count
        case .digest: 0
        }
    }
}
