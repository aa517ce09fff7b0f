#if canImport(Glibc)
    import Glibc
#endif

/// An IPv4 or IPv6 network (`10.0.0.0/8`, `fd00::/8`, or one address):
/// `trusted_proxies`, whose X-Forwarded-For hops are skipped when the
/// proxy looks for the client's address.
public struct IPRange: Sendable, Equatable, CustomStringConvertible {
    /// 16 bytes; an IPv4 network is kept as its IPv4-mapped IPv6 form, so
    /// `::ffff:10.1.2.3` and `10.1.2.3` are the same address.
    let bytes: [UInt8]
    let prefix: Int
    public let description: String

    /// `nil` if `text` is not `ADDRESS` or `ADDRESS/BITS`.
    public init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = Self.address(String(parts[0])) else { return nil }
        let isV4 = !parts[0].contains(":")
        let maxBits = isV4 ? 32 : 128
        var bits = maxBits
        if parts.count == 2 {
            guard let b = Int(parts[1]), (0...maxBits).contains(b), parts[1].allSatisfy(\.isASCII) else { return nil }
            bits = b
        }
        bytes = address
        prefix = isV4 ? 96 + bits : bits
        description = text
    }

    /// Whether `address` (text, as a peer address or an X-Forwarded-For hop) is in this network.
    public func contains(_ address: String) -> Bool {
        guard let other = Self.address(address) else { return false }
        return contains(bytes: other)
    }

    func contains(bytes other: [UInt8]) -> Bool {
        var bitsLeft = prefix
        for i in 0..<16 where bitsLeft > 0 {
            let take = min(8, bitsLeft)
            let mask: UInt8 = take == 8 ? 0xFF : ~(0xFF >> UInt8(take))
            if bytes[i] & mask != other[i] & mask { return false }
            bitsLeft -= take
        }
        return true
    }

    /// 16 bytes for an IPv4 (mapped) or IPv6 address in text, else nil.
    /// Brackets (`[::1]`) are accepted; a port is not.
    public static func address(_ text: String) -> [UInt8]? {
        var text = text
        if text.hasPrefix("["), text.hasSuffix("]") { text = String(text.dropFirst().dropLast()) }
        var out = [UInt8](repeating: 0, count: 16)
        if !text.contains(":") {
            var v4 = in_addr()
            guard inet_pton(AF_INET, text, &v4) == 1 else { return nil }
            out[10] = 0xFF
            out[11] = 0xFF
            withUnsafeBytes(of: v4.s_addr) { for i in 0..<4 { out[12 + i] = $0[i] } }
            return out
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
        withUnsafeBytes(of: v6) { for i in 0..<16 { out[i] = $0[i] } }
        return out
    }
}

/// Finds the client's address: the TCP peer, or, when the peer is a
/// trusted proxy, the rightmost X-Forwarded-For hop that is not one. With
/// no trusted proxies, X-Forwarded-For changes nothing: a client cannot
/// pick its own address by sending one.
public enum ClientAddress {
    /// - Parameter forwardedFor: the X-Forwarded-For values as received, in order.
    public static func resolve(peer: String, forwardedFor: [String], trusted: [IPRange]) -> String {
        guard !trusted.isEmpty, trusted.contains(where: { $0.contains(peer) }) else { return peer }
        var hops: [Substring] = []
        for value in forwardedFor { hops += value.split(separator: ",") }
        for hop in hops.reversed() {
            let address = hop.trimmingSpaces
            // Not an address (garbage, "unknown"): the chain cannot be followed further.
            guard IPRange.address(address) != nil else { return address.isEmpty ? peer : address }
            if !trusted.contains(where: { $0.contains(address) }) { return address }
        }
        // Every hop is a trusted proxy: the leftmost is as far as it goes.
        return hops.first.map(\.trimmingSpaces) ?? peer
    }
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
