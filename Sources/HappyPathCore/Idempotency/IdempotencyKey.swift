/// What counts as a client's `Idempotency-Key`: a field with a value. An
/// empty one (`Idempotency-Key:`, or only spaces and tabs) names no key, so
/// it makes no request repeatable (retry, hedge) and is not a key for
/// deliver later's dedupe (docs/retry.md, docs/deliver-later.md): treating
/// it as one would let the proxy send a POST twice on the strength of a
/// header that promises nothing.
public enum IdempotencyKey {
    /// Whether `value` is a key: it holds a byte other than SP or HTAB.
    public static func isKey(_ value: String?) -> Bool { value.map { isKey($0.utf8) } ?? false }

    static func isKey<C: Collection<UInt8>>(_ bytes: C) -> Bool {
        bytes.contains { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\t") }
    }

    /// Whether `headers` carry a key (what the retry and hedge rules ask,
    /// on every request): read in place, nothing decoded.
    public static func isPresent(in headers: HeaderBlock) -> Bool {
        var found = false
        headers.forEach { name, value, _ in
            if !found, HTTPBytes.equals(name, "idempotency-key"), isKey(value) { found = true }
        }
        return found
    }

    /// The first `Idempotency-Key` field of `headers` that holds a key, or nil.
    public static func value(in headers: HeaderBlock) -> String? {
        var found: String?
        headers.forEach { name, value, _ in
            guard found == nil, HTTPBytes.equals(name, "idempotency-key"), isKey(value) else { return }
            found = String(decoding: value, as: UTF8.self)
        }
        return found
    }
}
