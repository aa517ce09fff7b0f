// The check of the FuzzDifferential target, in a library so that the fuzz
// executable and the seed replay tests (HappyPathFuzzSeedTests) run the same
// code: the HTTP/1.1 request parser and llhttp (swift-nio's
// HTTPRequestDecoder) on the same bytes; any difference that is not on the
// oracle's allow-lists traps.
import HTTP1Oracle

public enum DifferentialHarness {
    /// Parses `bytes` with both parsers; traps on a difference, returns both answers.
    public static func check(_ bytes: [UInt8]) -> String {
        let (ours, llhttp, difference) = differential(bytes)
        if let difference { fatalError("\(difference)\n  input: \(String(decoding: bytes, as: UTF8.self).debugDescription)") }
        return "ours: \(ours)\n  llhttp: \(llhttp)"
    }
}
