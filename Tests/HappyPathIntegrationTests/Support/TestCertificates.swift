import Foundation

/// Certificates made for a test with the `openssl` command, in a folder of
/// their own: each self-signed (it is its own CA for the client).
final class TestCertificates {
    let folder: URL

    init() throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("hp-tls-\(UUID())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: folder) }

    struct Pair {
        let cert: String
        let key: String
    }

    /// A fresh key and a certificate for `names` (DNS names; 127.0.0.1 too).
    /// `expired`: valid for one day in 2020.
    func make(
        _ label: String, names: [String], rsa: Bool = false, expired: Bool = false, days: Int = 30, ip: Bool = true
    ) throws -> Pair {
        let cert = folder.appendingPathComponent("\(label).crt").path
        let key = folder.appendingPathComponent("\(label).key").path
        let san = "subjectAltName=" + (names.map { "DNS:\($0)" } + (ip ? ["IP:127.0.0.1"] : [])).joined(separator: ",")
        let keyArgs = rsa ? ["-newkey", "rsa:2048"] : ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
        if !expired {
            try run(
                ["req", "-x509"] + keyArgs + [
                    "-nodes", "-keyout", key, "-out", cert, "-days", String(days), "-subj", "/CN=\(names[0])", "-addext", san,
                ])
            return Pair(cert: cert, key: key)
        }
        // `openssl req` cannot date a certificate in the past; `openssl ca` can.
        let ca = folder.appendingPathComponent("ca-\(label)")
        try FileManager.default.createDirectory(at: ca, withIntermediateDirectories: true)
        try "".write(to: ca.appendingPathComponent("index.txt"), atomically: true, encoding: .utf8)
        try "01\n".write(to: ca.appendingPathComponent("serial"), atomically: true, encoding: .utf8)
        let config = """
            [ca]
            default_ca = d
            [d]
            database = \(ca.path)/index.txt
            new_certs_dir = \(ca.path)
            serial = \(ca.path)/serial
            default_md = sha256
            policy = p
            copy_extensions = copy
            [p]
            commonName = supplied
            """
        let configFile = ca.appendingPathComponent("ca.cnf").path
        try config.write(toFile: configFile, atomically: true, encoding: .utf8)
        let csr = ca.appendingPathComponent("req.csr").path
        try run(["req", "-new"] + keyArgs + ["-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=\(names[0])", "-addext", san])
        try run([
            "ca", "-batch", "-config", configFile, "-selfsign", "-keyfile", key, "-in", csr, "-out", cert,
            "-startdate", "20200101000000Z", "-enddate", "20200102000000Z",
        ])
        return Pair(cert: cert, key: key)
    }

    private func run(_ arguments: [String]) throws {
        let result = try runProcess("/usr/bin/openssl", arguments)
        guard result.status == 0 else { throw TestError("openssl \(arguments.first ?? "") failed: \(result.err)") }
    }
}

/// Runs a program to its end (at most `timeout` seconds): its status and output.
func runProcess(
    _ path: String, _ arguments: [String], input: String? = nil, timeout: Double = 20
) throws -> (status: Int32, out: String, err: String) {
    let dir = FileManager.default.temporaryDirectory
    let outFile = dir.appendingPathComponent("run-out-\(UUID())")
    let errFile = dir.appendingPathComponent("run-err-\(UUID())")
    defer {
        try? FileManager.default.removeItem(at: outFile)
        try? FileManager.default.removeItem(at: errFile)
    }
    for file in [outFile, errFile] { _ = FileManager.default.createFile(atPath: file.path, contents: nil) }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    process.standardOutput = try FileHandle(forWritingTo: outFile)
    process.standardError = try FileHandle(forWritingTo: errFile)
    if input != nil { process.standardInput = Pipe() }
    try process.run()
    if let input, let pipe = process.standardInput as? Pipe {
        pipe.fileHandleForWriting.write(Data(input.utf8))
        try? pipe.fileHandleForWriting.close()
    }
    if !eventually(timeout, { !process.isRunning }) {
        process.terminate()
        throw TestError("\(path) \(arguments.joined(separator: " ")) did not end")
    }
    return (
        process.terminationStatus, (try? String(contentsOf: outFile, encoding: .utf8)) ?? "",
        (try? String(contentsOf: errFile, encoding: .utf8)) ?? ""
    )
}
