// libFuzzer target for the cluster link's Redis reply reader, through
// `RedisReplyHarness.check`: a server's bytes in any split, every reply
// within the reader's bounds and the same whatever the split.
// `make fuzz` builds it with -sanitize=fuzzer -DFUZZING; a plain build
// replays input files: `FuzzRedisReply crash-1234 ...`.
import FuzzRedisReplyHarness
import FuzzSupport

func check(_ bytes: [UInt8]) -> String { RedisReplyHarness.check(bytes) }

#if FUZZING
    @_cdecl("FuzzRedisReply_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: check) } }
#endif
