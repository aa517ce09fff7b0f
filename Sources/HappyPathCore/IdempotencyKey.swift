/// What counts as a client's `Idempotency-Key`: a field with a value. An
/// empty one (`Idempotency-Key:`, or only spaces and tabs) names no key, so
/// it makes no request repeatable (retry, hedge) and is not a key for
/// deliver later's dedupe (docs/retry.md, docs/deliver-later.md): treating
/// it as one would let the proxy send a POST twice on the strength of a
/// header that promises nothing.
public enum IdempotencyKey {
    /// Whether `value` is a key: it holds a byte other than SP or HTAB.
    public static func isKey(_ value: String?) -> Bool {
        guard let value else { return false }
        return value.utf8.contains { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\t") }
    }

    /// The first `Idempotency-Key` field of `headers` that holds a key, or nil.
    public static func value(in headers: HeaderBlock) -> String? {
        var found: String?
        headers.forEach { name, value, _ in
            guard found == nil, HTTPBytes.equals(name, "idempotency-key") else { return }
            let text = String(decoding: value, as: UTF8.self)
            if isKey(text) { found = text }
        }
        return found
    }
}
