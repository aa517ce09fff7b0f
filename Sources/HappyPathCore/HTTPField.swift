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
        case 2: return equalsIgnoringCase(name, "te")
        case 7: return equalsIgnoringCase(name, "trailer") || equalsIgnoringCase(name, "upgrade")
        case 10: return equalsIgnoringCase(name, "connection") || equalsIgnoringCase(name, "keep-alive")
        case 17: return equalsIgnoringCase(name, "transfer-encoding")
        default: return name.count > 6 && hasPrefixIgnoringCase(name, "proxy-")
        }
    }

    /// ASCII case-insensitive comparison with a lower-case literal.
    public static func equalsIgnoringCase(_ name: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        name.count == lowercase.utf8CodeUnitCount && hasPrefixIgnoringCase(name, lowercase)
    }

    static func hasPrefixIgnoringCase(_ name: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        guard name.count >= lowercase.utf8CodeUnitCount else { return false }
        let p = lowercase.utf8Start
        for i in 0..<lowercase.utf8CodeUnitCount {
            let c = name[i]
            if (c >= 0x41 && c <= 0x5A ? c | 0x20 : c) != p[i] { return false }
        }
        return true
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
