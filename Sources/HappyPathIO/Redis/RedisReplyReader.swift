import CRedis
import HappyPathCore

/// Replies read from a Redis server's bytes: hiredis's reader with the
/// bounds of `CRedis` (at most 1,024 elements an array, 64 KiB a string,
/// 16,384 values and 4 MiB of strings a reply however it nests, 1 MiB
/// buffered for a reply not complete yet). Anything else is an
/// error, and the connection that fed it is given up; nothing is sized
/// by the peer. Fuzzed (`FuzzRedisReply`).
public final class RedisReplyReader {
    private let reader: UnsafeMutablePointer<redisReader>
    /// What the reply being read has taken of its bounds (`HP_REDIS_MAX_NODES`, `_REPLY_BYTES`).
    private let budget = UnsafeMutablePointer<hp_redis_budget>.allocate(capacity: 1)

    public init() {
        reader = hp_redis_reader_new()
        budget.initialize(to: hp_redis_budget(nodes: 0, bytes: 0))
    }

    deinit {
        redisReaderFree(reader)
        budget.deallocate()
    }

    public enum Failure: Error, Equatable {
        /// What hiredis said of the bytes.
        case unreadable(String)
        /// A reply not complete after this many bytes.
        case tooLarge(Int)
    }

    /// The most a reply not complete yet may hold.
    public static let maxBuffered = Int(HP_REDIS_MAX_BUFFERED)
    public static let maxElements = Int(HP_REDIS_MAX_ELEMENTS)
    public static let maxString = Int(HP_REDIS_MAX_STRING)

    public func feed(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        _ = redisReaderFeed(reader, base.assumingMemoryBound(to: CChar.self), bytes.count)
    }

    /// The next complete reply (nil: more bytes are needed).
    public func next() -> Result<RedisReply?, Failure> {
        var raw: UnsafeMutableRawPointer?
        guard hp_redis_reader_get(reader, &raw, budget) == REDIS_OK else {
            let why = withUnsafeBytes(of: reader.pointee.errstr) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            return .failure(.unreadable(why))
        }
        guard let raw else {
            let held = hp_redis_reader_buffered(reader)
            return held > Self.maxBuffered ? .failure(.tooLarge(held)) : .success(nil)
        }
        defer { freeReplyObject(raw) }
        return .success(Self.convert(raw.assumingMemoryBound(to: redisReply.self)))
    }

    /// hiredis's reply as a value; sizes were bounded by the reader.
    static func convert(_ r: UnsafeMutablePointer<redisReply>) -> RedisReply {
        let reply = r.pointee
        func bytes() -> [UInt8] {
            guard let str = reply.str, reply.len > 0 else { return [] }
            return Array(UnsafeRawBufferPointer(start: str, count: reply.len).bindMemory(to: UInt8.self))
        }
        switch reply.type {
        case REDIS_REPLY_STATUS: return .status(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ERROR: return .error(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_INTEGER: return .integer(Int64(reply.integer))
        case REDIS_REPLY_STRING: return .string(bytes())
        case REDIS_REPLY_ARRAY:
            var items: [RedisReply] = []
            items.reserveCapacity(reply.elements)
            for i in 0..<reply.elements {
                if let e = reply.element[i] { items.append(convert(e)) } else { items.append(.null) }
            }
            return .array(items)
        default: return .null
        }
    }
}
