import ArgumentParser
import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathDemo
import HappyPathIO
import HappyPathServer
import HappyPathStore
import Logging

#if canImport(Glibc)
    import Glibc
#endif

let happypathVersion = ProxyServer.version

struct HappyPath: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "happypath",
        abstract: "A resilient HTTP reverse proxy: clients write only the happy path.",
        subcommands: [Serve.self, Check.self, DemoUpstreamCommand.self, Version.self]
    )
}

/// Exit codes (docs/contract.md, "Commands"): 0 after a clean shutdown,
/// and these.
enum Exit {
    /// An invalid config file, or invalid command-line arguments.
    static let invalidConfigOrArguments: Int32 = 1
    static let cannotBind: Int32 = 2
}

func loadConfiguration(_ path: String?) -> Configuration {
    let file = path ?? ConfigLoader.defaultPath()
    do {
        return try ConfigLoader.load(path: file)
    } catch {
        FileHandle.standardError.write(Data((error.description + "\n").utf8))
        FileHandle.standardError.write(
            Data("\(file): \(error.errors.count) problem(s); fix them and run 'happypath check --config \(file)'\n".utf8))
        Foundation.exit(Exit.invalidConfigOrArguments)
    }
}

/// Blocks the main thread on a loop that turns SIGINT/SIGTERM into `onStop`
/// and SIGHUP into `onHangUp`. `onReady` runs once the signals are caught,
/// so whatever it announces (the listening line) is safe to signal.
func waitForTermination(
    onReady: () -> Void, onStop: @escaping () -> Void, onHangUp: @escaping () -> Void
) -> Never {
    let loop = EventLoop()
    var watchers: [SignalWatcher] = []
    for signo in [SIGINT, SIGTERM] {
        watchers.append(
            SignalWatcher(loop: loop, signal: signo) {
                onStop()
                loop.stop()
            })
    }
    watchers.append(SignalWatcher(loop: loop, signal: SIGHUP, handler: onHangUp))
    onReady()
    loop.run()
    withExtendedLifetime(watchers) {}
    Foundation.exit(0)
}

struct Serve: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the proxy.")

    @Option(help: "Config file (default: config/happypath.yaml, else /etc/happypath/happypath.yaml).")
    var config: String?
    @Option(help: "Listen address HOST:PORT, overriding the config's 'listen'.")
    var listen: String?
    @Option(help: "Event-loop threads, overriding the config's 'workers'.")
    var workers: Int?
    @Option(help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: String = "info"
    @Option(help: "json (one JSON object per line) or text.")
    var logFormat: String = "json"

    func run() throws {
        guard let level = Logger.Level(rawValue: logLevel) else {
            throw ValidationError("--log-level must be one of: \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard let format = LogFormat(rawValue: logFormat) else { throw ValidationError("--log-format must be json or text") }
        if let workers, workers < 1 { throw ValidationError("--workers must be at least 1") }
        var configuration = loadConfiguration(config)
        if let listen {
            guard let address = ListenAddress.parse(listen) else {
                throw ValidationError("--listen '\(listen)' is not HOST:PORT")
            }
            configuration.listen = address
        }
        let logger = Logger.happypath(format: format, level: level)
        let server = ProxyServer(
            configuration: configuration, workers: workers, logger: logger,
            accessLog: AccessLogSettings(level: level, format: format))
        do {
            try server.start()
        } catch let error as TLSSetupError {
            logger.critical("cannot load a TLS certificate", metadata: ["error": "\(error)"])
            FileHandle.standardError.write(
                Data("happypath: \(error) (check the listener's tls.certificates; run 'happypath check')\n".utf8))
            Foundation.exit(Exit.invalidConfigOrArguments)
        } catch let error as StoreError {
            logger.critical("cannot open the delivery store", metadata: ["error": "\(error)"])
            FileHandle.standardError.write(
                Data(
                    "happypath: cannot open the delivery store: \(error) (check storage.path: its directory must exist and be writable; run 'happypath check')\n"
                        .utf8))
            Foundation.exit(Exit.invalidConfigOrArguments)
        } catch {
            logger.critical("cannot start", metadata: ["error": "\(error)"])
            FileHandle.standardError.write(Data("happypath: \(error)\n".utf8))
            Foundation.exit(Exit.cannotBind)
        }
        waitForTermination(
            onReady: {
                for (listener, port) in zip(configuration.listeners, server.ports) {
                    print("listening on \(listener.tls == nil ? "http" : "https")://\(listener.address.host):\(port)")
                }
                fflush(nil)
            },
            onStop: {
                // The configuration in force now, not the one at start: a
                // reload may have changed drain_timeout (same thread as SIGHUP).
                let timeout = server.runtime.configuration.drainTimeout
                logger.info("signal received: draining", metadata: ["drain_timeout": "\(timeout.configText)"])
                server.drain(timeout: timeout)
            },
            onHangUp: {
                // Validate the whole file; on any error keep serving the old configuration.
                let file = config ?? ConfigLoader.defaultPath()
                do {
                    var fresh = try ConfigLoader.load(path: file)
                    if let listen, let address = ListenAddress.parse(listen) { fresh.listen = address }
                    let refused = server.reload(fresh)
                    for reason in refused {
                        logger.error(
                            "configuration reload refused; the old one stays",
                            metadata: ["config": "\(file)", "problem": "\(reason)"])
                    }
                } catch let error as ConfigErrors {
                    for problem in error.errors {
                        logger.error("configuration reload refused; the old one stays", metadata: ["problem": "\(problem)"])
                    }
                    server.reloadRejected(source: file, problems: error.errors.map(\.description))
                } catch {
                    logger.error("configuration reload refused; the old one stays", metadata: ["problem": "\(error)"])
                }
            })
    }
}

struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate a config file; exit 0 if valid, 1 with every problem as FILE:LINE:COL: message.")

    @Option(help: "Config file (default: config/happypath.yaml, else /etc/happypath/happypath.yaml).")
    var config: String?

    @Flag(help: "Also connect to what the file names outside this machine: the PostgreSQL store (storage.url), Redis (cluster.redis.url).")
    var connect = false

    func run() throws {
        let file = config ?? ConfigLoader.defaultPath()
        let configuration = loadConfiguration(file)
        var storage = ConfigLoader.storageProblems(configuration).map(\.description)
        if let spool = ConfigLoader.spoolProblem(configuration) { storage.append("\(file): \(spool)") }
        if connect, let url = configuration.storage.url {
            let name = StorageConfiguration.redact(url)
            do {
                let (found, supported) = try PostgresDeliveryStore.probe(url: url)
                if found > supported {
                    storage.append("\(file): storage.url: \(name) holds delivery store schema version \(found), newer than this build's \(supported)")
                } else {
                    print("storage.url: connected to \(name) (schema version \(found == 0 ? "none yet: created at start" : String(found)))")
                }
            } catch {
                storage.append("\(file): storage.url: \(error.message) (\(name))")
            }
        }
        if connect, let cluster = configuration.cluster {
            if let problem = ClusterProbe.problem(cluster) {
                storage.append("\(file): cluster.redis.url: \(problem)")
            } else {
                print("cluster.redis.url: connected to \(cluster.redis) (the rate-limit script is loaded)")
            }
        }
        let (tlsProblems, certificateWarnings) = Self.certificateProblems(configuration)
        let warnings = certificateWarnings + ConfigLoader.upstreamWarnings(configuration)
        for warning in warnings { FileHandle.standardError.write(Data("\(file): warning: \(warning)\n".utf8)) }
        if !storage.isEmpty || !tlsProblems.isEmpty {
            for problem in storage { FileHandle.standardError.write(Data((problem + "\n").utf8)) }
            for problem in tlsProblems { FileHandle.standardError.write(Data("\(file): \(problem)\n".utf8)) }
            Foundation.exit(Exit.invalidConfigOrArguments)
        }
        print(
            "\(file): OK (\(configuration.upstreams.count) upstream(s), \(configuration.routes.count) route(s), listen \(configuration.listen))"
        )
        for line in ConfigLoader.healthCheckSummary(configuration) { print("  " + line) }
    }
}

extension Check {
    /// Every certificate and key the file names (TLS listeners' pairs, an
    /// upstream's client pair) and every upstream `tls.ca`: readable, a
    /// matching pair, not expired (problems); expiring within 14 days (warnings).
    static func certificateProblems(_ configuration: Configuration, now: Date = Date()) -> (
        problems: [String], warnings: [String]
    ) {
        var problems: [String] = []
        var warnings: [String] = []
        func check(_ pair: CertificatePair, _ place: String) {
            switch TLSServerContext.check(pair) {
            case let .failure(error):
                problems.append("\(place): \(error.description)")
            case let .success(notAfter):
                let left = Double(notAfter) - now.timeIntervalSince1970
                let date = Date(timeIntervalSince1970: Double(notAfter)).formatted(.iso8601)
                if left <= 0 {
                    problems.append("\(place): the certificate \(pair.cert) expired at \(date)")
                } else if left < 14 * 86400 {
                    warnings.append("\(place): the certificate \(pair.cert) expires at \(date), in \(Int(left / 86400)) day(s)")
                }
            }
        }
        for listener in configuration.listeners {
            for pair in listener.tls?.certificates ?? [] { check(pair, "listen \(listener.address)") }
        }
        for upstream in configuration.upstreams {
            guard let tls = upstream.tls else { continue }
            let place = "upstreams.\(upstream.name).tls"
            if let ca = tls.ca, !FileManager.default.isReadableFile(atPath: ca) {
                problems.append("\(place): cannot read the CA file \(ca)")
            }
            if let cert = tls.clientCert, let key = tls.clientKey { check(CertificatePair(cert: cert, key: key), place) }
        }
        return (problems, warnings)
    }
}

struct DemoUpstreamCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-upstream", abstract: "Run the built-in flaky demo service (for trying the proxy and load tests).")

    @Option(help: "Listen address HOST:PORT.")
    var listen: String = "127.0.0.1:9000"

    func run() throws {
        guard let address = ListenAddress.parse(listen) else { throw ValidationError("--listen '\(listen)' is not HOST:PORT") }
        let demo: DemoUpstream
        do {
            demo = try DemoUpstream(host: address.host, port: address.port)
        } catch {
            FileHandle.standardError.write(Data("happypath demo-upstream: \(error)\n".utf8))
            Foundation.exit(Exit.cannotBind)
        }
        demo.start()
        waitForTermination(
            onReady: {
                print("listening on http://\(address.host):\(demo.port)")
                for endpoint in DemoUpstream.endpoints { print("  \(endpoint.path)  \(endpoint.what)") }
                fflush(nil)
            }, onStop: { demo.stop() }, onHangUp: {})
    }
}

struct Version: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the version.")
    func run() throws { print("happypath \(happypathVersion)") }
}

// A parent may start us with signals blocked (the mask is inherited, and
// every thread inherits it from this one): unblock the ones we act on
// before any thread exists, or SIGTERM would never arrive.
var handled = sigset_t()
sigemptyset(&handled)
for signo in [SIGINT, SIGTERM, SIGHUP] { sigaddset(&handled, signo) }
pthread_sigmask(SIG_UNBLOCK, &handled, nil)

// Like `HappyPath.main()`, except that a command line it cannot use exits 1
// (docs/contract.md, "Commands") instead of ArgumentParser's 64.
do {
    var command = try HappyPath.parseAsRoot()
    try command.run()
} catch {
    // --help and --version-style requests arrive as errors that exit 0.
    if HappyPath.exitCode(for: error) == .success { HappyPath.exit(withError: error) }
    FileHandle.standardError.write(Data((HappyPath.fullMessage(for: error) + "\n").utf8))
    Foundation.exit(Exit.invalidConfigOrArguments)
}
