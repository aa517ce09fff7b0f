import Foundation
import HappyPathCore

/// Takes the proxy's own credentials out of text an upstream wrote, before
/// that text goes into a problem body a client reads.
///
/// An upstream that echoes its request (a debug 500 that dumps the headers,
/// a token endpoint that repeats the form it got) hands back the very
/// credential the proxy injected. `Secret` keeps credentials out of what the
/// proxy prints; this keeps them out of what the proxy *relays* on the error
/// path: `upstream_body` and every text field of a problem built for an
/// exchange (docs/auth.md, "Where they never appear").
///
/// Each secret is searched for in every form it can take in such a body:
/// as is; JSON-escaped (with `/` as `/` and as `\/`, the way Foundation's
/// encoder writes it); form-encoded (`%2F`, `%2f`, `+` for a space); and,
/// for a `Basic` credential, decoded from base64 (`user:password`, and the
/// password alone). Each match becomes `***`. Longer forms are replaced
/// first, so a credential that contains another (`Bearer abc` and `abc`)
/// leaves no tail behind.
public struct SecretScrubber: Sendable {
    /// What is searched for, longest first.
    public let forms: [String]

    /// Pieces taken out of a secret (a `Basic` password, a login body's
    /// fields) shorter than this are not searched for: they would match
    /// ordinary words.
    public static let minimumPieceLength = 4

    /// - Parameters:
    ///   - secrets: credentials the proxy sends or holds, each searched for
    ///     whole (however short).
    ///   - pieces: parts of them worth finding on their own (a login body's
    ///     field values); those shorter than `minimumPieceLength` are skipped.
    public init(_ secrets: [Secret], pieces: [String] = []) {
        var found = Set<String>()
        func add(_ value: String, whole: Bool) {
            guard whole ? !value.isEmpty : value.utf8.count >= Self.minimumPieceLength else { return }
            found.insert(value)
            let quoted = JSON.quote(value)
            found.insert(String(quoted.dropFirst().dropLast()))
            found.insert(String(quoted.dropFirst().dropLast()).replacingOccurrences(of: "/", with: "\\/"))
            let form = FormEncoding.escape(value)
            found.insert(form)
            found.insert(form.lowercasedPercentEscapes())
            found.insert(form.replacingOccurrences(of: "+", with: "%20"))
        }
        for secret in secrets {
            let value = secret.reveal
            add(value, whole: true)
            // `Bearer abc`: an upstream may echo the token without its scheme.
            if let space = value.firstIndex(of: " ") {
                let scheme = value[..<space]
                let rest = String(value[value.index(after: space)...]).trimmingCharacters(in: .whitespaces)
                add(rest, whole: false)
                if scheme.lowercased() == "basic", let data = Data(base64Encoded: rest),
                    let decoded = String(data: data, encoding: .utf8)
                {
                    add(decoded, whole: false)
                    if let colon = decoded.firstIndex(of: ":") {
                        add(String(decoded[decoded.index(after: colon)...]), whole: false)
                    }
                }
            }
        }
        for piece in pieces { add(piece, whole: false) }
        forms = found.filter { !$0.isEmpty }.sorted {
            $0.utf8.count > $1.utf8.count || ($0.utf8.count == $1.utf8.count && $0 < $1)
        }
    }

    /// `text` with every form of every secret replaced by `***`.
    public func scrub(_ text: String) -> String {
        var out = text
        for form in forms where out.contains(form) {
            out = out.replacingOccurrences(of: form, with: "***")
        }
        return out
    }

    /// The string values in a login body: a JSON document's strings at any
    /// depth, or a form's field values.
    public static func values(inBody body: String) -> [String] {
        if let json = try? JSONSerialization.jsonObject(with: Data(body.utf8), options: [.fragmentsAllowed]) {
            var out: [String] = []
            func walk(_ value: Any) {
                switch value {
                case let s as String: out.append(s)
                case let a as [Any]: a.forEach(walk)
                case let d as [String: Any]: d.values.forEach(walk)
                default: break
                }
            }
            walk(json)
            return out
        }
        return body.split(separator: "&").compactMap { field in
            guard let eq = field.firstIndex(of: "=") else { return nil }
            let raw = String(field[field.index(after: eq)...]).replacingOccurrences(of: "+", with: " ")
            return raw.removingPercentEncoding ?? raw
        }
    }
}

extension Problem {
    /// This problem with every text that can carry an upstream's words
    /// scrubbed. `upstream_body` stays valid JSON: a replacement that broke
    /// it (a secret so short it matched inside an escape sequence) leaves
    /// the body out rather than send something a client cannot parse.
    public func scrubbed(by scrubber: SecretScrubber) -> Problem {
        var p = self
        p.title = scrubber.scrub(title)
        p.detail = detail.map(scrubber.scrub)
        p.recoverySuggestion = recoverySuggestion.map(scrubber.scrub)
        if let body = upstreamBodyJSON {
            let clean = scrubber.scrub(body)
            if clean == body {
                p.upstreamBodyJSON = body
            } else if (try? JSONSerialization.jsonObject(with: Data(clean.utf8), options: [.fragmentsAllowed])) != nil {
                p.upstreamBodyJSON = clean
            } else {
                p.upstreamBodyJSON = nil
            }
        }
        return p
    }
}

extension String {
    /// `%2F` → `%2f` (some servers echo a form with lowercase escapes).
    fileprivate func lowercasedPercentEscapes() -> String {
        var out = ""
        var pending = 0
        for ch in self {
            if ch == "%" {
                pending = 2
                out.append(ch)
            } else if pending > 0 {
                pending -= 1
                out += ch.lowercased()
            } else {
                out.append(ch)
            }
        }
        return out
    }
}
