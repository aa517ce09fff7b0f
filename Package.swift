// swift-tools-version:6.0
import PackageDescription

// The proxy's own targets, in release builds: no runtime exclusivity checks
// (swift_beginAccess/swift_endAccess on every class-property access, with
// the thread-local access set they keep: about 15,000 instructions a request
// over HTTP/1.1, 22,000 towards an h2c upstream, 11 % and 21 %; issue 47,
// docs/performance.md). Debug builds, which the tests run, keep them, so a
// violation still fails a test; the compile-time checks apply to both.
let hotPath: [SwiftSetting] = [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]

let package = Package(
    name: "happypath",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "happypath", targets: ["happypath"])
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "5.0.1"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.0.0"),
        // Test-only: llhttp (inside NIOHTTP1) is the reference parser the HTTP/1.1
        // oracle and the differential fuzzer compare ours with. No target that
        // `happypath` links depends on it.
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
    ],
    targets: [
        // MARK: - C: the only place libevent, libcurl and libnghttp2 are declared
        .systemLibrary(
            name: "CLibevent",
            pkgConfig: "libevent",
            providers: [.apt(["libevent-dev"])]
        ),
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        // libnghttp2: HTTP/2 framing, HPACK and flow control (docs/plans/http2.md).
        .systemLibrary(
            name: "CNghttp2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        .target(name: "CShims", dependencies: ["CLibevent", "CCurl"], linkerSettings: [.linkedLibrary("ssl")]),
        // hiredis (libhiredis-dev) as the Redis protocol only, its reader bounded:
        // the cluster link (`cluster.redis`) does its own socket I/O.
        .target(name: "CRedis", linkerSettings: [.linkedLibrary("hiredis")]),
        // OpenSSL (libssl-dev) behind opaque pointers: TLS termination.
        .target(name: "CTLS", linkerSettings: [.linkedLibrary("ssl"), .linkedLibrary("crypto")]),
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CPostgres",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),

        // MARK: - Pure Swift
        .target(name: "HappyPathCore", swiftSettings: hotPath),
        .target(
            name: "HappyPathConfig",
            dependencies: ["HappyPathCore", "HappyPathPolicies", .product(name: "Yams", package: "Yams")],
            swiftSettings: hotPath
        ),

        .target(name: "HappyPathPolicies", dependencies: ["HappyPathCore"], swiftSettings: hotPath),

        // The admin listener's pure side: the status page, the /admin/state
        // snapshot and its JSON, the admin API's actions and its access
        // policy. Read by the server's AdminServer, which does the I/O.
        .target(name: "HappyPathAdmin", dependencies: ["HappyPathCore", "HappyPathPolicies"], swiftSettings: hotPath),

        // MARK: - I/O: the only Swift code that imports C
        .target(
            name: "HappyPathIO", dependencies: ["HappyPathCore", "CLibevent", "CCurl", "CNghttp2", "CShims", "CTLS", "CRedis"],
            swiftSettings: hotPath),

        // The deliver-later store: SQLite (WAL, group commit on a writer
        // thread). With HappyPathIO, the only Swift code that imports C.
        .target(name: "HappyPathStore", dependencies: ["HappyPathCore", "CSQLite", "CPostgres"], swiftSettings: hotPath),

        // MARK: - Composition and executable
        .target(
            name: "HappyPathServer",
            dependencies: [
                "HappyPathCore", "HappyPathConfig", "HappyPathIO", "HappyPathPolicies", "HappyPathAdmin", "HappyPathStore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: hotPath
        ),
        // `happypath demo-upstream`: the flaky service to try the proxy on.
        // Not part of the proxy; the executable and the integration tests use it.
        .target(name: "HappyPathDemo", dependencies: ["HappyPathCore", "HappyPathIO"], swiftSettings: hotPath),
        .executableTarget(
            name: "happypath",
            dependencies: [
                "HappyPathServer", "HappyPathConfig", "HappyPathDemo", "HappyPathStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: hotPath
        ),

        // MARK: - Fuzzing and the llhttp oracle (never linked into happypath)
        // Frames a whole byte stream with the HTTP/1.1 parser, checking its invariants.
        .target(name: "HTTP1Framing", dependencies: ["HappyPathCore"], path: "Tests/Support/HTTP1Framing"),
        // The same byte stream through llhttp, and the rules for comparing the two.
        .target(
            name: "HTTP1Oracle",
            dependencies: [
                "HTTP1Framing", "HappyPathCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Tests/Support/HTTP1Oracle"
        ),
        // Each fuzz target's check, in a library of its own: the fuzz executable
        // and HappyPathFuzzSeedTests (every seed through it, in `swift test`) link it.
        .target(
            name: "FuzzRequestParserHarness", dependencies: ["HTTP1Framing"],
            path: "Tests/Support/FuzzHarnesses/FuzzRequestParserHarness"),
        .target(
            name: "FuzzResponseHeadHarness", dependencies: ["HappyPathCore", "HappyPathPolicies"],
            path: "Tests/Support/FuzzHarnesses/FuzzResponseHeadHarness"),
        .target(
            name: "FuzzDifferentialHarness", dependencies: ["HTTP1Oracle"],
            path: "Tests/Support/FuzzHarnesses/FuzzDifferentialHarness"),
        .target(
            name: "FuzzConfigHarness", dependencies: ["HappyPathConfig"],
            path: "Tests/Support/FuzzHarnesses/FuzzConfigHarness"),
        .target(
            name: "FuzzOutsideValuesHarness", dependencies: ["HappyPathCore", "HappyPathPolicies"],
            path: "Tests/Support/FuzzHarnesses/FuzzOutsideValuesHarness"),
        // The client connection's state machine driven without sockets, its invariants checked.
        .target(
            name: "FuzzConnectionHarness", dependencies: ["HappyPathCore"],
            path: "Tests/Support/FuzzHarnesses/FuzzConnectionHarness"),
        // HTTP2Session fed the client preface and random frames, its invariants checked.
        .target(
            name: "FuzzHTTP2Harness", dependencies: ["HappyPathIO", "HappyPathCore"],
            path: "Tests/Support/FuzzHarnesses/FuzzHTTP2Harness"),
        // A Redis server's random bytes through the cluster link's bounded reply reader.
        .target(
            name: "FuzzRedisReplyHarness", dependencies: ["HappyPathIO", "HappyPathCore"],
            path: "Tests/Support/FuzzHarnesses/FuzzRedisReplyHarness"),
        // The proxy's own HTTP/2 client session fed an upstream's random frames, its handlers' contract checked.
        .target(
            name: "FuzzHTTP2ClientHarness", dependencies: ["HappyPathIO", "HappyPathCore"],
            path: "Tests/Support/FuzzHarnesses/FuzzHTTP2ClientHarness"),
        // `make fuzz` builds these with -sanitize=fuzzer -DFUZZING; a plain build
        // gives a driver that replays the input files named on its command line.
        // libFuzzer's driver and the replay driver, shared by the fuzz targets.
        .target(name: "FuzzSupport", path: "Tests/Support/FuzzSupport"),
        .executableTarget(name: "FuzzRequestParser", dependencies: ["FuzzSupport", "FuzzRequestParserHarness"]),
        .executableTarget(name: "FuzzResponseHead", dependencies: ["FuzzSupport", "FuzzResponseHeadHarness"]),
        .executableTarget(name: "FuzzConfig", dependencies: ["FuzzSupport", "FuzzConfigHarness"]),
        .executableTarget(name: "FuzzDifferential", dependencies: ["FuzzSupport", "FuzzDifferentialHarness"]),
        .executableTarget(name: "FuzzConnection", dependencies: ["FuzzSupport", "FuzzConnectionHarness"]),
        .executableTarget(name: "FuzzOutsideValues", dependencies: ["FuzzSupport", "FuzzOutsideValuesHarness"]),
        .executableTarget(name: "FuzzHTTP2", dependencies: ["FuzzSupport", "FuzzHTTP2Harness"]),
        .executableTarget(name: "FuzzHTTP2Client", dependencies: ["FuzzSupport", "FuzzHTTP2ClientHarness"]),
        .executableTarget(name: "FuzzRedisReply", dependencies: ["FuzzSupport", "FuzzRedisReplyHarness"]),

        // Starts and stops the proxy many times in a process of its own
        // (LifecycleTests runs it): nothing may be left behind.
        .target(name: "CHeapProbe", path: "Tests/Support/CHeapProbe"),
        .target(name: "SmallDisk", path: "Tests/Support/SmallDisk"),
        // A PostgreSQL server of a test's own (initdb in /tmp, a free port), for the shared store's tests.
        .target(name: "PostgresTestServer", path: "Tests/Support/PostgresTestServer"),
        // A redis-server of a test's own (a free port, no persistence), for the cluster link's tests.
        .target(name: "RedisTestServer", dependencies: ["PostgresTestServer"], path: "Tests/Support/RedisTestServer"),
        .executableTarget(
            name: "LifecycleProbe",
            dependencies: [
                "CHeapProbe", "HappyPathServer", "HappyPathConfig", "HappyPathDemo",
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/Support/LifecycleProbe"
        ),

        // MARK: - Tests
        .testTarget(name: "HappyPathCoreTests", dependencies: ["HappyPathCore", "FuzzConnectionHarness"]),
        // The I/O layer's pieces that need no socket: C libraries driven in memory.
        .testTarget(name: "HappyPathIOTests", dependencies: ["HappyPathIO", "CNghttp2"]),
        .testTarget(name: "HappyPathConfigTests", dependencies: ["HappyPathConfig"]),
        .testTarget(name: "HappyPathPoliciesTests", dependencies: ["HappyPathPolicies", "HappyPathCore"]),
        .testTarget(name: "HappyPathAdminTests", dependencies: ["HappyPathAdmin", "HappyPathPolicies", "HappyPathCore"]),
        .testTarget(
            name: "HappyPathStoreTests", dependencies: ["HappyPathStore", "HappyPathCore", "SmallDisk", "PostgresTestServer"]),
        .testTarget(
            name: "HappyPathHTTPOracleTests",
            dependencies: [
                "HTTP1Oracle", "HTTP1Framing", "HappyPathCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        // Every file in Tests/FuzzSeeds/<target> through that target's check.
        .testTarget(
            name: "HappyPathFuzzSeedTests",
            dependencies: [
                "FuzzRequestParserHarness", "FuzzResponseHeadHarness", "FuzzDifferentialHarness", "FuzzConfigHarness",
                "FuzzConnectionHarness", "FuzzOutsideValuesHarness", "FuzzHTTP2Harness", "FuzzHTTP2ClientHarness",
                "FuzzRedisReplyHarness",
            ]
        ),
        .testTarget(
            name: "HappyPathIntegrationTests",
            dependencies: [
                "HappyPathServer", "HappyPathConfig", "HappyPathCore", "HappyPathIO", "HappyPathDemo", "HappyPathStore",
                "HappyPathAdmin", "HappyPathPolicies", "SmallDisk", "PostgresTestServer", "RedisTestServer", .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ]
)

// `make sanitize-thread` (HAPPYPATH_BUILD=tsan) builds only what
// ThreadSanitizer has something to watch: the proxy, its I/O layer and
// store, and the tests that run them on threads and loops. The pure
// targets' tests, the llhttp oracle (swift-nio) and the fuzz targets run
// single-threaded code; `make sanitize-address` runs them (and `make
// swift-test`). About three minutes less to build on two cores.
if Context.environment["HAPPYPATH_BUILD"] == "tsan" {
    let singleThreaded: Set<String> = [
        "HappyPathCoreTests", "HappyPathPoliciesTests", "HappyPathAdminTests", "HappyPathConfigTests", "HappyPathHTTPOracleTests",
        "HappyPathFuzzSeedTests", "HTTP1Framing", "HTTP1Oracle", "FuzzSupport", "FuzzRequestParserHarness",
        "FuzzResponseHeadHarness", "FuzzDifferentialHarness", "FuzzConfigHarness", "FuzzOutsideValuesHarness",
        "FuzzConnectionHarness", "FuzzHTTP2Harness", "FuzzRequestParser", "FuzzResponseHead", "FuzzConfig",
        "FuzzDifferential", "FuzzConnection", "FuzzOutsideValues", "FuzzHTTP2", "FuzzHTTP2ClientHarness",
        "FuzzHTTP2Client", "FuzzRedisReplyHarness", "FuzzRedisReply",
    ]
    package.targets.removeAll { singleThreaded.contains($0.name) }
}
