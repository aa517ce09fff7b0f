// The check of the FuzzRequestParser target, in a library so that the fuzz
// executable and the seed replay tests (HappyPathFuzzSeedTests) run the same
// code: the strict HTTP/1.1 request parser (RequestHeadScanner,
// RequestHeadParser, ChunkedDecoder) through `frameAll`, which traps on any
// broken invariant.
import HTTP1Framing

public enum RequestParserHarness {
    /// Frames `bytes` whole and cut at a point derived from them; traps on a
    /// broken invariant and returns what the framing did.
    public static func check(_ bytes: [UInt8]) -> String {
        "\(checkFramingInvariants(bytes, cut: fnv1a(bytes)))"
    }
}
