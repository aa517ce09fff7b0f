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
///
/// The address found is in one canonical form (`normalized`), so that
/// one client is one rate-limit key however a hop was written: a load
/// balancer that appends `203.0.113.7:51234` (address and source port)
/// names the same client on every connection, not a new one per port.
public enum ClientAddress {
    /// - Parameter forwardedFor: the X-Forwarded-For values as received, in order.
    public static func resolve(peer: String, forwardedFor: [String], trusted: [IPRange]) -> String {
        let peer = canonicalPeer(peer)
        // Each address is parsed once and compared as bytes with every range.
        func isTrusted(_ bytes: [UInt8]) -> Bool { trusted.contains { $0.contains(bytes: bytes) } }
        guard !trusted.isEmpty, let peerBytes = IPRange.address(peer), isTrusted(peerBytes) else { return peer }
        var hops: [Substring] = []
        for value in forwardedFor { hops += value.split(separator: ",") }
        for hop in hops.reversed() {
            let text = hop.trimmingSpaces
            // Not an address (garbage, "unknown"): the chain cannot be followed further.
            guard let (address, bytes) = parsed(text) else { return text.isEmpty ? peer : text }
            if !isTrusted(bytes) { return address }
        }
        // Every hop is a trusted proxy: the leftmost is as far as it goes.
        return hops.first.map { normalized($0.trimmingSpaces) ?? $0.trimmingSpaces } ?? peer
    }

    /// One client address in one form, or nil if `text` is not an address:
    /// a port is dropped (`192.0.2.1:8080`, `[2001:db8::1]:8080`), so are
    /// brackets (`[2001:db8::1]`); IPv6 is written as RFC 5952 says
    /// (lowercase, zeros compressed: `2001:DB8:0:0::1` is `2001:db8::1`);
    /// an IPv4-mapped IPv6 address is its IPv4 address (`::ffff:192.0.2.1`
    /// is `192.0.2.1`: a dual-stack listener sees IPv4 clients that way).
    /// A bare IPv6 address has no port: `2001:db8::1` is not read as
    /// `2001:db8:` port 1.
    public static func normalized(_ text: String) -> String? { parsed(text)?.text }

    /// `normalized`, with the address's 16 bytes.
    static func parsed(_ text: String) -> (text: String, bytes: [UInt8])? {
        var host = Substring(text)
        if host.hasPrefix("[") {
            // `[v6]` or `[v6]:port`.
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            guard rest.isEmpty || isPort(rest.dropFirst()) && rest.first == ":" else { return nil }
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.firstIndex(of: ":"), host.lastIndex(of: ":") == colon {
            // One colon: `v4:port` (IPv6 has at least two).
            guard isPort(host[host.index(after: colon)...]) else { return nil }
            host = host[..<colon]
        }
        guard let bytes = IPRange.address(String(host)) else { return nil }
        return (Self.text(of: bytes), bytes)
    }

    /// The TCP peer's address as the socket gave it: already canonical
    /// when it is IPv4 (`inet_ntop`), so only IPv6 text is looked at (an
    /// IPv4 client of a dual-stack listener shows as `::ffff:192.0.2.1`).
    public static func canonicalPeer(_ peer: String) -> String {
        guard peer.utf8.contains(UInt8(ascii: ":")) else { return peer }
        return normalized(peer) ?? peer
    }

    /// The canonical text of 16 address bytes (an IPv4-mapped one as IPv4).
    static func text(of bytes: [UInt8]) -> String {
        if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xFF, bytes[11] == 0xFF {
            return "\(bytes[12]).\(bytes[13]).\(bytes[14]).\(bytes[15])"
        }
        var v6 = in6_addr()
        withUnsafeMutableBytes(of: &v6) { for i in 0..<16 { $0[i] = bytes[i] } }
        var out = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        guard inet_ntop(AF_INET6, &v6, &out, socklen_t(out.count)) != nil else { return "" }
        return String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    private static func isPort(_ digits: Substring) -> Bool {
        !digits.isEmpty && digits.count <= 5 && digits.allSatisfy { $0 >= "0" && $0 <= "9" } && Int(digits)! <= 65535
    }
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
