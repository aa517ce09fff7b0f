import HappyPathCore
import Testing

/// A streamed request body between the client's stream (appending) and the
/// try in flight (reading): back-pressure by `room`, one wake-up per wait,
/// replay while the budget keeps every byte, and no replay after.
@Suite struct RequestBodyStreamTests {
    final class Calls {
        var room = 0
        var available = 0
    }

    static func make(ahead: Int = 8, budget: BodyBudget? = nil, declaredLength: Int? = nil) -> (RequestBodyStream, Calls) {
        let body = RequestBodyStream(declaredLength: declaredLength, ahead: ahead, budget: budget)
        let calls = Calls()
        body.onRoom = { calls.room += 1 }
        body.onAvailable = { calls.available += 1 }
        return (body, calls)
    }

    static func read(_ body: RequestBodyStream, max: Int) -> (RequestBodyStream.ReadResult, [UInt8]) {
        var out = [UInt8](repeating: 0, count: max)
        let r = out.withUnsafeMutableBytes { body.read(into: $0.baseAddress!, max: max) }
        if case let .bytes(n) = r { return (r, Array(out[..<n])) }
        return (r, [])
    }

    static func append(_ body: RequestBodyStream, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { body.append($0) }
    }

    @Test func bytesFlowInOrderAndTheEndIsReadAfterThem() {
        let (body, calls) = Self.make()
        Self.append(body, [1, 2, 3])
        #expect(body.room == 5)
        #expect(Self.read(body, max: 2) == (.bytes(2), [1, 2]))
        #expect(calls.room == 1)
        #expect(body.room == 7)
        body.finish()
        #expect(Self.read(body, max: 10) == (.bytes(1), [3]))
        #expect(Self.read(body, max: 10).0 == .end)
        #expect(calls.available == 0)
    }

    @Test func aWaitingReaderIsWokenOnceByBytesTheEndOrAFailure() {
        let (body, calls) = Self.make()
        #expect(Self.read(body, max: 4).0 == .wait)
        #expect(body.readerWaiting)
        Self.append(body, [9])
        Self.append(body, [8])
        #expect(calls.available == 1)
        #expect(Self.read(body, max: 4) == (.bytes(2), [9, 8]))
        #expect(Self.read(body, max: 4).0 == .wait)
        body.finish()
        #expect(calls.available == 2)
        #expect(Self.read(body, max: 4).0 == .end)

        let (failing, failCalls) = Self.make()
        #expect(Self.read(failing, max: 4).0 == .wait)
        failing.fail(.clientGone)
        #expect(failCalls.available == 1)
        #expect(Self.read(failing, max: 4).0 == .failed)
        #expect(!failing.replayable)
    }

    /// An upstream that has read the declared length has a whole request:
    /// the last byte waits for the client's END_STREAM, so a body that
    /// turns out malformed fails while the upstream still misses it.
    @Test func theLastByteOfADeclaredLengthWaitsForTheEnd() {
        let (body, calls) = Self.make(declaredLength: 4)
        Self.append(body, [1, 2])
        #expect(Self.read(body, max: 8) == (.bytes(2), [1, 2]))
        Self.append(body, [3, 4])
        #expect(calls.available == 0)
        #expect(Self.read(body, max: 8) == (.bytes(1), [3]))
        #expect(Self.read(body, max: 8).0 == .wait)
        body.finish()
        #expect(calls.available == 1)
        #expect(Self.read(body, max: 8) == (.bytes(1), [4]))
        #expect(Self.read(body, max: 8).0 == .end)

        // The length complete, then a failure (a DATA frame past it, a bad
        // trailer): the reader never gets the last byte.
        let (cut, cutCalls) = Self.make(declaredLength: 3)
        Self.append(cut, [7, 8, 9])
        #expect(Self.read(cut, max: 8) == (.bytes(2), [7, 8]))
        #expect(Self.read(cut, max: 8).0 == .wait)
        cut.fail(.clientGone)
        #expect(cutCalls.available == 1)
        #expect(Self.read(cut, max: 8).0 == .failed)

        // Without a declared length every byte is readable at once.
        let (open, _) = Self.make()
        Self.append(open, [5, 6])
        #expect(Self.read(open, max: 8) == (.bytes(2), [5, 6]))
    }

    @Test func theProducerMayRunOnlyAheadBytesBeyondTheReader() {
        let (body, _) = Self.make(ahead: 4)
        Self.append(body, [1, 2, 3, 4])
        #expect(body.room == 0)
        _ = Self.read(body, max: 3)
        #expect(body.room == 3)
    }

    @Test func aRetryReadsTheWholeBodyAgainWhileTheBudgetKeepsIt() {
        let budget = BodyBudget(limit: 100)
        let (body, _) = Self.make(budget: budget)
        Self.append(body, [1, 2, 3, 4, 5])
        #expect(budget.current == 5)
        _ = Self.read(body, max: 4)
        #expect(body.rewind())
        body.finish()
        #expect(Self.read(body, max: 10) == (.bytes(5), [1, 2, 3, 4, 5]))
        #expect(body.replayable)
    }

    @Test func oncePastTheBudgetWhatWasReadIsLetGoAndNoRetryReadsIt() {
        let budget = BodyBudget(limit: 4)
        let (body, _) = Self.make(budget: budget)
        Self.append(body, [1, 2, 3])
        #expect(Self.read(body, max: 2) == (.bytes(2), [1, 2]))
        Self.append(body, [4, 5])  // 5 bytes would pass the budget of 4
        #expect(budget.current == 0)
        #expect(body.dropped == 2)
        #expect(body.held == 3)
        #expect(!body.replayable)
        #expect(!body.rewind())
        #expect(Self.read(body, max: 10) == (.bytes(3), [3, 4, 5]))
        #expect(body.held == 0)
        Self.append(body, [6])
        body.finish()
        #expect(Self.read(body, max: 10) == (.bytes(1), [6]))
        #expect(Self.read(body, max: 10).0 == .end)
    }

    @Test func aBodyThatEndedWholeIsOnePiece() {
        let (body, _) = Self.make(budget: BodyBudget(limit: 100))
        Self.append(body, [1, 2])
        #expect(body.completeBody == nil)  // not ended yet
        Self.append(body, [3])
        body.finish()
        #expect(body.completeBody.map { Array($0) } == [1, 2, 3])
        let (cut, _) = Self.make(budget: BodyBudget(limit: 2))
        Self.append(cut, [1])
        _ = Self.read(cut, max: 1)
        Self.append(cut, [2, 3])  // past the budget: the read byte is let go
        cut.finish()
        #expect(cut.completeBody == nil)
        let (empty, _) = Self.make()
        empty.finish()
        #expect(empty.completeBody?.count == 0)
    }

    @Test func theBudgetIsGivenBackWhenTheBodyGoes() {
        let budget = BodyBudget(limit: 100)
        do {
            let (body, _) = Self.make(budget: budget)
            Self.append(body, [1, 2, 3])
            #expect(budget.current == 3)
        }
        #expect(budget.current == 0)
    }

    @Test func nothingIsTakenAfterTheEndOrAFailure() {
        let (body, _) = Self.make()
        body.finish()
        Self.append(body, [1])
        #expect(body.received == 0)
        body.fail(.tooLarge)
        #expect(body.failure == nil)  // a complete body does not fail afterwards
        let (other, _) = Self.make()
        other.fail(.tooLarge)
        Self.append(other, [1])
        #expect(other.received == 0)
        #expect(other.failure == .tooLarge)
    }
}
