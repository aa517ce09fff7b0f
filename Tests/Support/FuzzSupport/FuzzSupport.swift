// What every fuzz target shares: libFuzzer's driver (under -DFUZZING) and a
// replay driver for input files (a plain build). Each target sets
// `fuzzCheck` and defines its two C entry points, whose names differ per
// target (SwiftPM links an executable's `main` as `<module>_main`).
import Foundation

/// The target's check of one input: it traps on a broken invariant and
/// returns a summary (printed when replaying).
nonisolated(unsafe) public var fuzzCheck: ([UInt8]) -> String = { _ in "" }

/// One input, as libFuzzer hands it over.
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    _ = fuzzCheck(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

#if FUZZING
    @_silgen_name("LLVMFuzzerRunDriver")
    func LLVMFuzzerRunDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
        _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
    ) -> CInt

    /// libFuzzer's own main() is never linked in: this hands over to its driver.
    public func runFuzzer(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        var argc = argc
        var argv = argv
        return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOne(data, size) }
    }
#endif

/// Replays the files named on the command line (a crash libFuzzer saved, a seed).
public func replayFiles() {
    for path in CommandLine.arguments.dropFirst() {
        guard let data = FileManager.default.contents(atPath: path) else {
            print("\(path): cannot read")
            exit(2)
        }
        print("\(path): \(fuzzCheck(Array(data)))")
    }
}
