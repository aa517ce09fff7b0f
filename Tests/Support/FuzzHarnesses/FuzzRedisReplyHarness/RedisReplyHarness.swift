// A Redis server's bytes, made from the fuzz input, through the link's
// reply reader (hiredis's reader with CRedis's bounds) in splits of any
// size: every reply comes out within the bounds (elements, string length,
// nesting), the same replies whatever the split, and an error stops the
// stream for good. hiredis is not instrumented: libFuzzer is guided by our
// Swift and by CRedis's object functions only.
import HappyPathCore
import HappyPathIO

public enum RedisReplyHarness {
    public static func check(_ bytes: [UInt8]) -> String {
        guard let first = bytes.first else { return "empty" }
        let input = Array(bytes.dropFirst())
        let whole = read(input, split: input.count)
        let pieces = read(input, split: Int(first % 7) + 1)
        precondition(whole.replies == pieces.replies, "the replies depend on how the bytes were split")
        precondition(whole.failed == pieces.failed, "a failure depends on how the bytes were split")
        for reply in whole.replies { checkBounds(reply, depth: 0) }
        return "\(whole.replies.count) replies\(whole.failed ? ", then refused" : "")"
    }

    static func read(_ bytes: [UInt8], split: Int) -> (replies: [RedisReply], failed: Bool) {
        let reader = RedisReplyReader()
        var replies: [RedisReply] = []
        var at = 0
        while at < bytes.count {
            let end = min(bytes.count, at + max(1, split))
            bytes[at..<end].withUnsafeBytes { reader.feed($0) }
            at = end
            while true {
                switch reader.next() {
                case .failure: return (replies, true)
                case .success(nil): break
                case let .success(reply?):
                    replies.append(reply)
                    continue
                }
                break
            }
        }
        return (replies, false)
    }

    static func checkBounds(_ reply: RedisReply, depth: Int) {
        precondition(depth <= 9, "nested deeper than hiredis reads")
        switch reply {
        case let .string(b): precondition(b.count <= RedisReplyReader.maxString, "a string of \(b.count) bytes")
        case let .status(s), let .error(s): precondition(s.utf8.count <= RedisReplyReader.maxString * 3, "a line of \(s.utf8.count)")
        case let .array(items):
            precondition(items.count <= RedisReplyReader.maxElements, "an array of \(items.count)")
            for item in items { checkBounds(item, depth: depth + 1) }
        case .integer, .null: break
        }
    }
}
