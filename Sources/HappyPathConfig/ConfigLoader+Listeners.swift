import Foundation
import HappyPathCore
import HappyPathPolicies
import Yams

/// `listen`: the addresses the proxy accepts clients on, plain or TLS.
extension Reader {
    func address(_ node: Node?, _ path: String) -> ListenAddress? {
        guard let s = text(node, path) else { return nil }
        guard let a = ListenAddress.parse(s) else {
            error(node, "\(path): '\(s)' is not HOST:PORT (e.g. 127.0.0.1:8080 or [::1]:8080)")
            return nil
        }
        return a
    }

    /// `listen`: `HOST:PORT`, or a list of listeners, each `HOST:PORT` or
    /// `{ address, tls }`.
    /// `http2:` (top level, or a listener's over `base`): false, true, or
    /// a map of settings (each key over `base`'s). Nil: off (or in error).
    func http2(_ node: Node, _ path: String, base: HTTP2Configuration) -> HTTP2Configuration? {
        if case .scalar = node { return bool(node, path) == true ? base : nil }
        let hf = fields(node, path, known: ["max_concurrent_streams", "initial_stream_window", "initial_connection_window"])
        var settings = base
        if let v = int(hf["max_concurrent_streams"]?.value, "\(path).max_concurrent_streams", min: 1, max: 1000) {
            settings.maxConcurrentStreams = v
        }
        for (key, keyPath) in [
            ("initial_stream_window", \HTTP2Configuration.initialStreamWindow),
            ("initial_connection_window", \HTTP2Configuration.initialConnectionWindow),
        ] {
            guard let n = hf[key]?.value, let v = size(n, "\(path).\(key)") else { continue }
            if v < 64 * 1024 || v > HTTP2Configuration.maxWindow {
                error(n, "\(path).\(key) must be between 64KiB and 2147483647 bytes (2^31-1), got \(v)")
            } else {
                settings[keyPath: keyPath] = v
            }
        }
        if settings.initialConnectionWindow < settings.initialStreamWindow {
            error(
                node,
                "\(path).initial_connection_window (\(settings.initialConnectionWindow)) must be at least initial_stream_window (\(settings.initialStreamWindow)): one stream could not use its window"
            )
        }
        return settings
    }

    func listeners(_ node: Node) -> [Listener]? {
        if case .scalar = node { return address(node, "listen").map { [Listener(address: $0)] } }
        guard let items = sequence(node, "listen") else { return nil }
        guard !items.isEmpty else {
            error(node, "listen must name at least one address (HOST:PORT)")
            return nil
        }
        var out: [Listener] = []
        for (i, item) in items.enumerated() {
            let path = "listen[\(i)]"
            // The same address twice could never bind (port 0, a port of
            // its own for each, aside).
            func listedTwice(_ a: ListenAddress, _ node: Node, _ what: String) -> Bool {
                guard a.port != 0, let earlier = out.first(where: { $0.address == a }) else { return false }
                error(node, "\(what): \(a) is listed twice (also as \(earlier.address))")
                return true
            }
            if case .scalar = item {
                if let a = address(item, path), !listedTwice(a, item, path) { out.append(Listener(address: a)) }
                continue
            }
            let lf = fields(item, path, known: ["address", "tls", "http2"])
            guard let addressNode = lf["address"]?.value else {
                error(item, "\(path) needs an address (HOST:PORT)")
                continue
            }
            guard let a = address(addressNode, "\(path).address") else { continue }
            var listener = Listener(address: a)
            if let tlsNode = lf["tls"]?.value { listener.tls = tlsSettings(tlsNode, "\(path).tls") }
            if let h2 = lf["http2"]?.value {
                listener.http2 = http2(h2, "\(path).http2", base: topHTTP2 ?? HTTP2Configuration()).map { .on($0) } ?? .off
            }
            if listedTwice(a, addressNode, "\(path).address") { continue }
            out.append(listener)
        }
        return out.isEmpty ? nil : out
    }

    func tlsSettings(_ node: Node, _ path: String) -> TLSListenerSettings? {
        let tf = fields(node, path, known: ["certificates", "min_version", "alpn"])
        var pairs: [CertificatePair] = []
        if let list = tf["certificates"]?.value, let items = sequence(list, "\(path).certificates") {
            for (i, item) in items.enumerated() {
                let p = "\(path).certificates[\(i)]"
                let cf = fields(item, p, known: ["cert", "key"])
                guard let cert = string(cf["cert"]?.value, "\(p).cert"), let key = string(cf["key"]?.value, "\(p).key") else {
                    if cf["cert"] == nil || cf["key"] == nil { error(item, "\(p) needs both cert and key (PEM files)") }
                    continue
                }
                pairs.append(CertificatePair(cert: cert, key: key))
            }
        }
        guard !pairs.isEmpty else {
            error(node, "\(path).certificates must list at least one { cert, key } pair")
            return nil
        }
        var settings = TLSListenerSettings(certificates: pairs)
        if let v = tf["min_version"]?.value {
            let text = self.text(v, "\(path).min_version")
            if let text, let version = TLSMinimumVersion(rawValue: text) {
                settings.minVersion = version
            } else if let text {
                error(v, "\(path).min_version must be \"1.2\" or \"1.3\", got '\(text)'")
            }
        }
        if let a = tf["alpn"]?.value, let protocols = strings(a, "\(path).alpn") {
            if let other = protocols.first(where: { $0 != "h2" && $0 != "http/1.1" }) {
                error(a, "\(path).alpn: '\(other)' is not a protocol the proxy speaks; write [h2, http/1.1], [http/1.1], or leave alpn out")
            } else if !protocols.contains("http/1.1") {
                error(a, "\(path).alpn must include http/1.1 (clients without HTTP/2 need it); [h2, http/1.1] offers both")
            } else {
                settings.alpn = protocols
            }
        }
        return settings
    }
}
