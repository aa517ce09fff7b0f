import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The exit codes of docs/contract.md ("Commands"), on the real binary:
/// 0 success, 1 an invalid config or invalid arguments, 2 a port that
/// cannot be bound.
@Suite struct CommandLineTests {
    /// Runs `happypath ARGS` to its end; its exit status and what it printed.
    func run(_ arguments: [String], timeout: Double = 10) throws -> (status: Int32, out: String, err: String) {
        try runProcess(happypathBinary, arguments, timeout: timeout)
    }

    func config(_ text: String) throws -> String {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("hp-\(UUID()).yaml")
        try text.write(to: file, atomically: true, encoding: .utf8)
        return file.path
    }

    static let valid = """
        listen: 127.0.0.1:0
        upstreams: { u: { endpoints: [http://127.0.0.1:9] } }
        routes: [ { match: { path_prefix: / }, upstream: u } ]
        """

    @Test func versionAndAValidCheckExitZero() throws {
        let version = try run(["version"])
        #expect(version.status == 0)
        #expect(version.out.hasPrefix("happypath "))
        let check = try run(["check", "--config", try config(Self.valid)])
        #expect(check.status == 0)
        #expect(check.out.contains("OK (1 upstream(s), 1 route(s)"))
    }

    @Test func checkReadsEveryCertificateAndWarnsBeforeItExpires() throws {
        let certs = try TestCertificates()
        let good = try certs.make("good", names: ["localhost"])
        let soon = try certs.make("soon", names: ["localhost"], days: 7)
        let expired = try certs.make("expired", names: ["localhost"], expired: true)
        let stranger = try certs.make("stranger", names: ["localhost"])
        func config(_ pairs: [(String, String)]) throws -> String {
            let list = pairs.map { "        - { cert: \($0.0), key: \($0.1) }" }.joined(separator: "\n")
            return try self.config(
                """
                listen:
                  - address: 127.0.0.1:0
                    tls:
                      certificates:
                \(list)
                upstreams: { u: { endpoints: [http://127.0.0.1:9] } }
                routes: [ { match: { path_prefix: / }, upstream: u } ]
                """)
        }
        let fine = try run(["check", "--config", try config([(good.cert, good.key), (soon.cert, soon.key)])])
        #expect(fine.status == 0, "\(fine.err)")
        #expect(fine.err.contains("warning: listen 127.0.0.1:0: the certificate \(soon.cert) expires at"))
        #expect(!fine.err.contains(good.cert))
        let bad = try run([
            "check", "--config",
            try config([(expired.cert, expired.key), (good.cert, stranger.key), ("/nonexistent/x.crt", good.key)]),
        ])
        #expect(bad.status == 1)
        #expect(bad.err.contains("the certificate \(expired.cert) expired at 2020-01-02"))
        #expect(bad.err.contains("the private key \(stranger.key) does not belong to the certificate \(good.cert)"))
        #expect(bad.err.contains("cannot read the certificate /nonexistent/x.crt"))
        // An upstream's CA file and client pair are read too.
        let upstreams = try run([
            "check", "--config",
            try self.config(
                """
                listen: 127.0.0.1:0
                upstreams:
                  u: { endpoints: [https://127.0.0.1:9], tls: { ca: /nonexistent/ca.pem, client_cert: \(good.cert), client_key: \(stranger.key) } }
                routes: [ { match: { path_prefix: / }, upstream: u } ]
                """),
        ])
        #expect(upstreams.status == 1)
        #expect(upstreams.err.contains("upstreams.u.tls: cannot read the CA file /nonexistent/ca.pem"))
        #expect(upstreams.err.contains("upstreams.u.tls: the private key \(stranger.key) does not belong"))
    }

    @Test func anInvalidConfigExitsOneWithEveryProblemPositioned() throws {
        let path = try config(Self.valid + "\nbogus: 1\nworkers: many\n")
        for command in ["check", "serve"] {
            let r = try run([command, "--config", path])
            #expect(r.status == 1, "\(command)")
            #expect(r.err.contains("\(path):4:1: unknown key 'bogus'"), "\(command)")
            #expect(r.err.contains("\(path):5:10: workers must be a whole number"), "\(command)")
        }
    }

    @Test(arguments: [
        ["serve", "--workers", "0"], ["serve", "--no-such-option"], ["serve", "--log-level", "loud"],
        ["no-such-command"], ["demo-upstream", "--listen", "nowhere"],
    ])
    func invalidArgumentsExitOne(arguments: [String]) throws {
        let r = try run(arguments)
        #expect(r.status == 1)
        #expect(r.err.contains("Error:"))
    }

    @Test func aPortInUseExitsTwo() throws {
        let busy = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(busy) }
        let port = bindLoopback(busy)
        #expect(listen(busy, 1) == 0)
        let serve = try run(["serve", "--config", try config(Self.valid), "--listen", "127.0.0.1:\(port)"])
        #expect(serve.status == 2)
        let demo = try run(["demo-upstream", "--listen", "127.0.0.1:\(port)"])
        #expect(demo.status == 2)
    }
}
