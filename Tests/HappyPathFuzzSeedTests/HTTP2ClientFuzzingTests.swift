import FuzzHTTP2ClientHarness
import Testing

/// The HTTP/2 client fuzz target's rules (`checkHTTP2ClientInvariants`,
/// which traps on the first one broken: a try ended twice or told after
/// its end or a cancel, held bytes past a stream window, more body than the
/// upstream sent) on programs from a fixed pseudo-random sequence: what
/// `make fuzz` explores at length, a small part of it in every test run.
/// Each program is biased towards the ops that make streams and frames.
@Suite struct HTTP2ClientFuzzingTests {
    @Test func randomProgramsKeepTheInvariants() {
        var state: UInt64 = 0x2545_F491_4F6C_DD1D
        func next() -> UInt64 {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
        var ended = 0
        for _ in 0..<3000 {
            var program: [UInt8] = [8, UInt8(truncatingIfNeeded: next()), 11, 5, 1, 100, 1]
            for _ in 0..<Int(next() % 40) {
                // Mostly heads, data, delivery and the exchange's moves; some raw frames and resets.
                let ops: [UInt8] = [2, 2, 3, 3, 7, 7, 9, 10, 11, 8, 4, 6, 0, 5]
                program.append(ops[Int(next() % UInt64(ops.count))])
                for _ in 0..<4 { program.append(UInt8(truncatingIfNeeded: next())) }
            }
            let summary = checkHTTP2ClientInvariants(program)
            if !summary.contains("ended 0") { ended += 1 }
        }
        // The sequence reaches the ends it is meant to (complete answers, resets, refusals).
        #expect(ended > 300, "only \(ended) of 3,000 programs ended a try")
    }
}
