import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathPolicies

/// Turns an upstream's error answer into the client's problem: the built-in
/// code for its status, then the first matching mapping (route's before the
/// upstream's, like a responder chain), with the upstream's JSON body kept
/// under `upstream_body`.
enum ErrorMapper {
    /// Bodies larger than this are not kept or inspected.
    static let maxBody = 16 * 1024

    /// Fields of an upstream error answer that describe the body the
    /// problem replaces: they would describe the wrong body.
    /// (`content-range` is kept on a 416, where it says how long the resource is.)
    static let bodyFields: Set<String> = [
        "content-type", "content-length", "content-encoding", "content-language", "content-range", "content-location",
        "content-disposition", "etag", "last-modified", "digest", "content-digest", "repr-digest", "content-md5",
    ]

    /// Fields the problem answer sets itself; the proxy's win.
    static let proxyFields: Set<String> = ["cache-control", "x-request-id", "x-happypath-attempts"]

    /// What a problem keeps of the upstream error answer it replaces: every
    /// end-to-end field a client may act on (`WWW-Authenticate` on a 401,
    /// `Set-Cookie`, `Allow` on a 405, `Content-Range` on a 416, `Vary`,
    /// `Location`…), without the fields that describe the replaced body and
    /// those the proxy sets itself (`Retry-After` only when the proxy
    /// computed one for the problem). docs/errors.md has the table.
    static func keptFields(_ fields: [HTTPField], status: Int, proxyRetryAfter: Bool) -> [HTTPField] {
        fields.filter { field in
            let name = field.name.lowercased()
            if name == "content-range" { return status == 416 }
            if name == "retry-after" { return !proxyRetryAfter }
            return !bodyFields.contains(name) && !proxyFields.contains(name)
        }
    }

    static func builtInCode(for status: Int) -> ProblemCode {
        switch status {
        case 403: .forbidden
        case 404: .notFound
        case 429: .rateLimited
        case 400..<500: .clientError
        default: .upstreamUnavailable
        }
    }

    /// - Parameters:
    ///   - body: the first bytes of the upstream's body; `complete` says whether that was all of it.
    static func problem(
        status: Int, body: [UInt8], complete: Bool, mappings: [ErrorMapping], base: Problem
    ) -> Problem {
        let code = builtInCode(for: status)
        var p = base
        p.code = code.rawValue
        p.type = code.type
        p.title = code.title
        p.status = code == .clientError ? status : code.status
        p.retryable = code.retryable
        p.recoverySuggestion = code.recoverySuggestion
        p.recoveryOptions = code.recoveryOptions
        let json: Any? =
            complete && !body.isEmpty ? try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed]) : nil
        if json != nil, let text = String(bytes: body, encoding: .utf8) {
            p.upstreamBodyJSON = text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        guard let mapping = mappings.first(where: { matches($0, status: status, json: json) }) else { return p }
        p.code = mapping.code
        p.type = ProblemCode.type(for: mapping.code)
        if let title = mapping.title { p.title = title }
        if let detail = mapping.detail { p.detail = detail }
        if let suggestion = mapping.recoverySuggestion { p.recoverySuggestion = suggestion }
        if let retryable = mapping.retryable {
            p.retryable = retryable
            p.recoveryOptions = retryable ? ["retry", "cancel"] : ["cancel"]
        }
        if let options = mapping.recoveryOptions { p.recoveryOptions = options }
        return p
    }

    static func matches(_ mapping: ErrorMapping, status: Int, json: Any?) -> Bool {
        !mapping.when.isEmpty
            && mapping.when.allSatisfy { condition in
                switch condition {
                case let .status(s): return s == status
                case let .statusClass(c): return status / 100 == c
                case let .jsonPointer(pointer, equals):
                    guard let json, let value = JSONPointer.resolve(pointer, in: json) else { return false }
                    return JSONPointer.text(of: value) == equals
                }
            }
    }
}

extension JSONPointer {
    /// Scalars as text for comparison with a mapping's `equals`.
    static func text(of value: Any) -> String? {
        switch value {
        case let s as String: return s
        case let n as NSNumber:
            // JSON true/false arrive as boolean NSNumbers (objCType "c").
            if String(cString: n.objCType) == "c" { return n.boolValue ? "true" : "false" }
            return n.stringValue
        case is NSNull: return "null"
        default: return nil
        }
    }
}
