/// One header field as it travels through the proxy. Names keep the case the
/// peer sent; comparisons are case-insensitive (RFC 9110 section 5.1).
public struct HTTPField: Hashable, Sendable {
    public var name: String
    public var value: String

    public init(name: String, value: String) {
        self.name = name
        self.value = value
    }
}

extension Array where Element == HTTPField {
    /// The first value of the field named `name`, compared without case.
    public func value(for name: String) -> String? {
        first { $0.name.equalsIgnoringASCIICase(name) }?.value
    }
}

extension String {
    /// ASCII case-insensitive equality without allocating lowercased copies.
    public func equalsIgnoringASCIICase(_ other: String) -> Bool {
        var a = utf8.makeIterator()
        var b = other.utf8.makeIterator()
        while true {
            switch (a.next(), b.next()) {
            case (nil, nil): return true
            case let (x?, y?):
                if x == y { continue }
                if x | 0x20 != y | 0x20 { return false }
                let lower = x | 0x20
                if lower < UInt8(ascii: "a") || lower > UInt8(ascii: "z") { return false }
            default: return false
            }
        }
    }

    /// ASCII case-insensitive prefix test.
    public func hasPrefixIgnoringASCIICase(_ prefix: String) -> Bool {
        var a = utf8.makeIterator()
        for y in prefix.utf8 {
            guard let x = a.next() else { return false }
            if x == y { continue }
            let lower = x | 0x20
            if lower != y | 0x20 || lower < UInt8(ascii: "a") || lower > UInt8(ascii: "z") { return false }
        }
        return true
    }
}

/// Hop-by-hop headers (RFC 9110 section 7.6.1) belong to one connection and
/// are never forwarded, in either direction.
public enum HopByHop {
    public static func isHopByHop(_ name: String) -> Bool {
        switch name.utf8.count {
        case 2: return name.equalsIgnoringASCIICase("TE")
        case 7: return name.equalsIgnoringASCIICase("Trailer") || name.equalsIgnoringASCIICase("Upgrade")
        case 10: return name.equalsIgnoringASCIICase("Connection") || name.equalsIgnoringASCIICase("Keep-Alive")
        case 17: return name.equalsIgnoringASCIICase("Transfer-Encoding")
        default: return name.hasPrefixIgnoringASCIICase("Proxy-")
        }
    }

    /// Names listed in a `Connection` header value are hop-by-hop for that message too.
    public static func connectionTokens(_ value: String?) -> [String] {
        guard let value else { return [] }
        return value.split(separator: ",").map { $0.trimmingSpaces() }.filter {
            !$0.isEmpty && !$0.equalsIgnoringASCIICase("close") && !$0.equalsIgnoringASCIICase("keep-alive")
        }
    }
}

extension Substring {
    func trimmingSpaces() -> String {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" { s.removeLast() }
        return String(s)
    }
}
