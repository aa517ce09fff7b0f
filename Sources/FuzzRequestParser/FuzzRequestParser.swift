// libFuzzer target for the strict HTTP/1.1 request parser (RequestHeadScanner,
// RequestHeadParser, ChunkedDecoder), through `frameAll`, which traps on any
// broken invariant.
// The check is RequestParserHarness.check (Tests/Support/FuzzHarnesses/FuzzRequestParserHarness),
// which `make test` also runs on every seed (HappyPathFuzzSeedTests).
// `make fuzz` builds this with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzRequestParser crash-1234 ...`.
// (Not main.swift: under -parse-as-library Swift 6.3 rejects top-level
// statements even in an inactive #if branch, so the replay driver is @main;
// the drivers themselves are in Tests/Support/FuzzSupport.)
import FuzzRequestParserHarness
import FuzzSupport

#if FUZZING
    @_cdecl("FuzzRequestParser_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: RequestParserHarness.check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: RequestParserHarness.check) } }
#endif
