/// A string key with its hash made once: a dictionary hashes and compares
/// it many times (a lookup compares it with every key on its probe), and a
/// long key's bytes are then read once, not each time. The hash is the
/// string's own (seeded per process), so keys a client chooses cannot be
/// made to collide. The serve-stale store's keys (`StaleStore`) and a
/// worker's coalescing groups (`Coalescing`) are filed by it.
public struct HashedKey: Hashable, Sendable {
    public let text: String
    public let hash: Int

    public init(_ text: String) {
        self.text = text
        hash = text.hashValue
    }

    public static func == (a: HashedKey, b: HashedKey) -> Bool { a.hash == b.hash && a.text == b.text }
    public func hash(into hasher: inout Hasher) { hasher.combine(hash) }
    /// What the dictionary asks for at each lookup and insertion: the hash
    /// already made (a seeded SipHash of the whole key), not hashed a
    /// second time; a collision is told apart by `==`.
    public func _rawHashValue(seed: Int) -> Int { hash ^ seed }
}
