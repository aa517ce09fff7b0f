import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathServer
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// TLS termination with real clients (curl, Python's `ssl`) and
/// certificates made by the test with `openssl` (docs/tls.md).
@Suite(.serialized) struct TLSTests {
    /// A TLS listener (first) and a plain one in front of the demo upstream.
    static func yaml(_ pairs: [TestCertificates.Pair], clientTimeout: String = "5s", extra: String = "") -> String {
        let certificates = pairs.map { "        - { cert: \($0.cert), key: \($0.key) }" }.joined(separator: "\n")
        return """
            listen:
              - address: 127.0.0.1:0
                tls:
                  certificates:
            \(certificates)
              - 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            limits: { client_timeout: \(clientTimeout) }
            upstreams:
              demo: { endpoints: [{{DEMO}}] }
            routes:
              - match: { path_prefix: / }
                upstream: demo
            \(extra)
            """
    }

    func curl(_ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
        try runProcess("/usr/bin/curl", ["-sS", "--max-time", "10"] + arguments)
    }

    /// Runs a Python 3 program; what it printed.
    func python(_ program: String, timeout: Double = 30) throws -> String {
        let r = try runProcess("/usr/bin/python3", ["-c", program], timeout: timeout)
        guard r.status == 0 else { throw TestError("python3 failed: \(r.err)") }
        return r.out
    }

    @Test func curlAndPythonSpeakHTTPSBesideAPlainListener() throws {
        let certs = try TestCertificates()
        let api = try certs.make("api", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml([api]))
        defer { h.stop() }
        let (tlsPort, plainPort) = (h.proxy.ports[0], h.proxy.ports[1])
        let viaCurl = try curl(["--cacert", api.cert, "https://localhost:\(tlsPort)/status/200", "-w", " %{http_code} %{scheme}"])
        #expect(viaCurl.status == 0, "\(viaCurl.err)")
        #expect(viaCurl.out.hasSuffix(" 200 HTTPS"))
        // Python's ssl: verified against the certificate, ALPN, two requests on one connection.
        let out = try python(
            """
            import socket, ssl
            ctx = ssl.create_default_context(cafile="\(api.cert)")
            ctx.set_alpn_protocols(["http/1.1"])
            with socket.create_connection(("127.0.0.1", \(tlsPort))) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                    s.sendall(b"GET /status/200 HTTP/1.1\\r\\nHost: a\\r\\n\\r\\nGET /status/201 HTTP/1.1\\r\\nHost: a\\r\\nConnection: close\\r\\n\\r\\n")
                    data = b""
                    while True:
                        chunk = s.recv(65536)
                        if not chunk: break
                        data += chunk
                    print(s.version(), s.selected_alpn_protocol(), data.count(b"HTTP/1.1 200 "), data.count(b"HTTP/1.1 201 "))
            """)
        #expect(out.trimmingCharacters(in: .whitespacesAndNewlines) == "TLSv1.3 http/1.1 1 1")
        // A second connection resumes the first one's session (a TLS 1.3 ticket).
        let resumed = try python(
            """
            import socket, ssl
            ctx = ssl.create_default_context(cafile="\(api.cert)")
            def get(session=None):
                with socket.create_connection(("127.0.0.1", \(tlsPort))) as raw:
                    with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
                        s.sendall(b"GET /status/200 HTTP/1.1\\r\\nHost: a\\r\\nConnection: close\\r\\n\\r\\n")
                        while s.recv(65536): pass
                        return s.session, s.session_reused
            first, _ = get()
            _, reused = get(first)
            print(reused)
            """)
        #expect(resumed.trimmingCharacters(in: .whitespacesAndNewlines) == "True")
        let plain = try curl(["http://127.0.0.1:\(plainPort)/status/200", "-o", "/dev/null", "-w", "%{http_code}"])
        #expect(plain.out == "200")
        let admin = AdminProbe(port: h.adminPort)
        #expect(eventually { (try? admin.metric("happypath_tls_handshakes_total{version=\"1.3\"}")) ?? 0 >= 2 })
    }

    @Test func sniPicksTheCertificateThatCoversTheName() throws {
        let certs = try TestCertificates()
        let first = try certs.make("first", names: ["first.test"])
        let second = try certs.make("second", names: ["second.test"], rsa: true)
        let h = try ProxyHarness(Self.yaml([first, second]))
        defer { h.stop() }
        let port = h.proxy.ports[0]
        func subject(_ name: String) throws -> String {
            try python(
                """
                import socket, ssl
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                with socket.create_connection(("127.0.0.1", \(port))) as raw:
                    with ctx.wrap_socket(raw, server_hostname="\(name)") as s:
                        der = s.getpeercert(binary_form=True)
                        import subprocess
                        pem = ssl.DER_cert_to_PEM_cert(der)
                        print(subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem.encode(), capture_output=True).stdout.decode().strip())
                """
            ).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(try subject("second.test").hasSuffix("CN = second.test"))
        #expect(try subject("first.test").hasSuffix("CN = first.test"))
        #expect(try subject("unknown.test").hasSuffix("CN = first.test"), "no match: the first is the default")
    }

    @Test func plainHTTPGarbageAndOldVersionsAreRefusedWithTheirReasons() throws {
        let certs = try TestCertificates()
        let api = try certs.make("api", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml([api], extra: ""))
        defer { h.stop() }
        let port = h.proxy.ports[0]
        let admin = AdminProbe(port: h.adminPort)
        func failures(_ reason: String) -> Double {
            (try? admin.metric("happypath_tls_handshake_failures_total{reason=\"\(reason)\"}")) ?? 0
        }
        // Plain HTTP on the TLS port: a plain 400 in the problem shape that says what to do.
        let client = try TestConnection(port: port, timeout: 5)
        try client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        let answer = try client.readResponse()
        let body = String(decoding: answer.body, as: UTF8.self)
        #expect(answer.status == 400)
        #expect(body.contains("\"code\":\"BAD_REQUEST\"") && body.contains("Send it to https://"))
        #expect(eventually { failures("http_request") == 1 })
        // Not TLS at all.
        let garbage = try TestConnection(port: port, timeout: 5)
        try garbage.send("\u{1}\u{2}garbage that is no ClientHello\r\n\r\n")
        #expect(garbage.closedByPeer())
        #expect(eventually { failures("version") == 1 })
        // TLS 1.1 is below the minimum.
        let old = try curl(["--tls-max", "1.1", "--cacert", api.cert, "https://localhost:\(port)/"])
        #expect(old.status != 0)
        #expect(eventually { failures("version") == 2 })
        // ALPN naming neither h2 nor http/1.1: no_application_protocol.
        let alpn = try python(
            """
            import socket, ssl
            ctx = ssl.create_default_context(cafile="\(api.cert)")
            ctx.set_alpn_protocols(["spdy/3"])
            try:
                with socket.create_connection(("127.0.0.1", \(port))) as raw:
                    with ctx.wrap_socket(raw, server_hostname="localhost") as s: print("accepted")
            except ssl.SSLError as e:
                print("refused", e.reason)
            """)
        #expect(alpn.hasPrefix("refused"), "\(alpn)")
        #expect(eventually { failures("alpn") == 1 })
    }

    @Test func aTrickledHelloAndAThousandHalfOpenHandshakesNeitherBlockOthersNorStay() throws {
        let certs = try TestCertificates()
        let api = try certs.make("api", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml([api], clientTimeout: "2s"), workers: 1)
        defer { h.stop() }
        let port = h.proxy.ports[0]
        let admin = AdminProbe(port: h.adminPort)
        // 1,000 connections that never say a word, and one that trickles the
        // first bytes of a ClientHello.
        var silent: [TestConnection] = []
        for _ in 0..<1000 { silent.append(try TestConnection(port: port, timeout: 10)) }
        let trickle = try TestConnection(port: port, timeout: 10)
        try trickle.send("\u{16}")
        try trickle.send("\u{3}")
        // Meanwhile another client is served at once, on the same single worker.
        let started = Date()
        let served = try curl(["--cacert", api.cert, "https://localhost:\(port)/status/200", "-o", "/dev/null", "-w", "%{http_code}"])
        #expect(served.out == "200")
        #expect(Date().timeIntervalSince(started) < 1.5, "served before the waiting handshakes timed out")
        // Each handshake waits client_timeout at most, then closes.
        #expect(
            eventually(15) {
                ((try? admin.metric("happypath_tls_handshake_failures_total{reason=\"timeout\"}")) ?? 0) >= 1001
            })
        #expect(trickle.closedByPeer(), "closed without an answer")
        #expect(eventually { ((try? admin.metric("happypath_client_connections")) ?? 1) == 0 })
        silent.removeAll()
    }

    /// OpenSSL makes room at once for all a ClientHello declares (up to
    /// 131,396 bytes): a ClientHello that declares more than 16 KiB is
    /// refused on its first bytes (`too_large`), not held until
    /// `client_timeout`; handshakes of a normal size go on as before.
    @Test(arguments: [131_396, 16 * 1024 + 1])
    func aClientHelloDeclaringMoreThan16KiBIsRefusedAtOnce(declared: Int) throws {
        let certs = try TestCertificates()
        let api = try certs.make("api", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml([api], clientTimeout: "30s"), workers: 1)
        defer { h.stop() }
        let port = h.proxy.ports[0]
        let admin = AdminProbe(port: h.adminPort)
        // A handshake record (TLS 1.0 record version, 16 KiB of fragment
        // announced), a ClientHello header declaring `declared` bytes, then
        // the start of its body; nothing more.
        let length = [UInt8(declared >> 16), UInt8((declared >> 8) & 0xFF), UInt8(declared & 0xFF)]
        let hello = try TestConnection(port: port, timeout: 10)
        let started = ContinuousClock.now
        try hello.send([0x16, 0x03, 0x01, 0x40, 0x00, 0x01] + length + [0x03, 0x03] + [UInt8](repeating: 7, count: 32))
        #expect(hello.closedByPeer(), "closed without an answer")
        #expect(seconds(since: started) < 5, "at once, not at client_timeout (30 s)")
        #expect(
            eventually { ((try? admin.metric("happypath_tls_handshake_failures_total{reason=\"too_large\"}")) ?? 0) == 1 })
        #expect(eventually { ((try? admin.metric("happypath_client_connections")) ?? 1) == 0 })
        // A real handshake, ClientHello and all, is served as before.
        let served = try curl(["--cacert", api.cert, "https://localhost:\(port)/status/200", "-o", "/dev/null", "-w", "%{http_code}"])
        #expect(served.out == "200", "\(served.err)")
    }

    @Test func aReloadServesNewCertificatesToNewConnectionsAndRefusesABrokenPairByName() throws {
        let certs = try TestCertificates()
        let old = try certs.make("old", names: ["localhost"])
        let new = try certs.make("new", names: ["localhost"])
        let stranger = try certs.make("stranger", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml([old]))
        defer { h.stop() }
        let port = h.proxy.ports[0]
        // A connection opened before the reload keeps its session.
        let keep = try TLSClient(port: port, caFile: old.cert)
        #expect(try keep.get("/status/200") == 200)
        var next = try ConfigLoader.parse(
            Self.yaml([new]).replacingOccurrences(of: "{{DEMO}}", with: "http://127.0.0.1:\(h.demo.port)"), file: "next.yaml")
        next.listeners[0].address = h.proxy.runtime.configuration.listeners[0].address
        next.listeners[1].address = h.proxy.runtime.configuration.listeners[1].address
        next.admin = h.proxy.runtime.configuration.admin
        #expect(h.proxy.reload(next) == [])
        #expect(try curl(["--cacert", new.cert, "https://localhost:\(port)/status/200", "-o", "/dev/null"]).status == 0)
        #expect(try curl(["--cacert", old.cert, "https://localhost:\(port)/status/200", "-o", "/dev/null"]).status != 0)
        #expect(try keep.get("/status/201") == 201, "the open connection is untouched")
        // A key that does not belong to its certificate: refused by name; the new pair stays.
        var broken = next
        broken.listeners[0].tls?.certificates = [CertificatePair(cert: new.cert, key: stranger.key)]
        let problems = h.proxy.reload(broken)
        #expect(problems.count == 1)
        #expect(problems.first?.contains(stranger.key) == true && problems.first?.contains("does not belong") == true)
        #expect(try curl(["--cacert", new.cert, "https://localhost:\(port)/status/200", "-o", "/dev/null"]).status == 0)
        keep.close()
    }

    /// Upstreams over TLS: a second proxy with a TLS listener (a certificate
    /// for api.test only, no IP) stands for an HTTPS service.
    @Test func upstreamsAreVerifiedAndAFailedVerificationIsNotRetried() throws {
        let certs = try TestCertificates()
        let service = try certs.make("service", names: ["api.test"], ip: false)
        let other = try certs.make("other", names: ["api.test"], ip: false)
        let backend = try ProxyHarness(Self.yaml([service]))
        defer { backend.stop() }
        let origin = "https://127.0.0.1:\(backend.proxy.ports[0])"
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { reachability: { park_for: 0s } }
            upstreams:
              named: { endpoints: [\(origin)], tls: { ca: \(service.cert), server_name: api.test } }
              unnamed: { endpoints: [\(origin)], tls: { ca: \(service.cert) } }
              stranger: { endpoints: [\(origin)], tls: { ca: \(other.cert), server_name: api.test } }
              unchecked: { endpoints: [\(origin)], tls: { verify: false } }
            routes:
              - { match: { path_prefix: /named/ }, upstream: named, strip_prefix: /named }
              - { match: { path_prefix: /unnamed/ }, upstream: unnamed, strip_prefix: /unnamed }
              - { match: { path_prefix: /stranger/ }, upstream: stranger, strip_prefix: /stranger }
              - { match: { path_prefix: /unchecked/ }, upstream: unchecked, strip_prefix: /unchecked }
            """)
        defer { h.stop() }
        let before = backend.demo.hits.load(ordering: .relaxed)
        // Twice each, so pooled handles move between upstreams' settings.
        for _ in 0..<2 {
            #expect(try HTTP.request(port: h.port, "/named/status/200").status == 200)
            #expect(try HTTP.request(port: h.port, "/unchecked/status/200").status == 200)
            for path in ["/unnamed/status/200", "/stranger/status/200"] {
                let r = try HTTP.request(port: h.port, path)
                let body = String(decoding: r.body, as: UTF8.self)
                #expect(r.status == 502, "\(path): \(body)")
                #expect(body.contains("\"code\":\"UPSTREAM_TLS\""), "\(path): \(body)")
                #expect(body.contains("\"retryable\":false"))
                #expect(body.contains("\"attempts\":1"), "not retried: \(body)")
            }
        }
        #expect(backend.demo.hits.load(ordering: .relaxed) - before == 4, "only the verified (and unchecked) requests arrived")
    }

    /// An upstream that asks for a client certificate (Python's ssl server,
    /// trusting only the proxy's client certificate) gets it, and refuses a
    /// proxy without one.
    @Test func aClientCertificateIsPresentedToAnUpstreamThatAsksForOne() throws {
        let certs = try TestCertificates()
        let server = try certs.make("server", names: ["localhost"])
        let client = try certs.make("client", names: ["happypath.client"])
        let script = """
            import http.server, ssl, threading
            class H(http.server.BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"
                def do_GET(self):
                    cn = dict(x[0] for x in self.connection.getpeercert()["subject"])["commonName"]
                    body = ("client " + cn).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                def log_message(self, *a): pass
            httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain("\(server.cert)", "\(server.key)")
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations("\(client.cert)")
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
            print(httpd.server_address[1], flush=True)
            httpd.serve_forever()
            """
        let process = Process()
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-u", "-c", script]
        process.standardOutput = output
        try process.run()
        defer {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = output.fileHandleForReading.availableData
            guard !chunk.isEmpty else { break }
            line.append(chunk)
        }
        let port = try #require(Int(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))
        let h = try ProxyHarness(
            """
            listen: 127.0.0.1:0
            admin: { listen: 127.0.0.1:0 }
            defaults: { reachability: { park_for: 0s } }
            upstreams:
              with: { endpoints: [https://localhost:\(port)], tls: { ca: \(server.cert), client_cert: \(client.cert), client_key: \(client.key) } }
              without: { endpoints: [https://localhost:\(port)], tls: { ca: \(server.cert) } }
            routes:
              - { match: { path_prefix: /with/ }, upstream: with, strip_prefix: /with }
              - { match: { path_prefix: /without/ }, upstream: without, strip_prefix: /without }
            """)
        defer { h.stop() }
        let with = try HTTP.request(port: h.port, "/with/x")
        #expect(with.status == 200)
        #expect(String(decoding: with.body, as: UTF8.self) == "client happypath.client")
        let without = try HTTP.request(port: h.port, "/without/x")
        #expect(without.status == 502 || without.status == 503, "\(String(decoding: without.body, as: UTF8.self))")
    }

    @Test func requestsOverTLSGoUpstreamAsHTTPS() throws {
        let certs = try TestCertificates()
        let api = try certs.make("api", names: ["localhost"])
        let h = try ProxyHarness(Self.yaml([api]))
        defer { h.stop() }
        func forwardedProto(_ url: String) throws -> String? {
            let r = try curl(["--cacert", api.cert, url])
            let json = try JSONSerialization.jsonObject(with: Data(r.out.utf8)) as? [String: Any]
            let pairs = (json?["headers"] as? [[String]] ?? []).map { ($0[0].lowercased(), $0[1]) }
            return pairs.first { $0.0 == "x-forwarded-proto" }?.1
        }
        #expect(try forwardedProto("https://localhost:\(h.proxy.ports[0])/echo") == "https")
        #expect(try forwardedProto("http://127.0.0.1:\(h.proxy.ports[1])/echo") == "http")
    }

    @Test func aListenerWithAMissingCertificateDoesNotStart() throws {
        let yaml = Self.yaml([TestCertificates.Pair(cert: "/nonexistent/a.crt", key: "/nonexistent/a.key")])
        #expect(throws: (any Error).self) { _ = try ProxyHarness(yaml) }
    }
}

/// A keep-alive TLS connection driven by a Python child: each `get` sends
/// one request on the same session and reads its status.
final class TLSClient {
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()

    init(port: Int, caFile: String) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [
            "-u", "-c",
            """
            import socket, ssl, sys
            ctx = ssl.create_default_context(cafile="\(caFile)")
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", \(port))), server_hostname="localhost")
            f = s.makefile("rb")
            for line in sys.stdin:
                s.sendall(b"GET " + line.strip().encode() + b" HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n")
                status = f.readline().split()[1].decode()
                length = 0
                while True:
                    h = f.readline()
                    if h in (b"\\r\\n", b""): break
                    if h.lower().startswith(b"content-length:"): length = int(h.split(b":")[1])
                f.read(length)
                print(status, flush=True)
            """,
        ]
        process.standardInput = input
        process.standardOutput = output
        try process.run()
    }

    func get(_ path: String) throws -> Int {
        input.fileHandleForWriting.write(Data((path + "\n").utf8))
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = output.fileHandleForReading.availableData
            guard !chunk.isEmpty else { throw TestError("the TLS client ended") }
            line.append(chunk)
        }
        return Int(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    }

    func close() {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}
