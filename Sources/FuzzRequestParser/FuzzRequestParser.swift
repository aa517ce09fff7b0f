// libFuzzer target for the strict HTTP/1.1 request parser (RequestHeadScanner,
// RequestHeadParser, ChunkedDecoder), through `frameAll`, which traps on any
// broken invariant. `make fuzz` builds it with -sanitize=fuzzer -DFUZZING; a
// plain build replays input files: `FuzzRequestParser crash-1234 ...`.
// (Not main.swift: under -parse-as-library Swift 6.3 rejects top-level
// statements even in an inactive #if branch, so the replay driver is @main.)
import HTTP1Framing

func check(_ bytes: [UInt8]) {
    checkFramingInvariants(bytes, cut: fnv1a(bytes))
}

#if FUZZING
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    check(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

// SwiftPM links executables with `main` aliased to `<module>_main`, so
// libFuzzer's own main() is never used: this one hands over to its driver.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
) -> CInt

@_cdecl("FuzzRequestParser_main")
public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzz(data, size) }
}
#else
import Foundation

/// Replays input files (a crash libFuzzer saved, a seed) through the same check.
@main
struct Replay {
    static func main() {
        for path in CommandLine.arguments.dropFirst() {
            guard let data = FileManager.default.contents(atPath: path) else {
                print("\(path): cannot read")
                exit(2)
            }
            print("\(path): \(checkFramingInvariants(Array(data), cut: fnv1a(Array(data))))")
        }
    }
}
#endif
