import HappyPathCore
import HappyPathIO
import Testing

/// The cluster link's reply reader: replies in any split, and every bound
/// a hostile or broken Redis could push against refused before memory grows.
@Suite struct RedisReplyReaderTests {
    static func read(_ text: [UInt8], split: Int = .max) -> (replies: [RedisReply], failure: RedisReplyReader.Failure?) {
        let reader = RedisReplyReader()
        var replies: [RedisReply] = []
        var at = 0
        while at < text.count {
            let end = min(text.count, at + max(1, min(split, text.count)))
            text[at..<end].withUnsafeBytes { reader.feed($0) }
            at = end
            while true {
                switch reader.next() {
                case let .failure(f): return (replies, f)
                case .success(nil): break
                case let .success(r?):
                    replies.append(r)
                    continue
                }
                break
            }
        }
        return (replies, nil)
    }

    @Test func theScriptsAnswersInAnySplit() {
        let bytes = Array("*4\r\n:1\r\n:0\r\n:9\r\n:120000\r\n+OK\r\n$3\r\nabc\r\n-NOSCRIPT no\r\n$-1\r\n".utf8)
        let expected: [RedisReply] = [
            .array([.integer(1), .integer(0), .integer(9), .integer(120_000)]), .status("OK"), .string(Array("abc".utf8)),
            .error("NOSCRIPT no"), .null,
        ]
        for split in [1, 2, 3, 7, 100] { #expect(Self.read(bytes, split: split).replies == expected, "split \(split)") }
    }

    @Test func aHugeArrayOrStringIsRefusedBeforeItIsAllocated() {
        #expect(Self.read(Array("*2000000000\r\n".utf8)).failure != nil)
        #expect(Self.read(Array("*1025\r\n".utf8)).failure != nil)
        #expect(Self.read(Array("$65537\r\n".utf8) + [UInt8](repeating: 65, count: 65_539)).failure != nil)
    }

    @Test func aReplyNestedWideIsBoundedAsAWhole() {
        // 1,024 × 17 integers: each level within bounds, the whole past 16,384 values.
        var bytes = Array("*17\r\n".utf8)
        for _ in 0..<17 {
            bytes += Array("*1024\r\n".utf8)
            for _ in 0..<1024 { bytes += Array(":1\r\n".utf8) }
        }
        let result = Self.read(bytes, split: 4096)
        #expect(result.replies.isEmpty)
        #expect(result.failure != nil)
        // The reader's bounds are per reply: the next one on a fresh reader reads.
        #expect(Self.read(Array("*2\r\n:1\r\n:2\r\n".utf8)).replies == [.array([.integer(1), .integer(2)])])
    }

    @Test func manyRepliesEachWithinBoundsAllRead() {
        var bytes: [UInt8] = []
        for _ in 0..<20 {
            bytes += Array("*1000\r\n".utf8)
            for _ in 0..<1000 { bytes += Array(":7\r\n".utf8) }
        }
        let result = Self.read(bytes, split: 10_000)
        #expect(result.failure == nil)
        #expect(result.replies.count == 20)
    }
}
