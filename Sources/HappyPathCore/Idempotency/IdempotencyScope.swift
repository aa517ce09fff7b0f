/// Whose an `Idempotency-Key` is, and which request it was sent with
/// (docs/deliver-later.md, "Idempotency-Key"). A key is looked up only in
/// its scope (the route, its upstream and the client's identity), so one
/// client cannot learn or take over another's delivery by sending the same
/// key; and the same key with another request is refused rather than
/// answered with the first request's delivery.
///
/// Both are SHA-256 digests (hex): the client's `Authorization` value goes
/// into the scope's hash and is never kept as it is. Each field is hashed
/// with its length before it, so no two different field lists hash the
/// same bytes.
public enum IdempotencyScope {
    /// Who the client is, in the order the proxy looks.
    public enum Client: Equatable, Sendable {
        /// The request's `Authorization` value.
        case authorization(String)
        /// The route's `delivery.idempotency.client_header` and its value.
        case header(name: String, value: String)
        /// Neither: every such client of the route shares one scope.
        case anonymous
    }

    /// The client of a request: `Authorization` if it has one, else the
    /// route's client header (if configured and sent), else anonymous.
    public static func client(authorization: String?, headerName: String?, headerValue: String?) -> Client {
        if let authorization { return .authorization(authorization) }
        if let headerName, let headerValue { return .header(name: headerName.lowercased(), value: headerValue) }
        return .anonymous
    }

    /// The scope a key is unique in.
    public static func scope(route: String, upstream: String, client: Client) -> String {
        var h = SHA256()
        field(&h, "happypath idempotency scope 1")
        field(&h, route)
        field(&h, upstream)
        switch client {
        case let .authorization(value):
            field(&h, "authorization")
            field(&h, value)
        case let .header(name, value):
            field(&h, "header")
            field(&h, name)
            field(&h, value)
        case .anonymous:
            field(&h, "anonymous")
        }
        return SHA256.hex(digest: h.finish())
    }

    /// The request a key was sent with: method, target (path and query as
    /// the client sent them) and body, byte for byte. Headers are left out:
    /// a resend may differ in `traceparent`, `Date` or a refreshed token.
    public static func fingerprint(method: String, target: String, body: UnsafeRawBufferPointer) -> String {
        var h = SHA256()
        field(&h, "happypath request fingerprint 1")
        field(&h, method)
        field(&h, target)
        field(&h, body.count)
        h.update(body)
        return SHA256.hex(digest: h.finish())
    }

    private static func field(_ h: inout SHA256, _ text: String) {
        field(&h, text.utf8.count)
        h.update(text.utf8)
    }

    private static func field(_ h: inout SHA256, _ length: Int) {
        h.update("\(length):")
    }
}
