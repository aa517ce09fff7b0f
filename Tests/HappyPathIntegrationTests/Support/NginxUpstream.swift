import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// nginx (the Debian package, /usr/sbin/nginx) as an HTTP/2 upstream, run
/// unprivileged from a folder of its own as deploy/bench does: h2c with
/// prior knowledge (`listen … http2`) on one port, TLS with ALPN (`listen …
/// ssl http2`) on another. Every location answers 200 with `X-Upstream:
/// nginx` and the trailer `X-Checksum: c0ffee`, without `Content-Length`
/// (`sub_filter` takes it off, so trailers reach libcurl). Its access log
/// says how each request came: `$server_protocol $connection
/// $connection_requests $request_uri $http_x_tenant`. `/bytes` answers
/// a file of `bytes` bytes (10 MiB by default) with its length.
final class NginxUpstream {
    static let binary = "/usr/sbin/nginx"
    let folder: URL
    let process = Process()
    let plainPort: Int
    let tlsPort: Int

    init(certificate: TestCertificates.Pair, bytes: Int = 10 << 20) throws {
        guard FileManager.default.isExecutableFile(atPath: Self.binary) else { throw TestError("no \(Self.binary)") }
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("hp-nginx-\(UUID())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        plainPort = Self.freePort()
        tlsPort = Self.freePort()
        let dir = folder.path
        FileManager.default.createFile(
            atPath: dir + "/bytes.bin", contents: Data((0..<bytes).map { UInt8(truncatingIfNeeded: $0 &* 7) }))
        let config = """
            master_process off; daemon off; pid \(dir)/nginx.pid; error_log \(dir)/error.log warn;
            events { worker_connections 4096; }
            http {
              log_format h2 '$server_protocol $connection $connection_requests $request_uri $http_x_tenant';
              access_log \(dir)/access.log h2;
              client_body_temp_path \(dir)/t1; proxy_temp_path \(dir)/t2; fastcgi_temp_path \(dir)/t3;
              uwsgi_temp_path \(dir)/t4; scgi_temp_path \(dir)/t5;
              server {
                listen 127.0.0.1:\(plainPort) http2;
                listen 127.0.0.1:\(tlsPort) ssl http2;
                ssl_certificate \(certificate.cert); ssl_certificate_key \(certificate.key);
                location /bytes { alias \(dir)/bytes.bin; default_type application/octet-stream; }
                location / {
                  default_type text/html;
                  add_header X-Upstream nginx;
                  add_trailer X-Checksum c0ffee;
                  sub_filter 'never-there' 'never-there'; sub_filter_once off;
                  return 200 "hello from nginx\\n";
                }
              }
            }
            """
        try config.write(toFile: dir + "/nginx.conf", atomically: true, encoding: .utf8)
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = ["-p", dir + "/", "-c", dir + "/nginx.conf", "-e", dir + "/error.log"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let ports = [plainPort, tlsPort]
        let up = waitUntil("nginx to listen") { ports.allSatisfy { (try? TestConnection(port: $0, timeout: 1)) != nil } }
        if !up {
            stop()
            let log = (try? String(contentsOfFile: dir + "/error.log", encoding: .utf8)) ?? ""
            throw TestError("nginx did not start: \(log)")
        }
    }

    /// A port nothing listens on now (bound, then let go, for nginx to take).
    static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { Glibc.close(fd) }
        return bindLoopback(fd)
    }

    func stop() {
        guard process.isRunning else { return }
        // SIGKILL: nginx inherits the test process's blocked signals (SIGTERM
        // among them), and in one-process mode never unblocks them.
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: folder)
    }

    /// The access log's lines so far, each split in its five fields.
    var accessLog: [[String]] {
        let text = (try? String(contentsOfFile: folder.path + "/access.log", encoding: .utf8)) ?? ""
        return text.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
    }

    /// The access log's lines for `uri`, once there are `count` of them.
    func logged(_ uri: String, count: Int = 1) -> [[String]] {
        waitUntil("\(count) line(s) for \(uri) in nginx's access log") {
            accessLog.filter { $0.count > 3 && $0[3] == uri }.count >= count
        }
        return accessLog.filter { $0.count > 3 && $0[3] == uri }
    }
}
