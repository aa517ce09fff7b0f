// libFuzzer target comparing the HTTP/1.1 request parser with llhttp
// (swift-nio's HTTPRequestDecoder) on the same bytes: it traps on any
// difference that is not on the oracle's allow-lists.
// The check is DifferentialHarness.check (Tests/Support/FuzzHarnesses/FuzzDifferentialHarness),
// which `make test` also runs on every seed (HappyPathFuzzSeedTests).
// `make fuzz` builds this with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzDifferential crash-1234 ...`.
// (Not main.swift: under -parse-as-library Swift 6.3 rejects top-level
// statements even in an inactive #if branch, so the replay driver is @main;
// the drivers themselves are in Tests/Support/FuzzSupport.)
import FuzzDifferentialHarness
import FuzzSupport

#if FUZZING
    @_cdecl("FuzzDifferential_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: DifferentialHarness.check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: DifferentialHarness.check) } }
#endif
