// Drives the proxy's own HTTP/2 client session (`HTTP2ClientSessionDriver`:
// the session and its tries, without sockets) with an upstream's bytes made
// from the fuzz input: the server's SETTINGS, response heads (final, 1xx,
// trailers), DATA, RST_STREAM, GOAWAY, PING, WINDOW_UPDATE, PUSH_PROMISE,
// CONTINUATION and frames of any type with random flags, ids and payloads,
// delivered in splits of any size, with the exchange's moves in between
// (new tries, a handler that stops taking bytes, pause, resume, cancel,
// detach, the client's next pass). After every step it checks what the
// handlers heard and traps on the first rule broken. nghttp2 is not
// instrumented: libFuzzer is guided by our Swift only.
import HappyPathCore
import HappyPathIO

public enum HTTP2ClientHarness {
    public static func check(_ bytes: [UInt8]) -> String { checkHTTP2ClientInvariants(bytes) }
}

/// A try's handler that checks the contract it is owed: parts only before
/// the end, the end once, nothing after a detach or cancel, a head before
/// any body, body bytes only as many as the upstream sent.
final class CheckedHandler: UpstreamResponseHandler {
    var finished = 0
    var silenced = false
    var status = 0
    var body = 0
    var takes = true
    let name: String

    init(_ name: String) { self.name = name }

    func heard(_ what: String) {
        precondition(finished == 0, "\(name): \(what) after the end")
        precondition(!silenced, "\(name): \(what) after detach or cancel")
    }

    func upstreamStatus(_ status: Int, reason: UnsafeRawBufferPointer) {
        heard("a status")
        precondition((200...599).contains(status), "\(name): final status \(status)")
        self.status = status
    }
    func upstreamHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        heard("a field")
        precondition(status != 0, "\(self.name): a field before the status")
    }
    func upstreamInformational(_ status: Int, fields: UnsafeRawBufferPointer) {
        heard("a 1xx")
        precondition((102...199).contains(status), "\(name): informational \(status)")
        precondition(self.status == 0, "\(name): a 1xx after the final head")
    }
    func upstreamHeadersComplete() -> String? {
        heard("the head's end")
        precondition(status != 0, "\(name): a head without a status")
        return nil
    }
    func upstreamBody(_ bytes: UnsafeRawBufferPointer) -> Bool {
        heard("body bytes")
        precondition(status != 0, "\(name): body before the head")
        guard takes else { return false }
        body += bytes.count
        return true
    }
    func upstreamTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) { heard("a trailer") }
    func upstreamFinished(_ failure: UpstreamFailure?) {
        heard("the end")
        finished += 1
    }
}

/// The program is read one op byte at a time (`op % 12`), then its parameters:
/// - 0, 1: a frame of any type (`type % 11`, 10 an unknown type), flags, a
///   stream (one of the tries' ids or 0, 2, 99), a length (`% 40`) and that many payload bytes
/// - 2: a response HEADERS for a try's stream: `:status` from a short list
///   (200, 204, 404, 500, 103, 100, an invalid one, none: trailers), maybe
///   END_STREAM (0x80), maybe a field (good, upper-case, connection-specific,
///   `grpc-status`, a pseudo-header)
/// - 3: DATA for a try's stream (length `% 200` × 64, maybe END_STREAM)
/// - 4: RST_STREAM (stream, code `% 14`)
/// - 5: the server's SETTINGS (MAX_CONCURRENT_STREAMS and INITIAL_WINDOW_SIZE
///   from the input), or its ACK of ours
/// - 6: GOAWAY (last id from the tries', code)
/// - 7: deliver the bytes made so far, split in two at a point from the next byte
/// - 8: a new try (GET, or a POST of up to 100 KiB)
/// - 9: an exchange's move on a try: stop or go on taking bytes, pause,
///   resume, cancel, detach
/// - 10: the client's next pass
/// - 11: produce what the session has to send (window updates, resets, bodies)
public func checkHTTP2ClientInvariants(_ program: [UInt8]) -> String {
    guard let driver = try? HTTP2ClientSessionDriver(limits: HTTP2ClientLimits(maxHeadBytes: 1024, maxHeadFields: 8))
    else { fatalError("no session") }
    var handlers: [CheckedHandler] = []
    var pending: [UInt8] = []
    var dataSent = 0
    var k = 0
    func next() -> UInt8 {
        defer { k += 1 }
        return k < program.count ? program[k] : 0
    }
    func stream(_ p: UInt8) -> UInt32 {
        let i = Int(p)
        if !handlers.isEmpty, i % 4 != 3 {
            let id = driver.streamID(i % handlers.count)
            return id > 0 ? UInt32(id) : 1
        }
        return [0, 2, 99, 1][i % 4]
    }
    func frame(_ type: UInt8, _ flags: UInt8, _ stream: UInt32, _ payload: [UInt8]) {
        let n = payload.count
        pending += [
            UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n), type,
            flags, UInt8(truncatingIfNeeded: stream >> 24), UInt8(truncatingIfNeeded: stream >> 16),
            UInt8(truncatingIfNeeded: stream >> 8), UInt8(truncatingIfNeeded: stream),
        ]
        pending += payload
    }
    func deliver(split: Int) {
        guard !pending.isEmpty else { return }
        let cut = min(pending.count, split)
        if cut > 0 { driver.receive(Array(pending[..<cut])) }
        driver.receive(Array(pending[cut...]))
        pending = []
    }
    func checkAll() {
        var bodies = 0
        for (i, h) in handlers.enumerated() {
            precondition(h.finished <= 1, "try \(i) ended \(h.finished) times")
            precondition(driver.held(i) <= 65_536, "try \(i) holds \(driver.held(i)) bytes, past its window")
            bodies += h.body + driver.held(i)
        }
        precondition(bodies <= dataSent, "handlers got \(bodies) body bytes of \(dataSent) sent")
    }
    // The server's preface: its SETTINGS.
    frame(4, 0, 0, [])
    while k < program.count {
        switch next() % 12 {
        case 0, 1:
            let type = next() % 11
            let flags = next()
            let s = stream(next())
            let n = Int(next() % 40)
            let end = min(program.count, k + n)
            var payload = k < end ? Array(program[k..<end]) : []
            payload += [UInt8](repeating: 0, count: n - payload.count)
            k = max(k, end)
            if type == 0 { dataSent += n }  // a DATA frame made raw: its payload (padding included) is an upper bound
            frame(type == 10 ? 0x20 : type, flags, s, payload)
        case 2:
            let s = stream(next())
            let p = next()
            // HPACK: :status from the static table (8 = 200, 9 = 204, 13 = 404, 14 = 500),
            // or literal (name index 8) for 103, 100 and "2x0".
            let statuses: [[UInt8]] = [
                [0x88], [0x89], [0x8D], [0x8E], [0x08, 3] + Array("103".utf8), [0x08, 3] + Array("100".utf8),
                [0x08, 3] + Array("2x0".utf8), [],  // the last: no :status (trailers)
            ]
            var block = statuses[Int(p % 8)]
            let fields: [[UInt8]] = [
                [], [0x00, 1, 0x61, 1, 0x62], [0x00, 1, 0x41, 1, 0x62],  // a: b, A: b
                [0x00, 10] + Array("connection".utf8) + [5] + Array("close".utf8),
                [0x00, 11] + Array("grpc-status".utf8) + [1, 0x30], [0x00, 5] + Array(":path".utf8) + [1, 0x2F],
            ]
            block += fields[Int(p & 0x7F) / 8 % fields.count]
            frame(1, 0x4 | (p & 0x80 != 0 ? 0x1 : 0), s, block)
        case 3:
            let s = stream(next())
            let flags = next() & 0x1
            let n = Int(next() % 200) * 64
            dataSent += n
            frame(0, flags, s, [UInt8](repeating: 0x78, count: n))
        case 4: frame(3, 0, stream(next()), [0, 0, 0, next() % 14])
        case 5:
            if next() & 1 == 0 {
                frame(4, 0x1, 0, [])
            } else {
                let streams = next() % 4
                let window = UInt32(next()) << 8
                frame(
                    4, 0, 0,
                    [0, 3, 0, 0, 0, streams, 0, 4, UInt8(window >> 24), UInt8((window >> 16) & 0xFF),
                     UInt8((window >> 8) & 0xFF), UInt8(window & 0xFF)])
            }
        case 6: frame(7, 0, 0, [0, 0, 0, UInt8(stream(next()) & 0x7F), 0, 0, 0, next() % 14])
        case 7: deliver(split: Int(next()))
        case 8:
            let p = next()
            let h = CheckedHandler("try \(handlers.count)")
            handlers.append(h)
            driver.start(body: p & 1 == 0 ? nil : [UInt8](repeating: 0x62, count: Int(p) * 400), handler: h)
        case 9:
            guard !handlers.isEmpty else { break }
            let p = next()
            let i = Int(p >> 3) % handlers.count
            switch p % 6 {
            case 0: handlers[i].takes = false
            case 1: handlers[i].takes = true
            case 2: driver.pause(i)
            case 3: driver.resume(i)
            case 4:
                handlers[i].silenced = true
                driver.cancel(i)
            default:
                handlers[i].silenced = true
                driver.detach(i)
            }
        case 10: driver.runSoon()
        default: _ = driver.produce()
        }
        checkAll()
    }
    deliver(split: 0)
    for h in handlers { h.takes = true }
    for i in handlers.indices { driver.resume(i) }
    driver.runSoon()
    checkAll()
    let ended = handlers.filter { $0.finished == 1 }.count
    defer { driver.end() }  // the tries hold the driver: without this every input would leak its session
    return "tries \(handlers.count), ended \(ended), replays \(driver.replays), open \(driver.openStreams)"
        + (driver.ended ? ", session ended" : "")
}
