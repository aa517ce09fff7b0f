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

}

/// Hop-by-hop headers (RFC 9110 section 7.6.1) belong to one connection and
/// are never forwarded, in either direction.
public enum HopByHop {
    public static func isHopByHop(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { isHopByHop(UnsafeRawBufferPointer($0)) }
    }

    /// The same rule on raw bytes, for header names as libcurl hands them over.
    public static func isHopByHop(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 2: return HTTPBytes.equals(name, "te")
        case 7: return HTTPBytes.equals(name, "trailer") || HTTPBytes.equals(name, "upgrade")
        case 10: return HTTPBytes.equals(name, "connection") || HTTPBytes.equals(name, "keep-alive")
        case 17: return HTTPBytes.equals(name, "transfer-encoding")
        default: return name.count > 6 && HTTPBytes.equals(UnsafeRawBufferPointer(rebasing: name[0..<6]), "proxy-")
        }
    }
}
