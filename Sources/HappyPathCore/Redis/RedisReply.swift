/// One Redis reply (RESP2), as the link's reader made it: every size was
/// bounded before anything was kept (`CRedis`: at most 1,024 elements a
/// level, 64 KiB a string, nesting as deep as hiredis reads, 7 levels).
public indirect enum RedisReply: Sendable, Equatable {
    case status(String)
    case error(String)
    case integer(Int64)
    case string([UInt8])
    case null
    case array([RedisReply])

    /// An integer reply, or an element of an array of them.
    public var integer: Int64? {
        if case let .integer(v) = self { return v }
        return nil
    }

    public var elements: [RedisReply]? {
        if case let .array(a) = self { return a }
        return nil
    }

    public var text: String? {
        switch self {
        case let .status(s), let .error(s): s
        case let .string(b): String(decoding: b, as: UTF8.self)
        default: nil
        }
    }

    public var isError: Bool {
        if case .error = self { return true }
        return false
    }
}

/// How one command ended for whoever sent it.
public enum RedisResult: Sendable, Equatable {
    case reply(RedisReply)
    /// No reply within the link's timeout (the connection is closed with it).
    case timedOut
    /// The connection failed or closed before the reply.
    case failed(String)
}
