import HappyPathCore
import HappyPathIO
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// Where and how the access log is written: one line per client request,
/// at `info`, in the same format as the other log lines.
public struct AccessLogSettings: Sendable {
    /// Off below `info` (`--log-level warning` and higher).
    public var enabled: Bool
    public var format: LogFormat
    /// Receives whole batches of lines; stderr by default.
    public var sink: @Sendable (UnsafeRawBufferPointer) -> Void
    /// A batch is written when it is this old...
    public var flushInterval: Duration
    /// ...or this large, whichever comes first (and at stop).
    public var batchBytes: Int

    public init(
        level: Logger.Level, format: LogFormat,
        sink: @escaping @Sendable (UnsafeRawBufferPointer) -> Void = AccessLogSettings.writeToStderr,
        flushInterval: Duration = .milliseconds(100), batchBytes: Int = 64 * 1024
    ) {
        enabled = level <= .info
        self.format = format
        self.sink = sink
        self.flushInterval = flushInterval
        self.batchBytes = batchBytes
    }

    /// write(2) until every byte is out; a failing stderr drops the batch
    /// rather than stopping the worker.
    public static let writeToStderr: @Sendable (UnsafeRawBufferPointer) -> Void = { bytes in
        guard let base = bytes.baseAddress else { return }
        var offset = 0
        while offset < bytes.count {
            let n = write(2, base + offset, bytes.count - offset)
            if n > 0 {
                offset += n
            } else if n < 0, errno == EINTR {
                continue
            } else {
                return
            }
        }
    }
}

/// What one access-log line says about a finished request.
struct AccessRecord {
    var requestID: String
    var method: String
    /// The protocol the client's request came in (`HTTP/1.1`, `HTTP/2`):
    /// one of the stream's constants, so the record copies no text.
    var protocolName: StaticString
    var route: String
    var upstream: String
    var status: Int
    var code: String
    var attempts: Int
    var durationMicros: Int64
    var bytes: Int
    /// A gRPC call's `grpc_status` (its number, or `unknown`); nil for
    /// every other request, which carries no such field.
    var grpcStatus: String? = nil
    /// A coalesced follower's leader (its request id); nil for every other request.
    var coalesced: String? = nil
    /// A coalescing leader's followers (0: not written).
    var followers = 0
}

/// One worker's access log: lines are composed straight into a byte buffer
/// (no `String`, no metadata dictionary per request) and written in
/// batches, when the oldest line is `flushInterval` old, when `batchBytes`
/// have collected, and when the worker stops. Used on the worker's loop only.
final class AccessLog: LoopEventTarget {
    private let settings: AccessLogSettings
    private let loop: EventLoop
    /// The batch: raw storage, so composing a line is stores and copies
    /// with no per-byte capacity or bounds check.
    private var storage: UnsafeMutablePointer<UInt8>
    private var capacity: Int
    private var count = 0
    private var timer: LoopEvent?
    /// `2026-11-22T01:15:38` for the second in `cachedSecond`.
    private var cachedSecond = -1
    private var cachedStamp: (UInt64, UInt64, UInt32) = (0, 0, 0)

    var enabled: Bool { settings.enabled }

    init(settings: AccessLogSettings, loop: EventLoop) {
        self.settings = settings
        self.loop = loop
        capacity = settings.enabled ? settings.batchBytes + 4096 : 0
        storage = .allocate(capacity: max(1, capacity))
    }

    deinit {
        timer?.recycle()
        storage.deallocate()
    }

    func append(_ record: AccessRecord) {
        guard settings.enabled else { return }
        // The longest this line can be: fixed text plus every string escaped
        // at six bytes a byte (`\u00XX`).
        let strings =
            record.requestID.utf8.count + record.method.utf8.count + record.route.utf8.count
            + record.upstream.utf8.count + record.code.utf8.count
        // The protocol is ours (no escaping) and its key the only one past the 256.
        // A gRPC call's `grpc_status` (at most `unknown`) comes on top.
        let grpc = record.grpcStatus == nil ? 0 : 32
        // A follower's leader id (escaped), a leader's count.
        let coalescing = (record.coalesced.map { 16 + 6 * $0.utf8.count } ?? 0) + (record.followers > 0 ? 32 : 0)
        reserve(256 + 16 + grpc + coalescing + record.protocolName.utf8CodeUnitCount + 6 * strings)
        switch settings.format {
        case .json: appendJSON(record)
        case .text: appendText(record)
        }
        if count >= settings.batchBytes {
            flush()
        } else if timer == nil {
            let event = loop.takeEvent(target: self)
            timer = event
            event.arm(after: settings.flushInterval)
        }
    }

    /// Room for `n` more bytes: the batch is written first if it would not
    /// fit, and the storage grows only for a line larger than a batch.
    private func reserve(_ n: Int) {
        guard count + n > capacity else { return }
        flush()
        guard n > capacity else { return }
        storage.deallocate()
        capacity = n
        storage = .allocate(capacity: capacity)
    }

    /// Writes what has collected. At stop, and from the timer.
    func flush() {
        if let timer {
            timer.recycle()
            self.timer = nil
        }
        guard count > 0 else { return }
        settings.sink(UnsafeRawBufferPointer(start: storage, count: count))
        count = 0
    }

    func loopEventFired(_ event: LoopEvent) { flush() }

    // MARK: - Composing a line

    private func appendJSON(_ r: AccessRecord) {
        put("{\"ts\":\"")
        putTimestamp()
        put("\",\"level\":\"info\",\"msg\":\"request\",\"attempts\":")
        putInt(r.attempts)
        put(",\"bytes\":")
        putInt(r.bytes)
        if let coalesced = r.coalesced {
            put(",\"coalesced\":")
            putQuoted(coalesced)
        }
        put(",\"code\":")
        putQuoted(r.code)
        put(",\"duration_ms\":")
        putMillis(r.durationMicros)
        if r.followers > 0 {
            put(",\"followers\":")
            putInt(r.followers)
        }
        if let grpcStatus = r.grpcStatus {
            put(",\"grpc_status\":")
            putQuoted(grpcStatus)
        }
        put(",\"method\":")
        putQuoted(r.method)
        put(",\"protocol\":\"")
        put(r.protocolName)
        put("\",\"request_id\":")
        putQuoted(r.requestID)
        put(",\"route\":")
        putQuoted(r.route)
        put(",\"status\":")
        putInt(r.status)
        put(",\"upstream\":")
        putQuoted(r.upstream)
        put("}\n")
    }

    private func appendText(_ r: AccessRecord) {
        putTimestamp()
        put(" INFO request attempts=")
        putInt(r.attempts)
        put(" bytes=")
        putInt(r.bytes)
        if let coalesced = r.coalesced {
            put(" coalesced=")
            putRaw(coalesced)
        }
        put(" code=")
        putRaw(r.code)
        put(" duration_ms=")
        putMillis(r.durationMicros)
        if r.followers > 0 {
            put(" followers=")
            putInt(r.followers)
        }
        if let grpcStatus = r.grpcStatus {
            put(" grpc_status=")
            putRaw(grpcStatus)
        }
        put(" method=")
        putRaw(r.method)
        put(" protocol=")
        put(r.protocolName)
        put(" request_id=")
        putRaw(r.requestID)
        put(" route=")
        putRaw(r.route)
        put(" status=")
        putInt(r.status)
        put(" upstream=")
        putRaw(r.upstream)
        put("\n")
    }

    @inline(__always)
    private func byte(_ b: UInt8) {
        storage[count] = b
        count += 1
    }

    private func put(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        UnsafeMutableRawPointer(storage + count).copyMemory(from: base, byteCount: bytes.count)
        count += bytes.count
    }

    private func put(_ literal: StaticString) {
        put(UnsafeRawBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    private func putRaw(_ s: String) {
        var s = s
        s.withUTF8 { put(UnsafeRawBufferPointer($0)) }
    }

    private static let hex: StaticString = "0123456789abcdef"

    /// A JSON string: quotes, backslashes and control bytes escaped; runs
    /// that need nothing are copied whole.
    private func putQuoted(_ s: String) {
        byte(UInt8(ascii: "\""))
        var s = s
        s.withUTF8 { utf8 in
            let bytes = UnsafeRawBufferPointer(utf8)
            var run = 0
            for i in 0..<bytes.count {
                let b = bytes[i]
                guard b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") else { continue }
                put(UnsafeRawBufferPointer(rebasing: bytes[run..<i]))
                run = i + 1
                byte(UInt8(ascii: "\\"))
                if b >= 0x20 {
                    byte(b)
                } else {
                    put("u00")
                    byte(Self.hex.utf8Start[Int(b >> 4)])
                    byte(Self.hex.utf8Start[Int(b & 0xF)])
                }
            }
            put(UnsafeRawBufferPointer(rebasing: bytes[run..<bytes.count]))
        }
        byte(UInt8(ascii: "\""))
    }

    private func putInt(_ value: Int) {
        if value < 0 { byte(UInt8(ascii: "-")) }
        var v = value.magnitude
        var divisor: UInt = 1
        while v / divisor >= 10 { divisor *= 10 }
        repeat {
            byte(UInt8(ascii: "0") + UInt8(v / divisor))
            v %= divisor
            divisor /= 10
        } while divisor > 0
    }

    /// Microseconds as milliseconds with three decimals: `12.345`.
    private func putMillis(_ micros: Int64) {
        let m = max(0, micros)
        putInt(Int(m / 1000))
        byte(UInt8(ascii: "."))
        let frac = Int(m % 1000)
        byte(UInt8(ascii: "0") + UInt8(frac / 100))
        byte(UInt8(ascii: "0") + UInt8(frac / 10 % 10))
        byte(UInt8(ascii: "0") + UInt8(frac % 10))
    }

    /// UTC with milliseconds, as the other log lines; the date and time of
    /// day are formatted once per second.
    private func putTimestamp() {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let second = Int(ts.tv_sec)
        if second != cachedSecond {
            cachedSecond = second
            var t = time_t(ts.tv_sec)
            var parts = tm()
            gmtime_r(&t, &parts)
            withUnsafeMutableBytes(of: &cachedStamp) { out in
                var i = 0
                func two(_ v: Int32, then sep: UInt8?) {
                    out[i] = UInt8(ascii: "0") + UInt8(v / 10 % 10)
                    out[i + 1] = UInt8(ascii: "0") + UInt8(v % 10)
                    i += 2
                    if let sep {
                        out[i] = sep
                        i += 1
                    }
                }
                let year = parts.tm_year + 1900
                two(year / 100, then: nil)
                two(year % 100, then: UInt8(ascii: "-"))
                two(parts.tm_mon + 1, then: UInt8(ascii: "-"))
                two(parts.tm_mday, then: UInt8(ascii: "T"))
                two(parts.tm_hour, then: UInt8(ascii: ":"))
                two(parts.tm_min, then: UInt8(ascii: ":"))
                two(parts.tm_sec, then: nil)
            }
        }
        withUnsafeBytes(of: cachedStamp) { put(UnsafeRawBufferPointer(rebasing: $0[0..<19])) }
        let millis = Int(ts.tv_nsec / 1_000_000)
        byte(UInt8(ascii: "."))
        byte(UInt8(ascii: "0") + UInt8(millis / 100))
        byte(UInt8(ascii: "0") + UInt8(millis / 10 % 10))
        byte(UInt8(ascii: "0") + UInt8(millis % 10))
    }
}

extension AccessLog {
    /// The line of an exchange that ended, when the log is on (info level):
    /// one per client request, and one per delivery round.
    func append(_ exchange: Exchange, duration: Duration) {
        guard enabled else { return }
        let command = exchange.command
        append(
            AccessRecord(
                requestID: command.requestID, method: command.method, protocolName: exchange.protocolName,
                route: exchange.route.label, upstream: exchange.upstream.name, status: exchange.finalStatus,
                code: exchange.finalCode, attempts: exchange.triesSent, durationMicros: duration.nanoseconds / 1000,
                bytes: exchange.bytesOut, grpcStatus: exchange.isGRPC ? GRPCCall.label(exchange.grpcStatus) : nil,
                coalesced: exchange.result.coalescedWith, followers: exchange.result.followers))
    }
}
