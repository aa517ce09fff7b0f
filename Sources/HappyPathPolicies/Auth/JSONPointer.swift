import Foundation

/// RFC 6901 JSON pointers over JSONSerialization's objects.
public enum JSONPointer {
    public static func resolve(_ pointer: String, in document: Any) -> Any? {
        guard pointer.hasPrefix("/") else { return pointer.isEmpty ? document : nil }
        var current: Any = document
        for raw in pointer.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            let token = raw.replacingOccurrences(of: "~1", with: "/").replacingOccurrences(of: "~0", with: "~")
            if let object = current as? [String: Any], let next = object[token] {
                current = next
            } else if let array = current as? [Any], let i = Int(token), array.indices.contains(i) {
                current = array[i]
            } else {
                return nil
            }
        }
        return current
    }
}
