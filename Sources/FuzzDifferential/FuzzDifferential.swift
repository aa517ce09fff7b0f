// libFuzzer target comparing the HTTP/1.1 request parser with llhttp
// (swift-nio's HTTPRequestDecoder) on the same bytes: it traps on any
// difference that is not on the oracle's allow-lists. `make fuzz` builds it
// with -sanitize=fuzzer -DFUZZING; a plain build replays input files:
// `FuzzDifferential crash-1234 ...`.
// (Not main.swift: under -parse-as-library Swift 6.3 rejects top-level
// statements even in an inactive #if branch, so the replay driver is @main;
// the drivers themselves are in Tests/Support/FuzzSupport.)
import FuzzSupport
import HTTP1Framing
import HTTP1Oracle

func check(_ bytes: [UInt8]) -> String {
    let (ours, llhttp, difference) = differential(bytes)
    if let difference { fatalError("\(difference)\n  input: \(String(decoding: bytes, as: UTF8.self).debugDescription)") }
    return "ours: \(ours)\n  llhttp: \(llhttp)"
}

#if FUZZING
    @_cdecl("FuzzDifferential_main")
    public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        runFuzzer(argc, argv, check: check)
    }
#else
    @main struct Replay { static func main() { replayFiles(check: check) } }
#endif
