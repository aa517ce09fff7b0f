import Foundation
import HappyPathConfig
import HappyPathCore
import Synchronization
import Testing

@testable import HappyPathServer

/// Issue 33, step 10: `upstreams.NAME.protocol: h2`. The proxy speaks
/// HTTP/2 to a real HTTP/2-only upstream (Python `h2`, `H2Upstream`): h2c
/// with prior knowledge and TLS with ALPN; the upstream reports what it
/// saw (connection, stream, fields).
@Suite("upstream HTTP/2") struct UpstreamHTTP2Tests {
    /// A proxy with one worker (one libcurl multi: connection sharing is
    /// per worker) in front of `endpoint` with `protocol: h2`.
    static func proxy(
        _ endpoint: String, extra: String = "", defaults: String = "{ reachability: { park_for: 0s } }",
        limits: String = "{ client_timeout: 5s }"
    ) throws -> ProxyHarness {
        try ProxyHarness(yaml(endpoint, extra: extra, defaults: defaults, limits: limits), workers: 1)
    }

    static func yaml(
        _ endpoint: String, protocol: String = "h2", extra: String = "",
        defaults: String = "{ reachability: { park_for: 0s } }", limits: String = "{ client_timeout: 5s }"
    ) -> String {
        """
        listen: 127.0.0.1:0
        admin: { listen: 127.0.0.1:0 }
        limits: \(limits)
        defaults: \(defaults)
        upstreams:
          u:
            endpoints: [\(endpoint)]
            connect_timeout: 1s
            protocol: \(`protocol`)
            \(extra)
        routes:
          - match: { path_prefix: / }
            upstream: u
            timeout: 5s
        """
    }

    /// The upstream with a certificate of its own, and the `tls:` that trusts it.
    static func upstream() throws -> (H2Upstream, tls: String, TestCertificates) {
        let certificates = try TestCertificates()
        let pair = try certificates.make("h2-upstream", names: ["localhost"])
        return (try H2Upstream(certificate: pair), "tls: { ca: \(pair.cert) }", certificates)
    }

    /// The statuses of requests to `targets` sent at once, each on a
    /// connection of its own (0: no answer), sorted.
    static func statusesAtOnce(port: Int, _ targets: [String]) -> [Int] {
        let statuses = Locked<[Int]>([])
        DispatchQueue.concurrentPerform(iterations: targets.count) { i in
            let status = (try? HTTP.request(port: port, targets[i]).status) ?? 0
            statuses.withLock { $0.append(status) }
        }
        return statuses.withLock { $0 }.sorted()
    }

    func field(_ request: [String: Any], _ name: String) -> String? {
        (request["fields"] as? [[String]])?.first { $0.first == name }?.last
    }

    @Test func anH2cUpstreamGetsTheRequestAsHTTP2() throws {
        let (up, _, _) = try Self.upstream()
        let h = try Self.proxy("http://127.0.0.1:\(up.plainPort)")
        defer { h.stop() }
        let get = try HTTP.request(port: h.port, "/plain/get?q=1", headers: [("X-Tenant", "blue")])
        #expect(get.status == 200)
        #expect(get.header("X-Upstream") == "h2")
        #expect(get.header("Content-Type") == "application/json")
        #expect(get.json["path"] as? String == "/plain/get?q=1")
        let post = try HTTP.request(port: h.port, "POST", "/plain/post", body: Array(repeating: 0x61, count: 3000))
        #expect(post.status == 200)
        #expect(post.json["body_bytes"] as? Int == 3000)
        let seen = up.requests(to: "/plain/", atLeast: 2)
        try #require(seen.count == 2)
        #expect(seen.allSatisfy { $0["reached"] as? String == "h2c" })
        #expect(seen[0]["method"] as? String == "GET")
        #expect(field(seen[0], "x-tenant") == "blue")
        #expect(field(seen[0], ":authority") != nil)
        #expect(seen[1]["method"] as? String == "POST")
        // The proxy's own HTTP/2 client reuses the h2c connection.
        #expect(seen[0]["conn"] as? Int == seen[1]["conn"] as? Int)
    }

    @Test func aTLSUpstreamGetsTheRequestAsHTTP2ByALPN() throws {
        let (up, tls, certificates) = try Self.upstream()
        let h = try Self.proxy("https://127.0.0.1:\(up.tlsPort)", extra: tls)
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "/secure/a", headers: [("X-Tenant", "green")])
        #expect(r.status == 200, "\(r.text)")
        #expect(r.header("X-Upstream") == "h2")
        #expect(r.json["path"] as? String == "/secure/a")
        let seen = up.requests(to: "/secure/", atLeast: 1)
        try #require(seen.count == 1)
        #expect(seen[0]["reached"] as? String == "h2")
        #expect(field(seen[0], "x-tenant") == "green")
        #expect(field(seen[0], ":scheme") == "https")
        withExtendedLifetime(certificates) {}
    }

    /// Two tries in flight at once over TLS are two streams of one
    /// connection (PIPEWAIT: the second waits for the first one's
    /// connection instead of opening its own), then a later one reuses it.
    @Test func concurrentTriesShareOneTLSConnection() throws {
        let (up, tls, certificates) = try Self.upstream()
        let h = try Self.proxy("https://127.0.0.1:\(up.tlsPort)", extra: tls)
        defer { h.stop() }
        #expect(Self.statusesAtOnce(port: h.port, (0..<3).map { "/shared/\($0)?delay=400" }) == [200, 200, 200])
        #expect(try HTTP.request(port: h.port, "/shared/later").status == 200)
        let seen = up.requests(to: "/shared/", atLeast: 4)
        try #require(seen.count == 4)
        let connections = Set(seen.compactMap { $0["conn"] as? Int })
        #expect(connections.count == 1, "\(seen.map { ($0["conn"] ?? "-", $0["stream"] ?? "-") })")
        #expect(Set(seen.compactMap { $0["stream"] as? Int }).count == 4)
        withExtendedLifetime(certificates) {}
    }

    /// h2c tries at once are streams of one connection (the proxy's own
    /// HTTP/2 client; libcurl 7.88.1 had to open one per try). All succeed.
    @Test func concurrentH2cTriesShareOneConnection() throws {
        let (up, _, _) = try Self.upstream()
        let h = try Self.proxy("http://127.0.0.1:\(up.plainPort)")
        defer { h.stop() }
        #expect(Self.statusesAtOnce(port: h.port, (0..<3).map { "/own/\($0)?delay=300" }) == [200, 200, 200])
        let seen = up.requests(to: "/own/", atLeast: 3)
        #expect(seen.count == 3)
        #expect(Set(seen.compactMap { $0["conn"] as? Int }).count == 1)
    }

    /// An h2 upstream's trailers (after a body without content-length) go
    /// to an HTTP/1.1 client in the last chunk when it sent `TE: trailers`,
    /// and not otherwise; the body is the same either way.
    @Test(arguments: [false, true])
    func trailersFromAnH2UpstreamReachAClientThatAsksForThem(overTLS: Bool) throws {
        let (up, tls, certificates) = try Self.upstream()
        let h = try Self.proxy(
            overTLS ? "https://127.0.0.1:\(up.tlsPort)" : "http://127.0.0.1:\(up.plainPort)", extra: overTLS ? tls : "")
        defer { h.stop() }
        let asked = try HTTP.request(port: h.port, "/t/asked?trailers=1", headers: [("TE", "trailers")])
        #expect(asked.status == 200)
        #expect(asked.header("Transfer-Encoding") == "chunked")
        #expect(asked.json["path"] as? String == "/t/asked?trailers=1")
        #expect(asked.trailers.map { "\($0.name.lowercased())=\($0.value)" } == ["grpc-status=0", "x-checksum=c0ffee"])
        let unasked = try HTTP.request(port: h.port, "/t/unasked?trailers=1")
        #expect(unasked.status == 200)
        #expect(unasked.json["path"] as? String == "/t/unasked?trailers=1")
        #expect(unasked.trailers.isEmpty)
        #expect(up.requests(to: "/t/", atLeast: 2).count == 2)
        withExtendedLifetime(certificates) {}
    }

    /// One worker's pooled handles serve an h2 and an HTTP/1.1 upstream
    /// in turn: each try speaks its own upstream's protocol.
    @Test func pooledHandlesSwitchBetweenH2AndHTTP1Upstreams() throws {
        let (up, tls, certificates) = try Self.upstream()
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { reachability: { park_for: 0s } }
            upstreams:
              two: { endpoints: ["https://127.0.0.1:\(up.tlsPort)"], protocol: h2, \(tls) }
              plain: { endpoints: [{{DEMO}}] }
              clear: { endpoints: ["http://127.0.0.1:\(up.plainPort)"], protocol: h2 }
            routes:
              - { match: { path_prefix: /two/ }, upstream: two }
              - { match: { path_prefix: /clear/ }, upstream: clear }
              - { match: { path_prefix: / }, upstream: plain }
            """, workers: 1)
        defer { h.stop() }
        let before = h.demo.hits.load(ordering: .relaxed)
        for i in 0..<3 {
            #expect(try HTTP.request(port: h.port, "/two/\(i)").json["path"] as? String == "/two/\(i)")
            #expect(try HTTP.request(port: h.port, "/status/200").status == 200)
            #expect(try HTTP.request(port: h.port, "/clear/\(i)").json["path"] as? String == "/clear/\(i)")
            #expect(try HTTP.request(port: h.port, "/status/200").status == 200)
        }
        #expect(h.demo.hits.load(ordering: .relaxed) - before == 6)
        #expect(up.requests(to: "/two/", atLeast: 3).allSatisfy { $0["reached"] as? String == "h2" })
        #expect(up.requests(to: "/clear/", atLeast: 3).allSatisfy { $0["reached"] as? String == "h2c" })
        withExtendedLifetime(certificates) {}
    }

    /// A reload switches an upstream's protocol for the next tries, on the
    /// handles pooled under the old one.
    @Test func aReloadSwitchesTheProtocol() throws {
        let (up, _, _) = try Self.upstream()
        let endpoint = "http://127.0.0.1:\(up.plainPort)"
        let h = try ProxyHarness(Self.yaml(endpoint, protocol: "http1"), workers: 1)
        defer { h.stop() }
        // HTTP/1.1 to an upstream that speaks only HTTP/2: no answer.
        #expect(try HTTP.request(port: h.port, "/before").status >= 500)
        var next = try ConfigLoader.parse(Self.yaml(endpoint, protocol: "h2"), file: "test.yaml")
        next.listen = h.proxy.runtime.configuration.listen
        next.admin = h.proxy.runtime.configuration.admin
        #expect(h.proxy.reload(next).isEmpty)
        waitUntil("the worker to speak HTTP/2 to the upstream") {
            try HTTP.request(port: h.port, "/after").status == 200
        }
        #expect(up.requests(to: "/after", atLeast: 1).allSatisfy { $0["reached"] as? String == "h2c" })
        #expect(up.requests(to: "/before").isEmpty)
    }

    /// An h2 upstream's trailers reach an HTTP/2 client (nghttp over h2c)
    /// as the stream's last HEADERS, after the body.
    @Test func trailersFromAnH2UpstreamReachAnHTTP2Client() throws {
        let (up, tls, certificates) = try Self.upstream()
        let h = try Self.proxy("https://127.0.0.1:\(up.tlsPort)", extra: tls)
        defer { h.stop() }
        let n = try runProcess("/usr/bin/nghttp", ["-nv", "http://127.0.0.1:\(h.port)/h2t?trailers=1"], timeout: 20)
        #expect(n.status == 0, "\(n.err)")
        let lines = n.out.split(separator: "\n").map(String.init)
        let data = lines.firstIndex { $0.contains("recv DATA frame") }
        let checksum = lines.firstIndex { $0.contains("recv (stream_id=") && $0.hasSuffix(") x-checksum: c0ffee") }
        let status = lines.firstIndex { $0.contains("recv (stream_id=") && $0.hasSuffix(") grpc-status: 0") }
        #expect(data != nil && checksum != nil && status != nil, "\(n.out)")
        if let data, let checksum { #expect(checksum > data, "trailers after the body: \(n.out)") }
        withExtendedLifetime(certificates) {}
    }

    /// Retries and the breaker work over HTTP/2 as over HTTP/1.1: two 503s
    /// then a 200 is one answer of three tries; three 500s open the breaker,
    /// which then answers without a try.
    @Test func retriesAndTheBreakerWorkWithAnH2Upstream() throws {
        let (up, tls, certificates) = try Self.upstream()
        let h = try Self.proxy(
            "https://127.0.0.1:\(up.tlsPort)", extra: tls,
            defaults:
                "{ retry: { on: [503], attempts: 3, backoff: { base: 1ms, max: 1ms } }, circuit_breaker: { consecutive_failures: 3, while_open: fail, open_for: 30s }, reachability: { park_for: 0s } }"
        )
        defer { h.stop() }
        let retried = try HTTP.request(port: h.port, "/r/a?fail=2&key=a")
        #expect(retried.status == 200)
        #expect(retried.header("X-Happypath-Attempts") == "3")
        #expect(up.requests(to: "/r/a", atLeast: 3).count == 3)
        for i in 0..<3 { #expect(try HTTP.request(port: h.port, "/r/b\(i)?status=500").status >= 500) }
        #expect(up.requests(to: "/r/b", atLeast: 3).count == 3)
        let failedFast = try HTTP.request(port: h.port, "/r/d")
        #expect(failedFast.status == 503)
        #expect(failedFast.json["code"] as? String == "CIRCUIT_OPEN", "\(failedFast.text)")
        #expect(up.requests(to: "/r/d").isEmpty)
        withExtendedLifetime(certificates) {}
    }
}

/// Trailers from an HTTP/1.1 upstream's chunked body, relayed the same way.
@Suite("upstream trailers") struct UpstreamTrailerTests {
    static let chunked =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n"
        + "X-Sum: 5\r\nContent-Length: 99\r\nKeep-Alive: timeout=5\r\nX-Request-Id: forged\r\nGrpc-Message: fine\r\n\r\n"

    @Test func aChunkedUpstreamsTrailersPassWithoutHopByHopOrFramingFields() throws {
        let (h, _) = try ProxyHarness.scripted([Self.chunked])
        defer { h.stop() }
        let asked = try HTTP.request(port: h.port, "/a", headers: [("TE", "trailers")])
        #expect(asked.status == 200)
        #expect(asked.text == "hello")
        #expect(asked.trailers.map { "\($0.name)=\($0.value)" } == ["X-Sum=5", "Grpc-Message=fine"])
        let unasked = try HTTP.request(port: h.port, "/b", headers: [("TE", "gzip")])
        #expect(unasked.text == "hello")
        #expect(unasked.trailers.isEmpty)
    }

    /// An HTTP/1.0 client has no chunked coding: no trailers, whatever it sent.
    @Test func anHTTP10ClientGetsNoTrailers() throws {
        let (h, _) = try ProxyHarness.scripted([Self.chunked])
        defer { h.stop() }
        let c = try TestConnection(port: h.port)
        try c.send("GET /c HTTP/1.0\r\nHost: x\r\nTE: trailers\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.text == "hello")
        #expect(r.header("Transfer-Encoding") == nil)
    }

    /// Trailers beyond `limits.max_header_bytes` (name + value + 4 each) are dropped.
    @Test func trailersAreBoundedByMaxHeaderBytes() throws {
        let big = String(repeating: "v", count: 1000)
        let fields = (0..<10).map { "X-T\($0): \(big)\r\n" }.joined()
        let up = ScriptedUpstream(
            responses: ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nok\r\n0\r\n\(fields)\r\n"]
        ).started()
        defer { up.stop() }
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { max_header_bytes: 4KiB }
            upstreams: { u: { endpoints: ["http://127.0.0.1:\(up.port)"] } }
            routes: [ { match: { path_prefix: / }, upstream: u } ]
            """)
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "/big", headers: [("TE", "trailers")])
        #expect(r.text == "ok")
        // 1,008 bytes each: four fit in 4,096, the fifth does not, nor any after it.
        #expect(r.trailers.map(\.name) == ["X-T0", "X-T1", "X-T2", "X-T3"])
    }
}

/// `happypath check` on `protocol: h2`: valid, and a warning for the
/// transition's `h2_client` key (read and ignored), h2c or TLS alike.
@Suite struct UpstreamProtocolCheckTests {
    @Test(arguments: [("http://127.0.0.1:9", ", h2_client: libcurl", true), ("https://127.0.0.1:9", "", false)])
    func checkWarnsOfTheIgnoredH2ClientKey(endpoint: String, key: String, warns: Bool) throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        try """
        listen: 127.0.0.1:0
        upstreams: { u: { endpoints: ["\(endpoint)"], protocol: h2\(key) } }
        routes: [ { match: { path_prefix: / }, upstream: u } ]
        """.write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        let check = try runProcess(happypathBinary, ["check", "--config", file.path], timeout: 10)
        #expect(check.status == 0, "\(check.err)")
        #expect(check.out.contains("OK (1 upstream(s)"))
        #expect(check.err.contains("warning: upstreams.u.h2_client: libcurl is ignored") == warns, "\(check.err)")
        #expect(!check.err.contains("h2c"), "no h2c warning any more: \(check.err)")
    }
}

/// The same against nginx 1.22 (`NginxUpstream`): a server the proxy will
/// meet in production, h2c and TLS.
@Suite("upstream HTTP/2 to nginx") struct UpstreamHTTP2NginxTests {
    static func nginx() throws -> (NginxUpstream, tls: String, TestCertificates) {
        let certificates = try TestCertificates()
        let pair = try certificates.make("nginx-upstream", names: ["localhost"])
        return (try NginxUpstream(certificate: pair), "tls: { ca: \(pair.cert) }", certificates)
    }

    @Test(arguments: [false, true])
    func nginxSeesHTTP2AndItsTrailersReachTheClient(overTLS: Bool) throws {
        let (up, tls, certificates) = try Self.nginx()
        let endpoint = overTLS ? "https://127.0.0.1:\(up.tlsPort)" : "http://127.0.0.1:\(up.plainPort)"
        let h = try UpstreamHTTP2Tests.proxy(endpoint, extra: overTLS ? tls : "")
        defer { h.stop() }
        let r = try HTTP.request(port: h.port, "/n/1", headers: [("X-Tenant", "blue"), ("TE", "trailers")])
        #expect(r.status == 200)
        #expect(r.text == "hello from nginx\n")
        #expect(r.header("X-Upstream") == "nginx")
        #expect(r.trailers.map { "\($0.name.lowercased())=\($0.value)" } == ["x-checksum=c0ffee"])
        let second = try HTTP.request(port: h.port, "/n/2")
        #expect(second.text == "hello from nginx\n")
        #expect(second.trailers.isEmpty)
        let first = up.logged("/n/1")
        let next = up.logged("/n/2")
        try #require(first.count == 1 && next.count == 1)
        #expect(first[0][0] == "HTTP/2.0")
        #expect(first[0][4] == "blue")
        #expect(next[0][0] == "HTTP/2.0")
        // The second try is the second request of the first one's connection (h2c and TLS alike).
        #expect(next[0][1] == first[0][1])
        #expect(next[0][2] == "2")
        withExtendedLifetime(certificates) {}
    }
}
