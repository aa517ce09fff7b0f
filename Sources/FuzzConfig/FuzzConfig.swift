// libFuzzer target for the configuration loader: whatever the file holds,
// loading it never crashes, and every problem it reports reads
// `FILE:LINE:COL: message` with a position inside the file.
// The check is ConfigHarness.check (Tests/Support/FuzzHarnesses/FuzzConfigHarness),
// which `make test` also runs on every seed (HappyPathFuzzSeedTests).
// `make fuzz` builds this with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzConfig crash-1234 ...`.
// (Not main.swift: under -parse-as-library Swift 6.3 rejects top-level
// statements even in an inactive #if branch, so the replay driver is @main;
// the drivers themselves are in Tests/Support/FuzzSupport.)
import FuzzConfigHarness
import FuzzSupport

#if FUZZING
    @_cdecl("FuzzConfig_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: ConfigHarness.check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: ConfigHarness.check) } }
#endif
