import Foundation
import HappyPathConfig
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// What a browser could be tricked into sending the admin listener is
/// refused (docs/operations.md, "What a browser cannot make the admin
/// listener do"): a `Host` that is not the listener's (DNS rebinding), and
/// a state-changing request with a foreign `Origin`, `Sec-Fetch-Site:
/// cross-site` or a form's content type (CSRF). Raw requests on real
/// sockets; what is checked is the bytes that come back.
@Suite("admin browser defenses") struct AdminBrowserTests {
    /// One raw request (its head is `head` plus `Connection: close`); the
    /// status, the body, read to the end of the connection, and the
    /// answer's fields as they came.
    func send(_ port: Int, _ head: String, body: String = "", to address: String = "127.0.0.1") throws -> (
        status: Int, body: String, fields: [(name: String, value: String)]
    ) {
        let c = try TestConnection(port: port, host: address)
        try c.send(
            head + "Connection: close\r\n" + (body.isEmpty ? "" : "Content-Length: \(body.utf8.count)\r\n") + "\r\n" + body)
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(c.fd, &chunk, chunk.count, 0)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        let text = String(decoding: bytes, as: UTF8.self)
        let status = Int(text.split(separator: " ").dropFirst().first ?? "") ?? 0
        let end = text.range(of: "\r\n\r\n")
        let body = end.map { String(text[$0.upperBound...]) } ?? ""
        return (status, body, Self.fields(end.map { String(text[..<$0.lowerBound]) } ?? text))
    }

    /// The fields of an answer's head (the status line dropped).
    static func fields(_ head: String) -> [(name: String, value: String)] {
        head.components(separatedBy: "\r\n").dropFirst().compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces))
        }
    }

    func json(_ body: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:]
    }

    func yaml(allowed: String) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0, allowed_hosts: [\(allowed)] }
        upstreams: { demo: { endpoints: [{{DEMO}}] } }
        routes: [ { match: { path_prefix: / }, upstream: demo } ]
        """
    }

    @Test func aForeignHostIsRefusedAndTheListenersOwnNamesAreServed() throws {
        let h = try ProxyHarness(yaml(allowed: "Admin.Example.com"))
        let port = h.adminPort

        // A DNS-rebinding page: the browser names the attacker's host.
        let rebound = try send(port, "GET /admin/state HTTP/1.1\r\nHost: evil.example:\(port)\r\n")
        #expect(rebound.status == 403)
        #expect(json(rebound.body)["code"] as? String == "FORBIDDEN")
        #expect((json(rebound.body)["detail"] as? String)?.contains("add evil.example to admin.allowed_hosts") == true)
        #expect(!rebound.body.contains("upstreams"), "no state leaks with the refusal")
        // Probes are not exempt: they reach the listener by its address.
        #expect(try send(port, "GET /metrics HTTP/1.1\r\nHost: evil.example\r\n").status == 403)
        #expect(try send(port, "GET /healthz HTTP/1.1\r\nHost: 10.9.9.9:\(port)\r\n").status == 403)

        // The listener's own names.
        for host in ["127.0.0.1:\(port)", "127.0.0.1", "localhost:\(port)", "LocalHost", "[::1]:\(port)", "admin.EXAMPLE.com"] {
            let r = try send(port, "GET /admin/state HTTP/1.1\r\nHost: \(host)\r\n")
            #expect(r.status == 200, "Host: \(host)")
            #expect(json(r.body)["upstreams"] != nil, "Host: \(host)")
        }
        // HTTP/1.0 without Host: no browser sends that.
        #expect(try send(port, "GET /healthz HTTP/1.0\r\n").status == 200)

        // admin.allowed_hosts follows a reload.
        var next = try ConfigLoader.parse(
            yaml(allowed: "evil.example").replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(h.demo.port)"),
            file: "test.yaml")
        next.listen = h.proxy.runtime.configuration.listen
        next.admin.listen = h.proxy.runtime.configuration.admin.listen
        #expect(h.proxy.reload(next).isEmpty)
        #expect(eventually { (try? send(port, "GET /healthz HTTP/1.1\r\nHost: evil.example\r\n").status) == 200 })
        #expect(try send(port, "GET /healthz HTTP/1.1\r\nHost: admin.example.com\r\n").status == 403)
    }

    /// A listener on 0.0.0.0 reached on another address (a pod IP, as a
    /// Kubernetes probe reaches it): that address is its own.
    @Test(.enabled(if: nonLoopbackIPv4() != nil, "needs an address other than loopback"))
    func aWildcardListenerAcceptsTheAddressItWasReachedOn() throws {
        let ip = nonLoopbackIPv4()!
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 0.0.0.0:0, allow_remote: true }
            upstreams: { demo: { endpoints: [{{DEMO}}] } }
            routes: [ { match: { path_prefix: / }, upstream: demo } ]
            """)
        let port = h.adminPort
        #expect(try send(port, "GET /readyz HTTP/1.1\r\nHost: \(ip):\(port)\r\n", to: ip).status == 200)
        #expect(try send(port, "GET /metrics HTTP/1.1\r\nHost: \(ip)\r\n", to: ip).status == 200)
        #expect(try send(port, "GET /readyz HTTP/1.1\r\nHost: evil.example:\(port)\r\n", to: ip).status == 403)
        // The same address named on a connection that arrived on loopback is not this connection's.
        #expect(try send(port, "GET /readyz HTTP/1.1\r\nHost: \(ip):\(port)\r\n").status == 403)
    }

    @Test func crossSitePostsAreRefusedAndAScriptsPostWorks() throws {
        let store = try DeliverLaterTests.StoreDirectory()
        let upstream = RefusingPort()
        let h = try ProxyHarness(DeliverLaterTests.yaml(upstream: upstream.url, store: store), holding: [upstream])
        let port = h.adminPort
        let purge = "POST /admin/deliveries/purge HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"

        let forged: [(String, String, String)] = [
            ("an Origin of another site", "Origin: https://evil.example\r\n", ""),
            ("Origin: null", "Origin: null\r\n", ""),
            ("Sec-Fetch-Site: cross-site", "Sec-Fetch-Site: cross-site\r\n", ""),
            ("a form", "Content-Type: application/x-www-form-urlencoded\r\n", "a=1"),
            ("a multipart form", "Content-Type: multipart/form-data; boundary=x\r\n", "--x--"),
            ("text/plain", "Content-Type: text/plain;charset=UTF-8\r\n", "{}"),
        ]
        for (what, header, body) in forged {
            let r = try send(port, purge + header, body: body)
            #expect(r.status == 403, "\(what)")
            #expect(json(r.body)["code"] as? String == "FORBIDDEN", "\(what)")
            #expect(!r.body.contains("purged"), "\(what)")
        }
        // Replay is guarded the same way (before the delivery is looked up).
        let replay = try send(
            port, "POST /admin/deliveries/dlv_x/replay HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nOrigin: https://evil.example\r\n")
        #expect(replay.status == 403)

        // A script or curl: no Origin, no body or JSON. And the listener's own origin.
        let plain = try send(port, purge)
        #expect(plain.status == 200 && json(plain.body)["purged"] as? Int == 0)
        let jsonBody = try send(port, purge + "Content-Type: application/json\r\n", body: "{}")
        #expect(jsonBody.status == 200)
        let sameOrigin = try send(port, purge + "Origin: http://127.0.0.1:\(port)\r\nSec-Fetch-Site: same-origin\r\n")
        #expect(sameOrigin.status == 200)
        // Reads are not refused for an Origin: the Host check is what guards them.
        #expect(try send(port, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n").status == 200)
    }

    // MARK: - Repeated fields and what every answer carries

    /// A field the rules read, sent twice, is refused before any rule
    /// reads it (400, naming the field): with the first value winning, an
    /// own `Origin` followed by a forged one would pass the CSRF rule, and
    /// a proxy in front that keeps the last would pass the forged one on.
    @Test func aRepeatedFieldTheRulesReadIsRefused() throws {
        let store = try DeliverLaterTests.StoreDirectory()
        let upstream = RefusingPort()
        let h = try ProxyHarness(DeliverLaterTests.yaml(upstream: upstream.url, store: store), holding: [upstream])
        let port = h.adminPort
        let purge = "POST /admin/deliveries/purge HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
        let own = "Origin: http://127.0.0.1:\(port)\r\n"
        let jsonType = "Content-Type: application/json\r\n"
        let sameSite = "Sec-Fetch-Site: same-origin\r\n"

        let repeated: [(String, String, String, String)] = [
            // (what, the fields, a body, the field named)
            ("Origin, the own one first", own + "Origin: https://evil.example\r\n", "", "Origin"),
            ("Origin, the own one twice", own + own, "", "Origin"),
            ("Content-Type, JSON first", jsonType + "Content-Type: text/plain\r\n", "{}", "Content-Type"),
            ("Content-Type, in two cases", jsonType + "content-type: application/json\r\n", "{}", "Content-Type"),
            ("Sec-Fetch-Site", sameSite + "Sec-Fetch-Site: cross-site\r\n", "", "Sec-Fetch-Site"),
            ("Sec-Fetch-Site, in two cases", sameSite + "sec-fetch-site: same-origin\r\n", "", "Sec-Fetch-Site"),
        ]
        for (what, fields, body, name) in repeated {
            let r = try send(port, purge + fields, body: body)
            #expect(r.status == 400, "\(what)")
            #expect(json(r.body)["code"] as? String == "BAD_REQUEST", "\(what)")
            let detail = json(r.body)["detail"] as? String ?? ""
            #expect(detail.contains("carries \(name) 2 times") && detail.contains("send \(name) once"), "\(what): \(detail)")
            #expect(!r.body.contains("purged"), "\(what)")
        }
        // On any admin request, reads included.
        let read = try send(
            port, "GET /admin/state HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nSec-Fetch-Site: none\r\nSec-Fetch-Site: none\r\n")
        #expect(read.status == 400 && !read.body.contains("upstreams"))
        // A repeated Host never reaches the admin server: the HTTP/1.1 edge refuses it (RFC 9112 section 3.2).
        let hosts = try send(port, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nHost: 127.0.0.1:\(port)\r\n")
        #expect(hosts.status == 400)
        #expect(json(hosts.body)["detail"] as? String == "The request carries more than one Host header.")
        // Each once: served.
        let once = try send(port, purge + own + sameSite + jsonType, body: "{}")
        #expect(once.status == 200 && json(once.body)["purged"] as? Int == 0)
    }

    /// Every admin answer, whatever built it (JSON, metrics, the page and
    /// its assets, the redirect, the event stream, the deliveries and
    /// upstream APIs, the problems of the access rules, the API and the
    /// HTTP/1.1 edge), carries `X-Content-Type-Options: nosniff` and
    /// `Cache-Control: no-store`, each once.
    @Test func everyAnswerCarriesNosniffAndNoStoreOnce() throws {
        let store = try DeliverLaterTests.StoreDirectory()
        let upstream = RefusingPort()
        let h = try ProxyHarness(DeliverLaterTests.yaml(upstream: upstream.url, store: store), holding: [upstream])
        let port = h.adminPort
        let host = "Host: 127.0.0.1:\(port)\r\n"
        let manyFields = (0..<100).map { "X-Field-\($0): v\r\n" }.joined()
        let table: [(String, Int)] = [
            // (the request's head, the status expected)
            ("GET /healthz HTTP/1.1\r\n" + host, 200),
            ("GET /readyz HTTP/1.1\r\n" + host, 200),
            ("GET /metrics HTTP/1.1\r\n" + host, 200),
            ("GET /admin/state HTTP/1.1\r\n" + host, 200),
            ("GET / HTTP/1.1\r\n" + host, 302),
            ("GET /status HTTP/1.1\r\n" + host, 200),
            ("HEAD /status HTTP/1.1\r\n" + host, 200),
            ("GET /status.js HTTP/1.1\r\n" + host, 200),
            ("GET /status.css HTTP/1.1\r\n" + host, 200),
            ("GET /admin/deliveries HTTP/1.1\r\n" + host, 200),
            ("GET /admin/deliveries/dlv_none HTTP/1.1\r\n" + host, 404),
            ("GET /admin/deliveries?limit=0 HTTP/1.1\r\n" + host, 400),
            ("POST /admin/deliveries/purge HTTP/1.1\r\n" + host, 200),
            ("POST /admin/deliveries/dlv_none/replay HTTP/1.1\r\n" + host, 404),
            ("POST /admin/upstreams/hooks/breaker/auto HTTP/1.1\r\n" + host, 200),
            ("POST /admin/upstreams/hooks/endpoints/0/drain HTTP/1.1\r\n" + host, 409),
            ("POST /admin/upstreams/nope/breaker/open HTTP/1.1\r\n" + host, 404),
            ("POST /admin/fallback/purge HTTP/1.1\r\n" + host, 404),
            ("GET /nope HTTP/1.1\r\n" + host, 404),
            ("POST /healthz HTTP/1.1\r\n" + host, 400),
            ("GET /admin/state HTTP/1.1\r\nHost: evil.example\r\n", 403),
            ("POST /admin/deliveries/purge HTTP/1.1\r\n" + host + "Origin: https://evil.example\r\n", 403),
            ("GET /healthz HTTP/1.1\r\n" + host + "Origin: a\r\nOrigin: b\r\n", 400),
            ("GET /healthz HTTP/1.1\r\n" + host + host, 400),  // refused at the HTTP/1.1 edge
            ("GET /healthz HTTP/1.1\r\n" + host + manyFields, 431),  // the edge too: 100 fields at most
            ("GET /healthz HTTP/1.0\r\n", 200),
        ]
        for (head, status) in table {
            let what = String(head.prefix { $0 != "\r" })
            let r = try send(port, head)
            #expect(r.status == status, "\(what)")
            Self.expectOnce(r.fields, what)
        }

        // The event stream: its head, then it stays open.
        let events = try TestConnection(port: port)
        try events.send("GET /admin/events HTTP/1.1\r\n" + host + "\r\n")
        var head = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !head.contains("\r\n\r\n") {
            let n = recv(events.fd, &chunk, chunk.count, 0)
            guard n > 0 else { break }
            head += String(decoding: chunk[0..<n], as: UTF8.self)
        }
        #expect(head.hasPrefix("HTTP/1.1 200"))
        #expect(head.contains("Content-Type: text/event-stream"))
        Self.expectOnce(Self.fields(head.components(separatedBy: "\r\n\r\n")[0]), "/admin/events")
    }

    static func expectOnce(
        _ fields: [(name: String, value: String)], _ what: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        func values(_ name: String) -> [String] { fields.filter { $0.name.lowercased() == name }.map(\.value) }
        #expect(values("x-content-type-options") == ["nosniff"], "\(what)", sourceLocation: sourceLocation)
        #expect(values("cache-control") == ["no-store"], "\(what)", sourceLocation: sourceLocation)
    }
}
