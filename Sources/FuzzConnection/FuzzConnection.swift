// libFuzzer target for the client connection's state machine
// (HTTP1ServerConnectionStateMachine), through `checkConnectionInvariants`:
// a program of client bytes in any split, answers, output, timers, closes
// and drain, with the invariants checked after every event. `make fuzz`
// builds it with -sanitize=fuzzer -DFUZZING; a plain build replays input
// files: `FuzzConnection crash-1234 ...`.
import FuzzConnectionHarness
import FuzzSupport

func check(_ bytes: [UInt8]) -> String { ConnectionHarness.check(bytes) }

#if FUZZING
    @_cdecl("FuzzConnection_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: check) } }
#endif
