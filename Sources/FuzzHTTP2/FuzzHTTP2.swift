// libFuzzer target for HTTP2Session, through `checkHTTP2Invariants`: the
// client preface, then random typed frames (some of them well-formed
// request heads) in any split, with the driver's moves in between, the
// invariants checked after every one (no stream ready twice or after a
// reset, body bytes within the windows and the limit, streams within
// MAX_CONCURRENT_STREAMS, the outbound queue in proportion). `make fuzz`
// builds it with -sanitize=fuzzer -DFUZZING; a plain build replays input
// files: `FuzzHTTP2 crash-1234 ...`.
import FuzzHTTP2Harness
import FuzzSupport

func check(_ bytes: [UInt8]) -> String { HTTP2Harness.check(bytes) }

#if FUZZING
    @_cdecl("FuzzHTTP2_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: check) } }
#endif
