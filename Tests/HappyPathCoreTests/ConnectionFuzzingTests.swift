import FuzzConnectionHarness
import Foundation
import Testing

/// The connection fuzz target's invariants (`checkConnectionInvariants`,
/// which traps on the first one broken), on its seed programs and on many
/// programs from a fixed pseudo-random sequence: what `make fuzz` explores
/// at length, a small part of it in every test run.
@Suite struct ConnectionFuzzingTests {
    static let seedDirectory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("FuzzSeeds/FuzzConnection")

    static var seeds: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: seedDirectory.path)) ?? []).sorted()
    }

    @Test func seedsExist() { #expect(Self.seeds.count >= 10) }

    @Test(arguments: seeds)
    func seedKeepsTheInvariants(_ name: String) throws {
        let bytes = try [UInt8](Data(contentsOf: Self.seedDirectory.appendingPathComponent(name)))
        let summary = checkConnectionInvariants(bytes)
        #expect(summary.hasPrefix("dispatched"))
    }

    /// Programs made of request pieces and events in random order: every
    /// one must keep the invariants (a broken one traps the test process).
    @Test func randomProgramsKeepTheInvariants() {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func next() -> UInt64 {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
        let pieces: [[UInt8]] = [
            "GET /p HTTP/1.1\r\nHost: a\r\n\r\n", "GET /pp HTTP/1.0\r\n\r\n",
            "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
            "PUT /pp HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n", "wxyz",
            "POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", "3\r\nabc\r\n", "0\r\n\r\n",
            "GET /p HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", "GET /p HTTP/1.1\n\r\n", "\r\n",
        ].map { Array($0.utf8) }
        var dispatched = 0
        for _ in 0..<3000 {
            var program: [UInt8] = []
            for _ in 0..<(Int(next() % 24) + 1) {
                let r = next()
                switch r % 4 {
                case 0, 1:
                    var piece = pieces[Int((r >> 8) % UInt64(pieces.count))]
                    // Split it anywhere.
                    while !piece.isEmpty {
                        let n = min(piece.count, Int((r >> 16) % 64) + 1)
                        program += [0, UInt8(n - 1)] + piece.prefix(n)
                        piece.removeFirst(n)
                    }
                default:
                    program += [UInt8(3 + (r >> 8) % 5), UInt8(truncatingIfNeeded: r >> 24)]
                }
            }
            let summary = checkConnectionInvariants(program)
            if let n = Int(summary.split(separator: " ")[1].dropLast()) { dispatched += n }
        }
        // The programs reached the delegate, not just the parser's refusals.
        #expect(dispatched > 1000)
    }
}
