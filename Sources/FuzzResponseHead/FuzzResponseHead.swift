// libFuzzer target for the checks on an upstream's response head
// (ResponseFraming): a status line, then field lines up to the empty line.
// The check is ResponseHeadHarness.check (Tests/Support/FuzzHarnesses/FuzzResponseHeadHarness),
// which `make test` also runs on every seed (HappyPathFuzzSeedTests).
// `make fuzz` builds this with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzResponseHead crash-1234 ...`.
// (Not main.swift: under -parse-as-library Swift 6.3 rejects top-level
// statements even in an inactive #if branch, so the replay driver is @main;
// the drivers themselves are in Tests/Support/FuzzSupport.)
import FuzzResponseHeadHarness
import FuzzSupport

#if FUZZING
    @_cdecl("FuzzResponseHead_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: ResponseHeadHarness.check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: ResponseHeadHarness.check) } }
#endif
