import HappyPathCore

/// An answer kept for `fallback.serve_stale`.
public struct StaleEntry: Sendable {
    public var status: Int
    /// The upstream's own reason phrase, when it was not the standard one.
    public var reason: [UInt8]?
    /// Its end-to-end fields, as relayed to the client, as raw bytes.
    public var fields: KeptFields
    public var body: [UInt8]
    /// For `Age`.
    public var receivedAt: Instant
    /// Never answered after this.
    public var expiresAt: Instant
    /// The request fields its `Vary` names, lower-cased ...
    public var varyNames: [String]
    /// ... and the request's values of them when it was kept (nil: absent).
    public var varyValues: [String?]
    /// The path the client asked for (a purge matches its prefix).
    public var path: String

    /// Inlinable, so that a caller in another module builds the entry in
    /// place (not built here and then copied out, part by part retained).
    @inlinable
    public init(
        status: Int, reason: [UInt8]?, fields: KeptFields, body: [UInt8], receivedAt: Instant, expiresAt: Instant,
        varyNames: [String], varyValues: [String?], path: String
    ) {
        self.status = status
        self.reason = reason
        // Fields and body copied as they streamed may hold twice the room
        // they need: what they hold is what counts, so the slack is given
        // back first.
        self.fields = fields.compacted()
        self.body = body.withoutSlack()
        self.receivedAt = receivedAt
        self.expiresAt = expiresAt
        self.varyNames = varyNames
        self.varyValues = varyValues.isEmpty ? varyValues : varyValues.map { $0.map(StaleStore.trim) }
        self.path = path
    }

    public init(
        status: Int, reason: [UInt8]?, fields: [HTTPField], body: [UInt8], receivedAt: Instant, expiresAt: Instant,
        varyNames: [String], varyValues: [String?], path: String
    ) {
        self.init(
            status: status, reason: reason, fields: KeptFields(fields), body: body, receivedAt: receivedAt,
            expiresAt: expiresAt, varyNames: varyNames, varyValues: varyValues, path: path)
    }

    /// What it counts against `stale_max_bytes`: everything it keeps — the
    /// room of the body and of the fields, the `Vary` names and the
    /// request's values of them (a `Vary: User-Agent` answer keeps that
    /// whole field), the reason phrase, the path — with
    /// `StaleStore.perPart` for the fields' array and for each `Vary` name
    /// and value, and `StaleStore.overhead` for the entry. The key is
    /// added by the store.
    var size: Int {
        var n = body.capacity + fields.capacity + StaleStore.perPart + path.utf8.count + (reason?.count ?? 0)
        n += StaleStore.overhead
        for name in varyNames { n += name.utf8.count + StaleStore.perPart }
        for value in varyValues { n += (value?.utf8.count ?? 0) + StaleStore.perPart }
        return n
    }
}

/// The answers the process keeps for `fallback.serve_stale`, shared by
/// every worker (each call takes one lock). Bounded by `maxBytes`: a new
/// answer that does not fit pushes out the least recently used (kept or
/// answered) first, each in O(1), from a doubly linked list threaded
/// through an array of slots. Under one key (`StaleKey`) sit up to
/// `maxVariants` answers told apart by their `Vary` values. Every byte an
/// entry keeps counts (`StaleEntry.size` and its key), so `maxBytes`
/// bounds the memory kept, whatever the request's fields.
public final class StaleStore: Sendable {
    /// Bookkeeping counted per entry besides its bytes (its slot, its
    /// place in the key's list, the key's dictionary entry).
    public static let overhead = 128
    /// Counted per field, per `Vary` name and value, and for the key: the
    /// room of its array slot and its allocation's header.
    public static let perPart = 48
    /// Variants kept under one key; the oldest goes first.
    public static let maxVariants = 8

    public let maxBytes: Int
    public let maxEntryBytes: Int
    /// Mixed into every credential hash (`StaleKey`), so a hash kept here
    /// cannot be matched against a list of likely tokens elsewhere. One per
    /// process: the store outlives reloads, and so do its keys.
    public let salt: [UInt8]
    private let state = Locked(State())

    /// - Parameter salt: nil: 32 random bytes.
    public init(maxBytes: Int, maxEntryBytes: Int, salt: [UInt8]? = nil) {
        self.maxBytes = max(0, maxBytes)
        self.maxEntryBytes = max(0, maxEntryBytes)
        if let salt {
            self.salt = salt
        } else {
            var random = SystemRandomNumberGenerator()
            self.salt = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
        }
    }

    /// Keeps `entry` under `key`, in place of the variant with the same
    /// `Vary` values. False (and that variant dropped: it is outdated) when
    /// it is larger than `maxEntryBytes` or the whole store.
    @discardableResult
    public func keep(_ entry: consuming StaleEntry, key: String) -> Bool {
        let size = entry.size + key.utf8.count + Self.perPart
        let key = Key(key)
        // Moved into the store, not copied: each copy of an entry retains
        // and releases every one of its parts.
        var pending: StaleEntry? = consume entry
        return state.withLock { s in
            var first = s.variants[key]
            // The slots under one key share the dictionary's copy of it:
            // each new answer's own copy is let go, not kept beside it.
            let shared = first.map { s.slots[$0].key } ?? key
            if let oldest = first,
                let same = s.variant(from: oldest, names: pending!.varyNames, values: pending!.varyValues)
            {
                s.remove(same)
                first = s.variants[key]
            }
            guard size <= maxEntryBytes, size <= maxBytes else { return false }
            if let oldest = first, s.variantCount(from: oldest) >= Self.maxVariants { s.remove(oldest) }
            while s.bytes + size > maxBytes, s.tail >= 0 { s.remove(s.tail) }
            s.insert(pending.take()!, key: shared, size: size)
            return true
        }
    }

    /// The answer kept under `key` whose `Vary` values are the request's
    /// (`requestValue(name)`), if it has not expired; it becomes the most
    /// recently used. Expired answers met on the way are dropped.
    public func lookup(key: String, at now: Instant, requestValue: (String) -> String?) -> StaleEntry? {
        lookup(keys: [key], at: now, requestValue: requestValue)
    }

    /// The most recently received of the answers that fit under any of
    /// `keys` (a request's own credentials' and the shared ones).
    public func lookup(keys: [String], at now: Instant, requestValue: (String) -> String?) -> StaleEntry? {
        state.withLock { s in
            var best: Int?
            for key in keys {
                var next = s.variants[Key(key)] ?? -1
                while next >= 0 {
                    let slot = next
                    next = s.slots[slot].nextVariant
                    guard let entry = s.slots[slot].entry else { continue }
                    if entry.expiresAt <= now {
                        s.remove(slot)
                        continue
                    }
                    let matches = zip(entry.varyNames, entry.varyValues).allSatisfy { name, kept in
                        requestValue(name).map(Self.trim) == kept
                    }
                    if matches, best.map({ entry.receivedAt > s.slots[$0].entry!.receivedAt }) ?? true { best = slot }
                }
            }
            guard let best else { return nil }
            s.touch(best)
            return s.slots[best].entry
        }
    }

    /// Drops every answer whose path starts with `pathPrefix` ("" or "/": all).
    public func purge(pathPrefix: String) -> (entries: Int, bytes: Int) {
        state.withLock { s in
            var entries = 0
            var bytes = 0
            for slot in s.slots.indices {
                guard let entry = s.slots[slot].entry, entry.path.hasPrefix(pathPrefix) else { continue }
                entries += 1
                bytes += s.slots[slot].size
                s.remove(slot)
            }
            return (entries, bytes)
        }
    }

    /// Answers kept and the bytes they count.
    public var usage: (entries: Int, bytes: Int) { state.withLock { ($0.count, $0.bytes) } }

    @usableFromInline
    static func trim(_ value: String) -> String {
        var v = Substring(value)
        while let c = v.first, c == " " || c == "\t" { v.removeFirst() }
        while let c = v.last, c == " " || c == "\t" { v.removeLast() }
        return String(v)
    }

    /// A key with its hash, made once per call (`HashedKey`).
    typealias Key = HashedKey
    /// A free slot's.
    static let noKey = Key("")

    /// Slots in an array, linked most recently used first; freed slots are
    /// reused. The variants under one key are a second list through the
    /// same slots, oldest first, from the dictionary's slot (no array per
    /// key: a new key costs no allocation of its own).
    struct State {
        struct Slot {
            var entry: StaleEntry?
            var key = StaleStore.noKey
            var size = 0
            var newer = -1
            var older = -1
            /// The next newer variant under the same key (-1: none).
            var nextVariant = -1
        }

        var slots: [Slot] = []
        var free: [Int] = []
        /// Each key's oldest variant.
        var variants: [Key: Int] = [:]
        /// Most and least recently used (-1: empty).
        var head = -1
        var tail = -1
        var bytes = 0
        var count = 0

        /// The variant from `first` on kept for these `Vary` values.
        func variant(from first: Int, names: [String], values: [String?]) -> Int? {
            var slot = first
            while slot >= 0 {
                if let entry = slots[slot].entry, entry.varyNames == names, entry.varyValues == values { return slot }
                slot = slots[slot].nextVariant
            }
            return nil
        }

        func variantCount(from first: Int) -> Int {
            var n = 0
            var slot = first
            while slot >= 0 {
                n += 1
                slot = slots[slot].nextVariant
            }
            return n
        }

        mutating func insert(_ entry: consuming StaleEntry, key: Key, size: Int) {
            let slot: Int
            if let reused = free.popLast() {
                slot = reused
            } else {
                slot = slots.count
                slots.append(Slot())
            }
            slots[slot] = Slot(entry: consume entry, key: key, size: size)
            // One hash of the key: the dictionary's slot is made or read in place.
            var last = -1
            { (first: inout Int) in
                if first < 0 { first = slot } else { last = first }
            }(&variants[key, default: -1])
            if last >= 0 {
                while slots[last].nextVariant >= 0 { last = slots[last].nextVariant }
                slots[last].nextVariant = slot
            }
            link(slot)
            bytes += size
            count += 1
        }

        mutating func remove(_ slot: Int) {
            guard slots[slot].entry != nil else { return }
            unlink(slot)
            let key = slots[slot].key
            let next = slots[slot].nextVariant
            if let first = variants[key] {
                if first == slot {
                    variants[key] = next >= 0 ? next : nil
                } else {
                    var before = first
                    while slots[before].nextVariant >= 0, slots[before].nextVariant != slot { before = slots[before].nextVariant }
                    if slots[before].nextVariant == slot { slots[before].nextVariant = next }
                }
            }
            bytes -= slots[slot].size
            count -= 1
            slots[slot] = Slot()
            free.append(slot)
        }

        mutating func touch(_ slot: Int) {
            guard head != slot else { return }
            unlink(slot)
            link(slot)
        }

        /// At the head (most recently used).
        private mutating func link(_ slot: Int) {
            slots[slot].newer = -1
            slots[slot].older = head
            if head >= 0 { slots[head].newer = slot }
            head = slot
            if tail < 0 { tail = slot }
        }

        private mutating func unlink(_ slot: Int) {
            let newer = slots[slot].newer
            let older = slots[slot].older
            if newer >= 0 { slots[newer].older = older } else { head = older }
            if older >= 0 { slots[older].newer = newer } else { tail = newer }
            slots[slot].newer = -1
            slots[slot].older = -1
        }
    }
}
