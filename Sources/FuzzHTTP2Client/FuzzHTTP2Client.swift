// libFuzzer target for the proxy's own HTTP/2 client session, through
// `checkHTTP2ClientInvariants`: an upstream's frames made from the input
// (heads, DATA, resets, GOAWAY, SETTINGS, frames of any type) in any split,
// with the exchange's moves in between, the handlers' contract checked
// after every one (each try ends once, nothing after its end or a cancel,
// held bytes within the stream window, no more body than was sent).
// `make fuzz` builds it with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzHTTP2Client crash-1234 ...`.
import FuzzHTTP2ClientHarness
import FuzzSupport

func check(_ bytes: [UInt8]) -> String { HTTP2ClientHarness.check(bytes) }

#if FUZZING
    @_cdecl("FuzzHTTP2Client_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: check) } }
#endif
