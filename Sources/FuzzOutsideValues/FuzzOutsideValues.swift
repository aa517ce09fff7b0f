// libFuzzer target for the numbers that come from outside (OutsideValues
// and its callers): Retry-After in both forms, HTTP dates, Age and
// Cache-Control delta-seconds, RateLimit fields, a token endpoint's
// `expires_in`, `traceparent`, and durations and instants past their range.
// Whatever the bytes, nothing traps and every result is within its bound.
// The check is OutsideValuesHarness.check (Tests/Support/FuzzHarnesses/FuzzOutsideValuesHarness),
// which `make test` also runs on every seed (HappyPathFuzzSeedTests).
// `make fuzz` builds this with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzOutsideValues crash-1234 ...`.
import FuzzOutsideValuesHarness
import FuzzSupport

#if FUZZING
    @_cdecl("FuzzOutsideValues_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: OutsideValuesHarness.check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: OutsideValuesHarness.check) } }
#endif
