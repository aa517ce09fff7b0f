// Drives an HTTP1ServerConnectionStateMachine the way HTTPConnection does,
// without sockets, from a program read out of fuzz bytes: client bytes in
// splits of any size, answers started, written and ended, output queued and
// drained, timers fired, the peer closing, drain. After every event it checks
// the connection's invariants and traps on the first one broken.
import HappyPathCore

/// Runs `program` and checks the invariants; returns a summary.
///
/// The program is read one op byte at a time (`op % 8`), some ops taking
/// the next byte as a parameter:
/// - 0, 1, 2: the client sends the next `p % 64 + 1` bytes (if reading is not paused)
/// - 3: the delegate answers the open request (status and length from `p`), whole or streamed
/// - 4: the timer fires (if armed)
/// - 5: the client closes its side
/// - 6: output: queued, progressed, drained, or a failed write (from `p`)
/// - 7: drain, a request asking to hear of its output drained, or a parse pass
public func checkConnectionInvariants(_ program: [UInt8]) -> String {
    var driver = FuzzedConnection()
    var k = 0
    func next() -> UInt8 {
        defer { k += 1 }
        return k < program.count ? program[k] : 0
    }
    while k < program.count {
        let op = next() % 8
        switch op {
        case 0, 1, 2:
            let n = Int(next() % 64) + 1
            let end = min(program.count, k + n)
            if k < end { driver.clientSends(Array(program[k..<end])) }
            k = max(k, end)
        case 3: driver.answer(next())
        case 4: driver.timerFires()
        case 5: driver.peerCloses()
        case 6: driver.output(next())
        default: driver.misc(next())
        }
        driver.checkInvariants()
        if driver.machine.state == .closed { break }
    }
    return "dispatched \(driver.machine.requestsDispatched), answered \(driver.machine.requestsAnswered), \(driver.machine.state)"
}

/// What `HTTPConnection` keeps, minus the socket.
struct FuzzedConnection {
    typealias M = HTTP1ServerConnectionStateMachine
    static let limits = M.Limits(request: RequestLimits(maxHeadBytes: 512, maxFields: 8, maxBodyBytes: 4096))
    /// The process's body budget, small enough to be reached.
    static let budget = 2048

    var machine = M(limits: limits)
    var input: [UInt8] = []
    var requestStart = 0
    /// What the driver was told: the timer armed, reading on, the write watch.
    var timer: M.Wait?
    var reading = true
    var writeWatch = false
    var outputPending = false
    /// A parse pass is scheduled (`parseNext`).
    var parseScheduled = false
    /// A drained check is scheduled (`checkDrained`).
    var drainCheckScheduled = false
    /// The request the delegate holds, and whether its answer has started.
    var open = false
    var answerStarted = false
    var bodyReserved = 0
    var bodyExpected = 0
    var bodyFilled = 0
    var dispatched = 0
    var closed = false

    init() { perform(machine.start()) }

    // MARK: - Events

    mutating func clientSends(_ bytes: [UInt8]) {
        // A paused connection is not read: the bytes wait in the kernel.
        guard reading, !closed else { return }
        readable(bytes)
    }

    /// A read event; `bytes` is what a read would return (none: a
    /// scheduled parse pass). Bytes the plan does not take stay unread.
    private mutating func readable(_ bytes: [UInt8]) {
        let plan = machine.readReady(buffered: input.count - requestStart)
        switch plan {
        case .ignore:
            return
        case .pause:
            if reading { perform(M.Actions(reading: false)) }
        case .discard:
            input.removeAll()
            requestStart = 0
        case let .body(remaining):
            // Straight into the body's storage.
            precondition(remaining > 0, "a body read with nothing left to read")
            let n = min(remaining, bytes.count)
            if n > 0 {
                bodyFilled += n
                perform(machine.bodyRead(n))
            }
        case .parseBuffered:
            process()
        case .input:
            precondition(reading || bytes.isEmpty, "read while paused")
            guard !bytes.isEmpty else { return }
            input += bytes
            perform(machine.inputRead())
            process()
        }
    }

    private mutating func process() {
        if !machine.decodingChunked {
            perform(input.withUnsafeBytes { machine.parse(UnsafeRawBufferPointer(rebasing: $0[requestStart...])) })
        }
        if machine.decodingChunked { decodeChunked() }
    }

    private mutating func decodeChunked() {
        let headLength = machine.head!.headLength
        let from = requestStart + headLength
        var reserved = bodyReserved
        let (consumed, actions) = input.withUnsafeBytes { raw in
            machine.decodeChunked(UnsafeRawBufferPointer(rebasing: raw[from...])) { data in
                guard reserved + data.count <= Self.budget else { return false }
                reserved += data.count
                return true
            }
        }
        bodyReserved = reserved
        precondition(consumed >= 0 && from + consumed <= input.count, "consumed past the buffer")
        input.removeSubrange(from..<(from + consumed))
        perform(actions)
    }

    mutating func answer(_ p: UInt8) {
        guard open else { return }
        let statuses = [200, 204, 304, 404, 101, 503, 200, 302]
        let status = statuses[Int(p % 8)]
        let length: Int? = p & 0x10 == 0 ? Int(p >> 5) : nil
        if p & 0x08 != 0 {
            let head = machine.responseStarted(status: status, contentLength: length, whole: true)
            precondition(!head.chunked)
        } else {
            let head = machine.responseStarted(status: status, contentLength: length)
            precondition(!(head.chunked && head.contentLength != nil), "two framings")
            answerStarted = true
            let offered = Int(p >> 4)
            let n = machine.bodyBytes(offered)
            precondition(n <= offered)
            precondition(head.hasBody || n == 0, "a body where none may be")
            if let length = head.contentLength, head.hasBody { precondition(n <= length, "more than announced") }
            if machine.responseShort {
                // Cut short: the request aborts, which closes the connection.
                close()
                return
            }
        }
        endAnswer()
    }

    private mutating func endAnswer() {
        open = false
        answerStarted = false
        bodyReserved = 0
        let end = requestStart + machine.requestEnd
        let actions = machine.responseEnded(buffered: max(0, input.count - end), outputPending: outputPending)
        if machine.state == .idle {
            precondition(end <= input.count, "the request ends past the buffer")
            requestStart = end
            if requestStart == input.count {
                input.removeAll()
                requestStart = 0
            }
        }
        perform(actions)
    }

    mutating func timerFires() {
        guard timer != nil else { return }
        timer = nil
        perform(machine.timerFired())
    }

    mutating func peerCloses() {
        perform(machine.readEnded())
    }

    mutating func output(_ p: UInt8) {
        switch p % 4 {
        case 0:
            guard open || machine.state == .body else { return }
            outputPending = true
            perform(machine.outputQueued())
        case 1:
            guard outputPending else { return }
            perform(machine.outputProgressed())
        case 2:
            guard outputPending || drainCheckScheduled else { return }
            outputPending = false
            drainCheckScheduled = false
            perform(machine.outputDrained())
        default:
            guard outputPending else { return }
            perform(machine.writeFailed())
        }
    }

    mutating func misc(_ p: UInt8) {
        switch p % 3 {
        case 0: perform(machine.drain(buffered: input.count - requestStart, outputPending: outputPending))
        case 1:
            guard open else { return }
            perform(machine.notifyWhenDrained(outputPending: outputPending))
        default:
            if parseScheduled {
                parseScheduled = false
                readable([])
            }
        }
    }

    // MARK: - Actions

    private mutating func perform(_ a: M.Actions) {
        if closed {
            precondition(a == .none, "an action after the close: \(a)")
            return
        }
        switch a.timer {
        case let .arm(w): timer = w
        case .cancel: timer = nil
        case nil: break
        }
        if let r = a.reading {
            precondition(r != reading || r, "paused twice")
            reading = r
        }
        if let w = a.writeInterest {
            precondition(w != writeWatch, "the write watch set to what it was")
            writeWatch = w
        }
        switch a.step {
        case .none: break
        case .startBody:
            precondition(!open, "a second request while one is open")
            guard let head = machine.head else { preconditionFailure("startBody without a head") }
            var buffered = 0
            if case let .contentLength(n) = head.framing {
                guard n <= Self.budget else { return perform(machine.refused(.bodyOverBudget)) }
                bodyExpected = n
                buffered = min(n, input.count - requestStart - head.headLength)
                bodyFilled = buffered
            }
            perform(machine.bodyStarted(buffered: buffered))
        case .dispatch:
            precondition(!open || machine.head?.expectsContinue == true, "a second request while one is open")
            if !open { dispatched += 1 }
            open = true
        case .refuse:
            if !open { dispatched += 1 }
            open = true
        case .askAdmission:
            precondition(!open, "a second request while one is open")
            dispatched += 1
            open = true
            // The delegate admits requests whose path is odd in length, and
            // answers the others itself.
            let granted = (machine.head!.pathAndQuery.count) % 2 == 1
            if !granted { endAnswer() }
            perform(machine.admission(granted))
        case .writeContinue: break
        case .parseNext: parseScheduled = true
        case .halfClose: break
        case .close: close()
        case .clientLost: precondition(open, "a client lost with no request open")
        case .notifyDrained: precondition(open && !outputPending, "drained told while output waits")
        case .checkDrained: drainCheckScheduled = true
        }
    }

    private mutating func close() {
        closed = true
        timer = nil
        _ = machine.closed()
        open = false
    }

    // MARK: - Invariants

    func checkInvariants() {
        precondition(machine.timer == timer, "the machine's timer \(String(describing: machine.timer)) is not the one armed \(String(describing: timer))")
        precondition(machine.readPaused == !reading || closed, "reading paused \(machine.readPaused) but told \(reading)")
        precondition(machine.writeInterest == writeWatch || closed, "write watch out of step")
        precondition(machine.requestsDispatched == dispatched, "dispatched \(machine.requestsDispatched) != \(dispatched)")
        precondition(machine.requestsAnswered <= machine.requestsDispatched, "more answers than requests")
        precondition(machine.requestOpen == open || closed, "the request's openness out of step")
        if closed {
            precondition(machine.state == .closed)
            return
        }
        // No connection waits forever: a state that waits for the client has a timer.
        switch machine.state {
        case .idle, .head, .body, .lingering:
            precondition(timer != nil, "\(machine.state) with no timer armed")
        case .dispatched:
            if writeWatch { precondition(timer != nil, "output waiting with no stall timer") }
        case .admitting, .closed:
            break
        }
        if machine.state == .head || machine.state == .idle { precondition(!open, "a request open between requests") }
    }
}

/// The FuzzConnection target's check, as the fuzz executable and the seed
/// replay tests call it.
public enum ConnectionHarness {
    public static func check(_ bytes: [UInt8]) -> String { checkConnectionInvariants(bytes) }
}
