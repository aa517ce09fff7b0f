import Foundation
import HappyPathCore

/// A credential as the proxy injects it. Printing one shows `***` for the
/// credential itself.
public struct Token: Sendable, Equatable {
    /// The full header value, scheme included (`Bearer abc`).
    public var credential: Secret
    /// nil: does not expire (static credentials, or no `expires_in`).
    public var expiresAt: Instant?
    /// Counts refreshes, so a try can tell whether a fresher token exists.
    public var generation: Int

    public init(credential: Secret, expiresAt: Instant?, generation: Int) {
        self.credential = credential
        self.expiresAt = expiresAt
        self.generation = generation
    }

}

/// What a token endpoint said, parsed. Pure: tests feed it bytes.
public struct TokenResponse: Sendable, Equatable {
    public var accessToken: Secret
    public var tokenType: String?
    public var expiresIn: Duration?
    /// A rotated refresh token (oauth2_refresh_token), if the server sent one.
    public var refreshToken: Secret?

    public init(accessToken: Secret, tokenType: String?, expiresIn: Duration?, refreshToken: Secret?) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.refreshToken = refreshToken
    }

    public enum ParseError: Error, Equatable, CustomStringConvertible {
        case notJSON
        case missing(String)
        case unusable

        public var description: String {
            switch self {
            case .notJSON: "the token endpoint's answer is not a JSON object"
            case let .missing(what): "the token endpoint's answer has no \(what)"
            case .unusable: "the token endpoint's token has spaces or control characters and cannot go into a header"
            }
        }
    }

    /// RFC 6749 section 5.1: `access_token`, `token_type`, `expires_in`, `refresh_token`.
    public static func oauth2(_ body: [UInt8]) -> Result<TokenResponse, ParseError> {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] else {
            return .failure(.notJSON)
        }
        guard let token = object["access_token"] as? String, !token.isEmpty else { return .failure(.missing("access_token")) }
        guard usable(token) else { return .failure(.unusable) }
        return .success(
            TokenResponse(
                accessToken: Secret(token), tokenType: object["token_type"] as? String,
                expiresIn: seconds(object["expires_in"]), refreshToken: (object["refresh_token"] as? String).map(Secret.init)))
    }

    /// A login answer: the token at `tokenPointer`, its lifetime (seconds) at `expiresInPointer`.
    public static func login(_ body: [UInt8], tokenPointer: String, expiresInPointer: String?) -> Result<
        TokenResponse, ParseError
    > {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) else { return .failure(.notJSON) }
        guard let token = JSONPointer.resolve(tokenPointer, in: object) as? String, !token.isEmpty else {
            return .failure(.missing("token at \(tokenPointer)"))
        }
        guard usable(token) else { return .failure(.unusable) }
        let lifetime = expiresInPointer.flatMap { seconds(JSONPointer.resolve($0, in: object)) }
        return .success(TokenResponse(accessToken: Secret(token), tokenType: nil, expiresIn: lifetime, refreshToken: nil))
    }

    /// A token goes into a header value verbatim: visible ASCII only, so it
    /// can never end the field or the head early (RFC 6750's b64token is a
    /// subset of this).
    static func usable(_ token: String) -> Bool {
        token.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }

    /// `expires_in`: a JSON number or a string of one, read by
    /// `OutsideValues.lifetimeSeconds`: below one second it is one second,
    /// past ten years ten years; zero, negative, NaN, infinite or not a
    /// number is absent (the token does not expire).
    static func seconds(_ value: Any?) -> Duration? {
        switch value {
        case let n as NSNumber:
            return OutsideValues.lifetimeSeconds(n.doubleValue)
        case let s as String:
            // Digits, a sign, a point and an exponent only: `Double` would also read "inf", "nan" and hex.
            guard s.utf8.count <= 64, s.utf8.allSatisfy({ (0x30...0x39).contains($0) || "+-.eE".utf8.contains($0) })
            else { return nil }
            return OutsideValues.lifetimeSeconds(Double(s))
        default: return nil
        }
    }
}

/// application/x-www-form-urlencoded bodies for token requests.
public enum FormEncoding {
    public static func encode(_ fields: [(String, String)]) -> String {
        fields.map { escape($0.0) + "=" + escape($0.1) }.joined(separator: "&")
    }

    static func escape(_ s: String) -> String {
        var out = ""
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(UnicodeScalar(byte))
            case UInt8(ascii: " "): out += "+"
            default: out += "%" + String(byte, radix: 16, uppercase: true).leftPadded()
            }
        }
        return out
    }
}

extension String {
    fileprivate func leftPadded() -> String { count == 1 ? "0" + self : self }
}
