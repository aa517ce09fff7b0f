#if canImport(Glibc)
    import Glibc
#endif

/// The request body, owned once and shared by every try of a command, so a
/// replay sends exactly the bytes the client sent. The storage is a fixed
/// allocation whose address libcurl may read while a try is in flight.
/// `@unchecked Sendable`: the bytes are written once, by whoever made the
/// body, before it is shared (a delivery's body goes to the store's
/// thread); after that every user only reads them.
///
/// A large body may be kept in a spool file instead of memory
/// (`limits.body_in_memory`): the file (without a name) is mapped, so the
/// body is read into it and sent from it through the same `baseAddress`;
/// its pages are the kernel's page cache, written to disk and given back
/// under pressure, not the process's own memory.
public final class RequestBody: @unchecked Sendable {
    public let count: Int
    public let baseAddress: UnsafeMutableRawPointer?
    /// Where this body's bytes are counted, given back when it is freed.
    private let budget: BodyBudget?
    /// The spool file mapped at `baseAddress` (nil: the bytes are in memory).
    private let mapping: SpoolMapping?

    public static let empty = RequestBody(count: 0)

    /// Allocates `count` bytes for the caller to fill before sharing the body.
    public init(count: Int) {
        self.count = count
        budget = nil
        mapping = nil
        baseAddress = count > 0 ? malloc(count)! : nil
    }

    /// `count` bytes in the spool file `open` makes (a file without a
    /// name), their blocks allocated at once so a full disk says so now,
    /// not with a fault as the body is read; counted in `budget` (the
    /// client's share of `limits.max_spooled_bytes`). Nil, with nothing
    /// left behind, when the budget, the directory or the disk cannot take it.
    public convenience init?(spooling count: Int, budget: BodyBudget, open: () -> Int32) {
        guard let mapping = SpoolMapping(capacity: count, budget: budget, open: open) else { return nil }
        self.init(mapping: mapping, count: count)
    }

    /// The first `count` bytes of `mapping`, which the body keeps (and
    /// its reservation) until it is freed.
    public init(mapping: SpoolMapping, count: Int) {
        precondition(count <= mapping.capacity)
        self.count = count
        budget = nil
        self.mapping = mapping
        baseAddress = mapping.base
    }

    /// The body is kept in a spool file.
    public var isSpooled: Bool { mapping != nil }

    /// Allocates `count` bytes counted in `budget`; nil if they do not fit.
    /// `reserved`: bytes the caller already took from the budget for this body.
    public init?(count: Int, budget: BodyBudget, reserved: Int = 0) {
        if count > reserved, !budget.reserve(count - reserved) { return nil }
        if reserved > count { budget.release(reserved - count) }
        self.count = count
        self.budget = budget
        mapping = nil
        baseAddress = count > 0 ? malloc(count)! : nil
    }

    /// Takes over `base` (from `malloc`, `count` bytes), whose bytes are
    /// already counted in `budget`.
    init(adopting base: UnsafeMutableRawPointer?, count: Int, budget: BodyBudget?) {
        self.count = count
        self.budget = budget
        mapping = nil
        baseAddress = base
    }

    public convenience init(_ bytes: [UInt8]) {
        self.init(count: bytes.count)
        if let baseAddress { bytes.withUnsafeBytes { baseAddress.copyMemory(from: $0.baseAddress!, byteCount: count) } }
    }

    public var bytes: [UInt8] {
        guard let baseAddress else { return [] }
        return Array(UnsafeRawBufferPointer(start: baseAddress, count: count))
    }

    deinit {
        // A mapping is let go (and its reservation given back) with the body.
        if mapping == nil { free(baseAddress) }
        budget?.release(count)
    }
}

/// One client request as an immutable, re-submittable snapshot: everything a
/// try needs and nothing about the connection it arrived on. A retry or a
/// replay sends a copy with `attempt + 1`, never the original changed in
/// place (docs/contract.md, "Request lifecycle").
public struct Command: Sendable {
    public let requestID: String
    public let method: String
    /// Path and query as sent upstream (after `strip_prefix`).
    public let target: String
    /// Headers as sent upstream: hop-by-hop removed, forwarding headers added.
    public let headers: HeaderBlock
    public let body: RequestBody
    public let routeIndex: Int
    public let upstream: String
    public let deadline: Instant
    public let attempt: Int

    public init(
        requestID: String, method: String, target: String, headers: HeaderBlock, body: RequestBody,
        routeIndex: Int, upstream: String, deadline: Instant, attempt: Int = 1
    ) {
        self.requestID = requestID
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.routeIndex = routeIndex
        self.upstream = upstream
        self.deadline = deadline
        self.attempt = attempt
    }

    /// The copy a listener re-submits.
    public func nextAttempt() -> Command {
        Command(
            requestID: requestID, method: method, target: target, headers: headers, body: body,
            routeIndex: routeIndex, upstream: upstream, deadline: deadline, attempt: attempt + 1)
    }

    /// Time left before the deadline, never negative.
    public func remaining(at now: Instant) -> Duration {
        now < deadline ? deadline - now : .zero
    }
}
