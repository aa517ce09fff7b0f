import CTLS
import HappyPathCore
import HappyPathIO

/// A client's request to switch protocols on a route with `upgrades`
/// (docs/websocket.md): a `GET` over HTTP/1.1 with `Connection: upgrade`, an
/// `Upgrade` naming a protocol the route allows, and no body. Anything else
/// is a plain request (its `Upgrade` dropped as a hop-by-hop field). Or an
/// HTTP/2 extended CONNECT (RFC 8441) whose `:protocol` the route allows:
/// towards the upstream it becomes the same HTTP/1.1 upgrade, with the
/// `Sec-WebSocket-Key` the proxy makes (an RFC 8441 client sends none),
/// whose `Sec-WebSocket-Accept` the proxy checks.
struct UpgradeRequest {
    /// The protocols asked for that the route allows, as the client wrote
    /// them (`websocket`): the `Upgrade` value sent upstream.
    let protocols: [String]
    /// An extended CONNECT's WebSocket key, made here (nil: an HTTP/1.1
    /// upgrade, whose client's own key and the upstream's answer pass as they are).
    var key: String?
    /// An HTTP/2 extended CONNECT: answered `200` with HTTP/2's fields, not `101`.
    var extended = false

    /// An extended CONNECT on a route that allows its protocol (nil: it does not).
    static func extendedConnect(_ request: HTTPRequest, route: RuntimeRoute) -> UpgradeRequest? {
        guard let name = request.connectProtocol, route.upgrades.contains(name) else { return nil }
        var key: String?
        if name == "websocket" {
            var g = SystemRandomNumberGenerator()
            key = String(decoding: Base64.padded((0..<16).map { _ in UInt8.random(in: 0...255, using: &g) }), as: UTF8.self)
        }
        return UpgradeRequest(protocols: [name], key: key, extended: true)
    }

    /// The `Sec-WebSocket-Accept` an upstream must answer `key` with (RFC 6455 section 4.2.2).
    static func webSocketAccept(for key: String) -> String {
        let text = Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8)
        var digest = [UInt8](repeating: 0, count: 20)
        text.withUnsafeBytes { t in digest.withUnsafeMutableBufferPointer { hp_sha1(t.baseAddress, t.count, $0.baseAddress) } }
        return String(decoding: Base64.padded(digest), as: UTF8.self)
    }

    static func of(_ request: HTTPRequest, method: String, route: RuntimeRoute) -> UpgradeRequest? {
        if !route.upgrades.isEmpty, request.connectProtocol != nil { return extendedConnect(request, route: route) }
        // `Connection: upgrade` names a field, which the parser noted: a
        // plain request on an upgrades route costs two checks, no scan.
        guard !route.upgrades.isEmpty, request.connectionNominatesFields, method == "GET", request.isHTTP11 else {
            return nil
        }
        var connectionUpgrade = false
        var offered: [String] = []
        var hasBody = false
        request.forEachHeader { name, value in
            switch name.lowercased() {
            case "connection":
                if tokens(value).contains(where: { $0.lowercased() == "upgrade" }) { connectionUpgrade = true }
            case "upgrade":
                offered += tokens(value)
            case "content-length":
                if value.trimmingSpaces != "0" { hasBody = true }
            case "transfer-encoding":
                hasBody = true
            default:
                break
            }
        }
        guard connectionUpgrade, !hasBody else { return nil }
        let allowed = offered.filter { route.upgrades.contains(protocolName($0)) }
        return allowed.isEmpty ? nil : UpgradeRequest(protocols: allowed)
    }

    /// The request head for the upstream: the forwarded fields (credentials
    /// replaced), `Host` for the endpoint, and the upgrade's own two fields.
    func head(target: String, origin: String, fields: [HTTPField], replacing: HTTPField?) -> [UInt8] {
        var host = origin
        if let scheme = host.range(of: "://") { host = String(host[scheme.upperBound...]) }
        if host.hasSuffix("/") { host.removeLast() }
        var text = "GET \(target) HTTP/1.1\r\nHost: \(host)\r\n"
        let replaced = replacing?.name.lowercased()
        for field in fields where field.name.lowercased() != replaced {
            // The proxy's key stands for the client's (an RFC 8441 client has none to give).
            if key != nil, field.name.lowercased() == "sec-websocket-key" { continue }
            text += "\(field.name): \(field.value)\r\n"
        }
        if let replacing { text += "\(replacing.name): \(replacing.value)\r\n" }
        if let key {
            text += "Sec-WebSocket-Key: \(key)\r\n"
            if !fields.contains(where: { $0.name.lowercased() == "sec-websocket-version" }) { text += "Sec-WebSocket-Version: 13\r\n" }
        }
        text += "Connection: Upgrade\r\nUpgrade: \(protocols.joined(separator: ", "))\r\n\r\n"
        return Array(text.utf8)
    }

    /// Why an upstream's `101` is refused (nil: accepted): it must name in
    /// `Upgrade` only protocols the client asked for.
    func refusal(of fields: [HTTPField]) -> String? {
        let named = fields.filter { $0.name.lowercased() == "upgrade" }.flatMap { Self.tokens($0.value) }
        guard !named.isEmpty else { return "the upstream answered 101 without an Upgrade field" }
        let asked = Set(protocols.map(Self.protocolName))
        for name in named where !asked.contains(Self.protocolName(name)) {
            return "the upstream switched to '\(name)', which the client did not ask for"
        }
        if let key {
            let accepts = fields.filter { $0.name.lowercased() == "sec-websocket-accept" }.map(\.value)
            guard accepts == [Self.webSocketAccept(for: key)] else {
                return accepts.isEmpty
                    ? "the upstream's 101 has no Sec-WebSocket-Accept" : "the upstream's Sec-WebSocket-Accept does not answer the proxy's key"
            }
        }
        return nil
    }

    /// The `101`'s fields for the client: the upstream's end-to-end fields
    /// (none it names in `Connection`), then the upgrade's own, then the
    /// proxy's request id.
    func answerFields(_ fields: [HTTPField], requestID: String) -> [HTTPField] {
        if extended { return extendedConnectFields(fields, requestID: requestID) }
        var nominated = Set<String>()
        var upgrade: [String] = []
        for field in fields {
            switch field.name.lowercased() {
            case "connection": for t in Self.tokens(field.value) { nominated.insert(t.lowercased()) }
            case "upgrade": upgrade += Self.tokens(field.value)
            default: break
            }
        }
        var out = fields.filter { field in
            let name = field.name.lowercased()
            return !HopByHop.isHopByHop(name) && !nominated.contains(name) && name != "content-length"
                && name != "x-request-id"
        }
        out.append(HTTPField(name: "Connection", value: "Upgrade"))
        out.append(HTTPField(name: "Upgrade", value: upgrade.joined(separator: ", ")))
        out.append(HTTPField(name: "X-Request-Id", value: requestID))
        return out
    }

    /// The `200`'s fields for an extended CONNECT: the upstream's end-to-end
    /// fields (`Sec-WebSocket-Protocol` and `-Extensions` among them), not
    /// the handshake's own (`Sec-WebSocket-Accept` answered the proxy's
    /// key; HTTP/2 has no `Connection` or `Upgrade`), then the request id.
    func extendedConnectFields(_ fields: [HTTPField], requestID: String) -> [HTTPField] {
        var nominated = Set<String>()
        for field in fields where field.name.lowercased() == "connection" {
            for t in Self.tokens(field.value) { nominated.insert(t.lowercased()) }
        }
        var out = fields.filter { field in
            let name = field.name.lowercased()
            return !HopByHop.isHopByHop(name) && !nominated.contains(name) && name != "content-length"
                && name != "x-request-id" && name != "sec-websocket-accept"
        }
        out.append(HTTPField(name: "x-request-id", value: requestID))
        return out
    }

    /// `websocket` of `websocket` or `WebSocket/13`, lowercased.
    static func protocolName(_ token: String) -> String {
        let name = token.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        return name.lowercased()
    }

    /// The elements of a comma-separated list, trimmed, empty ones dropped.
    static func tokens(_ value: String) -> [String] {
        value.split(separator: ",").map { String($0).trimmingSpaces }.filter { !$0.isEmpty }
    }
}

extension String {
    fileprivate var trimmingSpaces: String {
        var s = Substring(self)
        while let c = s.first, c == " " || c == "\t" { s.removeFirst() }
        while let c = s.last, c == " " || c == "\t" { s.removeLast() }
        return String(s)
    }
}
