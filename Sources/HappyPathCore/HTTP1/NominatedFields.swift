/// Which fields a `Connection` header names (RFC 9110 section 7.6.1): those
/// fields are hop-by-hop for this message and are not forwarded.
///
/// Linear in the size of the input: the field names go into a small hash
/// table once, then each token is hashed once and compared with the names
/// in its bucket. (Comparing every token with every field would let one
/// 60 KB head with 20,000 tokens cost seconds.)
public enum NominatedFields {
    /// Sets `nominated[k]` for every field `k` (of `count`, named by
    /// `name(k)`) that a token of the comma-separated `connectionValue`
    /// names. `close` and `keep-alive` name no field.
    public static func mark(
        count: Int, name: (Int) -> UnsafeRawBufferPointer, connectionValue: UnsafeRawBufferPointer,
        nominated: inout [Bool]
    ) {
        if nominated.count < count { nominated.append(contentsOf: repeatElement(false, count: count - nominated.count)) }
        guard count > 0 else { return }
        var size = 16
        while size < count * 2 { size <<= 1 }
        let mask = size - 1
        // Open addressing, linear probing; -1 is empty. A chain of fields
        // with the same name is walked in full (each is marked).
        var table = [Int](repeating: -1, count: size)
        for k in 0..<count {
            var slot = Int(truncatingIfNeeded: hash(name(k))) & mask
            while table[slot] >= 0 { slot = (slot + 1) & mask }
            table[slot] = k
        }
        forEachListElement(connectionValue) { token in
            if HTTPBytes.equals(token, "close") || HTTPBytes.equals(token, "keep-alive") { return }
            var slot = Int(truncatingIfNeeded: hash(token)) & mask
            while table[slot] >= 0 {
                let k = table[slot]
                if !nominated[k], HTTPBytes.equalsIgnoringCase(name(k), token) { nominated[k] = true }
                slot = (slot + 1) & mask
            }
        }
    }

    /// FNV-1a over the lower-cased bytes.
    @inline(__always)
    static func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in bytes {
            h ^= UInt64(HTTPBytes.lower(b))
            h &*= 0x100_0000_01b3
        }
        return h
    }
}
