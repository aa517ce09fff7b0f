// Drives an HTTP2Session the way the HTTP/2 driver will, without sockets:
// the client preface, then frames made from the fuzz bytes (typed, with
// random flags, stream ids and payloads, some of them well-formed request
// heads), delivered in splits of any size through `receive`, with the
// driver's own moves in between (output produced, bodies taken, answers
// submitted and streamed, streams reset, GOAWAY). After every move it checks
// the session's invariants and traps on the first one broken. nghttp2 is
// not instrumented: libFuzzer is guided by our Swift only.
import HappyPathCore
import HappyPathIO

/// Runs `program` and checks the invariants; returns a summary.
///
/// The program is read one op byte at a time (`op % 8`), then its parameters:
/// - 0, 1, 2: a frame of any type (`type % 11`, 10 being an unknown type),
///   then flags, a stream (`s % 9`: 0, or one of the odd ids 1 … 15), a
///   length (`% 48`) and that many payload bytes
/// - 3: a well-formed request HEADERS (stream, flags: END_STREAM, a method,
///   a field), or with flag 0x80 trailers (END_STREAM) with one field, good
///   or malformed
/// - 4: a DATA frame (stream, flags, length `% 64`) of zeros
/// - 5: RST_STREAM (stream, code)
/// - 6: deliver the frames made so far, split in two at a point from the next byte
/// - 7: a driver move (`p % 8`): produce output, take a body, answer a ready
///   stream, stream its body, end it with or without trailers, reset it,
///   GOAWAY, or the shutdown notice
public func checkHTTP2Invariants(_ program: [UInt8]) -> String {
    var driver = FuzzedHTTP2Driver()
    var k = 0
    func next() -> UInt8 {
        defer { k += 1 }
        return k < program.count ? program[k] : 0
    }
    while k < program.count {
        switch next() % 8 {
        case 0, 1, 2:
            let type = next() % 11
            let flags = next()
            let stream = FuzzedHTTP2Driver.stream(next())
            let n = Int(next() % 48)
            let end = min(program.count, k + n)
            var payload = k < end ? Array(program[k..<end]) : []
            payload += [UInt8](repeating: 0, count: n - payload.count)
            k = max(k, end)
            driver.frame(type: type == 10 ? 0x20 : type, flags: flags, stream: stream, payload)
        case 3: driver.requestHead(stream: FuzzedHTTP2Driver.stream(next()), flags: next())
        case 4:
            let stream = FuzzedHTTP2Driver.stream(next())
            let flags = next()
            driver.frame(type: 0, flags: flags & 0x1, stream: stream, [UInt8](repeating: 0, count: Int(next() % 64)))
        case 5: driver.frame(type: 3, flags: 0, stream: FuzzedHTTP2Driver.stream(next()), [0, 0, 0, next() % 14])
        case 6: driver.deliver(split: Int(next()))
        default: driver.move(next())
        }
        if driver.dead { break }
    }
    driver.deliver(split: 0)
    return driver.summary
}

public enum HTTP2Harness {
    public static func check(_ bytes: [UInt8]) -> String { checkHTTP2Invariants(bytes) }
}

/// What the HTTP/2 driver keeps, minus the socket.
struct FuzzedHTTP2Driver {
    static let limits = RequestLimits(maxHeadBytes: 1024, maxFields: 8, maxBodyBytes: 2000)
    static let settings = HTTP2SessionSettings(
        maxConcurrentStreams: 4, initialStreamWindow: 1024, initialConnectionWindow: 1 << 20, request: limits)
    /// nghttp2's window before our SETTINGS are acknowledged.
    static let defaultWindow = 65_535

    let session: HTTP2Session
    /// Client bytes made and not yet delivered.
    var pending: [UInt8]
    /// Streams that came out ready, in order, and those still open among them.
    var everReady: Set<Int32> = []
    var answerable: [Int32] = []
    /// Streams the client reset or that closed: never ready after that.
    var gone: Set<Int32> = []
    /// Streams whose trailers were malformed: never ended, never ready after.
    var malformed: Set<Int32> = []
    var answered: Set<Int32> = []
    var framesMade = 0
    var submitted = 0
    var reads = 0
    var dead = false
    var error: HTTP2SessionError?

    init() {
        do { session = try HTTP2Session(settings: Self.settings) } catch { fatalError("no session: \(error)") }
        pending = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0]
    }

    static func stream(_ p: UInt8) -> UInt32 {
        let s = UInt32(p % 9)
        return s == 0 ? 0 : 2 * s - 1
    }

    var summary: String {
        "reads \(reads), ready \(everReady.count), answered \(answered.count), open \(session.openStreams)"
            + (malformed.isEmpty ? "" : ", malformed \(malformed.count)") + (error.map { ", ended: \($0)" } ?? "")
    }

    // MARK: - Client bytes

    mutating func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) {
        let n = payload.count
        pending += [
            UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n), type,
            flags, UInt8(truncatingIfNeeded: stream >> 24), UInt8(truncatingIfNeeded: stream >> 16),
            UInt8(truncatingIfNeeded: stream >> 8), UInt8(truncatingIfNeeded: stream),
        ]
        pending += payload
        framesMade += 1
    }

    /// HEADERS with END_HEADERS, in HPACK from the static table:
    /// `:method` GET or POST, `:scheme http`, `:path /`, `:authority a`,
    /// and maybe a regular field or a forbidden one.
    mutating func requestHead(stream: UInt32, flags: UInt8) {
        if flags & 0x80 != 0 { return trailers(stream: stream, flags: flags) }
        var block: [UInt8] = [flags & 0x2 == 0 ? 0x82 : 0x83, 0x86, 0x84, 0x41, 0x01, 0x61]
        switch flags >> 4 & 0x7 {
        case 1: block += [0x40, 0x01, 0x78, 0x01, 0x79]  // x: y
        case 2: block += [0x40, 0x0A] + Array("connection".utf8) + [0x01, 0x63]  // connection: c
        case 3: block += [0x5C, 0x02, 0x31, 0x30]  // content-length: 10
        case 4: block += [0x5C, 0x01, 0x30]  // content-length: 0
        case 5: block += [0x40, 0x01, 0x78, 0x03, 0x61, 0x0A, 0x62]  // x: a LF b
        default: break
        }
        frame(type: 1, flags: 0x4 | (flags & 0x1), stream: max(1, stream), block)
    }

    /// Trailers (HEADERS, END_STREAM and END_HEADERS) with one field:
    /// `x: y`, `:path /`, `content-length: 1`, `x: a CR LF b`,
    /// `transfer-encoding: c`, `te: trailers`, an upper-case name, none.
    mutating func trailers(stream: UInt32, flags: UInt8) {
        let block: [UInt8]
        switch flags >> 4 & 0x7 {
        case 0: block = [0x40, 0x01, 0x78, 0x01, 0x79]
        case 1: block = [0x84]
        case 2: block = [0x5C, 0x01, 0x31]
        case 3: block = [0x40, 0x01, 0x78, 0x04, 0x61, 0x0D, 0x0A, 0x62]
        case 4: block = [0x40, 0x11] + Array("transfer-encoding".utf8) + [0x01, 0x63]
        case 5: block = [0x40, 0x02, 0x74, 0x65, 0x08] + Array("trailers".utf8)
        case 6: block = [0x40, 0x01, 0x58, 0x01, 0x79]
        default: block = []
        }
        frame(type: 1, flags: 0x5, stream: max(1, stream), block)
    }

    mutating func deliver(split: Int) {
        guard !pending.isEmpty, !dead else { return }
        let bytes = pending
        pending = []
        let cut = bytes.count > 1 ? split % bytes.count : 0
        if cut > 0 { receive(Array(bytes[..<cut])) }
        if !dead { receive(Array(bytes[cut...])) }
    }

    private mutating func receive(_ bytes: [UInt8]) {
        let result = session.receive(bytes)
        reads += 1
        let before = gone
        for event in result.events {
            switch event {
            case let .resetByPeer(id, _), let .closed(id, _): gone.insert(id)
            case let .malformed(id):
                precondition(!malformed.contains(id), "stream \(id) malformed twice")
                malformed.insert(id)
            case let .requestEnded(id):
                precondition(!malformed.contains(id), "stream \(id) ended after its trailers were malformed")
            default: break
            }
        }
        for id in result.ready {
            precondition(!everReady.contains(id), "stream \(id) ready twice")
            precondition(!gone.contains(id), "stream \(id) ready after it was reset or closed")
            precondition(!before.contains(id), "stream \(id) ready after it was gone")
            precondition(!malformed.contains(id), "stream \(id) ready after its trailers were malformed")
            precondition(session.isOpen(id), "stream \(id) ready but not open")
            precondition(
                (session.head(of: id) != nil) != (session.refusal(of: id) != nil), "stream \(id): neither head nor refusal")
            everReady.insert(id)
            answerable.append(id)
        }
        if let error = result.error {
            precondition(result.ready.isEmpty, "ready streams out of a failed read")
            self.error = error
            dead = true
        } else {
            precondition(result.consumed == bytes.count, "nghttp2 read \(result.consumed) of \(bytes.count) bytes")
        }
        collect(session.takeEvents())
        checkInvariants()
    }

    private mutating func collect(_ later: HTTP2ReceiveResult) {
        for event in later.events {
            if case let .closed(id, _) = event { gone.insert(id) }
        }
        answerable.removeAll { !session.isOpen($0) }
    }

    func checkInvariants() {
        let window = max(Self.defaultWindow, Int(Self.settings.initialStreamWindow))
        for id in everReady {
            precondition(session.bufferedBody(of: id) <= window, "stream \(id) buffers past its window")
            precondition(session.bufferedBody(of: id) <= Self.limits.maxBodyBytes, "stream \(id) buffers past the body limit")
        }
        precondition(session.bufferedBodyBytes <= session.openStreams * window, "body bytes past the windows")
        precondition(session.openStreams <= Int(Self.settings.maxConcurrentStreams), "more streams than advertised")
        let frames = session.framesBegun.counts.reduce(0, &+)
        precondition(session.outboundQueueSize <= 3 * (frames + submitted) + 8, "outbound queue out of proportion")
    }

    // MARK: - The driver's moves

    mutating func move(_ p: UInt8) {
        let target = answerable.isEmpty ? nil : answerable[Int(p >> 3) % answerable.count]
        switch p % 8 {
        case 0: session.produce(highWater: Int(p) * 16) { _ in }
        case 1:
            if let target {
                let body = session.takeBody(of: target)
                precondition(body.count <= Self.limits.maxBodyBytes, "a body past the limit")
            }
        case 2:
            if let target, !answered.contains(target) {
                answered.insert(target)
                submitted += 1
                _ = session.submitResponse(
                    target, status: 200, fields: [HTTPField(name: "x", value: "y")], hasBody: p & 0x10 != 0)
            }
        case 3:
            if let target { session.sendData(target, [UInt8](repeating: 0x41, count: Int(p))) }
        case 4:
            if let target {
                submitted += 1
                session.sendData(target, [1], end: true, trailers: p & 0x10 != 0 ? [HTTPField(name: "t", value: "1")] : nil)
            }
        case 5:
            if let target {
                submitted += 1
                session.resetStream(target)
            }
        case 6:
            submitted += 1
            session.goaway(code: UInt32(p >> 3) % 14)
        default:
            submitted += 1
            session.shutdownNotice()
        }
        collect(session.takeEvents())
        if session.fatalError != nil { dead = true }
        checkInvariants()
    }
}
