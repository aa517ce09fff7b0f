// What every fuzz target shares: libFuzzer's driver (under -DFUZZING) and a
// replay driver for input files (a plain build). Each target defines only
// `<module>_main` (SwiftPM links an executable's `main` under that name) and
// an `@main` replay type, both one line into this module.
import Foundation

/// The target's check of one input: it traps on a broken invariant and
/// returns a summary (printed when replaying).
public typealias FuzzCheck = ([UInt8]) -> String

nonisolated(unsafe) private var currentCheck: FuzzCheck = { _ in "" }

#if FUZZING
    /// libFuzzer's entry for one input (one per binary: each links this module once).
    @_cdecl("LLVMFuzzerTestOneInput")
    public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
        _ = currentCheck(Array(UnsafeBufferPointer(start: data, count: size)))
        return 0
    }

    @_silgen_name("LLVMFuzzerRunDriver")
    func LLVMFuzzerRunDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
        _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
    ) -> CInt

    /// libFuzzer's own main() is never linked in: this hands over to its driver.
    public func runFuzzer(
        _ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?, check: @escaping FuzzCheck
    ) -> CInt {
        currentCheck = check
        var argc = argc
        var argv = argv
        return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOne(data, size) }
    }
#endif

/// Replays the files named on the command line (a crash libFuzzer saved, a seed).
public func replayFiles(check: FuzzCheck) {
    for path in CommandLine.arguments.dropFirst() {
        guard let data = FileManager.default.contents(atPath: path) else {
            print("\(path): cannot read")
            exit(2)
        }
        print("\(path): \(check(Array(data)))")
    }
}
